"""The exchange's group collectives on torch.distributed process groups (``--transport torch``).

The same three collectives as :class:`enspipe.exchange.engine.Mpi4pyTransport`, for the same scheme
descriptions, as the paper's Horovod process sets did them: one process group per distinct group
of the scheme (``new_group``, made by every rank in the same order); All-Shared's gather is one
``all_gather_into_tensor`` per array straight into a receive buffer, Single-Broadcast a
``broadcast`` from the group's root, Multi-Broadcast the P roots' broadcasts in flight at once.

A batch's arrays travel as their bytes (any wire dtype, bfloat16 included), images and meta as two
collectives in flight together; every rank of a group waits on both (``Work.wait`` sleeps in
gloo's C++ without the GIL). Blocks of unequal size (a batch that does not divide among the
members, or a preprocessor that skipped a corrupt image) are padded to the largest for the
gather and packed again, and exchanged first where not known.

Backends: gloo between CPU batches, the members' batches in host memory as with MPI. NCCL is
named by ``backend="nccl"`` (members on different GPUs); it is refused on a machine without CUDA
and for members that share a GPU.

Started by :func:`enspipe.exchange.torchcomm.init_torch`: from ``torchrun``'s (or any launcher's)
env:// variables, or, under ``mpiexec``/``srun``, at a port its rank 0 names over MPI.
"""
from __future__ import annotations

import numpy as np

from enspipe.common import keys
from enspipe.exchange.base import Batch, TransportStats

BACKENDS = ("gloo",)  # the process groups' backend for the batches


class TorchTransport:
    """Group collectives on torch.distributed process groups; byte counts as in the mpi4py transport."""

    name = "torch"

    def __init__(self, comm, groups: list[tuple[int, ...]], image_shape: tuple[int, ...], dtype, max_batch: int,
                 queue_depth: int, events=None, uses: dict[tuple[int, ...], int] | None = None, unit: int = 1):
        """``comm``: the members' communicator (mpi4py's, or a :class:`~enspipe.exchange.torchcomm.TorchComm`),
        whose ranks are torch's; the groups are made on it, collectively."""
        import torch
        import torch.distributed as dist

        from enspipe.exchange.engine import BufferRing
        from enspipe.exchange.torchcomm import TIMEOUT, init_torch

        init_torch(comm)
        self.torch, self.dist, self.rank = torch, dist, comm.Get_rank()
        # torch 2.13 renamed all_gather_into_tensor (the GPU nodes' 2.11 has the old name only)
        self._gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.image_shape, self.dtype = tuple(image_shape), np.dtype(dtype)
        self.row = int(np.prod(self.image_shape)) * self.dtype.itemsize  # an image's bytes
        self.stats = TransportStats()
        self.groups, self.paths = {}, {}
        for g in dict.fromkeys(groups):  # every rank makes every group, in the scheme's order
            pg = dist.new_group(list(g), backend="gloo", timeout=TIMEOUT)
            if self.rank in g:
                self.groups[g] = pg
                self.paths[g] = "torch-gloo"
                if events is not None:
                    events.log(keys.EXCHANGE_PATH, group=list(g), path="torch-gloo")
        uses = uses or {}
        takes = sum(uses.get(g, 1) for g in self.groups)
        self.ring = BufferRing((queue_depth + 1 + unit) * max(takes, 1), max_batch, self.image_shape, self.dtype)

    # -- arrays as torch tensors of their bytes -----------------------------------------------
    def _bytes(self, a: np.ndarray):
        """A uint8 tensor sharing ``a``'s memory, one row per sample."""
        width = a.dtype.itemsize * int(np.prod(a.shape[1:]))
        return self.torch.from_numpy(a.reshape(-1).view(np.uint8).reshape(len(a), width))

    def _tensors(self, b: Batch) -> tuple:
        return self._bytes(b.images), self._bytes(b.meta)

    def _wait(self, works) -> None:
        for w in works:
            w.wait()

    def _counts(self, group, mine: list[int], known) -> list[np.ndarray]:
        """Per batch of the unit, each group member's block size: ``known``, or exchanged (one
        all-gather for the unit)."""
        if known is not None:
            return [np.asarray(known, np.int64)] * len(mine)
        out = self.torch.zeros(len(group) * len(mine), dtype=self.torch.int64)
        self._gather(out, self.torch.tensor(mine, dtype=self.torch.int64), group=self.groups[group])
        return [np.ascontiguousarray(col) for col in out.numpy().reshape(len(group), len(mine)).T]

    # -- the three collectives ----------------------------------------------------------------
    def allgatherv(self, group: tuple[int, ...], mine: list[Batch], counts: list[int] | None = None) -> list[Batch]:
        counts_each = self._counts(group, [len(b) for b in mine], counts)
        outs, works, unpack = [], [], []
        for b, n in zip(mine, counts_each):
            out = self.ring.take(int(n.sum()))
            if (n == n[0]).all():  # equal blocks: gathered straight into the receive buffer
                for send, recv in zip(self._tensors(b), self._tensors(out)):
                    works.append(self._gather(recv, send, group=self.groups[group], async_op=True))
            else:
                unpack.append(self._gather_padded(group, b, n, out, works))
            outs.append(out)
        self._wait(works)
        for finish in unpack:
            finish()
        for b, out in zip(mine, outs):
            self.stats.add(b, out)
        return outs

    def _gather_padded(self, group, b: Batch, n: np.ndarray, out: Batch, works: list):
        """Start the gather of unequal blocks, each padded to the largest; returns what packs the
        received blocks into ``out`` once it is done."""
        top, ends = int(n.max()), np.concatenate([[0], np.cumsum(n)])
        pairs = []
        for send_arr, out_arr in ((b.images, out.images), (b.meta, out.meta)):
            send = np.zeros((top, *send_arr.shape[1:]), send_arr.dtype)
            send[:len(send_arr)] = send_arr
            recv = np.empty((len(n) * top, *send_arr.shape[1:]), send_arr.dtype)
            works.append(self._gather(self._bytes(recv), self._bytes(send),
                                                          group=self.groups[group], async_op=True))
            pairs.append((recv, out_arr))

        def finish() -> None:
            for recv, out_arr in pairs:
                for i, k in enumerate(n):
                    out_arr[ends[i]:ends[i + 1]] = recv[i * top:i * top + k]
        return finish

    def broadcast(self, group: tuple[int, ...], root: int, batches: list[Batch | None],
                  count: int | None = None) -> list[Batch]:
        is_root, pg = self.rank == root, self.groups[group]
        if count is None:
            n = self.torch.tensor([len(b) if is_root else 0 for b in batches], dtype=self.torch.int64)
            self.dist.broadcast(n, src=root, group=pg)
            count_each = n.tolist()
        else:
            count_each = [count] * len(batches)
        outs = batches if is_root else [self.ring.take(k) for k in count_each]
        works = [self.dist.broadcast(t, src=root, group=pg, async_op=True)
                 for out in outs for t in self._tensors(out)]
        self._wait(works)
        for out in outs:
            self.stats.add(out if is_root else None, out)
        return outs

    def block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: list[Batch | None],
                         counts: list[int] | None = None) -> list[Batch]:
        pg = self.groups[group]
        counts_each = self._counts(group, [len(b) if b is not None else 0 for b in mine], counts)
        local = [group.index(r) for r in roots]
        outs, works = [], []
        for b, n in zip(mine, counts_each):
            out = self.ring.take(int(n[local].sum()))
            offset = 0
            for r, lr in zip(roots, local):  # the P roots' broadcasts in flight together
                block = Batch(out.images[offset:offset + n[lr]], out.meta[offset:offset + n[lr]])
                if r == self.rank:
                    self.stats.copy(block.images, b.images)
                    self.stats.copy(block.meta, b.meta)
                works += [self.dist.broadcast(t, src=r, group=pg, async_op=True) for t in self._tensors(block)]
                offset += int(n[lr])
            outs.append(out)
        self._wait(works)
        for b, out in zip(mine, outs):
            self.stats.add(b, out)
        return outs

    def close(self) -> None:
        """The groups live as long as torch.distributed's default group, which the script (or
        its launcher) owns; nothing of this transport's outlives it."""
        self.groups = {}
