"""The embedded default dataset: real JPEG-encoded TF-Slim ImageNet-format TFRecord shards of
synthetic images, deterministic from a seed.

Sizes follow ImageNet's training set (mean about 400x350 px, JPEG about 110 KB): each image is a
class-coloured gradient with random shapes and a fine texture whose strength sets the JPEG size.
Every image is drawn from ``numpy.random.default_rng((seed, index))``, so the dataset does not
depend on how it is generated.
"""
from __future__ import annotations

import math
import os
import shutil

import numpy as np
import tensorflow as tf

from enspipe.data import MANIFEST, Manifest, add_digests, digest_of, manifest_dict, sample_ids, write_json_atomic

JPEG_QUALITY = 90


def _bytes(v: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))


def _int(v: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))


def slim_example(encoded: bytes, label: int, height: int, width: int, filename: str, synset: str) -> bytes:
    """A ``tf.train.Example`` with TF-Slim's ImageNet feature keys."""
    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": _bytes(encoded), "image/format": _bytes(b"JPEG"),
        "image/class/label": _int(label), "image/class/synset": _bytes(synset.encode()),
        "image/class/text": _bytes(synset.encode()), "image/height": _int(height), "image/width": _int(width),
        "image/colorspace": _bytes(b"RGB"), "image/channels": _int(3), "image/filename": _bytes(filename.encode()),
    })).SerializeToString()


def synthetic_image(seed: int, index: int, num_classes: int) -> tuple[np.ndarray, int]:
    """One synthetic RGB uint8 image and its label."""
    rng = np.random.default_rng((seed, index))
    label = int(rng.integers(num_classes))
    h = int(np.clip(rng.normal(350, 60), 180, 520))
    w = int(np.clip(rng.normal(400, 70), 200, 600))
    base = np.array([(label * 37) % 256, (label * 91) % 256, (label * 53) % 256], np.float32)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    ramp = (np.cos(angle) * xx / w + np.sin(angle) * yy / h)[..., None]
    img = base * 0.6 + 80.0 * ramp + rng.uniform(-40, 40, 3)
    for _ in range(int(rng.integers(3, 9))):  # random ellipses
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(10, h / 3), rng.uniform(10, w / 3)
        mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
        img[mask] = img[mask] * 0.4 + rng.uniform(0, 255, 3) * 0.6
    texture = rng.normal(0.0, rng.uniform(36, 46), (h, w, 1)) + rng.normal(0.0, 24.0, (h, w, 3))
    return np.clip(img + texture, 0, 255).astype(np.uint8), label


def write_shards(out: str, samples, num_images: int, num_classes: int, images_per_shard: int,
                 info: dict, synthetic: bool) -> Manifest:
    """Write ``(jpeg, label, height, width, filename, synset)`` samples as Slim TFRecord shards
    ``train-XXXXX-of-YYYYY`` and, last and atomically, ``manifest.json``."""
    num_shards = max(1, math.ceil(num_images / images_per_shard))
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, MANIFEST)):
        os.remove(os.path.join(out, MANIFEST))  # an incomplete rewrite must not look complete
    tmp = os.path.join(out, ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    names, counts, digest, total_bytes, it = [], [], digest_of([]), 0, iter(samples)
    for s in range(num_shards):
        name = f"train-{s:05d}-of-{num_shards:05d}"
        n = min(images_per_shard, num_images - s * images_per_shard)
        with tf.io.TFRecordWriter(os.path.join(tmp, name)) as writer:
            for _ in range(n):
                encoded, label, h, w, filename, synset = next(it)
                writer.write(slim_example(encoded, label, h, w, filename, synset))
                total_bytes += len(encoded)
        names.append(name)
        counts.append(n)
        digest = add_digests(digest, digest_of(sample_ids([f"{name}:{i}" for i in range(n)])))
    for name in names:
        os.replace(os.path.join(tmp, name), os.path.join(out, name))
    os.rmdir(tmp)
    info = dict(info, mean_jpeg_bytes=round(total_bytes / max(1, num_images)))
    m = Manifest(out, "tfrecord", num_images, num_classes, digest, tuple(names), synthetic=synthetic, info=info,
                 counts=tuple(counts), sizes=tuple(os.path.getsize(os.path.join(out, n)) for n in names))
    write_json_atomic(os.path.join(out, MANIFEST), manifest_dict(m))
    return m


def ensure_dataset(out: str, num_images: int, seed: int = 0) -> Manifest:
    """The dataset in ``out`` if its manifest is there (a complete earlier run), else a new one."""
    from enspipe.data import load_manifest

    if os.path.exists(os.path.join(out, MANIFEST)):
        return load_manifest(out)
    return make_dataset(out, num_images, seed)


def make_dataset(out: str, num_images: int, seed: int = 0, num_classes: int = 100,
                 images_per_shard: int = 256) -> Manifest:
    """Generate the embedded default dataset into ``out``."""
    if num_images < 1:
        raise ValueError("--num-images must be >= 1")

    def samples():
        for i in range(num_images):
            img, label = synthetic_image(seed, i, num_classes)
            encoded = tf.io.encode_jpeg(img, quality=JPEG_QUALITY).numpy()
            yield encoded, label, img.shape[0], img.shape[1], f"synthetic_{seed}_{i:08d}.JPEG", f"class{label:04d}"

    info = {"generator": "enspipe.synthetic", "seed": seed, "jpeg_quality": JPEG_QUALITY}
    return write_shards(out, samples(), num_images, num_classes, images_per_shard, info, synthetic=True)
