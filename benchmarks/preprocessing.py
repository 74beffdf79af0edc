"""Preprocessing cost per image: images/s per core and CPU ms per image, per preprocessing and
thread count, on the embedded synthetic dataset (real JPEG decode + Slim augmentation).

    python benchmarks/preprocessing.py [--images 256] [--size 224] [--repeats 3]

Each row runs the tf.data map over the same encoded images with a private pool of T threads,
after one warm-up pass; it reports the median of the repeats and their spread.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import tensorflow as tf

from enspipe.data.shards import read_slices
from enspipe.data.preprocessing import make_preprocess_fn
from enspipe.data.synthetic import ensure_dataset


def encoded_images(n: int) -> list[bytes]:
    m = ensure_dataset(os.path.join(tempfile.gettempdir(), f"enspipe-bench-{n}"), n)
    return tf.constant(next(read_slices(m, 0, 0, False, n, 0, n))["encoded"])


def measure(encoded, name: str, size: int, threads: int, fast: bool) -> tuple[float, float]:
    fn = make_preprocess_fn(name, size, fast)
    ds = tf.data.Dataset.from_tensor_slices(encoded).enumerate()
    ds = ds.map(lambda i, e: fn(e, tf.stack([tf.constant(0, tf.int64), i])), num_parallel_calls=threads)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    opts.threading.max_intra_op_parallelism = 1
    ds = ds.with_options(opts)
    t, cpu = time.perf_counter(), time.process_time()
    for _ in ds:
        pass
    return time.perf_counter() - t, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    encoded = encoded_images(a.images)
    print(f"{a.images} synthetic JPEGs, {a.size} px, {os.cpu_count()} CPUs visible, median of {a.repeats}")
    print(f"{'preprocessing':<22}{'threads':>8}{'img/s':>10}{'img/s/core':>12}{'CPU ms/img':>12}{'spread':>9}")
    for name, fast in (("inception", False), ("inception", True), ("vgg", False)):
        for threads in (1, 2):
            measure(encoded, name, a.size, threads, fast)  # warm-up: tracing, caches
            runs = [measure(encoded, name, a.size, threads, fast) for _ in range(a.repeats)]
            walls, cpus = np.array([r[0] for r in runs]), np.array([r[1] for r in runs])
            rate = a.images / np.median(walls)
            label = f"{name}{' (fast_mode)' if fast else ''}"
            print(f"{label:<22}{threads:>8}{rate:>10.1f}{rate / threads:>12.1f}"
                  f"{1000 * np.median(cpus) / a.images:>12.2f}{(walls.max() - walls.min()) / np.median(walls):>8.0%}")


if __name__ == "__main__":
    main()
