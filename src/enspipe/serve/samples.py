"""One sample of a dataset by its number, read and preprocessed into a slot of the server's pool
(by the server's backend's maker, :mod:`enspipe.engine.backends`), and the pool itself: a file in ``/dev/shm`` that the server and every consumer map.
"""
from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from enspipe.common.ownerlock import create_locked, reap_unlocked
from enspipe.data.keys import sample_ids
from enspipe.data.manifest import DataError, Manifest
from enspipe.data.order import NumpyOrder, RecordReader, read_file
from enspipe.data.parse import resolve
from enspipe.data.records import record_format
from enspipe.exchange import ipc

SHM_DIR = "/dev/shm"
POOL_PREFIX = "enspipe-pool-"  # + the server's pid and a token; locked by the server while it lives


class SampleSource:
    """Sample ``s`` (its number in the dataset's canonical order) as ``(encoded, label, id, key)``;
    safe to call from several threads (each has its own record reader)."""

    def __init__(self, m: Manifest):
        self.m, self.folders = m, m.kind == "jpeg_folders"
        self.parser = None if self.folders else resolve(record_format(m))
        self.paths = m.paths()
        self.labels = np.asarray(m.labels, np.int64) if self.folders else None
        rows = NumpyOrder(m, 0, 0).samples(np.arange(m.num_images))
        self.keys, self.shard_of, self.record_of = rows["key"], rows["shard"], rows["record"]
        self.ids = sample_ids(self.keys) if m.num_images else np.zeros(0, np.int64)  # once, not per sample
        self._local = threading.local()

    def read(self, s: int) -> tuple[bytes, int, int, str]:
        shard, key = int(self.shard_of[s]), self.keys[s]
        if self.folders:
            encoded, label = read_file(self.paths[shard], key, False), int(self.labels[shard])
        else:
            reader = getattr(self._local, "reader", None)
            if reader is None:
                reader = self._local.reader = RecordReader(self.m, False)
            encoded, label = self.parser.fn(reader.read(shard, int(self.record_of[s])), key)
        return encoded, int(label), int(self.ids[s]), key.decode()


class Pool:
    """``slots`` preprocessed samples and their ``[id, label]`` rows, created by the server
    (:meth:`create`) and mapped read-only by each consumer (:meth:`open`): one node-shared file,
    or, for a pool on a GPU (``--backend gpu``), the rows in that file and the images in the
    server's allocation on the GPU, which each consumer maps through CUDA IPC (:meth:`handle`).

    The server holds the file's owner lock (:mod:`enspipe.common.ownerlock`) for as long as it
    lives: a pool whose lock anyone can take is a dead server's, removed at once by the next server
    to start and by a consumer that finds its server gone (:func:`reap`)."""

    def __init__(self, path: str, slots: int, shape: tuple, dtype, fd: int | None = None, device=None,
                 handle: dict | None = None):
        """``fd``: the server's own descriptor of the file it created (holding its lock); None
        for a consumer, which maps it read-only. ``device``: the server's CUDA device (the images
        there); ``handle``: a consumer's way to them (:meth:`handle`)."""
        self.path, self.slots, self.shape, self.dtype = path, int(slots), tuple(shape), np.dtype(dtype)
        on_gpu = device is not None or handle is not None
        image_bytes = 0 if on_gpu else self.slots * int(np.prod(self.shape)) * self.dtype.itemsize
        size = image_bytes + self.slots * 16
        self._owner = fd
        if fd is not None:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        else:
            try:
                ro = os.open(path, os.O_RDONLY)
            except PermissionError:
                raise PoolDenied(f"{path}: permission denied (the pool is its server's user's"
                                 f"{' and group' if os.path.exists(path) else ''} only)") from None
            try:
                self._map = mmap.mmap(ro, size, prot=mmap.PROT_READ)
            finally:
                os.close(ro)
        self.meta = np.frombuffer(self._map, np.int64, self.slots * 2, image_bytes).reshape(self.slots, 2)
        self.torch = None
        if not on_gpu:
            self.images = np.frombuffer(self._map, self.dtype, self.slots * int(np.prod(self.shape)), 0).reshape(
                (self.slots, *self.shape))
            return
        import torch

        self.torch = torch
        if handle is not None:
            self.images = ipc.mapped_cuda(handle)
            return
        self.images = ipc.gpu_allocation(torch, (self.slots, *self.shape), getattr(torch, self.dtype.name), device,
                                         f"the pool of {self.slots} samples")

    def handle(self) -> dict | None:
        """The server's, for one consumer: how it maps a GPU pool's images (None for a pool in
        /dev/shm). One per consumer: each handle carries a reference torch's CUDA IPC counts, and
        the consumer that maps it releases that one."""
        return ipc.cuda_handle(self.images) if self.torch is not None else None

    @classmethod
    def create(cls, slots: int, shape: tuple, dtype, mode: int = 0o600, gid: int | None = None, say=None,
               device=None) -> "Pool":
        """A new pool, ``mode`` exactly whatever the umask (``gid``: its group), after removing
        every pool of this user's servers that died without removing theirs; ``device``: a CUDA
        device for the images."""
        from secrets import token_hex

        reap_dead(say)
        path = os.path.join(SHM_DIR, f"{POOL_PREFIX}{os.getpid()}-{token_hex(4)}")
        fd = create_locked(path, mode)
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)
            return cls(path, slots, shape, dtype, fd=fd, device=device)
        except BaseException:
            os.remove(path)
            os.close(fd)
            raise

    @classmethod
    def open(cls, path: str, slots: int, shape: tuple, dtype, handle: dict | None = None) -> "Pool":
        return cls(path, slots, shape, dtype, handle=handle)

    @property
    def bytes(self) -> int:
        """The pool's size: the file's, and the images' on the GPU."""
        on_gpu = 0 if self.torch is None else self.slots * int(np.prod(self.shape)) * self.dtype.itemsize
        return len(self._map) + on_gpu

    def put(self, slots: list, images, meta) -> None:
        """The server's: ``images[i]`` (an array or a tensor) and ``meta[i]`` (``[id, label]``)
        into ``slots[i]``; on a GPU, finished before it returns (a consumer told of the slots
        reads them from its own stream)."""
        if not len(slots):
            return
        self.meta[slots] = meta
        if self.torch is None:
            self.images[slots] = images.cpu().numpy() if hasattr(images, "cpu") else images
            return
        torch = self.torch
        x = torch.as_tensor(images).to(self.images.device, non_blocking=False)
        self.images.index_copy_(0, torch.as_tensor(slots, device=self.images.device), x)
        torch.cuda.current_stream(self.images.device).synchronize()

    def gather(self, slots: list) -> tuple:
        """Copies of these slots' images and ``[id, label]`` rows: the consumer's own batch (on a
        GPU pool, a tensor on that GPU, finished before it returns: the slots may then be released)."""
        meta = np.take(self.meta, slots, axis=0)
        if self.torch is None:
            return np.take(self.images, slots, axis=0), meta
        images = self.images.index_select(0, self.torch.as_tensor(slots, device=self.images.device))
        self.torch.cuda.current_stream(self.images.device).synchronize()
        return images, meta

    def close(self, unlink: bool = False) -> None:
        self.images = self.meta = None
        try:
            self._map.close()
        except BufferError:  # a view still held: the mapping goes with the process
            pass
        if unlink:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
        if self._owner is not None:
            os.close(self._owner)  # the lock goes last: the file is gone first
            self._owner = None


class PoolDenied(PermissionError):
    """A consumer may not map its server's pool (another user's server)."""


def reap_dead(say=None, path: str | None = None, wait: float = 0.0) -> list[str]:
    """Remove the pools of dead servers: every one of this user's (``path`` None), or the one at
    ``path``, whose owner lock anyone can take, retrying for up to ``wait`` seconds (a server just
    killed releases its lock as its process ends, maybe after its socket closed). Returns them."""
    import time

    parent, prefix = (SHM_DIR, POOL_PREFIX) if path is None else os.path.split(path)
    end = time.monotonic() + wait
    while True:
        removed = reap_unlocked(parent, prefix)
        if removed or path is None or not os.path.exists(path) or time.monotonic() >= end:
            break
        time.sleep(0.01)
    if removed and say:
        say(f"removed {len(removed)} pool(s) of servers that died: {', '.join(removed)}")
    return removed


class SampleMaker:
    """Samples read here and made by the server's backend: its module's ``maker(spec)``, beside
    the engine every member runs (:mod:`enspipe.engine.backends`), makes a chunk with the draws of
    the samples' stream positions (the pillow backend on a worker process per calling thread, the
    gpu backend as one tensor on its device)."""

    def __init__(self, source: SampleSource, opts):
        self.source = source
        self.backend = opts.backend_row.engine_module().maker(opts.prep_spec(source.m))
        self.device = getattr(self.backend, "device", None)  # where its images are (None: host memory)

    @property
    def decodes(self) -> dict | None:
        """The backend's decodes: a GPU backend's on its device and on the CPU, the pillow backend's
        images decoded whole by reason; None for a backend that does not count them."""
        return getattr(self.backend, "decodes", None)

    def make(self, samples: list, positions: list) -> tuple:
        """The samples preprocessed with the draws of their stream positions: ``(images, rows)``,
        a row ``(id, label, problem)`` per sample, ``problem`` None or why it could not be made
        (its image then undefined)."""
        encoded, rows = read(self.source, samples)
        images, failed = self.backend.make(encoded, positions, [r[0] for r in rows])
        return images, made_rows(rows, failed)

    def close(self) -> None:
        self.backend.close()


def read(source: SampleSource, samples: list) -> tuple[list, list]:
    """The samples' encoded bytes (empty for one that cannot be read) and a row ``[id, label,
    problem, key]`` each."""
    rows, encoded = [], []
    for s in samples:
        try:
            data, label, sid, key = source.read(s)
            rows.append([sid, label, None, key])
        except (DataError, OSError) as e:
            data = b""
            rows.append([-1, -1, str(e), None])
        encoded.append(data)
    return encoded, rows


def made_rows(rows: list, failed: dict) -> list:
    """``(id, label, problem)`` per sample: its read problem, or why its image was undecodable."""
    for i, why in failed.items():
        if rows[i][2] is None:
            rows[i][2] = f"{rows[i][3]}: undecodable image ({why})"
    return [(sid, label, problem) for sid, label, problem, _ in rows]
