"""What every preprocessing backend shares: the spec of one member's preprocess stage, the
stages' stop signal, and the engine protocol.

A backend module (one per backend, registered in :mod:`enspipe.engine.backends`; what it can do
is its :class:`~enspipe.engine.backends.Backend` row, checked before any work) provides:

* ``slices(spec)``: this member's share of each unit of global batches, read and parsed (numpy
  dicts of ``encoded``, ``label``, ``id``, ``epoch``, ``position``, ``key``; nothing decoded);
* ``engine(spec)``: the preprocess engine, whose ``run(take)`` takes ``take()`` (the next slice;
  raises :class:`Stopped` once the pipeline stops) and yields ``(slice, images, meta, seconds)``
  (the slice as read, its images and ``[id, epoch, position, label]`` rows, skipped images left
  out in skip mode, and the seconds it worked on it, not counting its waits for input), and whose
  ``close()`` frees what it holds;
* ``maker(spec)`` (a backend whose row ``serves``): the attach server's, whose ``make(encoded,
  positions, samples)`` makes a chunk of samples, each with the draws of its stream position,
  returning ``(images, {index: why})`` (an image undefined where it failed), and ``close()``; a
  maker on a GPU has ``device`` (and ``decodes``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from enspipe.common import spelling


class Stopped(Exception):
    """The pipeline was closed while a stage (or its consumer) waited."""


@dataclass(frozen=True)
class PrepSpec:
    """One member's read and preprocess stages: what a backend needs to build them."""

    manifest: Any               # enspipe.data.manifest.Manifest
    preprocessing: Any          # a built-in's name, or a UserPreprocess
    size: int
    fast_mode: bool
    wire_dtype: str
    impl: str
    order_seed: int
    prep_seed: int
    shuffle_buffer: int
    skip_corrupt: bool
    batch: int
    share: tuple[int, int]      # this member's share [lo, hi) of each global batch
    unit: int                   # global batches per read and preprocessing call
    threads: int                # the member's cores: its pool's threads, or its worker processes
    depth: int                  # the stage queues' depth
    image_shape: tuple
    image_dtype: Any
    cache: Any = None           # a DecodeCache, or None
    device: Any = None          # the torch device the member exchanges on (None: host memory)

    def __post_init__(self):
        if self.threads < 1:
            raise ValueError(f"threads: must be at least 1, got {self.threads}")
        if self.skip_corrupt and self.unit != 1:
            raise ValueError("--on-corrupt skip keeps each slice's own bounds: one batch at a time")

    @classmethod
    def of(cls, stream, manifest, preprocessing, *, seed: int, **member) -> "PrepSpec":
        """The spec of a member of ``stream`` (a :class:`~enspipe.engine.config.StreamConfig`)
        reading ``manifest``, its order and augmentation seeded by ``seed``; ``member``: its
        ``share``, ``unit``, ``threads``, ``image_shape``, ``image_dtype``, ``cache`` and ``device``."""
        return cls(manifest=manifest, preprocessing=preprocessing, size=stream.image_size, fast_mode=stream.fast_mode,
                   wire_dtype=stream.wire_dtype, impl=stream.preprocess_impl, order_seed=seed, prep_seed=seed,
                   shuffle_buffer=stream.shuffle_buffer, skip_corrupt=stream.skip_corrupt, batch=stream.batch_size,
                   depth=stream.queue_depth, **member)

    @property
    def slice_len(self) -> int:
        return self.share[1] - self.share[0]


def meta_rows(item: dict) -> np.ndarray:
    """A read slice's ``[id, epoch, position, label]`` rows."""
    return np.stack([item["id"], item["epoch"], item["position"], item["label"]], axis=1).astype(np.int64)


def kept(item: dict, failed: dict[int, str], skip_corrupt: bool) -> np.ndarray:
    """Which of a read slice's images a backend keeps: all but those that ``failed`` (index ->
    why) under ``skip_corrupt``; without it the first failure is a DataError naming its record."""
    if failed and not skip_corrupt:
        from enspipe.data.manifest import DataError

        bad = min(failed)
        raise DataError(undecodable(item["key"][bad], failed[bad]))
    ok = np.ones(len(item["id"]), bool)
    ok[list(failed)] = False
    return ok


def undecodable(key: bytes, why) -> str:
    return f"{key.decode()}: undecodable image ({why}); fix or remove the record, or {spelling.skip_hint()}"
