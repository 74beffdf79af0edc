"""Cells across separate hosts: the namespaced Slurm cluster of ``.ci/slurm-up --nodes 3`` (root).

    python benchmarks/nodes.py [--repeats 3] [--steps 40] [--rates 1gbit,100mbit] [--figure link.png]

Two tables, every cell ``--repeats`` times, interleaved (the order reversed in every other repeat):

1. **The node-leader path's CPU.** All-Shared with one member on each of 3 nodes (the node
   leaders' all-gather over TCP between the nodes) against the same cell with its 3 members on one
   node (node-shared memory): process CPU per delivered image per member, and their ratio, paired
   within each repeat. The goal: the 3-node cell within 15% of the one-node cell.
2. **A narrowing link.** Images/s per member of All-Shared, Single-Broadcast and Multi-Broadcast
   (P = 2), one member per node, as every node's link is limited each way with ``tc tbf``
   (``.ci/slurm-node shape``): the bridge unlimited, then each of ``--rates``. Beside each, the cost
   model's bound for that link (:func:`enspipe.plan.model.predict`'s exchange time, the link's rate
   as its inter-node bandwidth), capped at the scheme's unlimited rate: ``predicted``. The paper's
   Fig. 10 predicts the broadcast schemes falling behind All-Shared as the link narrows; this
   measures it.

The nodes share this machine's kernel and cores (3 nodes of 2 CPUs on 2 cores here): a cell's CPU
is its processes' own, and its throughput is this machine's, not a cluster's.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import numpy as np

from cells import cpu_per_image, dataset, run_under, schedule, spread

from enspipe.plan.model import CommCosts, Machine, predict

NODE = os.path.join(os.path.dirname(__file__), "..", ".ci", "slurm-node")
SCHEMES = (("all_shared", None), ("single_broadcast", 2), ("multi_broadcast", 2))
BITS = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}


def nodes() -> list[str]:
    """The namespaced cluster's nodes that Slurm knows (none without Slurm)."""
    if not shutil.which("sinfo"):
        return []
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True)
    names = sorted(set(r.stdout.split())) if r.returncode == 0 else []
    return [x for x in names if x.startswith("node") and os.path.exists(f"/run/netns/enspipe-{x}")]


def srun(hosts: int, per_node: int) -> list[str]:
    layout = [f"--ntasks-per-node={per_node}"] if hosts > 1 else ["--overcommit"]  # a node has 2 CPUs here
    return ["srun", "-N", str(hosts), "-n", str(hosts * per_node), *layout, "--mpi=pmi2", "--kill-on-bad-exit=1"]


def shape(rate: str) -> None:
    for i in range(1, 4):
        subprocess.run(["bash", NODE, "shape", str(i), rate], check=True)


def bytes_per_second(rate: str) -> float:
    for unit, bits in BITS.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * bits / 8
    raise SystemExit(f"--rates: {rate!r} is not a tc rate such as 1gbit or 100mbit")


def cell(scheme: str, p: int | None, a) -> list:
    args = ["--scheme", scheme, "--consumer", "peak", "--batch-size", a.batch, "--image-size", a.size,
            "--steps", a.steps, "--warmup", a.warmup]
    return args + (["--preprocessors", p] if p else [])


def leader_cpu(a, data: str) -> None:
    layouts = {"3 nodes x 1": srun(3, 1), "1 node x 3": srun(1, 3)}
    got = {k: [] for k in layouts}
    for rep, name in schedule(list(layouts), a.repeats):
        s = run_under(layouts[name], data, cell("all_shared", None, a))
        got[name].append(cpu_per_image(s))
        print(f"  rep {rep} {name}: {s['images_per_second_per_member']:.1f} images/s per member, "
              f"{cpu_per_image(s) * 1e3:.2f} ms CPU per image, paths {sorted(set(s['ranks'][0]['exchange_paths'].values()))}",
              file=sys.stderr)
    ratio = np.array(got["3 nodes x 1"]) / np.array(got["1 node x 3"])
    print("\nAll-Shared, n = 3: CPU per delivered image per member (ms), median (min-max) over "
          f"{a.repeats} repeats")
    print("| layout | CPU per image | vs one node |")
    print("|---|---|---|")
    print(f"| 1 node x 3 members (node-shm) | {spread(got['1 node x 3'], 1e3)} | 1 |")
    print(f"| 3 nodes x 1 member (node leaders over TCP) | {spread(got['3 nodes x 1'], 1e3)} | {spread(ratio)} |")
    print(f"goal: within 15% of one node: {'met' if abs(np.median(ratio) - 1) <= 0.15 else 'NOT met'} "
          f"(median ratio {np.median(ratio):.2f})")


def link(a, data: str) -> dict:
    rates = ["unlimited", *a.rates.split(",")]
    todo = [(r, s) for r in rates for s in SCHEMES]
    got = {k: [] for k in todo}
    try:
        for rep, (rate, (scheme, p)) in schedule(todo, a.repeats):
            shape("off" if rate == "unlimited" else rate)
            s = run_under(srun(3, 1), data, cell(scheme, p, a))
            got[(rate, (scheme, p))].append(s["images_per_second_per_member"])
            print(f"  rep {rep} {rate} {scheme}: {got[(rate, (scheme, p))][-1]:.1f} images/s", file=sys.stderr)
    finally:
        shape("off")
    print(f"\nOne member on each of 3 nodes, batch {a.batch} at {a.size} px (float32, "
          f"{a.batch * a.size * a.size * 12 / 1e6:.1f} MB): images/s per member, median (min-max) over {a.repeats} "
          "repeats; predicted: the cost model's bound for the link, capped at the scheme's unlimited rate")
    print("| link (each way, per node) | " + " | ".join(f"{s} (P={p or 3})" for s, p in SCHEMES) + " |")
    print("|---|" + "---|" * len(SCHEMES))
    table = {}
    for rate in rates:
        row = []
        for scheme, p in SCHEMES:
            v = got[(rate, (scheme, p))]
            pred = None
            if rate != "unlimited":
                m = Machine(rp={1: 1.0}, rc=None, cores_per_node=2, nodes=3,
                            comm=CommCosts(inter_node_bandwidth=bytes_per_second(rate)))
                t_x = predict(scheme, 3, p, a.batch, a.size, m).stages["exchange"]
                pred = min(a.batch / t_x, float(np.median(got[("unlimited", (scheme, p))])))
            table[(rate, scheme)] = (v, pred)
            row.append(spread(v, digits=1) + (f"; predicted {pred:.1f}" if pred else ""))
        print(f"| {rate} | " + " | ".join(row) + " |")
    return {"rates": rates, "table": table}


def figure(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    x = np.arange(len(res["rates"]))
    for k, (scheme, p) in enumerate(SCHEMES):
        vals = [res["table"][(r, scheme)][0] for r in res["rates"]]
        med = [np.median(v) for v in vals]
        lo = [np.median(v) - min(v) for v in vals]
        hi = [max(v) - np.median(v) for v in vals]
        line = ax.errorbar(x, med, yerr=[lo, hi], marker="o", capsize=3, label=f"{scheme} (P={p or 3}), measured")
        pred = [res["table"][(r, scheme)][1] for r in res["rates"]]
        ax.plot([i for i, v in zip(x, pred) if v], [v for v in pred if v], ls="--", color=line[0].get_color(),
                label=f"{scheme}, predicted")
    ax.set_xticks(x, ["unlimited\n(bridge)" if r == "unlimited" else r.replace("gbit", " Gbit/s").replace(
        "mbit", " Mbit/s") for r in res["rates"]])
    ax.set_yscale("log")
    ax.set_ylabel("images/s per member")
    ax.set_title("3 namespaced nodes, 1 member each: the link narrows", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"figure: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="measured batches per member")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--size", type=int, default=224, help="image side in px")
    ap.add_argument("--rates", default="1gbit,100mbit", help="link limits, tc's rate syntax")
    ap.add_argument("--figure", default=None, help="draw the link table as a figure here (PNG)")
    ap.add_argument("--only", choices=("cpu", "link"), default=None, help="one of the two tables")
    a = ap.parse_args()
    if len(nodes()) < 3:
        raise SystemExit("benchmarks/nodes.py needs the namespaced Slurm cluster of 3 nodes: "
                         "`sudo .ci/slurm-up --nodes 3` (root, where network namespaces can be made)")
    data = dataset(1000)
    if a.only in (None, "cpu"):
        leader_cpu(a, data)
    if a.only in (None, "link"):
        res = link(a, data)
        if a.figure:
            figure(res, a.figure)


if __name__ == "__main__":
    main()
