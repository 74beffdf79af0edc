"""What both streams (:class:`~enspipe.SharedStream` and :class:`~enspipe.api.attach.AttachedStream`)
offer a training script, written once over what each provides:

* ``_batches(writable)``: one epoch of ``(images, labels)`` numpy batches (``writable``: arrays a
  framework may take without a copy);
* ``_endless()``: ``(images, labels)`` batches until the stream closes (``dataset()``'s);
* ``element_spec``, ``sample_layout`` (``HWC``, ``CHW`` or None: what the preprocessing returns),
  ``steps_per_epoch``, ``_ledger`` and ``_dataset_batch`` (the batch dimension of every batch, or
  None where an epoch's last may be smaller).
"""
from __future__ import annotations


class StreamAdapters:
    """The numpy, PyTorch, JAX and tf.data iteration of a stream."""

    _dataset_batch: int | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.steps_per_epoch

    def __iter__(self):
        """The (rest of this) epoch's batches, as ``(images, labels)`` numpy arrays."""
        return self._batches(writable=False)

    def torch(self, layout: str | None = None, device=None):
        """One epoch as PyTorch ``(images, labels)`` tensors (:class:`~enspipe.api.frameworks.TorchBatches`):
        ``layout`` ``NCHW``, ``channels_last`` or ``NHWC``, whatever the samples' own (None, the
        default: the samples' own, as a ``DataLoader`` collates them); ``device`` e.g. ``"cuda"``.

        Example::

            for images, labels in stream.torch(layout="channels_last", device="cuda"):
                ...
        """
        from enspipe.api.frameworks import TorchBatches

        return TorchBatches(self, layout, device)

    def jax(self, device=None):
        """One epoch as ``(images, labels)`` ``jax.Array`` s, copies on ``device``
        (:class:`~enspipe.api.frameworks.JaxBatches`).

        Example::

            for images, labels in stream.jax():
                ...
        """
        from enspipe.api.frameworks import JaxBatches

        return JaxBatches(self, device)

    def dataset(self):
        """The stream as an endless ``tf.data.Dataset`` of ``(images, labels)`` batches: pass
        ``steps_per_epoch=stream.steps_per_epoch`` to ``model.fit``."""
        from enspipe.api.frameworks import tf_dataset

        return tf_dataset(self._endless, *self.element_spec, batch=self._dataset_batch)

    def epochs(self) -> list[dict]:
        """The epochs completed: per epoch its ``count`` of samples, their order-free ``digest``
        and how many are ``missing`` (0: every sample exactly once)."""
        return self._ledger.completed()
