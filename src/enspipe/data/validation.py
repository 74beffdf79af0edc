"""A validation set for early stopping: a small dataset, read once in its canonical order and
preprocessed with Slim's evaluation transform (no random distortion), held in memory."""
from __future__ import annotations

import numpy as np


def load_validation(root: str, preprocessing: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(images float32 [M, size, size, 3], labels int32 [M])`` of the dataset at ``root``."""
    import tensorflow as tf

    from enspipe.data.preprocessing import EVAL_PREPROCESSING, decode
    from enspipe.data.shards import load_manifest, load_samples, sample_stream, without_autotune

    m = load_manifest(root)
    evaluate = EVAL_PREPROCESSING[preprocessing]
    ds = (sample_stream(m, 0, shuffle_buffer=0, in_graph=True).take(m.num_images).batch(64)
          .map(lambda b: load_samples(m.kind, b))
          .map(lambda b: (tf.map_fn(lambda e: evaluate(decode(e), size), b["encoded"],
                                    fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32)), b["label"])))
    images, labels = zip(*((x.numpy(), y.numpy()) for x, y in without_autotune(ds)))
    return np.concatenate(images), np.concatenate(labels).astype(np.int32)
