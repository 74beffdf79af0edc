"""Sharing schemes side by side: peak throughput, CPU per delivered image, and where the gap to the ideal goes.

    python benchmarks/sharing.py [--ns 1,2,4] [--steps 30] [--warmup 5] [--batch 32] [--size 224] [--repeats 3]
    .venv-horovod/bin/python benchmarks/sharing.py --transport horovod ...   (make horovod first)

Runs every scheme (single/multi-broadcast with P = max(1, N // 2); ``tfdata_service``, the tf.data
service peer, with one worker and with N) under ``mpiexec -n N`` with
``--consumer peak`` on the embedded dataset, ``--repeats`` times, interleaved (every cell once per
repeat, the order reversed in every other repeat), and prints two tables.

The first, per scheme and N: peak images/s per member and the cell's own process CPU per delivered
image per member, each as ``median (min-max)`` over the repeats; ``spread``, the largest repeat's
distance from the median (of either); the ideal CPU (the same N's baseline divided by N: every sharing scheme
preprocesses each image once, split among its P preprocessors, for all N members); ``vs
baseline``, baseline's CPU over the scheme's (the paper's CPU reduction; its ceiling is N), taken
in each repeat, where the two ran minutes apart, so a drift of the machine's speed between repeats
cancels: ``median (min-max)`` over the repeats (a median above N is explained: an unbalanced window,
repeats straddling N, or an N-member baseline that pays for oversubscribed cores); ``vs N=1``,
images/s per member over one member's of the same scheme, paired the same way (its median; where
members outnumber the cores, its ceiling is what as many processes that do nothing but preprocess
get: ``benchmarks/preprocessing.py --layouts 1x2,4x1``);
``vs base N=1``,
one member alone's CPU over the scheme's; and ``exch/prep``, the exchange's CPU (its copies and collectives) over the preprocessing CPU
(the read and preprocess stages); ``balance``, the images preprocessed inside the window over those
its deliveries needed (1.00: the window's CPU is the work of what it delivered).

The second splits each scheme's gap to its ideal by stage (:mod:`enspipe.measure.stages`): per stage, the
scheme's median CPU per delivered image minus the ideal share of the baseline's (x 1/N), in
microseconds; the stages add up to the gap. ``--transport horovod`` adds Horovod's background
thread to the exchange. ``--block-images 1,32`` runs each sharing scheme one batch at a time and
in units (the run's ``--block-images``), interleaved. A third table gives every repeat's own
numbers, in the order they ran, so a swing that every cell of one repeat shares (the machine) is
told from one cell's own; the script ends with the sharing goals' verdicts.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from cells import dataset, run_cell, schedule, spread

from enspipe.measure.stages import STAGES
from enspipe.plan.schemes import SCHEME_KINDS

EXCHANGE = ("copy_in", "collective")
PREPROCESSING = ("read", "preprocess")
COMM_THREADS = ("enspipe-horovod",)  # Horovod's background thread does its collectives' work


def cell_args(scheme, p, block, a) -> list:
    args = ["--scheme", scheme, "--network", a.network, "--consumer", "peak", "--batch-size", a.batch,
            "--steps", a.steps, "--warmup", a.warmup, "--image-size", a.size, "--transport", a.transport]
    if p:
        args += ["--preprocessors", p]
    if block:
        args += ["--block-images", block]
    if a.exchange == "mpi":
        args += ["--no-node-shm"]
    if a.cores:
        args += ["--cores", a.cores]
    return args


Cell = tuple[str, int, "int | None", "int | None"]  # scheme, N, P (None: N), --block-images (None: default)


def cells(ns: list[int], schemes: list[str], blocks: list[int | None]) -> list[Cell]:
    """Every scheme at every N (the baseline once per N, the others once per ``--block-images``)."""
    out = []
    for n in ns:
        for scheme in schemes:
            kind = SCHEME_KINDS[scheme]
            if kind.service:  # the peer: one worker, and one per member (All-Shared's cores)
                out += [(scheme, n, p, None) for p in sorted({1, n})]
                continue
            p = max(1, n // 2) if kind.takes_p else None
            if kind.takes_p and p > kind.p_max(n):
                continue
            out += [(scheme, n, p, b) for b in ([None] if scheme == "baseline" else blocks)]
    return out


def measure(s: dict) -> dict:
    """One run's numbers: rate, process CPU per image and per-stage CPU per image (members' mean)."""
    ranks = s["ranks"]
    horovod = float(np.mean([sum(r["thread_cpu_seconds"].get(t, 0.0) for t in COMM_THREADS) / r["images"]
                             for r in ranks]))
    if "stages_per_image" in s:
        stages = {k: v["cpu"] for k, v in s["stages_per_image"].items()}
    else:  # an enspipe from before the stage breakdown (to compare with): the exchange and the pools only
        per = [{"read": r["thread_cpu_seconds"].get("enspipe-read", 0.0) / r["images"],
                "preprocess": r["thread_cpu_seconds"].get("enspipe-preproc", 0.0) / r["images"],
                "collective": r["collective_cpu_seconds"] / r["images"]} for r in ranks]
        stages = {k: float(np.mean([p.get(k, float("nan")) for p in per])) for k in STAGES}
        stages["copy_in"] = 0.0
    prep = sum(stages[k] for k in PREPROCESSING)
    return {"rate": s["images_per_second_per_member"],
            "cpu": float(np.mean([r["cpu_seconds"] / r["images"] for r in ranks])),
            "stages": stages,
            "exch_prep": (sum(stages[k] for k in EXCHANGE) + horovod) / prep if prep else float("nan"),
            "unit": s.get("unit_batches") or 1,
            "balance": (s.get("window") or {}).get("balance") or float("nan")}


def ceiling(cell: Cell, vs: float, ratios: list[float], balance: float, base: dict, alone: dict | None) -> str:
    """Why a reduction came out above N, the most sharing can save: the window's CPU and images
    disagree (balance off 1), the repeats straddle N (the machine's speed drifted within a repeat),
    or the N-member baseline itself pays more per image than one member alone (shared cores)."""
    scheme, n, _, block = cell
    head = f"{scheme} N={n} block {block}: {vs:.2f}x > N"
    if abs(balance - 1) > 0.02:
        return f"{head}: the window's balance is {balance:.2f}, so its CPU is not the work of what it delivered"
    if min(ratios) <= n:
        return f"{head}: repeats range {min(ratios):.2f}-{max(ratios):.2f}x, straddling N (noise, not a saving)"
    if alone and base["cpu"] > 1.02 * alone["cpu"]:
        return (f"{head}: the {n}-member baseline pays for sharing the cores ({1000 * base['cpu']:.2f} ms/img "
                f"against {1000 * alone['cpu']:.2f} alone)")
    return f"{head} in every repeat with the window balanced: a measuring bug to find"


def ideal_share(scheme: str, n: int, p: int | None) -> float:
    """The fraction of the baseline's CPU per delivered image a scheme needs at best: every sharing
    scheme preprocesses each image once for all n members (P preprocessors split it), the baseline n times."""
    return 1.0 if scheme == "baseline" else 1.0 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,2,4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--network", default="alexnet_v2")
    ap.add_argument("--transport", default="mpi4py", choices=("mpi4py", "horovod"),
                    help="horovod: run this script with .venv-horovod/bin/python (make horovod)")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--exchange", choices=("shm", "mpi"), default="shm",
                    help="node-shared-memory batches (default) or MPI collectives only (--no-node-shm)")
    ap.add_argument("--cores", type=int, default=None, help="--cores per member (default: all)")
    ap.add_argument("--schemes", default="baseline,all_shared,single_broadcast,multi_broadcast",
                    help=f"comma-separated, of {', '.join(SCHEME_KINDS)}")
    ap.add_argument("--block-images", default="",
                    help="comma-separated --block-images values to run each sharing scheme with, interleaved "
                         "(e.g. 1,32: one batch at a time against units); default: the run's default")
    a = ap.parse_args()
    data = dataset(a.images)
    ns = [int(n) for n in a.ns.split(",")]
    blocks = [int(b) for b in a.block_images.split(",")] if a.block_images else [None]
    schemes = a.schemes.split(",")
    if "baseline" not in schemes:
        schemes = ["baseline", *schemes]  # the ideal and the reduction are against it
    todo = cells(ns, schemes, blocks)
    print(f"{a.network}, batch {a.batch}, {a.size} px, {a.warmup}+{a.steps} steps, transport {a.transport}, "
          f"exchange {a.exchange}, cores {a.cores or 'all'}, {os.cpu_count()} CPUs, {a.repeats} repeats interleaved "
          "(every other one in reverse order)",
          flush=True)
    runs: dict = {c: [] for c in todo}
    failed: list[str] = []
    for rep, cell in schedule(todo, a.repeats):
        scheme, n, p, block = cell
        try:
            started = time.time()
            runs[cell].append({**measure(run_cell(data, n, cell_args(scheme, p, block, a))), "started": started})
        except RuntimeError as e:
            runs[cell].append(None)  # kept in place: repeat i of every cell stays at index i (paired ratios)
            failed.append(f"{scheme} N={n} block {block} repeat {rep}: {str(e).splitlines()[-1]}")
    over = [n for n in ns if n * (a.cores or os.cpu_count()) > os.cpu_count()]
    if over:
        print(f"oversubscribed: N = {', '.join(map(str, over))} asks for N x {a.cores or 'all'} cores of "
              f"{os.cpu_count()} CPUs (members share the cores; 'vs N=1' is against one member with its cores to itself)")
    report(todo, runs, a.repeats)
    for f in failed:
        print(f"failed: {f}")


def paired(runs: dict, over: Cell, under: Cell, key: str) -> list[float]:
    """``over``'s ``key`` (cpu, rate) over ``under``'s, one ratio per repeat in which both ran: the
    two ran minutes apart at most, so a drift of the machine's speed between repeats cancels (and
    within one, see :func:`schedule`)."""
    return [o[key] / u[key] for o, u in zip(runs.get(over, []), runs.get(under, [])) if o and u]


def per_repeat(todo: list[Cell], runs: dict, repeats: int) -> None:
    """Every repeat's own numbers, in the order they ran: a swing shared by every cell of one
    repeat is the machine's speed drifting; one cell's alone is that cell's."""
    t0 = min((r["started"] for rs in runs.values() for r in rs if r), default=0.0)
    print("\nPer repeat, CPU ms/img/member @ images/s per member (+minutes from the first cell's start):")
    print(f"{'scheme':<18}{'N':>3}{'P':>3}{'block':>6}" + "".join(f"{'repeat ' + str(i):>24}" for i in range(repeats)))
    for cell in todo:
        scheme, n, p, block = cell
        cols = [f"{1000 * r['cpu']:.2f} @ {r['rate']:.0f} (+{(r['started'] - t0) / 60:.0f})" if r else "failed"
                for r in runs[cell]]
        print(f"{scheme:<18}{n:>3}{p or n:>3}{block or '-':>6}" + "".join(f"{c:>24}" for c in cols))


def report(todo: list[Cell], runs: dict, repeats: int) -> None:
    """The three tables (per cell, per repeat, the gap by stage) and the goals' verdicts."""
    done = {c: [r for r in rs if r] for c, rs in runs.items()}
    med = {c: {"cpu": float(np.median([r["cpu"] for r in rs])), "rate": float(np.median([r["rate"] for r in rs])),
               "stages": {k: float(np.median([r["stages"][k] for r in rs])) for k in STAGES}}
           for c, rs in done.items() if rs}
    one = {(c[0], c[3]): c for c in med if c[1] == 1}  # one member's cell, per scheme and block
    # per cell, the largest repeat's distance from the median, of its rate or its CPU
    spreads = {c: max(max(abs(v / np.median(vs) - 1) for v in vs)
                      for vs in ([r["rate"] for r in rs], [r["cpu"] for r in rs])) for c, rs in done.items() if rs}
    print(f"\n{'scheme':<18}{'N':>3}{'P':>3}{'block':>6}{'unit':>5}{'img/s/member':>22}{'vs N=1':>8}"
          f"{'CPU ms/img/member':>22}{'spread':>8}{'ideal ms':>10}{'vs baseline':>22}{'vs base N=1':>13}{'exch/prep':>11}"
          f"{'balance':>9}")
    verdicts, above = [], []
    for cell in todo:
        scheme, n, p, block = cell
        rs = done[cell]
        label = f"{scheme:<18}{n:>3}{p or n:>3}{block or '-':>6}"
        if not rs:
            print(f"{label}  (every repeat failed)")
            continue
        rates, cpus = [r["rate"] for r in rs], [r["cpu"] for r in rs]
        worst = spreads[cell]
        base = med.get(("baseline", n, None, None))
        ideal = base["cpu"] * ideal_share(scheme, n, p) if base else float("nan")
        ratios = paired(runs, ("baseline", n, None, None), cell, "cpu")  # the baseline's CPU over the cell's
        vs = float(np.median(ratios)) if ratios else float("nan")
        alone = med.get(("baseline", 1, None, None))  # one member with the machine to itself: no contention
        vs_alone = alone["cpu"] / med[cell]["cpu"] if alone else float("nan")
        of_ones = paired(runs, cell, one[scheme, block], "rate") if (scheme, block) in one else []
        of_one = float(np.median(of_ones)) if of_ones else float("nan")
        exch = float(np.median([r["exch_prep"] for r in rs]))
        balance = float(np.median([r["balance"] for r in rs]))
        unit = "/".join(sorted({str(r["unit"]) for r in rs}))
        print(f"{label}{unit:>5}{spread(rates, digits=0):>22}{of_one:>8.0%}{spread(cpus, 1000):>22}{worst:>8.0%}"
              f"{1000 * ideal:>10.2f}{spread(ratios) + 'x' if ratios else 'nan':>22}{vs_alone:>12.2f}x{exch:>11.1%}"
              f"{balance:>9.2f}")
        if vs > n:
            above.append(ceiling(cell, vs, ratios, balance, base, alone))
        if scheme == "all_shared" and n > 1:
            verdicts += [(f"{label.strip()}: CPU reduction {vs:.2f}x >= 0.9 N = {0.9 * n:.1f}x", vs >= 0.9 * n),
                         (f"{label.strip()}: exchange + copies {exch:.1%} of preprocessing <= 5%", exch <= 0.05)]
            if n == 4 and (scheme, block) in one:
                verdicts.append((f"{label.strip()}: {of_one:.0%} of one member's rate >= 90%", of_one >= 0.9))
        if repeats >= 3:
            floor = spreads.get(("baseline", 1, None, None))
            machine = f" (one member alone, nothing shared: {floor:.0%})" if floor is not None and n > 1 else ""
            verdicts.append((f"{label.strip()}: repeat spread {worst:.0%} <= 15%{machine}", worst <= 0.15))

    for a in above:
        print(f"above the ceiling: {a}")
    per_repeat(todo, runs, repeats)
    print("\nGap to the ideal by stage, us of CPU per delivered image per member (scheme's median minus the "
          "ideal share of the baseline's):")
    print(f"{'scheme':<18}{'N':>3}{'P':>3}{'block':>6}" + "".join(f"{s:>12}" for s in STAGES) + f"{'gap':>10}")
    for cell in todo:
        scheme, n, p, block = cell
        base = med.get(("baseline", n, None, None))
        if scheme == "baseline" or cell not in med or not base:
            continue
        share = ideal_share(scheme, n, p)
        gaps = [med[cell]["stages"][s] - share * base["stages"][s] for s in STAGES]
        print(f"{scheme:<18}{n:>3}{p or n:>3}{block or '-':>6}" + "".join(f"{1e6 * g:>12.0f}" for g in gaps)
              + f"{1e6 * sum(gaps):>10.0f}")
    if verdicts:
        print(f"\nGoals (issue 15): {sum(ok for _, ok in verdicts)} of {len(verdicts)} met")
        for text, ok in verdicts:
            print(f"  {'met ' if ok else 'MISS'}  {text}")


if __name__ == "__main__":
    main()
