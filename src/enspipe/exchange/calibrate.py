"""``enspipe calibrate-comm``: time this machine's collectives, for the cost model to fit.

Under ``mpiexec -n N`` (N >= 2) every rank times, for payloads of 64 KiB to ``max_bytes``: an
all-gather of ``m`` bytes in all (``m / N`` from each rank), a broadcast of ``m`` bytes from rank 0,
and an empty barrier; rank 0 also times one core's memory copy of ``max_bytes``. Each is the
median of ``repeats`` timed runs after one untimed one, and a collective's time is the slowest
rank's. :func:`enspipe.plan.model.fit_comm` turns the table into latency and bandwidth.

Where the ranks span several nodes (say ``srun -N 2 --ntasks-per-node=2``), the table is timed
within each node (its ranks together, every node at once) and, as ``inter_node``, between the
nodes' first ranks: the inter-node latency and bandwidth, measured instead of assumed.
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
    from mpi4py import MPI

    hosts = comm.allgather(platform.node())
    if len(set(hosts)) == 1:
        return _table(comm, max_bytes, repeats) | {"hosts": sorted(set(hosts))}
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    sizes = comm.allgather(node.Get_size())
    if min(sizes) < 2:
        raise ValueError(f"several nodes, but some with one rank ({sizes}): launch at least 2 ranks per node "
                         "(e.g. srun -N 2 --ntasks-per-node=2) so that both the node and the network are timed")
    within = _table(node, max_bytes, repeats)
    leaders = comm.Split(0 if node.Get_rank() == 0 else MPI.UNDEFINED, key=comm.Get_rank())
    between = None
    if leaders != MPI.COMM_NULL:
        between = _table(leaders, max_bytes, repeats)
        leaders.Free()
    node.Free()
    between = comm.bcast(between, root=0)  # world rank 0 leads its node
    within_all = comm.gather(within["rows"], root=0)
    if comm.Get_rank() == 0:  # a collective's time within a node: the slowest node's
        within["rows"] = [max(rs, key=lambda r: r["allgather_s"]) | {"bcast_s": max(r["bcast_s"] for r in rs)}
                          for rs in zip(*within_all)]
    within = comm.bcast(within, root=0)
    return within | {"hosts": sorted(set(hosts)), "inter_node": {"ranks": between["ranks"], "rows": between["rows"]}}


def _table(comm, max_bytes: int, repeats: int) -> dict:
    """All-gathers and broadcasts by payload, the barrier and one core's copy, on ``comm``."""
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
    return {"ranks": p, "repeats": repeats, "rows": rows, "barrier_s": barrier,
            "copy_bytes": int(src.nbytes), "copy_s": copy_s, "time": time.time()}
