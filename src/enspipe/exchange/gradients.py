"""How a data-parallel member's ranks exchange gradients (``--gradient-exchange``): numpy buffers
and MPI only; the training side (:mod:`enspipe.run.gradients`) hands them over and takes them back.

* :class:`WholeExchange` (``whole``): once backpropagation ends, one all-reduce of the whole
  gradient.
* :class:`BlockExchange` (``blocks`` and ``prophet``): the gradient in blocks of consecutive
  layers, each all-reduced as soon as its gradients exist while backpropagation goes on. One
  exchange thread of the rank posts the blocks' non-blocking all-reduces, in the block plan's order
  on every rank (nonblocking collectives must be posted in the same order everywhere), and drives
  MPI's progress by testing them every :data:`PROGRESS_POLL` seconds: MPICH moves a posted
  collective only inside MPI calls, so without the thread a block would sit unsent until the
  step's wait. Each step's record says when each block was posted and done, and how many of its
  bytes were done before backpropagation ended (:meth:`BlockExchange.step_record`).
* :class:`AkoExchange` (``ako``): Ako's partial exchange (Watcharapichat et al., SoCC 2016). The
  flat gradient is cut into ``p`` partitions; each rank applies its own gradient at once, keeps
  what it has not yet sent in an accumulator, and each step sends one partition of it to its
  peers, rank j partition ``(t + j p / g) mod p`` (an all-gather of partitions); what it receives,
  its peers' partitions, it applies too. Every gradient reaches every replica within p steps, but
  the replicas differ in between: not an equivalent of the all-reduce.

Byte counts are the algorithm's payload per rank per step (MPICH's ring all-reduce sends
``2 (g-1)/g`` of the gradient; an all-gather of partitions ``(g-1)/p`` of it).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from enspipe.exchange.base import wait_quietly

PROGRESS_POLL = 100e-6  # s between the exchange thread's tests of its posted blocks


def allreduce_bytes(nbytes: int, ranks: int) -> float:
    """The payload a rank sends in a ring all-reduce of ``nbytes`` among ``ranks``."""
    return 2 * (ranks - 1) / ranks * nbytes


class WholeExchange:
    """One all-reduce of the whole flat gradient, after backpropagation."""

    kind = "whole"

    def __init__(self, group):
        self.group = group
        self.bytes_per_step = 0.0

    def sum(self, flat: np.ndarray) -> np.ndarray:
        from mpi4py import MPI

        total = np.empty_like(flat)
        self.bytes_per_step = allreduce_bytes(flat.nbytes, self.group.Get_size())
        wait_quietly([self.group.Iallreduce(flat, total, op=MPI.SUM)])  # asleep while a peer still computes
        return total

    def close(self) -> None:
        pass


@dataclass(eq=False)
class _Block:
    send: np.ndarray
    recv: np.ndarray
    readied: int = 0     # the steps whose gradients were handed over
    completed: int = 0   # the steps whose sum is in ``recv``
    applied: int = 0     # the steps whose sum was taken back
    request: object = None
    ready_at: float = 0.0
    posted_at: float = 0.0
    done_at: float = 0.0


class BlockExchange:
    """Blocks of flat float32 gradients all-reduced in the order given, as each becomes ready (see
    the module). ``sizes[k]``: block k's element count, in posting order. A step's blocks are
    handed over with :meth:`ready` and taken back with :meth:`wait`, in that step or (deferred)
    at the next one's start; a block's buffers are reused only once it was taken back."""

    def __init__(self, group, sizes: list[int], kind: str = "blocks"):
        self.group, self.kind = group, kind
        self.blocks = [_Block(np.zeros(n, np.float32), np.zeros(n, np.float32)) for n in sizes]
        self._cv = threading.Condition()
        self._closing = False
        self._error: BaseException | None = None  # the exchange thread's failure, raised where the sums are awaited
        self.bytes_per_step = sum(allreduce_bytes(b.send.nbytes, group.Get_size()) for b in self.blocks)
        self._thread = threading.Thread(target=self._guarded, name="gradient-exchange", daemon=True)
        self._thread.start()

    # -- the training side -----------------------------------------------------------------------
    def ready(self, k: int, parts: list[np.ndarray]) -> None:
        """Block ``k``'s gradients of this step exist: copied into its buffer, in order; the thread
        posts it once every block before it in the plan is posted."""
        b = self.blocks[k]
        at = 0
        for p in parts:
            flat = p.reshape(-1)
            b.send[at:at + flat.size] = flat
            at += flat.size
        with self._cv:
            b.ready_at = time.perf_counter()
            b.readied += 1
            self._cv.notify_all()

    def wait(self, k: int) -> np.ndarray:
        """Block ``k``'s sum over the member's ranks for the last step that handed it over (the
        rank sleeps until it is done), or zeros where that sum was taken back already (a deferred
        apply's first step, or after a flush)."""
        b = self.blocks[k]
        with self._cv:
            if b.applied >= b.readied:
                return np.zeros_like(b.recv)
            while b.completed < b.readied and self._error is None:
                self._cv.wait()
            if self._error is not None:
                raise RuntimeError(f"the gradient exchange failed: {self._error!r}") from self._error
            b.applied = b.readied
            return b.recv.copy()

    @property
    def pending(self) -> bool:
        """Whether some step's sums have not all been taken back."""
        return any(b.applied < b.readied for b in self.blocks)

    def step_record(self) -> dict:
        """The last step's blocks: when each was posted and done (s after the first was handed
        over, at backpropagation's start), the share of their bytes done before backpropagation
        ended (MPI progressed during it) and the wait after it (the exchange it did not hide)."""
        with self._cv:
            t0 = min(b.ready_at for b in self.blocks)
            end = max(b.ready_at for b in self.blocks)
            sizes = np.array([b.send.nbytes for b in self.blocks], float)
            done = np.array([b.done_at for b in self.blocks])
            posted = [round(b.posted_at - t0, 6) for b in self.blocks]
        return {"blocks": len(self.blocks), "backward_s": round(end - t0, 6), "posted_s": posted,
                "done_s": [round(t - t0, 6) for t in done],
                "done_before_backward_end": round(float(sizes[done <= end].sum() / sizes.sum()), 4),
                "exposed_s": round(max(0.0, float(done.max()) - end), 6)}

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()

    # -- the exchange thread ---------------------------------------------------------------------
    def _guarded(self) -> None:
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - handed to the training side, which fails the rank
            with self._cv:
                self._error = e
                self._cv.notify_all()

    def _run(self) -> None:
        from mpi4py import MPI

        step, k, live = 1, 0, []  # the next block to post: block k of step ``step``
        while True:
            with self._cv:
                while not self._closing and not live and self.blocks[k].readied < step:
                    self._cv.wait()
                if self._closing and not live:
                    return
                due = []
                while self.blocks[k].readied >= step:  # in the plan's order, the same on every rank
                    due.append(self.blocks[k])
                    k += 1
                    if k == len(self.blocks):
                        step, k = step + 1, 0
                        break
            for b in due:
                b.request = self.group.Iallreduce(b.send, b.recv, op=MPI.SUM)
                b.posted_at = time.perf_counter()
                live.append(b)
            finished = [b for b in live if b.request.Test()]
            if finished:
                with self._cv:
                    for b in finished:
                        b.done_at = time.perf_counter()
                        b.completed = b.readied
                        live.remove(b)
                    self._cv.notify_all()
            if live:
                time.sleep(PROGRESS_POLL)


class AkoExchange:
    """Ako's partial gradient exchange over ``partitions`` contiguous parts of the flat gradient
    (see the module); ``partitions`` is a multiple of the member's ranks."""

    kind = "ako"

    def __init__(self, group, size: int, partitions: int):
        g = group.Get_size()
        if partitions % g:
            raise ValueError(f"{partitions} partitions do not split evenly over {g} ranks")
        self.group, self.p, self.g, self.rank = group, partitions, g, group.Get_rank()
        self.bounds = np.linspace(0, size, partitions + 1).astype(np.int64)
        self.accumulated = np.zeros(size, np.float32)
        self.step = 0
        widest = int(np.diff(self.bounds).max())
        self._send = np.zeros(widest + 1, np.float32)  # a partition, then the rank's weighted loss
        self._recv = np.zeros((widest + 1) * g, np.float32)
        self.bytes_per_step = 0.0

    def partition(self, rank: int, step: int) -> int:
        """The partition rank ``rank`` sends at ``step``: round-robin, the ranks evenly apart."""
        return (step + rank * (self.p // self.g)) % self.p

    def exchange(self, own: np.ndarray, loss: float) -> tuple[np.ndarray, float]:
        """This step's update to the rank's replica (flat, to subtract times the learning rate): its
        own gradient ``own`` and the partitions its peers sent now; and the member's loss (each
        rank's weighted ``loss`` on its part, on its own replica, summed)."""
        self.accumulated += own
        k = self.partition(self.rank, self.step)
        lo, hi = self.bounds[k], self.bounds[k + 1]
        self._send[:hi - lo] = self.accumulated[lo:hi]
        self._send[-1] = loss
        self.accumulated[lo:hi] = 0.0
        wide = self._send.size
        wait_quietly([self.group.Iallgather(self._send, self._recv)])
        update = own.copy()
        for j in range(self.g):
            if j == self.rank:
                continue
            k = self.partition(j, self.step)
            a, b = self.bounds[k], self.bounds[k + 1]
            update[a:b] += self._recv[j * wide:j * wide + (b - a)]
        self.bytes_per_step = (self.g - 1) * wide * 4  # each rank's message is the widest partition
        self.step += 1
        return update, float(self._recv[wide - 1::wide].sum())

    def close(self) -> None:
        pass
