"""What every transport shares: the interface the engine drives (:class:`Transport`), a batch as two
contiguous arrays, the exchange's byte and time accounting, and waiting for MPI requests without
spinning."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np


META_FIELDS = ("id", "epoch", "position", "label")


PAGE = 4096  # bytes: the kernel maps memory into a process a page at a time, on first touch


def touch_pages(buf: np.ndarray) -> None:
    """Write a zero into every page of ``buf`` (a contiguous array): the kernel maps each page into
    the process now, once, instead of in the exchange's first pass over its ring. Those faults
    cost more than the copies themselves (on a 2-vCPU VM, 50 us of a 4-member All-Shared's 62 us per
    delivered image of copying into a node-shared ring of 224 px float32 batches)."""
    buf.reshape(-1).view(np.uint8)[::PAGE] = 0


def allreduce_quietly(comm, value: int, op) -> int:
    """``value`` reduced over ``comm``'s ranks with ``op`` (MPI.MIN, MAX, SUM), waited for with
    :func:`wait_quietly`: a rank that waits for its peers sleeps instead of spinning a core."""
    out = np.zeros(1, np.int64)
    wait_quietly([comm.Iallreduce(np.array([value], np.int64), out, op=op)])
    return int(out[0])


def wait_quietly(requests, arrival=None) -> None:
    """Wait for MPI requests without spinning: MPICH busy-polls inside blocking collectives, which
    would bill a member that waits for its peers a full core. Poll with sleeps that grow with the
    wait (to 5% of the time waited so far, at most 10 ms): a long wait for a slow peer costs a few
    dozen polls, not thousands, and wakes at most 5% late.

    ``arrival``: the communicator of the requests' collectives, for large ones between nodes. A
    message over TCP moves about a socket buffer per poll of each side, so a receiver that has
    slept its way to 10 ms polls would take 10 ms per buffer. With it, the sleeping is done on a
    barrier posted after the collectives (every rank has posted its part once it completes); the
    transfer itself is then polled at short intervals, for as long as it moves data."""
    if arrival is None or arrival.Get_size() == 1:
        _poll(requests, 10e-3)
        return
    _poll([arrival.Ibarrier()], 10e-3)
    _poll(requests, 50e-6)


def _poll(requests, longest: float) -> None:
    testall = type(requests[0]).Testall  # mpi4py's Request, or a TorchComm's (enspipe.exchange.torchcomm)
    delay, start = 20e-6, time.perf_counter()
    while not testall(requests):
        time.sleep(delay)
        delay = min(delay * 2, max(min(1e-3, longest), min(longest, 0.05 * (time.perf_counter() - start))))


@dataclass
class Batch:
    images: np.ndarray
    meta: np.ndarray
    stream: int = 0  # which producer's stream it came from (the tf.data service's workers; 0 otherwise)
    # its arrays are a node-shared slot that the node's members refill: valid until the consumer has
    # taken as many batches again as the window has slots (copy what must outlive that)
    volatile: bool = False

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
    copy_seconds: float = 0.0            # of which copying this rank's own block in (wall)
    copy_cpu_seconds: float = 0.0        # and its CPU time

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``dst[...] = src``, timed as this rank's copy into the exchange."""
        t, c = time.perf_counter(), time.thread_time()
        dst[...] = src
        self.copy_seconds += time.perf_counter() - t
        self.copy_cpu_seconds += time.thread_time() - c

    def add(self, own: "Batch | None", out: "Batch") -> None:
        """Count a collective's payload: what this rank contributed (``own``) and what it obtained
        from the others (the rest of ``out``)."""
        sent = own.nbytes if own is not None else 0
        self.bytes_sent += sent
        self.bytes_received += out.nbytes - sent

    def as_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "collective_seconds": self.collective_seconds,
                "collective_cpu_seconds": self.collective_cpu_seconds, "collectives": self.collectives,
                "copy_seconds": self.copy_seconds, "copy_cpu_seconds": self.copy_cpu_seconds}


class Transport(Protocol):
    """What :class:`~enspipe.exchange.engine.ExchangeEngine` needs of a transport (mpi4py with or
    without node-shared memory, Horovod): three group collectives over the groups it was built
    with, each on a unit of consecutive batches (this member's block of each, or None) and leaving
    the member with the unit's assembled batches; ``counts`` (block sizes in the group's order, the
    same for every batch of the unit) are exchanged first where the caller does not know them.
    ``stats`` accounts the payload and time; ``paths`` says how each of this member's groups
    exchanges."""

    name: str
    stats: TransportStats
    paths: dict[tuple[int, ...], str]

    def allgatherv(self, group: tuple[int, ...], mine: list[Batch], counts: list[int] | None = None
                   ) -> list[Batch]: ...

    def broadcast(self, group: tuple[int, ...], root: int, batches: list[Batch | None], count: int | None = None
                  ) -> list[Batch]: ...

    def block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: list[Batch | None],
                         counts: list[int] | None = None) -> list[Batch]: ...

    def close(self) -> None: ...
