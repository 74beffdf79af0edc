"""``enspipe calibrate-comm``: time this machine's collectives, for the cost model to fit.

Under ``mpiexec -n N`` (N >= 2) every rank times, for payloads of 64 KiB to ``max_bytes``: an
all-gather of ``m`` bytes in all (``m / N`` from each rank), a broadcast of ``m`` bytes from rank 0,
and an empty barrier; rank 0 also times one core's memory copy of ``max_bytes``. Each is the
median of ``repeats`` timed runs after one untimed one, and a collective's time is the slowest
rank's. :func:`enspipe.plan.model.fit_comm` turns the table into latency and bandwidth.
"""
from __future__ import annotations

import platform
import time

import numpy as np


def _timed(fn, repeats: int, comm) -> float:
    fn()  # untimed: first-touch pages, the library's connection set-up
    times = []
    for _ in range(repeats):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(comm.allreduce(float(np.median(times)), op=_max()))


def _max():
    from mpi4py import MPI

    return MPI.MAX


def measure_collectives(comm, max_bytes: int = 32 << 20, repeats: int = 5) -> dict:
    """The timings (rank 0's copy of the table; every rank returns it)."""
    p = comm.Get_size()
    sizes = [s for s in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20) if s <= max_bytes] or [max_bytes]
    rows = []
    for m in sizes:
        block = np.ones(max(1, m // p // 4), np.float32)
        gathered = np.empty(block.size * p, np.float32)
        whole = np.ones(max(1, m // 4), np.float32)
        ag = _timed(lambda: comm.Allgather(block, gathered), repeats, comm)
        bc = _timed(lambda: comm.Bcast(whole, root=0), repeats, comm)
        rows.append({"bytes": int(gathered.nbytes), "allgather_s": ag, "bcast_s": bc})
    barrier = _timed(comm.Barrier, repeats * 4, comm)
    src = np.ones(max_bytes // 4, np.float32)
    dst = np.empty_like(src)
    copy = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        np.copyto(dst, src)
        copy.append(time.perf_counter() - t)
    copy_s = float(np.median(copy[1:]))
    hosts = comm.allgather(platform.node())
    return {"ranks": p, "hosts": sorted(set(hosts)), "repeats": repeats, "rows": rows, "barrier_s": barrier,
            "copy_bytes": int(src.nbytes), "copy_s": copy_s, "time": time.time()}
