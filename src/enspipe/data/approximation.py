"""The error of an approximate preprocessing path, measured on a dataset's own images: the
``fused-colour`` path against the exact one (crop-first), same samples and seeds, both backends.

Example::

    fused_colour_error(manifest, tensorflow=True, size=224)   # {'samples': 16, 'mean_abs_error': ..., ...}
"""
from __future__ import annotations

import numpy as np

from enspipe.data.order import NumpyOrder, read_share
from enspipe.data.parse import resolve
from enspipe.data.records import record_format

WHAT = ("fused-colour: Slim's colour distortion as one affine map in YIQ (hue and saturation as DALI's Hsv "
        "does them), clipped once; the exact path uses HSV")


def first_images(m, count: int) -> list[bytes]:
    """The dataset's first ``count`` encoded images in canonical order (read without TensorFlow)."""
    count = min(count, m.num_images)
    item = next(read_share(m, NumpyOrder(m, 0, 0), resolve(record_format(m)), True, count, 0, count))
    return [e for e in item["encoded"] if len(e)]


def _outputs(encoded: list[bytes], tensorflow: bool, size: int, fast_mode: bool, fused: bool) -> np.ndarray:
    """inception's outputs in [-1, 1] of the images (seed 0, position i), exact or fused."""
    if tensorflow:
        import tensorflow as tf

        from enspipe.data.preprocessing import make_preprocess_fn

        fn = tf.function(make_preprocess_fn("inception", size, fast_mode, "fused-colour" if fused else "crop-first"))
        return np.stack([fn(tf.constant(e), tf.constant([0, i], tf.int64)).numpy() for i, e in enumerate(encoded)])
    from enspipe.data import pixels as px

    return np.stack([px.to_wire("inception", px.inception_train(e, size, px.generator(0, i), fast_mode, fused),
                                "float32") for i, e in enumerate(encoded)])


def fused_colour_error(m, tensorflow: bool, size: int, fast_mode: bool = False, count: int = 16) -> dict:
    """The fused colour's error against the exact path on the dataset's first ``count`` images, in
    the output's units (its range is [-1, 1]): mean, 99th percentile and largest absolute error."""
    encoded = first_images(m, count)
    diff = np.abs(_outputs(encoded, tensorflow, size, fast_mode, True) - _outputs(encoded, tensorflow, size, fast_mode,
                                                                                 False))
    return {"what": WHAT, "samples": len(encoded), "range": [-1.0, 1.0], "mean_abs_error": float(diff.mean()),
            "p99_abs_error": float(np.percentile(diff, 99)), "max_abs_error": float(diff.max())}
