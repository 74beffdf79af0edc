"""Does a cell measure the same in a shared MPI job (enspipe run-cells) as alone? One cell (AlexNet's
preprocessing, one member, the peak consumer, 224 px, as make run's n = 1 cells) run alone and as
each of K identical cells of one job, interleaved, 3 repeats: process CPU per delivered image by
position in the job against alone, and the wall time a cell costs each way.

    python benchmarks/shared_jobs.py [--cells 4] [--repeats 3] [--steps 80]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from cells import cpu_per_image, dataset, spread


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=80)
    a = p.parse_args()
    args = ["--data", dataset(), "--network", "alexnet_v2", "--scheme", "baseline", "--consumer", "peak",
            "--batch-size", "48", "--image-size", "224", "--steps", str(a.steps), "--warmup", "5"]
    alone, by_position, wall = [], [[] for _ in range(a.cells)], {"alone": [], "job": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for way in (("alone", "job") if rep % 2 == 0 else ("job", "alone")):
                t = time.perf_counter()
                if way == "alone":
                    out = os.path.join(tmp, f"alone{rep}")
                    _run([sys.executable, "-m", "enspipe", "run", *args, "--out", out])
                    alone.append(_cpu(out))
                    wall["alone"].append(time.perf_counter() - t)
                    continue
                spec = os.path.join(tmp, f"spec{rep}.json")
                outs = [os.path.join(tmp, f"job{rep}", f"c{i}") for i in range(a.cells)]
                with open(spec, "w") as f:
                    json.dump({"n": 1, "cells": [{"name": f"c{i}", "args": [*args, "--out", o]}
                                                 for i, o in enumerate(outs)]}, f)
                _run([sys.executable, "-m", "enspipe", "run-cells", spec])
                for i, o in enumerate(outs):
                    by_position[i].append(_cpu(o))
                wall["job"].append((time.perf_counter() - t) / a.cells)
    print(f"| where | CPU ms per image, median (min-max) of {a.repeats} | vs alone |")
    print("|---|---|---|")
    base = sorted(alone)[len(alone) // 2]
    print(f"| alone | {spread(alone, 1e3)} | 1.00 |")
    for i, values in enumerate(by_position):
        print(f"| job, position {i} | {spread(values, 1e3)} | {sorted(values)[len(values) // 2] / base:.2f} |")
    print(f"\nwall seconds per cell: alone {spread(wall['alone'])}, in a job of {a.cells} {spread(wall['job'])}")


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def _cpu(out: str) -> float:
    with open(os.path.join(out, "summary.json")) as f:
        return cpu_per_image(json.load(f))


if __name__ == "__main__":
    main()
