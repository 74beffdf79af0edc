"""Sharing schemes side by side: peak throughput and CPU cost per delivered image.

    python benchmarks/sharing.py [--ns 1,2,4] [--steps 20] [--warmup 5] [--batch 32] [--size 224]
    .venv-horovod/bin/python benchmarks/sharing.py --transport horovod ...   (make horovod first)

Runs every scheme (single/multi-broadcast with P = max(1, N // 2)) under ``mpiexec -n N`` with
``--consumer peak`` on the embedded dataset and prints, per scheme and N: peak images/s per
member, CPU-seconds per delivered image per member (process CPU time over the measured window),
the ratio of baseline's CPU per image to the scheme's (the paper's CPU reduction; ideal: N for
All-Shared), and communication CPU as a share of preprocessing CPU (CPU time of the exchange
thread inside collectives, plus Horovod's background thread with ``--transport horovod``, over
the CPU time of the read and preprocess threads and their TensorFlow pools). Each cell runs
``--repeats`` times; the table shows medians.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from cells import dataset, run_cell

PREPROCESSING_THREADS = ("enspipe-read", "enspipe-preproc")  # thread groups named by the pipeline
COMM_THREADS = ("enspipe-horovod",)  # Horovod's background thread does its collectives' work


def cell_args(scheme, p, a) -> list:
    args = ["--scheme", scheme, "--network", a.network, "--consumer", "peak", "--batch-size", a.batch,
            "--steps", a.steps, "--warmup", a.warmup, "--image-size", a.size, "--transport", a.transport]
    if p:
        args += ["--preprocessors", p]
    if a.exchange == "mpi":
        args += ["--no-node-shm"]
    if a.cores:
        args += ["--cores", a.cores]
    return args


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,2,4")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--network", default="alexnet_v2")
    ap.add_argument("--transport", default="mpi4py", choices=("mpi4py", "horovod"),
                    help="horovod: run this script with .venv-horovod/bin/python (make horovod)")
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--exchange", choices=("shm", "mpi"), default="shm",
                    help="node-shared-memory batches (default) or MPI collectives only (--no-node-shm)")
    ap.add_argument("--cores", type=int, default=None, help="--cores per member (default: all)")
    ap.add_argument("--schemes", default="baseline,all_shared,single_broadcast,multi_broadcast")
    a = ap.parse_args()
    data = dataset(a.images)
    print(f"{a.network}, batch {a.batch}, {a.size} px, {a.warmup}+{a.steps} steps, transport {a.transport}, exchange {a.exchange}, cores {a.cores or 'all'}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'scheme':<18}{'N':>3}{'P':>3}{'img/s/member':>14}{'CPU ms/img/member':>19}{'vs baseline':>13}"
          f"{'comm/preproc CPU':>18}")
    base: dict[int, float] = {}
    for n in map(int, a.ns.split(",")):
        for scheme in a.schemes.split(","):
            p = max(1, n // 2) if scheme in ("single_broadcast", "multi_broadcast") else None
            if scheme == "single_broadcast" and (p is None or p >= n):
                continue
            rates, cpus, comms = [], [], []
            for _ in range(a.repeats):
                s = run_cell(data, n, cell_args(scheme, p, a))
                ranks = s["ranks"]
                rates.append(s["images_per_second_per_member"])
                cpus.append(float(np.mean([r["cpu_seconds"] / r["images"] for r in ranks])))
                prep = sum(r["thread_cpu_seconds"].get(t, 0.0) for r in ranks for t in PREPROCESSING_THREADS)
                comm = sum(r["collective_cpu_seconds"] + sum(r["thread_cpu_seconds"].get(t, 0.0) for t in COMM_THREADS)
                           for r in ranks)
                comms.append(comm / prep if prep else float("nan"))
            cpu_per_img = float(np.median(cpus))
            if scheme == "baseline":
                base[n] = cpu_per_img
            print(f"{scheme:<18}{n:>3}{s['p']:>3}{np.median(rates):>14.1f}"
                  f"{1000 * cpu_per_img:>19.2f}{base[n] / cpu_per_img:>12.2f}x{np.median(comms):>17.1%}", flush=True)


if __name__ == "__main__":
    main()
