"""The torch transport's ring of batch slots that the members of one group share on one device.

When every member of a group is on one host, and (for a GPU) on one GPU, the group's batches are
assembled in memory they all map:

- on the GPU, an allocation of its first member, mapped by the others through CUDA IPC (torch's
  ``reduce_tensor`` handles);
- in host memory, a file in /dev/shm.

Each member writes its block at its offset of the slot (a copy on the device). One barrier
publishes the unit of batches, and every member reads them in place. Nothing passes through
gloo's sockets, NCCL, or host memory for a GPU batch. The slots' meta rows and the barrier (a
:class:`~enspipe.exchange.shm.SleepingBarrier`) are in a second /dev/shm file.

Slot reuse follows :mod:`enspipe.exchange.shm`'s argument. A member writes unit u's slots only
after every member entered unit u-1's barrier, so each had queued unit u-2. ``slots_for(depth,
unit)`` slots are then never written while a batch in them is still in use. That is the
release rule: a slot is free once every member has passed the barrier after taking it. A batch
is ``volatile``: a consumer that keeps one gets a private copy (:class:`enspipe.SharedStream`),
so nobody skips a batch and nobody's kept batch changes. A member that dies is the heartbeat's
case, as everywhere: its peers end the job within ``peer_timeout``.

Both files are unlinked as soon as every member has mapped them, so a job killed outright
leaves nothing in /dev/shm.
"""
from __future__ import annotations

import mmap
import os
import secrets

import numpy as np

from enspipe.exchange.base import Batch
from enspipe.exchange.shm import SleepingBarrier, _aligned, _semaphores

SHM = "/dev/shm"


def usable() -> bool:
    """Whether this host can hold such a ring: /dev/shm and process-shared semaphores."""
    return os.path.isdir(SHM) and _semaphores() is not None


def _segment(name: str, size: int, create: bool) -> mmap.mmap:
    """A /dev/shm file of ``size`` bytes (owner-only), mapped."""
    path = os.path.join(SHM, name)
    fd = os.open(path, os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0), 0o600)
    try:
        if create:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def cuda_handle(tensor) -> dict:
    """What another process on this host needs to map ``tensor`` (a CUDA tensor) through CUDA
    IPC, as plain JSON values: torch's own sharing handles (``reduce_tensor``), the bytes as hex.
    The exporting process keeps the tensor alive while any other maps it."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, (_, size, stride, offset, _, dtype, device, handle, nbytes, storage_offset, _, counter, counter_offset, event,
        event_sync) = reduce_tensor(tensor)
    return {"size": list(size), "stride": list(stride), "offset": offset, "dtype": str(dtype).removeprefix("torch."),
            "device": device, "handle": _hex(handle), "nbytes": nbytes, "storage_offset": storage_offset,
            "counter": _hex(counter), "counter_offset": counter_offset, "event": _hex(event),
            "event_sync": bool(event_sync)}


def mapped_cuda(handle: dict):
    """The tensor :func:`cuda_handle` describes, mapped into this process (no copy)."""
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    h = handle
    return rebuild_cuda_tensor(torch.Tensor, torch.Size(h["size"]), tuple(h["stride"]), h["offset"],
                               torch.storage.TypedStorage, getattr(torch, h["dtype"]), h["device"],
                               _unhex(h["handle"]), h["nbytes"], h["storage_offset"], False, _unhex(h["counter"]),
                               h["counter_offset"], _unhex(h["event"]), h["event_sync"])


def gpu_allocation(torch, shape: tuple, dtype, device, what: str):
    """``torch.empty`` on a GPU; out of memory there raises :class:`OutOfDeviceMemory` naming
    ``what`` was asked for, its size and what the GPU had free."""
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except torch.cuda.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(device)
        asked = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        raise OutOfDeviceMemory(f"{what}: {asked / 2**20:.0f} MiB asked on {device}, which has {free / 2**20:.0f} MiB "
                                f"free of {total / 2**20:.0f}") from None


class OutOfDeviceMemory(MemoryError):
    """A shared allocation that does not fit on its GPU, named with what was asked for."""


def _hex(b) -> str | None:
    return None if b is None else bytes(b).hex()


def _unhex(s: str | None) -> bytes | None:
    return None if s is None else bytes.fromhex(s)


class IpcBatchWindow:
    """One group's ring of slots on its shared device (see the module's note).

    ``pg``: the group's torch process group and ``ranks`` its global ranks (the first makes the
    ring); ``device``: None (numpy slots in host memory), a CPU or a CUDA torch device (tensor
    slots). Collective over the group."""

    def __init__(self, torch, pg, ranks: tuple[int, ...], slots: int, max_batch: int,
                 image_shape: tuple[int, ...], dtype: np.dtype, device, stats):
        import torch.distributed as dist

        self.torch, self.dist, self.pg, self.stats = torch, dist, pg, stats
        self.me = ranks.index(dist.get_rank())
        self.leader, self.device = self.me == 0, device
        self.on_gpu = device is not None and device.type == "cuda"
        self.slots, self.max_batch, self.next = slots, max_batch, 0
        row = int(np.prod(image_shape)) * dtype.itemsize
        meta_bytes = _aligned(slots * max_batch * 4 * 8)
        ctrl_size, image_size = meta_bytes + SleepingBarrier.BYTES, slots * max_batch * row
        box = [None]
        if self.leader:
            try:
                box = [self._made(ctrl_size, image_size, ranks[0], len(ranks) - 1)]
            except OutOfDeviceMemory as e:  # every member says why, not only the leader
                box = [str(e)]
        dist.broadcast_object_list(box, src=ranks[0], group=pg)
        if isinstance(box[0], str):
            raise OutOfDeviceMemory(box[0])
        ctrl_name, images_handles = box[0]
        self._ctrl = _segment(ctrl_name, ctrl_size, create=False) if not self.leader else self._ctrl
        raw = np.frombuffer(self._ctrl, np.uint8)
        self.meta = raw[:meta_bytes].view(np.int64)[: slots * max_batch * 4].reshape(slots, max_batch, 4)
        self.barrier = SleepingBarrier(raw[meta_bytes:], len(ranks), init=self.leader)
        if not self.leader:
            self._images_raw = self._mapped(images_handles[self.me - 1], image_size)
        self.images = self._typed(self._images_raw, slots, max_batch, image_shape, dtype)
        dist.barrier(group=pg)  # every member has mapped both: their names can go
        if self.leader:
            os.unlink(os.path.join(SHM, ctrl_name))
            if not self.on_gpu:
                os.unlink(os.path.join(SHM, images_handles[0]))

    def _made(self, ctrl_size: int, image_size: int, leader: int, others: int) -> tuple:
        """The leader's segments (and GPU allocation); what the others need to map them: the
        control file's name, and the images' for each of the ``others`` (a CUDA IPC handle each:
        torch counts one reference per handle, released by the member that maps it)."""
        stem = f"enspipe-ipc-{os.getpid()}-{leader}-{secrets.token_hex(4)}"
        if self.on_gpu:  # (first: a GPU that cannot hold it leaves no file behind)
            self._images_raw = gpu_allocation(self.torch, (image_size,), self.torch.uint8, self.device,
                                              f"the group's ring of {self.slots} slots of {self.max_batch} images")
        self._ctrl = _segment(stem + "-ctrl", ctrl_size, create=True)
        if self.on_gpu:
            return stem + "-ctrl", [cuda_handle(self._images_raw) for _ in range(others)]
        self._images_raw = _segment(stem + "-images", max(image_size, 1), create=True)
        return stem + "-ctrl", [stem + "-images"] * max(others, 1)

    def _mapped(self, handle, image_size: int):
        if self.on_gpu:
            return mapped_cuda(handle)  # the leader's allocation, mapped through CUDA IPC
        return _segment(handle, max(image_size, 1), create=False)

    def _typed(self, raw, slots: int, max_batch: int, image_shape: tuple[int, ...], dtype: np.dtype):
        """The images' bytes as ``(slots, max_batch, *image_shape)``: numpy (no device) or a tensor."""
        count = slots * max_batch * int(np.prod(image_shape))
        if self.device is None:
            return np.frombuffer(raw, dtype, count=count).reshape(slots, max_batch, *image_shape)
        flat = raw if self.on_gpu else self.torch.frombuffer(raw, dtype=self.torch.uint8)
        return flat[: count * dtype.itemsize].view(getattr(self.torch, dtype.name)).reshape(
            slots, max_batch, *image_shape)

    def _write(self, slot: int, lo: int, block: Batch) -> None:
        k = len(block)
        self.stats.copy(self.meta[slot][lo:lo + k], block.meta)
        src = block.images
        if self.device is not None and isinstance(src, np.ndarray):
            src = self.torch.from_numpy(src)
        self.stats.copy(self.images[slot][lo:lo + k], src)

    def assemble(self, mine: list, counts: list[np.ndarray]) -> list[Batch]:
        """Write each of ``mine`` (per batch of the unit: None or this member's block of
        ``counts[i][me]`` samples) at its offset of its own slot; return the unit's whole
        batches as views of their slots, once every member has written."""
        filled = []
        for block, n in zip(mine, counts):
            total = int(n.sum())
            if total > self.max_batch:
                raise ValueError(f"a batch of {total} exceeds the shared slots' {self.max_batch}")
            s, self.next = self.next, (self.next + 1) % self.slots
            if n[self.me]:
                self._write(s, int(n[:self.me].sum()), block)
            filled.append((s, total))
        if self.on_gpu:  # the copies are on this process's stream: done before the others read
            self.torch.cuda.current_stream(self.device).synchronize()
        self.barrier.wait()
        return [Batch(self.images[s][:total], self.meta[s][:total], volatile=True) for s, total in filled]

    def free(self) -> None:
        """Unmap, once every member is done with the ring (collective over the group): the
        leader's GPU allocation outlives the others' mappings of it."""
        self.images = self.meta = None
        if not self.leader:
            self._images_raw = None
        self.dist.barrier(group=self.pg)
        self._images_raw = self._ctrl = None
