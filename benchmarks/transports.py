"""The transports side by side on All-Shared: mpi4py through node-shared memory (the default),
mpi4py's MPI collectives alone (--no-node-shm), torch.distributed's members through their shared
ring of slots (--transport torch) and over gloo alone (--transport torch --no-node-shm).

    .venv-notf/bin/python benchmarks/transports.py [--ns 2,4] [--repeats 3] [--steps 30] [--warmup 5] \
        [--wire-dtype uint8]

Runs in an environment with torch (make test-notf's .venv-notf; the pillow backend, no TensorFlow).
Every cell is ``mpiexec -n N enspipe run --scheme all_shared --consumer peak`` on the embedded
dataset, ``--repeats`` times, interleaved (every cell once per repeat, the order reversed in every
other repeat). Per N and transport: images/s per member and the members' process CPU per
delivered image (every thread's: gloo's own threads count as the member's), each ``median
(min-max)`` over the repeats; ``exchange``, the exchange thread's CPU per image (its copies and the
collectives it waits in); ``vs mpi4py``, the transport's CPU per image over mpi4py's (node-shm)
in the same repeat, ``median (min-max)``. The script ends with the torch transport's goal: no more
CPU per image than mpi4py's All-Shared at every N.
"""
from __future__ import annotations

import argparse

import numpy as np

from cells import dataset, run_cell, schedule, spread

TRANSPORTS = {"mpi4py": ["--transport", "mpi4py"], "mpi4py-mpi": ["--transport", "mpi4py", "--no-node-shm"],
              "torch": ["--transport", "torch"], "torch-gloo": ["--transport", "torch", "--no-node-shm"]}


def measure(s: dict) -> dict:
    ranks = s["ranks"]
    stages = s.get("stages_per_image", {})
    return {"rate": s["images_per_second_per_member"],
            "cpu": float(np.mean([r["cpu_seconds"] / r["images"] for r in ranks])),
            "exchange": sum(stages.get(k, {}).get("cpu", 0.0) for k in ("copy_in", "collective")),
            "paths": sorted({p for r in ranks for p in r["exchange_paths"].values()})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="2,4")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--wire-dtype", default="float32", choices=("float32", "uint8"))
    a = ap.parse_args()
    data = dataset(a.images)
    todo = [(n, t) for n in map(int, a.ns.split(",")) for t in TRANSPORTS]
    runs: dict = {}
    for rep, (n, t) in schedule(todo, a.repeats):
        args = ["--scheme", "all_shared", "--consumer", "peak", "--backend", "pillow", "--batch-size", a.batch,
                "--image-size", a.size, "--steps", a.steps, "--warmup", a.warmup, "--wire-dtype", a.wire_dtype,
                "--cpu-monitor", "none", *TRANSPORTS[t]]
        try:
            s = run_cell(data, n, args)
        except RuntimeError as e:  # said, and run once more: a table with a hole would not compare
            print(f"repeat {rep} n={n} {t} FAILED, run again: {str(e)[:300]}", flush=True)
            s = run_cell(data, n, args)
        runs.setdefault((n, t), {})[rep] = measure(s)
        print(f"repeat {rep} n={n} {t}: {runs[(n, t)][rep]['rate']:.1f} images/s per member, "
              f"{runs[(n, t)][rep]['cpu'] * 1e3:.2f} ms CPU per image", flush=True)
    print(f"\nAll-Shared, {a.size} px {a.wire_dtype}, batch {a.batch}, {a.steps} steps, {a.repeats} repeats: "
          "median (min-max)\n")
    print("| N | transport | path | images/s per member | CPU ms per image | exchange us per image | vs mpi4py |")
    print("|---|---|---|---|---|---|---|")
    verdicts = []
    for n, t in todo:
        r = runs[(n, t)]
        reps = sorted(r)
        ratio = [r[k]["cpu"] / runs[(n, "mpi4py")][k]["cpu"] for k in reps]
        print(f"| {n} | {t} | {'+'.join(r[reps[0]]['paths'])} | {spread([r[k]['rate'] for k in reps], digits=1)} | "
              f"{spread([r[k]['cpu'] for k in reps], 1e3)} | {spread([r[k]['exchange'] for k in reps], 1e6, 0)} | "
              f"{spread(ratio)} |")
        if t == "torch":  # (the default path within a node)
            verdicts.append((n, float(np.median(ratio)), max(ratio)))
    print()
    for n, med, top in verdicts:
        met = "met" if med <= 1.0 else "not met"
        print(f"goal: the torch transport's CPU per image <= mpi4py's All-Shared at N={n}: {met} "
              f"(median ratio {med:.3f}, worst repeat {top:.3f})")


if __name__ == "__main__":
    main()
