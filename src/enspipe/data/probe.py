"""A user's preprocessing, tried on the dataset's first samples before any member starts: it must
run, in a tf.data graph, and return one static shape and one dtype for every sample."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from enspipe.data.manifest import Manifest
from enspipe.data.preprocessing import UserPreprocess, decode
from enspipe.data.parse import first_images
from enspipe.data.transforms import PreprocessError, sample_layout


def probe_preprocess(fn, m: Manifest, seed: int) -> UserPreprocess:
    """``fn`` run in a tf.data graph on the dataset's first samples, with their seeds; returns it
    with its output's shape and dtype, or raises :class:`PreprocessError` naming it."""
    name = getattr(fn, "__qualname__", repr(fn))
    encoded = first_images(m)

    def one(e, position):
        return fn(decode(e), tf.stack([tf.constant(seed, tf.int64), position]))

    try:
        ds = tf.data.Dataset.from_tensor_slices((encoded, np.arange(len(encoded), dtype=np.int64))).map(one)
        spec = ds.element_spec
        outs = [x.numpy() for x in ds] if isinstance(spec, tf.TensorSpec) else []
    except Exception as e:  # noqa: BLE001 - whatever the user's code raised, named
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        said = lines[-1] if lines else type(e).__name__  # autograph puts the user's own words last
        raise PreprocessError(f"preprocess {name} failed on the dataset's first sample: {said}",
                              "fix the function: it gets one decoded uint8 image (H x W x 3) and an int64 seed [2] "
                              "and returns a tensor") from None
    if not isinstance(spec, tf.TensorSpec):
        raise PreprocessError(f"preprocess {name} returned {spec}, not one tensor", "return a single tensor")
    if not spec.shape.is_fully_defined():
        raise PreprocessError(f"preprocess {name} returns shape {spec.shape} in a graph, not a fixed one",
                              "resize or crop to a fixed size (tf.image.resize, tf.ensure_shape)")
    shapes = {tuple(x.shape) for x in outs}
    if len(shapes) > 1 or shapes != {tuple(spec.shape)}:
        raise PreprocessError(f"preprocess {name} returned shapes {sorted(shapes)} for the dataset's first "
                              f"{len(outs)} samples", "return one shape for every sample")
    shape = tuple(spec.shape.as_list())
    try:
        layout = sample_layout(shape)
    except PreprocessError as e:
        raise PreprocessError(f"preprocess {name}: {e.problem}", e.fix) from None
    return UserPreprocess(fn, shape, np.dtype(spec.dtype.as_numpy_dtype), layout)
