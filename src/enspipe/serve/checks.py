"""The attach server's checks before any work: its options, the dataset, the socket and the memory.
A problem raises :class:`enspipe.ConfigError` naming the option and the fix (``enspipe serve``
exits 2 with it)."""
from __future__ import annotations

import os

from enspipe.data.records import indexed
from enspipe.engine.backends.gpu import member_gpu
from enspipe.engine.config import check_gpu_backend, checked_manifest
from enspipe.exchange.shm import shm_free_bytes
from enspipe.plan.errors import ConfigError, require
from enspipe.serve.wire import ServeOptions, live_server


def load_dataset(data: str):
    """The dataset's manifest, checked as :class:`~enspipe.StreamConfig` checks it, and indexed
    (the server reads records by their number)."""
    if not os.path.isdir(data):
        raise ConfigError("data", f"{data}: no such directory", "pass a dataset directory")
    m = checked_manifest(str(data))
    require(m.kind == "jpeg_folders" or indexed(m), "data", f"{data}: the manifest does not count every shard's "
            "records", f"index it once with `enspipe index --data {data}`")
    require(m.num_images > 0, "data", f"{data}: no samples", "pass a dataset with images")
    return m


def claim_socket(path: str, say) -> None:
    """Refuse a socket a live server answers on; remove a stale one (saying so)."""
    parent = os.path.dirname(os.path.abspath(path))
    require(os.path.isdir(parent), "socket", f"{parent}: no such directory", "pass --socket in an existing directory")
    if not os.path.lexists(path):
        return
    if live_server(path):
        raise ConfigError("socket", f"{path} is in use by a live server", "stop that server (enspipe serve "
                          f"--status --socket {path} names its pid), or pass another --socket")
    os.remove(path)
    say(f"removed a stale socket {path} (no server answered on it)")


def prepare(opts: ServeOptions, say):
    """Every check, in order; returns the dataset's manifest."""
    m = load_dataset(str(opts.data))
    if opts.own_preprocess:  # imported and tried on the first samples: its output's size sizes the pool
        opts.load_transform(m)
    problem = opts.slots_problem()
    require(problem is None, "memory", f"{problem}", "pass a larger --memory, or a smaller --batch-size")
    if opts.backend_row.on_gpu:
        _check_gpu(opts)
    free = shm_free_bytes()
    in_shm = opts.slots * 16 if opts.on_gpu else opts.pool_bytes  # a GPU pool's rows alone are in /dev/shm
    require(free is None or in_shm <= free, "memory", f"{in_shm} bytes asked, /dev/shm has {free} free",
            "pass a smaller --memory (with --wire-dtype uint8 a sample takes a quarter of the bytes), or free /dev/shm")
    claim_socket(opts.socket, say)
    return m


def _check_gpu(opts: ServeOptions) -> None:
    """The gpu backend can run here (CUDA, nvJPEG), on a GPU this process sees, with room for the
    pool; on ``--device cpu``, its torch ops can."""
    import importlib.util

    fix = "pass --backend pillow (the CPU)"
    if not opts.on_gpu:
        require(importlib.util.find_spec("torch") is not None, "backend", "the gpu backend needs torch", fix)
        return
    check_gpu_backend(opts.preprocess, fix=fix)
    import torch

    device = member_gpu(opts.device)
    require(device.index is None or device.index < torch.cuda.device_count(), "device", f"{opts.device}: this "
            f"process sees {torch.cuda.device_count()} GPUs", "pass a GPU it sees, or leave --device out")
    free, _ = torch.cuda.mem_get_info(device)
    require(opts.pool_bytes <= free, "memory", f"the pool of {opts.slots} samples ({opts.pool_bytes} bytes) does not "
            f"fit on {device}, which has {free} bytes free", "pass a smaller --memory (or --wire-dtype uint8: a quarter of the bytes), or free the GPU")
