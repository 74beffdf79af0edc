"""K ensemble members in one process against K processes (Crossbow's several models per accelerator).

    python benchmarks/members_per_rank.py [--networks tiny,mobilenet_v2] [--ks 2,4] [--repeats 3]

Every cell trains K members of one network for real on the CPU (``--consumer train``), each on
every delivered batch:

* ``one process``: ``mpiexec -n 1 enspipe run --members-per-rank K``: one pipeline, the K models
  trained one after another on each batch, nothing exchanged;
* ``K processes``: ``mpiexec -n K enspipe run --scheme all_shared``: one member per process, the
  preprocessing of each batch split among them and all-gathered.

Both preprocess each batch once. Per member it prints the process CPU per delivered image (the
cell's CPU over the images each member got, over the members), the images/s each member trained
on, and the peak resident memory (the ranks' together, over the members), as the median (min-max)
of the repeats; the arms alternate within each repeat, and ``one/K`` is their ratio paired within
each repeat. K processes on this machine's cores oversubscribe them where K exceeds them: the
table says so.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from cells import dataset, run_cell, schedule, spread


def measure(data: str, network: str, k: int, together: bool, a: argparse.Namespace) -> dict:
    common = ["--network", network, "--consumer", "train", "--image-size", a.image_size, "--batch-size", a.batch_size,
              "--steps", a.steps, "--warmup", a.warmup, "--cpu-monitor", "none"]
    if together:
        s = run_cell(data, 1, [*common, "--scheme", "baseline", "--members-per-rank", k])
    else:
        s = run_cell(data, k, [*common, "--scheme", "all_shared"])
    images = float(np.mean([r["images"] for r in s["ranks"]]))
    return {"cpu_ms": 1e3 * s["cpu_seconds_total"] / images / k, "rate": s["images_per_second_per_member"],
            "rss_mb": sum(r["max_rss_bytes"] for r in s["ranks"]) / k / 2**20,
            "oversubscribed": s["placement"]["oversubscribed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", default="tiny,mobilenet_v2")
    ap.add_argument("--ks", default="2,4", help="members K (default 2,4)")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    data = dataset(1000)
    cells = [(net, int(k), together) for net in a.networks.split(",") for k in a.ks.split(",")
             for together in (True, False)]
    got: dict[tuple, list] = {c: [None] * a.repeats for c in cells}
    for rep, cell in schedule(cells, a.repeats):
        got[cell][rep] = measure(data, *cell, a)
        m = got[cell][rep]
        print(f"repeat {rep} {cell[0]} K={cell[1]} {'one process' if cell[2] else 'K processes'}: "
              f"{m['cpu_ms']:.2f} CPU ms/img, {m['rate']:.1f} img/s, {m['rss_mb']:.0f} MB per member", flush=True)
    print(f"\n{a.image_size} px, batch {a.batch_size}, {a.steps} measured steps, {a.repeats} repeats, per member, "
          f"median (min-max); {os.cpu_count()} cores\n")
    print("| network | K | arm | CPU ms/img | img/s | peak RSS MB | one/K: CPU | one/K: img/s | one/K: RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for net in a.networks.split(","):
        for k in map(int, a.ks.split(",")):
            one, many = got[(net, k, True)], got[(net, k, False)]
            ratio = {key: [x[key] / y[key] for x, y in zip(one, many)] for key in ("cpu_ms", "rate", "rss_mb")}
            for label, rows in (("one process", one), (f"{k} processes", many)):
                over = " (oversubscribed)" if rows[0]["oversubscribed"] else ""
                cols = " | ".join(spread([r[key] for r in rows], 1, d) for key, d in
                                  (("cpu_ms", 2), ("rate", 1), ("rss_mb", 0)))
                paired = " | ".join(spread(ratio[key]) for key in ratio) if label == "one process" else " | | "
                print(f"| {net} | {k} | {label}{over} | {cols} | {paired} |")


if __name__ == "__main__":
    main()
