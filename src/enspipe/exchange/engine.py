"""The exchange engine: executes a :class:`~enspipe.plan.schemes.Scheme`'s steps through a transport.

A batch travels as two contiguous arrays: ``images`` (b, S, S, 3) in the wire dtype and ``meta``
(b, 4) int64 rows of ``(id, epoch, position, label)``. Block sizes follow from the scheme; when
corrupt records may be skipped they are exchanged first, so a preprocessor that skipped one
simply contributes a shorter block.

Transports implement three group collectives, each on a unit of consecutive batches at once
(their requests in flight together, one barrier or wait for all); :class:`Mpi4pyTransport` uses
mpi4py's buffer-based (uppercase) non-blocking calls on communicators built once per run.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from enspipe.common import keys
from enspipe.exchange import shm
from enspipe.exchange.base import Batch, Transport, TransportStats, touch_pages, wait_quietly
from enspipe.plan.schemes import BlockBroadcasts, Broadcast, Gather, Scheme


def givers_only(counts_each: list[np.ndarray], givers: list[int]) -> list[np.ndarray]:
    """Each batch's block sizes with every group member but the ``givers`` (group-local ranks,
    a broadcast's root or the block broadcasts' roots) at 0: what a shared ring assembles."""
    out = []
    for n in counts_each:
        z = np.zeros_like(n)
        z[givers] = n[givers]
        out.append(z)
    return out


def assembled(window, mine: list[Batch | None], counts: list[np.ndarray], me: int, stats: TransportStats
              ) -> list[Batch]:
    """The unit's batches assembled in a shared ``window`` (node-shm's, or the torch transport's
    ring), its payload counted: what member ``me`` (group-local) gave, what it obtained."""
    outs = window.assemble(mine, counts)
    for b, n, out in zip(mine, counts, outs):
        stats.add(b if n[me] else None, out)
    return outs


class BufferRing:
    """Receive buffers allocated once and reused in turn, pinned while anyone still holds them.

    Allocating a fresh batch per step costs as much CPU as the copy itself (page faults on first
    touch), so the ring's pages are touched once when it is made. A slot is reused ``slots`` takes
    later, so ``slots`` must exceed the number of batches the pipeline keeps alive at once: the
    compute queue's capacity, the one being consumed and the unit being received
    (``queue_depth + 1 + unit``; the previous unit's batches are all queued by then).

    A consumer may keep a batch longer (a list of batches, a replay buffer): every view of a slot
    refers to the slot's array, so its reference count says whether anything outside the ring
    still holds it. Such a slot is never written again: :meth:`take` leaves it to its holders and
    puts a new buffer in its place (``replaced`` counts them), so a batch never changes under
    whoever holds it.
    """

    def __init__(self, slots: int, max_batch: int, image_shape: tuple[int, ...], dtype):
        self.images = [np.empty((max_batch, *image_shape), dtype) for _ in range(slots)]
        self.meta = [np.empty((max_batch, 4), np.int64) for _ in range(slots)]
        for a in (*self.images, *self.meta):
            touch_pages(a)
        self.next = 0
        self.replaced = 0

    def held(self, i: int) -> bool:
        """Whether slot ``i`` is referenced outside the ring (the list's reference and the call's
        argument are the ring's own)."""
        return sys.getrefcount(self.images[i]) > 2 or sys.getrefcount(self.meta[i]) > 2

    def take(self, n: int) -> Batch:
        i, self.next = self.next, (self.next + 1) % len(self.images)
        if n > len(self.meta[i]):
            raise ValueError(f"a batch of {n} exceeds the receive buffers' {len(self.meta[i])}")
        if self.held(i):  # its last batch is still held: leave it to its holders
            self.images[i], self.meta[i] = np.empty_like(self.images[i]), np.empty_like(self.meta[i])
            self.replaced += 1
        return Batch(self.images[i][:n], self.meta[i][:n])


class Mpi4pyTransport:
    """Group collectives on mpi4py communicators (the paper's "Horovod Groups" on plain MPI).

    Each collective takes the block sizes when the caller knows them (every preprocessor
    contributes its full share) and exchanges them first when it does not (a preprocessor that
    skipped corrupt images sends a shorter block).

    With ``node_shm`` (the default) a group assembles its batches in node-shared memory
    (:mod:`enspipe.exchange.shm`): within a node nothing is copied but each contributed block, once;
    across nodes one leader per node all-gathers the node's part. Without it (or where the
    shared window does not fit in /dev/shm, or a group's nodes interleave) the group uses the
    MPI collectives themselves (all-gather-v, broadcast, concurrent broadcasts) into a
    :class:`BufferRing`. ``paths`` records which each group used.

    Byte counts are payload bytes: what a rank contributes (sent) and what it obtains from
    others (received), independent of the MPI library's algorithm.
    """

    name = "mpi4py"

    def __init__(self, comm, groups: list[tuple[int, ...]], image_shape: tuple[int, ...], dtype,
                 max_batch: int, queue_depth: int, node_shm: bool = True, events=None,
                 uses: dict[tuple[int, ...], int] | None = None, unit: int = 1):
        from mpi4py import MPI

        self.MPI, self.rank = MPI, comm.Get_rank()
        self.image_shape, self.dtype = tuple(image_shape), np.dtype(dtype)
        self.image_size = int(np.prod(self.image_shape))
        self.stats = TransportStats()
        self.comms, self.windows, self.paths = {}, {}, {}
        # A group that several steps use assembles several batches per global batch: its window (and
        # the receive ring of a rank in several steps) holds that many more slots; ``unit`` batches
        # are exchanged at a time.
        uses = uses or {}
        for g in groups:  # every rank splits for every group, in the same order
            slots = shm.slots_for(queue_depth, unit) * uses.get(g, 1)
            need = shm.window_bytes(slots, max_batch, self.image_shape, self.dtype)
            c = comm.Split(0 if self.rank in g else MPI.UNDEFINED, key=self.rank)
            if c == MPI.COMM_NULL:
                continue
            self.comms[g] = c
            path, why = "mpi", "--no-node-shm"
            if node_shm:
                layout = shm.NodeLayout(MPI, c)
                free = shm.shm_free_bytes()
                fits = free is None or free >= need * 1.1
                ok = c.allreduce(bool(layout.contiguous and fits), op=MPI.LAND)
                if ok:
                    self.windows[g] = shm.NodeBatchWindow(MPI, c, layout, slots, max_batch,
                                                          self.image_shape, self.dtype, self._wait, self.stats)
                    path = "node-shm" if len(set(layout.node_of)) == 1 else "node-shm+mpi"
                else:
                    layout.free()
                    why = ("a node's /dev/shm is too small for the shared batches" if not fits or layout.contiguous
                           else "the group's ranks interleave across nodes")
            self.paths[g] = path
            if events is not None:
                events.log(keys.EXCHANGE_PATH, group=list(g), path=path,
                           **({"reason": why} if path == "mpi" else {"window_bytes": need}))
        takes = sum(uses.get(g, 1) for g in self.comms if g not in self.windows)
        self.ring = (BufferRing((queue_depth + 1 + unit) * takes, max_batch, self.image_shape, self.dtype)
                     if takes else None)

    def _wait(self, requests, arrival=None) -> None:
        wait_quietly(requests, arrival)

    def _counts(self, c, mine: list[int], known: list[int] | None) -> list[np.ndarray]:
        """Per batch of the unit, each group member's block size: ``known`` for every batch, or
        exchanged (one all-gather for the whole unit)."""
        if known is not None:
            return [np.asarray(known, np.int64)] * len(mine)
        counts = np.empty((c.Get_size(), len(mine)), np.int64)
        self._wait([c.Iallgather(np.asarray(mine, np.int64), counts)])
        return [np.ascontiguousarray(col) for col in counts.T]

    def _assemble(self, group, mine: list[Batch | None], counts: list[np.ndarray]) -> list[Batch]:
        return assembled(self.windows[group], mine, counts, self.comms[group].Get_rank(), self.stats)

    def allgatherv(self, group: tuple[int, ...], mine: list[Batch], counts: list[int] | None = None) -> list[Batch]:
        c = self.comms[group]
        counts_each = self._counts(c, [len(b) for b in mine], counts)
        if group in self.windows:
            return self._assemble(group, mine, counts_each)
        outs = [self.ring.take(int(n.sum())) for n in counts_each]
        requests = []
        for b, out, n in zip(mine, outs, counts_each):  # the unit's collectives in flight together
            requests += [c.Iallgatherv(b.meta, [out.meta, (n * 4).tolist()]),
                         c.Iallgatherv(b.images, [out.images, (n * self.image_size).tolist()])]
        self._wait(requests, c)
        for b, out in zip(mine, outs):
            self.stats.add(b, out)
        return outs

    def broadcast(self, group: tuple[int, ...], root: int, batches: list[Batch | None],
                  count: int | None = None) -> list[Batch]:
        c, local_root, is_root = self.comms[group], group.index(root), self.rank == root
        if count is None:
            n = np.array([len(b) if is_root else 0 for b in batches], np.int64)
            self._wait([c.Ibcast(n, root=local_root)])
            count_each = [int(x) for x in n]
        else:
            count_each = [count] * len(batches)
        if group in self.windows:
            counts = givers_only([np.full(c.Get_size(), k, np.int64) for k in count_each], [local_root])
            return self._assemble(group, batches if is_root else [None] * len(batches), counts)
        outs = batches if is_root else [self.ring.take(k) for k in count_each]
        self._wait([r for out in outs for r in (c.Ibcast(out.meta, root=local_root),
                                                 c.Ibcast(out.images, root=local_root))], c)
        for out in outs:
            self.stats.add(out if is_root else None, out)
        return outs

    def block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: list[Batch | None],
                         counts: list[int] | None = None) -> list[Batch]:
        c = self.comms[group]
        counts_each = self._counts(c, [len(b) if b is not None else 0 for b in mine], counts)
        local_roots = [group.index(r) for r in roots]
        if group in self.windows:
            return self._assemble(group, mine, givers_only(counts_each, local_roots))
        outs, requests = [], []
        for b, n in zip(mine, counts_each):
            out = self.ring.take(int(n[local_roots].sum()))
            offset = 0
            for r, lr in zip(roots, local_roots):
                block = Batch(out.images[offset:offset + n[lr]], out.meta[offset:offset + n[lr]])
                if r == self.rank:
                    self.stats.copy(block.images, b.images)
                    self.stats.copy(block.meta, b.meta)
                requests += [c.Ibcast(block.meta, root=lr), c.Ibcast(block.images, root=lr)]
                offset += int(n[lr])
            outs.append(out)
        self._wait(requests, c)
        for b, out in zip(mine, outs):
            self.stats.add(b, out)
        return outs

    def close(self) -> None:
        for w in self.windows.values():
            w.free()
        for c in self.comms.values():
            c.Free()
        self.comms, self.windows = {}, {}


class ExchangeEngine:
    """Runs a scheme's steps for one rank: ``run(my blocks) -> the full batches``, a unit of
    ``unit`` consecutive global batches at a time (:meth:`enspipe.plan.schemes.Scheme.unit_batches`):
    each step exchanges the whole unit in one call, so its fixed costs (a barrier, a wait) are paid
    once per unit.

    With ``fixed_blocks`` every preprocessor contributes exactly its share of each global batch of
    ``batch`` samples, so block sizes follow from the scheme and are not exchanged; without it
    (corrupt records may be skipped) each collective first exchanges them.
    """

    def __init__(self, scheme: Scheme, rank: int, transport: Transport, batch: int, fixed_blocks: bool,
                 unit: int = 1):
        self.scheme, self.rank, self.transport = scheme, rank, transport
        self.batch, self.fixed_blocks, self.unit = batch, fixed_blocks, unit
        self.counts = scheme.block_counts(batch) if fixed_blocks else [None] * len(scheme.steps)

    def run(self, mine: list[Batch | None]) -> list[Batch]:
        """``mine``: this rank's block of each of the unit's batches (None where it preprocesses
        nothing); returns the unit's assembled batches, in order."""
        if len(mine) != self.unit:
            raise ValueError(f"rank {self.rank}: a unit of {len(mine)} batches, not {self.unit}")
        batches = list(mine)
        t0, cpu0 = time.perf_counter(), time.thread_time()
        for step, counts in zip(self.scheme.steps, self.counts):
            if self.rank not in step.group:
                continue
            if isinstance(step, Gather):
                batches = self.transport.allgatherv(step.group, batches, counts)
            elif isinstance(step, Broadcast):
                batches = self.transport.broadcast(step.group, step.root, batches, counts)
            elif isinstance(step, BlockBroadcasts):
                batches = self.transport.block_broadcasts(step.group, step.roots, batches, counts)
            else:  # pragma: no cover - schemes are built by make_scheme
                raise TypeError(f"unknown step {step!r}")
        if self.scheme.steps:
            self.transport.stats.collective_seconds += time.perf_counter() - t0
            self.transport.stats.collective_cpu_seconds += time.thread_time() - cpu0
            self.transport.stats.collectives += len(batches)
        if any(b is None for b in batches):
            raise RuntimeError(f"rank {self.rank}: scheme {self.scheme.name} left this member without a batch")
        return batches
