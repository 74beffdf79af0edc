"""A validation set: a small dataset, read once in its canonical order and preprocessed without
random distortion (Slim's evaluation transform, or a user's preprocessing at a fixed seed), held
in memory."""
from __future__ import annotations

import numpy as np

from enspipe.data.build import load_manifest
from enspipe.data.order import NumpyOrder, read_share
from enspipe.data.parse import resolve
from enspipe.data.records import record_format


def load_validation(root: str, preprocessing, size: int, tensorflow: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(images [M, ...], labels int32 [M])`` of the dataset at ``root`` (any format the stream
    reads). ``preprocessing``: a built-in's name (its evaluation transform: ``float32 [M, size,
    size, 3]``) or a :class:`~enspipe.data.preprocessing.UserPreprocess` (its function, seed
    ``[0, position]``). ``tensorflow``: in TensorFlow's ops (the tf backend's), else without them
    (:mod:`enspipe.data.pixels`, the built-ins' and users' pipelines on arrays)."""
    if not tensorflow:
        return _load_without_tensorflow(root, preprocessing, size)
    import tensorflow as tf

    from enspipe.data.preprocessing import EVAL_PREPROCESSING, UserPreprocess, decode
    from enspipe.data.shards import read_slices, without_autotune

    m = load_manifest(root)
    samples = next(read_slices(m, 0, 0, False, m.num_images, 0, m.num_images))  # one canonical epoch
    if isinstance(preprocessing, UserPreprocess):
        def one(encoded, position):
            return preprocessing.fn(decode(encoded), tf.stack([tf.constant(0, tf.int64), position]))
    else:
        evaluate = EVAL_PREPROCESSING[preprocessing]

        def one(encoded, position):
            return evaluate(decode(encoded), size)
    ds = tf.data.Dataset.from_tensor_slices((list(samples["encoded"]), samples["position"])).map(one).batch(64)
    images = np.concatenate([x.numpy() for x in without_autotune(ds)])
    return images, np.asarray(samples["label"]).astype(np.int32)


def _load_without_tensorflow(root: str, preprocessing, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The pillow backend's: a built-in's evaluation transform, or a user's pipeline
    (:class:`~enspipe.data.transforms.ArrayPreprocess`: given what it takes, seeded by position)."""
    from enspipe.data import pixels

    m = load_manifest(root)
    n = m.num_images
    samples = next(read_share(m, NumpyOrder(m, 0, 0), resolve(record_format(m)), False, n, 0, n))
    if isinstance(preprocessing, str):
        evaluate = pixels.EVAL_PREPROCESSING[preprocessing]
        images = np.stack([pixels.to_wire(preprocessing, evaluate(e, size), "float32") for e in samples["encoded"]])
    else:
        from enspipe.data import transforms
        from enspipe.data.decoding import decode

        images = np.stack([transforms.apply(preprocessing.fn, decode(e), transforms.sample_seed(0, int(p)),
                                            preprocessing.given)
                           for e, p in zip(samples["encoded"], samples["position"])])
    return images, np.asarray(samples["label"]).astype(np.int32)
