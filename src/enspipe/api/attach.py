"""A stream from an attach server (``enspipe serve``), for a process that comes and goes on its
own: a trial of a hyperparameter search, a notebook, any training script, with no ``mpiexec``.

Example::

    import enspipe
    stream = enspipe.attach("data/train")            # the server for that dataset on this node
    for epoch in range(3):
        for images, labels in stream:                # one epoch of this consumer: every sample once
            ...
    stream.close()

Each consumer has its own epochs, from the moment it attaches: every sample of the dataset
exactly once per epoch, in an order that differs from epoch to epoch. The server preprocesses
each sample once for every consumer that needs it at about the same time (see
:mod:`enspipe.serve.schedule`); a batch is copied out of the node-shared pool into arrays of its
own, so a batch kept never changes.

Ending: :meth:`AttachedStream.close` (or the process exiting, or being killed) detaches; the
server lets go of what this consumer needed at once. Where the server ends, the iteration raises
:class:`~enspipe.serve.wire.ServerGone` as soon as its socket closes; where it stops answering,
after ``timeout`` seconds.
"""
from __future__ import annotations

import atexit
import math
import os
import socket

import numpy as np

from enspipe.api.adapters import StreamAdapters
from enspipe.api.stream import _host, _is_tensor
from enspipe.plan.errors import ConfigError, unknown_keywords
from enspipe.serve import wire


def attach(target, *, batch_size: int | None = None, image_size: int | None = None, preprocess: str | None = None,
           wire_dtype: str | None = None, seed: int | None = None, data: str | None = None, name: str | None = None,
           timeout: float = 60.0, **unknown) -> "AttachedStream":
    """Attach to the server for ``target``: a dataset directory (its server's default socket, and
    the dataset checked against the server's) or a server's socket path.

    The options that are given must be the server's (``batch_size``, ``image_size``,
    ``preprocess``, ``wire_dtype``, ``seed``; ``data``: the dataset, where ``target`` is a
    socket); a difference raises :class:`enspipe.ConfigError` naming it. ``name`` labels this
    consumer in the server's status; ``timeout``: seconds to wait for a batch from a server that
    does not answer (one that has ended is noticed at once).
    """
    unknown_keywords(unknown, ("batch_size", "image_size", "preprocess", "wire_dtype", "seed", "data", "name",
                               "timeout"), "attach", {"num_workers": "name", "transform": "preprocess"})
    target = os.fspath(target)
    data = os.fspath(data) if data is not None else (target if os.path.isdir(target) else None)
    path = wire.default_socket(target) if os.path.isdir(target) else target
    hello = {"op": "hello", "batch_size": batch_size, "image_size": image_size, "preprocess": preprocess,
             "wire_dtype": wire_dtype, "seed": seed, "pid": os.getpid(), "name": name, "data": data,
             "digest": _digest(data) if data is not None else None}
    return AttachedStream(path, hello, timeout)


def _denied(path: str, why: str) -> ConfigError:
    owner = _owner(path)
    return ConfigError("attach()", f"permission denied on {path}{owner}: {why}. An attach server is its user's alone "
                       "unless that user starts it with --group GROUP", "attach as the server's user, or have it "
                       "started with --group naming a group this user is in (id -Gn lists them)")


def _owner(path: str) -> str:
    import pwd

    try:
        uid = os.stat(path).st_uid
    except OSError:
        return ""
    try:
        return f" (the server of user {pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f" (the server of uid {uid})"


def _gpu_pool(path: str, handle: dict | None) -> dict | None:
    """A GPU pool's CUDA IPC handle, once this process can map it: torch with CUDA, the server's
    GPU among those it sees; else a ConfigError. None for a pool in /dev/shm."""
    if handle is None:
        return None
    fix = "attach from a process that sees the server's GPU, or start the server with --backend pillow"
    try:
        import torch
    except ImportError:
        raise ConfigError("attach()", f"the server on {path} holds its pool on a GPU, and torch is not installed here",
                          fix) from None
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if handle["device"] >= seen:
        raise ConfigError("attach()", f"the server on {path} holds its pool on its GPU {handle['device']}, and this "
                          f"process sees {seen} GPUs", fix)
    return handle


def _digest(data: str) -> str:
    from enspipe.serve.checks import load_dataset

    return load_dataset(data).digest


class AttachedStream(StreamAdapters):
    """One consumer's stream from an attach server: the surface of :class:`~enspipe.SharedStream`
    (``for images, labels in stream``, :meth:`next_batch`, :meth:`torch`, :meth:`jax`,
    :meth:`dataset`, :meth:`epochs`, :meth:`close`). Made by :func:`attach`."""

    def __init__(self, path: str, hello: dict, timeout: float):
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ConfigError("timeout", f"must be a positive number of seconds, got {timeout!r}", "pass e.g. 60")
        self.path, self.timeout, self._closed = path, float(timeout), True
        self.info: dict = {}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
        except PermissionError:
            self._sock.close()
            raise _denied(path, "its socket is not this user's to connect to") from None
        except OSError as e:
            self._sock.close()
            raise ConfigError("attach()", f"no server answers on {path} ({e.strerror})", "start one on this node: "
                              "enspipe serve --data DIR --batch-size B (its socket: --socket, or the dataset's "
                              "default)") from None
        self._sock.settimeout(self.timeout)
        try:
            wire.send(self._sock, hello)
        except OSError:  # closed as it came: the server's reason, if it gave one, is still to be read
            pass
        info = self._answer()
        if "error" in info:
            self._sock.close()
            if info.get("reason") == "permission":
                raise _denied(path, f"the server refused this user: {info['error']}")
            raise ConfigError("attach()", f"the server on {path} refused this consumer: {info['error']}",
                              "attach with the server's options (enspipe serve --status shows them), or start a "
                              "server for yours")
        from enspipe.data.ledger import EpochLedger
        from enspipe.serve.samples import Pool, PoolDenied

        try:
            self._pool = Pool.open(info["pool"], info["slots"], tuple(info["shape"]), np.dtype(info["dtype"]),
                                   _gpu_pool(path, info.get("images")))
        except PoolDenied as e:
            self._sock.close()
            raise _denied(path, f"its pool is not this user's to read: {e}") from None
        except ConfigError:
            self._sock.close()
            raise
        self.info, self.consumer = info, info["consumer"]
        self._ledger = EpochLedger(info["num_images"])
        self._held: list = []  # the last batch's slots, copied out: released with the next request
        self._closed = False
        atexit.register(self.close)

    # -- what a training script reads -----------------------------------------------------------
    @property
    def num_images(self) -> int:
        """Samples in one epoch."""
        return self.info["num_images"]

    @property
    def num_classes(self) -> int:
        return self.info["num_classes"]

    @property
    def batch_size(self) -> int:
        return self.info["batch_size"]

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch: ``ceil(num_images / batch_size)`` (the last one may be smaller)."""
        return math.ceil(self.num_images / self.batch_size)

    @property
    def element_spec(self) -> tuple:
        """``(image shape, image dtype)`` of one preprocessed sample."""
        return tuple(self.info["shape"]), np.dtype(self.info["dtype"])

    @property
    def sample_layout(self) -> str | None:
        """One sample's layout (``HWC``, ``CHW`` or None), as the server's preprocessing returns it."""
        return self.info.get("layout", "HWC")

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch of this consumer's stream, ``(images, labels)`` (read-only arrays of its own)."""
        images, meta, _ = self._next()
        images = _host(images)
        images.flags.writeable = meta.flags.writeable = False
        return images, meta[:, 1]

    def _batches(self, writable: bool, tensors: bool = False):
        """One epoch of numpy batches of its own; ``tensors``: a GPU pool's batches as tensors of
        their own on its GPU (:meth:`torch`), else copied to host memory."""
        while True:
            images, meta, end = self._next()
            if not (tensors and _is_tensor(images)):
                images = images.cpu().numpy() if _is_tensor(images) else images  # a copy of its own
                if not writable:
                    images.flags.writeable = meta.flags.writeable = False
            yield images, meta[:, 1]
            if end:
                return

    def _endless(self):
        while not self._closed:
            images, meta, _ = self._next()
            yield _host(images), meta[:, 1]  # an epoch's last batch may be smaller: no fixed batch dimension

    def close(self) -> None:
        """Detach: the server lets go of what this consumer needed."""
        if self._closed:
            return
        self._closed = True
        try:
            wire.send(self._sock, {"op": "bye"})
        except OSError:
            pass
        self._sock.close()
        self._pool.close()

    def __enter__(self) -> "AttachedStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the exchange with the server ------------------------------------------------------------
    def _answer(self) -> dict:
        try:
            answer = wire.recv(self._sock)
        except socket.timeout:
            raise wire.ServerGone(f"the server on {self.path} did not answer in {self.timeout:g} s") from None
        except (EOFError, OSError, wire.Malformed) as e:
            raise self._gone(e) from None
        if not isinstance(answer, dict):
            raise wire.ServerGone(f"the server on {self.path} answered {type(answer).__name__}, not an enspipe answer")
        return answer

    def _gone(self, e: Exception) -> wire.ServerGone:
        """The server has ended: its pool, where it died without removing it, goes with it."""
        if self.info:
            from enspipe.serve.samples import reap_dead

            reap_dead(path=self.info["pool"], wait=1.0)
        return wire.ServerGone(f"the server on {self.path} has ended ({e})")

    def _next(self) -> tuple[np.ndarray, np.ndarray, bool]:
        if self._closed:
            from enspipe.api.stream import StreamClosed

            raise StreamClosed("the stream is closed")
        try:
            wire.send(self._sock, {"op": "next", "release": self._held})
        except OSError as e:
            raise self._gone(e) from None
        batch = self._answer()
        if "error" in batch:
            raise wire.ServerGone(f"the server on {self.path}: {batch['error']}")
        images, meta = self._pool.gather(batch["slots"])
        self._held = batch["slots"]
        self._ledger.add(meta[:, 0], np.full(len(meta), batch["epoch"], np.int64))
        return images, meta, batch["end"]
