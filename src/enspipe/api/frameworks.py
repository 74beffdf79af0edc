"""The stream as PyTorch tensors or JAX arrays: thin iterators over :class:`~enspipe.SharedStream`'s
batches, one epoch each, with the numpy iteration's guarantees (every sample exactly once per
epoch, a kept batch never changes, ``close()`` as before). Made by :meth:`SharedStream.torch`
and :meth:`SharedStream.jax`; neither framework is imported until one is asked for.

PyTorch: the batch's own memory where that is safe (a read-only numpy array handed to
``torch.from_numpy`` warns that writing to it is undefined behaviour; enspipe hands over a
writable view of a buffer private to the batch instead, so no warning and no copy). JAX: always
a copy (``jax.device_put`` on the CPU may alias writable numpy memory, which enspipe reuses).
"""
from __future__ import annotations

import importlib

import numpy as np

from enspipe.plan.errors import require

LAYOUTS = ("NHWC", "NCHW", "channels_last")


def tf_dataset(batches, shape: tuple, dtype, batch: int | None = None):
    """``batches()`` (a generator function of ``(images, labels)`` numpy batches) as a
    ``tf.data.Dataset``; ``batch``: the batch dimension where every batch has it (None: it varies)."""
    import tensorflow as tf

    return tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((batch, *shape), tf.as_dtype(dtype)), tf.TensorSpec((batch,), tf.int64)))


def require_framework(name: str, extra: str):
    """The framework's module, or ImportError saying what to install."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"enspipe: {name} is not installed here ({e}); pip install 'enspipe[{extra}]'") from None


class TorchBatches:
    """One epoch of ``(images, labels)`` torch tensors; ``len()`` is the batches per epoch.

    Example::

        for images, labels in stream.torch(layout="channels_last", device="cuda"):
            loss = loss_fn(model(images.float()), labels)

    ``layout`` is what is yielded, whatever layout the samples have (a built-in's and a numpy
    function's are ``(H, W, C)``, a torchvision pipeline's ``(C, H, W)``; enspipe reads it from
    the first samples): ``NCHW`` is ``(B, C, H, W)`` contiguous, ``channels_last`` ``(B, C, H, W)``
    in channels-last memory (PyTorch's fast layout for convolutions), ``NHWC`` ``(B, H, W, C)``
    contiguous; ``None`` (the default) the samples' own, stacked, as a ``DataLoader`` collates
    them. Where the samples already have the layout asked for, no copy is made. Labels are int64.
    ``device``: where the tensors go (``None``: where the stream's batches are: the CPU, or the GPU
    a ``SharedStream(device=...)`` exchanges on, with no copy). A batch in host memory bound for a
    CUDA device is copied into one of two pinned staging buffers allocated once, then to the device
    without blocking the host; the copy has finished when the batch is yielded. Usable where a
    ``DataLoader`` is iterated (it has ``len()`` and yields tensors).
    """

    def __init__(self, stream, layout: str | None = None, device=None):
        require(layout is None or layout in LAYOUTS, "layout", f"unknown layout {layout!r}",
                f"choose one of {', '.join(LAYOUTS)}, or leave it out (the samples' own)")
        self.sample_layout = stream.sample_layout
        require(layout is None or self.sample_layout is not None, "layout", f"the samples are of shape "
                f"{tuple(stream.element_spec[0])}, not images with a channel axis, so they have no {layout} layout",
                "leave layout out (the samples as they are)")
        self.torch = require_framework("torch", "torch")
        try:
            self.device = None if device is None else self.torch.device(device)
        except (RuntimeError, TypeError) as e:
            from enspipe.plan.errors import ConfigError

            raise ConfigError("device", f"{device!r} is not a torch device ({e})", "pass e.g. 'cuda', 'cuda:0' or "
                              "'cpu'") from None
        self.stream, self.layout = stream, layout
        self._pinned: list = []

    def __len__(self) -> int:
        return len(self.stream)

    def _tensors(self, images, labels):
        """The batch as tensors where it is: a view of a host array's private buffer (no copy, no
        warning), or the exchange's tensor on its device; in the layout asked for."""
        torch = self.torch
        x = images if isinstance(images, torch.Tensor) else torch.from_numpy(images)
        x = in_layout(torch, x, self.sample_layout, self.layout)
        y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        return x, (y if x.device.type == "cpu" else y.to(x.device))

    def _there(self, x) -> bool:
        """Whether ``x`` is on the device asked for (None: wherever the stream's batches are)."""
        d = self.device
        return d is None or (x.device.type == d.type and (d.index is None or x.device.index == d.index))

    def _to_device(self, x, y, slot: int):
        """Through the slot's pinned buffers to the device, without blocking the host."""
        torch = self.torch
        if len(self._pinned) <= slot:
            self._pinned.append((torch.empty(x.shape, dtype=x.dtype, pin_memory=True),
                                 torch.empty(y.shape, dtype=y.dtype, pin_memory=True)))
        px, py = self._pinned[slot]
        if px.shape != x.shape:  # a short last batch (skip mode)
            px, py = px[: x.shape[0]], py[: y.shape[0]]
        px.copy_(x)
        py.copy_(y)
        done = torch.cuda.Event()
        gx, gy = px.to(self.device, non_blocking=True), py.to(self.device, non_blocking=True)
        done.record()
        return gx, gy, done

    def __iter__(self):
        ahead = None  # the batch whose copy to the device is in flight
        for step, (images, labels) in enumerate(self.stream._batches(writable=True, tensors=True)):
            x, y = self._tensors(images, labels)
            if self._there(x):
                yield x, y
                continue
            if self.device.type != "cuda" or x.device.type != "cpu":
                yield x.to(self.device), y.to(self.device)
                continue
            sent = self._to_device(x, y, step % 2)
            if ahead is not None:
                ahead[2].synchronize()
                yield ahead[0], ahead[1]
            ahead = sent
        if ahead is not None:
            ahead[2].synchronize()
            yield ahead[0], ahead[1]

    def loader(self):
        """These batches as a ``torch.utils.data.DataLoader``, for integrations that accept nothing
        else: an ``IterableDataset`` of whole batches with ``batch_size=None`` and no workers, so
        each iteration is one epoch of the same tensors (no collation, no copy, every sample once)."""
        data = self.torch.utils.data

        class Batches(data.IterableDataset):
            def __init__(self, batches):
                self.batches = batches

            def __iter__(self):
                return iter(self.batches)

            def __len__(self) -> int:
                return len(self.batches)

        return data.DataLoader(Batches(self), batch_size=None, num_workers=0)


def in_layout(torch, x, have: str | None, want: str | None):
    """A batch ``x`` of samples in layout ``have`` (``HWC``, ``CHW``) as ``want`` (:data:`LAYOUTS`,
    None: as it is): a view where the memory already is so, else one copy."""
    if want is None or have is None:
        return x
    if have == "HWC":
        if want == "NHWC":
            return x
        x = x.permute(0, 3, 1, 2)  # an NCHW view over NHWC memory: channels_last already
        return x.contiguous() if want == "NCHW" else x
    if want == "NCHW":
        return x
    if want == "NHWC":
        return x.permute(0, 2, 3, 1).contiguous()
    return x.contiguous(memory_format=torch.channels_last)


class JaxBatches:
    """One epoch of ``(images, labels)`` ``jax.Array`` s on ``device`` (default: JAX's first),
    each a copy of the batch, never an alias of enspipe's buffers. Labels are int32, or int64
    where ``jax_enable_x64`` is on.

    Example::

        for images, labels in stream.jax():
            params, opt_state = train_step(params, opt_state, images, labels)
    """

    def __init__(self, stream, device=None):
        self.jax = require_framework("jax", "jax")
        self.stream, self.device = stream, device

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self):
        put = self.jax.device_put
        wide = bool(self.jax.config.read("jax_enable_x64"))
        for images, labels in self.stream._batches(writable=False):
            labels = np.array(labels, dtype=np.int64 if wide else np.int32)  # JAX's own integer width
            yield put(np.array(images), self.device), put(labels, self.device)


def lightning_member():
    """A Lightning cluster environment for one ensemble member: a job of one process, rank 0.

    Pass it to each member's ``Trainer(devices=1, plugins=[enspipe.lightning_member()])``. Under
    ``torchrun`` or ``mpiexec`` Lightning otherwise finds an environment of several processes
    (TorchElastic's, MPI's) and would make the members one data-parallel model; with it, each
    member's Trainer trains its own model on the shared stream, logs and saves its own checkpoints,
    and never starts or joins a process group (the stream's own, under torchrun, is left alone)."""
    environments = require_framework("lightning.pytorch.plugins.environments", "lightning")

    class MemberEnvironment(environments.LightningEnvironment):
        """One process, rank 0, on its own node (see :func:`lightning_member`)."""

        @staticmethod
        def detect() -> bool:
            return True

        def world_size(self) -> int:
            return 1

        def set_world_size(self, size: int) -> None:
            """Lightning's count of devices x nodes: one, and this member is all of it."""

        def global_rank(self) -> int:
            return 0

        def set_global_rank(self, rank: int) -> None:
            """Always 0: this member's Trainer is a job of its own."""

        def local_rank(self) -> int:
            return 0

        def node_rank(self) -> int:
            return 0

    return MemberEnvironment()
