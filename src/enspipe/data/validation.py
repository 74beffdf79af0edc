"""A validation set: a small dataset, read once in its canonical order and preprocessed without
random distortion (Slim's evaluation transform, or a user's preprocessing at a fixed seed), held
in memory."""
from __future__ import annotations

import numpy as np


def load_validation(root: str, preprocessing, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(images [M, ...], labels int32 [M])`` of the dataset at ``root``. ``preprocessing``: a
    built-in's name (its evaluation transform: ``float32 [M, size, size, 3]``) or a
    :class:`~enspipe.data.preprocessing.UserPreprocess` (its function, seed ``[0, position]``)."""
    import tensorflow as tf

    from enspipe.data.preprocessing import EVAL_PREPROCESSING, UserPreprocess, decode
    from enspipe.data.shards import load_manifest, load_samples, sample_stream, without_autotune

    m = load_manifest(root)
    if isinstance(preprocessing, UserPreprocess):
        fn, spec = preprocessing.fn, tf.TensorSpec(preprocessing.shape, tf.as_dtype(preprocessing.dtype))

        def evaluate_batch(b):
            return tf.map_fn(lambda e: fn(decode(e[0]), tf.stack([tf.constant(0, tf.int64), e[1]])),
                             (b["encoded"], b["position"]), fn_output_signature=spec)
    else:
        evaluate = EVAL_PREPROCESSING[preprocessing]

        def evaluate_batch(b):
            return tf.map_fn(lambda e: evaluate(decode(e), size), b["encoded"],
                             fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32))
    ds = (sample_stream(m, 0, shuffle_buffer=0, in_graph=True).take(m.num_images).batch(64)
          .map(lambda b: load_samples(m.kind, b))
          .map(lambda b: (evaluate_batch(b), b["label"])))
    images, labels = zip(*((x.numpy(), y.numpy()) for x, y in without_autotune(ds)))
    return np.concatenate(images), np.concatenate(labels).astype(np.int32)
