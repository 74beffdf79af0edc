"""The embedded default dataset: real JPEG-encoded TF-Slim ImageNet-format TFRecord shards of
synthetic images, deterministic from a seed.

Sizes follow ImageNet's training set (mean about 400x350 px, JPEG about 110 KB): each image is a
class-coloured gradient with random shapes and a fine texture whose strength sets the JPEG size.
Every image is drawn from ``numpy.random.default_rng((seed, index))``, so the dataset does not
depend on how it is generated.
"""
from __future__ import annotations

import io
import math
import os

import numpy as np
from PIL import Image

from enspipe.data.build import load_manifest
from enspipe.data.manifest import MANIFEST, Manifest
from enspipe.data.records import write_shards

JPEG_QUALITY = 90


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


def synthetic_jpeg(seed: int, index: int, num_classes: int = 100) -> tuple[bytes, int, tuple[int, int]]:
    """One image of the embedded dataset as its shards hold it: ``(JPEG, label, (height, width))``."""
    img, label = synthetic_image(seed, index, num_classes)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "JPEG", quality=JPEG_QUALITY)  # libjpeg's 4:2:0, as TensorFlow's encoder
    return buf.getvalue(), label, img.shape[:2]


def ensure_dataset(out: str, num_images: int, seed: int = 0, num_classes: int = 100) -> Manifest:
    """The dataset in ``out`` if its manifest is there (a complete earlier run), else a new one."""
    if os.path.exists(os.path.join(out, MANIFEST)):
        return load_manifest(out)
    return make_dataset(out, num_images, seed, num_classes)


def make_dataset(out: str, num_images: int, seed: int = 0, num_classes: int = 100,
                 images_per_shard: int = 256) -> Manifest:
    """Generate the embedded default dataset into ``out``."""
    if num_images < 1:
        raise ValueError("--num-images must be >= 1")

    def samples():
        for i in range(num_images):
            encoded, label, (h, w) = synthetic_jpeg(seed, i, num_classes)
            yield encoded, label, h, w, f"synthetic_{seed}_{i:08d}.JPEG", f"class{label:04d}"

    info = {"generator": "enspipe.synthetic", "seed": seed, "jpeg_quality": JPEG_QUALITY}
    return write_shards(out, samples(), num_images, num_classes, images_per_shard, info, synthetic=True)
