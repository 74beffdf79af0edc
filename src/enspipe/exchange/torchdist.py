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

Where the batches live (``device``):

* None: host memory, numpy arrays, over gloo (as with MPI);
* a CUDA device: each member's block is copied to its GPU once and the images are exchanged there
  by NCCL (``cpu:gloo,cuda:nccl`` groups: the small meta rows and block sizes stay on gloo), so a
  batch on a GPU never passes through host memory; the member's batch is a tensor of its own on
  its GPU. NCCL needs one GPU per member (:func:`shared_gpus`); a group entirely on one GPU shares
  a ring of slots there instead (:mod:`enspipe.exchange.ipc`, through CUDA IPC);
* ``cpu``: the same path with torch CPU tensors over gloo.

Started by :func:`enspipe.exchange.torchcomm.init_torch`: from ``torchrun``'s (or any launcher's)
env:// variables, or, under ``mpiexec``/``srun``, at a port its rank 0 names over MPI.
"""
from __future__ import annotations

import numpy as np

from enspipe.common import keys
from enspipe.exchange import ipc, shm
from enspipe.exchange.base import Batch, TransportStats
from enspipe.exchange.engine import BufferRing, assembled, givers_only
from enspipe.common.host import host_id
from enspipe.exchange.torchcomm import TIMEOUT, init_torch
from enspipe.plan.errors import ConfigError


def member_device(spec: str, host_rank: int):
    """The torch device a member exchanges on: ``spec`` is ``cpu``, ``cuda:K``, or ``cuda`` (the
    member's own GPU: its rank among its host's members, round the GPUs this process sees)."""
    import torch

    if spec == "cuda":
        return torch.device("cuda", host_rank % torch.cuda.device_count())
    return torch.device(spec)


def device_identity(device) -> str | None:
    """What names ``device``'s GPU across processes (its UUID: ``CUDA_VISIBLE_DEVICES`` renumbers
    GPUs per process); None for the CPU."""
    if device.type != "cuda":
        return None
    import torch

    props = torch.cuda.get_device_properties(device)
    return str(getattr(props, "uuid", f"{props.name} #{device.index}"))


def shared_gpus(placed: list[tuple[str, str | None]]) -> dict[tuple[str, str], list[int]]:
    """``placed``: each member's (host, GPU identity or None). The GPUs that more than one member
    would exchange on, with those members: NCCL refuses two ranks on one GPU."""
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for member, (host, gpu) in enumerate(placed):
        if gpu is not None:
            by_gpu.setdefault((host, gpu), []).append(member)
    return {gpu: members for gpu, members in by_gpu.items() if len(members) > 1}


def _check_gpus(groups, placed: list[tuple[str, str | None]]) -> None:
    """NCCL's groups need one GPU per member: a group whose members are not all on one GPU (the
    shared ring's case) must have no two on one. Refused naming them; the same verdict on every
    rank (each checks every group)."""
    for g in dict.fromkeys(groups):
        if len({placed[r] for r in g}) == 1:
            continue
        for (host, gpu), members in shared_gpus([placed[r] for r in g]).items():
            raise ConfigError("device", f"members {[g[i] for i in members]} would exchange on one GPU ({gpu} on "
                              f"{host}) with others of their group elsewhere, and NCCL refuses two ranks on one GPU",
                              "run one member per GPU, or all of a node's members on one GPU (they then share its "
                              "ring of slots), or leave device out (host memory)")


class TensorRing:
    """Receive batches on a torch device: each a fresh tensor from torch's caching allocator, which
    reuses a block only once no tensor refers to it (so a kept batch never changes, and nothing is
    faulted in again: the allocator keeps its blocks); the meta rows in host memory."""

    replaced = 0

    def __init__(self, torch, device, image_shape: tuple[int, ...], dtype: np.dtype):
        self.torch, self.device, self.image_shape = torch, device, image_shape
        self.dtype = getattr(torch, dtype.name)

    def take(self, n: int) -> Batch:
        images = self.torch.empty((n, *self.image_shape), dtype=self.dtype, device=self.device)
        return Batch(images, np.empty((n, 4), np.int64))


class TorchTransport:
    """Group collectives on torch.distributed process groups; byte counts as in the mpi4py transport."""

    name = "torch"

    def __init__(self, comm, groups: list[tuple[int, ...]], image_shape: tuple[int, ...], dtype, max_batch: int,
                 queue_depth: int, events=None, uses: dict[tuple[int, ...], int] | None = None, unit: int = 1,
                 device=None, node_shm: bool = True):
        """``comm``: the members' communicator (mpi4py's, or a :class:`~enspipe.exchange.torchcomm.TorchComm`),
        whose ranks are torch's; the groups are made on it, collectively. ``device``: a torch device
        the batches are exchanged on (see the module's note), or None (host memory); ``node_shm``:
        a group on one host (and GPU) shares a ring of slots (:mod:`enspipe.exchange.ipc`)."""
        import torch
        import torch.distributed as dist

        init_torch(comm)
        self.torch, self.dist, self.rank = torch, dist, comm.Get_rank()
        # torch 2.13 renamed all_gather_into_tensor (the GPU nodes' 2.11 has the old name only)
        self._gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.image_shape, self.dtype = tuple(image_shape), np.dtype(dtype)
        self.row = int(np.prod(self.image_shape)) * self.dtype.itemsize  # an image's bytes
        self.stats = TransportStats()
        self.device = None if device is None else torch.device(device)
        on_gpu = self.device is not None and self.device.type == "cuda"
        if on_gpu:
            torch.cuda.set_device(self.device)  # NCCL's communicators are made on the current device
        placed = comm.allgather((host_id(), device_identity(self.device) if on_gpu else None))
        _check_gpus(groups, placed)
        backend = "cpu:gloo,cuda:nccl" if on_gpu else "gloo"
        self.groups, self.paths, self.windows = {}, {}, {}
        uses = uses or {}
        for g in dict.fromkeys(groups):  # every rank makes every group, in the scheme's order
            pg = dist.new_group(list(g), backend=backend, timeout=TIMEOUT)
            if self.rank not in g:
                continue
            self.groups[g] = pg
            if node_shm and len(g) > 1 and len({placed[r] for r in g}) == 1 and ipc.usable():
                self.windows[g] = ipc.IpcBatchWindow(torch, pg, g, shm.slots_for(queue_depth, unit) * uses.get(g, 1),
                                                     max_batch, self.image_shape, self.dtype, self.device, self.stats)
            self.paths[g] = ("torch-ipc" if on_gpu else "torch-shm") if g in self.windows else \
                ("torch-nccl" if on_gpu else "torch-gloo")
            if events is not None:
                events.log(keys.EXCHANGE_PATH, group=list(g), path=self.paths[g])
        takes = sum(uses.get(g, 1) for g in self.groups if g not in self.windows)
        self.ring = (BufferRing((queue_depth + 1 + unit) * max(takes, 1), max_batch, self.image_shape, self.dtype)
                     if self.device is None else TensorRing(torch, self.device, self.image_shape, self.dtype))

    # -- arrays as torch tensors of their bytes -----------------------------------------------
    def _bytes(self, a):
        """A uint8 tensor sharing the memory of ``a`` (a numpy array, or a tensor on the device),
        one row per sample."""
        width = int(np.prod(a.shape[1:]))
        if isinstance(a, np.ndarray):
            return self.torch.from_numpy(a.reshape(-1).view(np.uint8).reshape(len(a), width * a.dtype.itemsize))
        return a.reshape(len(a), width).view(self.torch.uint8)

    def _tensors(self, b: Batch) -> tuple:
        return self._bytes(b.images), self._bytes(b.meta)

    def _placed(self, batches: list[Batch | None]) -> list[Batch | None]:
        """This member's blocks with their images on the exchange's device (copied there once, by
        their bytes: any wire dtype); as they are where there is none, or they are there."""
        if self.device is None:
            return batches
        out = []
        for b in batches:
            if b is not None and isinstance(b.images, np.ndarray):
                images = self._bytes(b.images).to(self.device).view(self.ring.dtype).reshape(b.images.shape)
                b = Batch(images, b.meta, b.stream)
            out.append(b)
        return out

    def _wait(self, works) -> None:
        for w in works:
            w.wait()
        if self.device is not None and self.device.type == "cuda":  # NCCL's wait orders the stream, not the host:
            self.torch.cuda.current_stream(self.device).synchronize()  # a batch is whole once it is queued

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
        mine = self._placed(mine)
        counts_each = self._counts(group, [len(b) for b in mine], counts)
        if group in self.windows:
            return self._assemble(group, mine, counts_each)
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
        for mine, whole in ((b.images, out.images), (b.meta, out.meta)):
            src = self._bytes(mine)  # on the device of the arrays it views
            send = src.new_zeros((top, src.shape[1]))
            send[:len(src)] = src
            recv = src.new_empty((len(n) * top, src.shape[1]))
            works.append(self._gather(recv, send, group=self.groups[group], async_op=True))
            pairs.append((recv, self._bytes(whole)))

        def finish() -> None:
            for recv, dst in pairs:
                for i, k in enumerate(n):
                    dst[ends[i]:ends[i + 1]] = recv[i * top:i * top + k]
        return finish

    def broadcast(self, group: tuple[int, ...], root: int, batches: list[Batch | None],
                  count: int | None = None) -> list[Batch]:
        batches = self._placed(batches)
        is_root, pg = self.rank == root, self.groups[group]
        if count is None:
            n = self.torch.tensor([len(b) if is_root else 0 for b in batches], dtype=self.torch.int64)
            self.dist.broadcast(n, src=root, group=pg)
            count_each = n.tolist()
        else:
            count_each = [count] * len(batches)
        if group in self.windows:
            givers = givers_only([np.full(len(group), k, np.int64) for k in count_each], [group.index(root)])
            return self._assemble(group, batches if is_root else [None] * len(batches), givers)
        outs = batches if is_root else [self.ring.take(k) for k in count_each]
        works = [self.dist.broadcast(t, src=root, group=pg, async_op=True)
                 for out in outs for t in self._tensors(out)]
        self._wait(works)
        for out in outs:
            self.stats.add(out if is_root else None, out)
        return outs

    def block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: list[Batch | None],
                         counts: list[int] | None = None) -> list[Batch]:
        pg, mine = self.groups[group], self._placed(mine)
        counts_each = self._counts(group, [len(b) if b is not None else 0 for b in mine], counts)
        local = [group.index(r) for r in roots]
        if group in self.windows:
            return self._assemble(group, mine, givers_only(counts_each, local))
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

    def _assemble(self, group, mine: list[Batch | None], counts: list[np.ndarray]) -> list[Batch]:
        return assembled(self.windows[group], mine, counts, group.index(self.rank), self.stats)

    def close(self) -> None:
        """Unmap the shared rings (collective over each group). The groups live as long as
        torch.distributed's default group, which the script (or its launcher) owns."""
        for w in self.windows.values():
            w.free()
        self.groups, self.windows = {}, {}

