"""The exchange engine: executes a :class:`~enspipe.schemes.Scheme`'s steps through a transport.

A batch travels as two contiguous arrays: ``images`` (b, S, S, 3) in the wire dtype and ``meta``
(b, 4) int64 rows of ``(id, epoch, position, label)``. Block sizes are exchanged first, so a
preprocessor that skipped a corrupt image simply contributes a shorter block.

Transports implement three group collectives; :class:`Mpi4pyTransport` uses mpi4py's
buffer-based (uppercase) non-blocking calls on communicators built once per run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from enspipe.schemes import BlockBroadcasts, Broadcast, Gather, Scheme

META_FIELDS = ("id", "epoch", "position", "label")


@dataclass
class Batch:
    images: np.ndarray
    meta: np.ndarray

    def __len__(self) -> int:
        return len(self.meta)

    @property
    def nbytes(self) -> int:
        return self.images.nbytes + self.meta.nbytes


@dataclass
class TransportStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    collective_seconds: float = 0.0      # wall time in collectives, waiting for peers included
    collective_cpu_seconds: float = 0.0  # CPU time of the exchange thread in collectives
    collectives: int = 0

    def as_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "collective_seconds": self.collective_seconds,
                "collective_cpu_seconds": self.collective_cpu_seconds, "collectives": self.collectives}


class Mpi4pyTransport:
    """Group collectives on mpi4py communicators (the paper's "Horovod Groups" on plain MPI).

    Byte counts are payload bytes: what a rank contributes (sent) and what it obtains from
    others (received), independent of the MPI library's algorithm.
    """

    name = "mpi4py"

    def __init__(self, comm, groups: list[tuple[int, ...]], image_shape: tuple[int, ...], dtype):
        from mpi4py import MPI

        self.MPI, self.rank = MPI, comm.Get_rank()
        self.image_shape, self.dtype = tuple(image_shape), np.dtype(dtype)
        self.stats = TransportStats()
        self.comms = {}
        for g in groups:  # every rank splits for every group, in the same order
            c = comm.Split(0 if self.rank in g else MPI.UNDEFINED, key=self.rank)
            if c != MPI.COMM_NULL:
                self.comms[g] = c

    def _wait(self, requests) -> None:
        """Wait without spinning: MPICH busy-polls inside blocking collectives, which would bill a
        member that waits for its peers a full core. Poll with a short sleep instead."""
        delay = 20e-6
        while not self.MPI.Request.Testall(requests):
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)

    def _empty(self, n: int) -> Batch:
        return Batch(np.empty((n, *self.image_shape), self.dtype), np.empty((n, 4), np.int64))

    def allgatherv(self, group: tuple[int, ...], mine: Batch) -> Batch:
        c = self.comms[group]
        counts = np.empty(c.Get_size(), np.int64)
        self._wait([c.Iallgather(np.array([len(mine)], np.int64), counts)])
        out = self._empty(int(counts.sum()))
        self._wait([c.Iallgatherv(mine.meta, [out.meta, (counts * 4).tolist()]),
                    c.Iallgatherv(mine.images, [out.images, (counts * int(np.prod(self.image_shape))).tolist()])])
        self.stats.bytes_sent += mine.nbytes
        self.stats.bytes_received += out.nbytes - mine.nbytes
        return out

    def broadcast(self, group: tuple[int, ...], root: int, batch: Batch | None) -> Batch:
        c, local_root = self.comms[group], group.index(root)
        count = np.array([len(batch) if self.rank == root else 0], np.int64)
        self._wait([c.Ibcast(count, root=local_root)])
        out = batch if self.rank == root else self._empty(int(count[0]))
        self._wait([c.Ibcast(out.meta, root=local_root), c.Ibcast(out.images, root=local_root)])
        if self.rank == root:
            self.stats.bytes_sent += out.nbytes
        else:
            self.stats.bytes_received += out.nbytes
        return out

    def block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: Batch | None) -> Batch:
        c = self.comms[group]
        counts = np.empty(c.Get_size(), np.int64)
        self._wait([c.Iallgather(np.array([len(mine) if mine is not None else 0], np.int64), counts)])
        local_roots = [group.index(r) for r in roots]
        out = self._empty(int(counts[local_roots].sum()))
        requests, offset = [], 0
        for r, lr in zip(roots, local_roots):
            block = Batch(out.images[offset:offset + counts[lr]], out.meta[offset:offset + counts[lr]])
            if r == self.rank:
                block.images[...], block.meta[...] = mine.images, mine.meta
            requests += [c.Ibcast(block.meta, root=lr), c.Ibcast(block.images, root=lr)]
            offset += int(counts[lr])
        self._wait(requests)
        own = mine.nbytes if mine is not None else 0
        self.stats.bytes_sent += own
        self.stats.bytes_received += out.nbytes - own
        return out

    def close(self) -> None:
        for c in self.comms.values():
            c.Free()
        self.comms = {}


class ExchangeEngine:
    """Runs a scheme's steps for one rank: ``run(my_block_or_None) -> the full batch``."""

    def __init__(self, scheme: Scheme, rank: int, transport):
        self.scheme, self.rank, self.transport = scheme, rank, transport

    def run(self, mine: Batch | None) -> Batch:
        batch = mine
        t0, cpu0 = time.perf_counter(), time.thread_time()
        for step in self.scheme.steps:
            if self.rank not in step.group:
                continue
            if isinstance(step, Gather):
                batch = self.transport.allgatherv(step.group, batch)
            elif isinstance(step, Broadcast):
                batch = self.transport.broadcast(step.group, step.root, batch)
            elif isinstance(step, BlockBroadcasts):
                batch = self.transport.block_broadcasts(step.group, step.roots, batch)
            else:  # pragma: no cover - schemes are built by make_scheme
                raise TypeError(f"unknown step {step!r}")
        if self.scheme.steps:
            self.transport.stats.collective_seconds += time.perf_counter() - t0
            self.transport.stats.collective_cpu_seconds += time.thread_time() - cpu0
            self.transport.stats.collectives += 1
        if batch is None:
            raise RuntimeError(f"rank {self.rank}: scheme {self.scheme.name} left this member without a batch")
        return batch
