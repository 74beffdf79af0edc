"""Where a short cell's wall time goes: its fixed cost per cell, phase by phase.

    python benchmarks/overhead.py [--n 2] [--steps 20] [--repeats 3] [--config config/config.yaml]

Runs ``mpiexec -n N enspipe run`` (the peak consumer, AlexNet's preprocessing at 224 px) ``--repeats``
times, timing the launch and the exit here and reading rank 0's phase stamps (``phases.json``,
:mod:`enspipe.common.phases`). Prints, per phase, the median seconds and the spread over the
repeats; the fixed cost per cell (everything but the measured window); and that cost times the cells
of ``--config``'s grid (the workflow's runs, lag cells included): the time a whole run spends
outside its windows.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from cells import MPIEXEC, dataset, run_outputs, spread

# (phase, the stamp that ends it, what it is); "launch" starts at mpiexec's start, "exit" ends at its exit
PHASES = (
    ("launch", "process", "mpiexec to rank 0's process start"),
    ("imports", "imports", "Python and enspipe's imports"),
    ("option checks", "checked", "the run config checked against files and machine; TensorFlow imported"),
    ("MPI_Init", "mpi_init", "mpi4py's import: MPI_Init"),
    ("placement", "placement", "hosts, cores and pinning agreed"),
    ("TensorFlow", "tensorflow", "TensorFlow's thread pools sized"),
    ("pipeline build", "pipeline_built", "transport, shared windows, pipeline, consumer"),
    ("pipeline start", "pipeline_started", "the producer threads started"),
    ("warm-up", "warm_up", "warm-up and draining to the steady state"),
    ("window", "window", "the measured steps"),
    ("stop", "stop", "the producers stopped together"),
    ("rank report", "reported", "this rank's report"),
    ("monitor close", "monitor_closed", "the job's window agreed, the node monitor's last sample"),
    ("summary", "summarized", "the gather and rank 0's summary"),
    ("summary write", "summary_written", "cpu.csv, power.csv, summary.json"),
    ("exit", None, "TensorFlow's and MPI's shutdown, mpiexec's exit"),
)


def one(data: str, a) -> dict[str, float]:
    args = ["--scheme", a.scheme, "--consumer", "peak", "--batch-size", a.batch, "--steps", a.steps,
            "--warmup", a.warmup]
    t0 = time.time()
    stamps = run_outputs([MPIEXEC, "-n", str(a.n)], data, args, ("phases.json",))["phases.json"]
    t1 = time.time()
    times, prev = {}, t0
    for name, stamp, _ in PHASES:
        end = stamps[stamp] if stamp else t1
        times[name], prev = end - prev, end
    return times


def grid_cells(path: str) -> int:
    import yaml

    from enspipe.run import grid

    config = yaml.safe_load(open(path))
    cells, _ = grid.expand(config)
    return len(cells) + len(grid.lag_cells(config))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2, help="members (ranks)")
    ap.add_argument("--scheme", default="all_shared")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="measured steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "config", "config.yaml"),
                    help="the workflow config whose grid the fixed cost is multiplied by")
    a = ap.parse_args()
    data = dataset(1000)
    runs = [one(data, a) for _ in range(a.repeats)]
    print(f"mpiexec -n {a.n} enspipe run --scheme {a.scheme} --consumer peak, batch {a.batch}, {a.warmup} + "
          f"{a.steps} steps: seconds per phase, median (min-max) over {a.repeats} runs")
    print("| phase | seconds | what |")
    print("|---|---|---|")
    for name, _, what in PHASES:
        print(f"| {name} | {spread([r[name] for r in runs])} | {what} |")
    total = [sum(r.values()) for r in runs]
    fixed = [t - r["window"] for t, r in zip(total, runs)]
    print(f"| **total** | {spread(total)} | |")
    print(f"| **fixed cost** (all but the window) | {spread(fixed)} | |")
    cells = grid_cells(a.config)
    print(f"\n{os.path.relpath(a.config)}: {cells} cells x {np.median(fixed):.1f} s = "
          f"{cells * np.median(fixed) / 60:.1f} minutes outside the measured windows")


if __name__ == "__main__":
    main()
