"""Natural photographs for measuring and testing preprocessing: random crops of the photos that
ship inside scikit-image (``skimage.data``: an astronaut, a cat, coffee, a rocket, a retina, the
Hubble deep field, a tissue stain; a camera man, the moon and coins in grey), 330-500 px a side,
re-encoded as JPEG at quality 90 by Pillow. Synthetic JPEGs decode unlike photographs; these
decode like ImageNet's. Most are baseline 4:2:0 as ImageNet's are; every fifth is 4:4:4, every
seventh progressive, and the grey sources stay one channel.

Example::

    from enspipe.data.photos import photo_jpegs, write_photo_folder

    jpegs = photo_jpegs(64)                       # a list of encoded JPEGs (bytes)
    write_photo_folder("data/photos", 512)        # JPEG class folders, a dataset enspipe reads

Needs scikit-image (``pip install scikit-image``; the ``test`` extra has it).
"""
from __future__ import annotations

import io
import os

import numpy as np

SOURCES = ("astronaut", "chelsea", "coffee", "rocket", "retina", "hubble_deep_field", "immunohistochemistry",
           "camera", "moon", "coins")
SIDES = (330, 500)


def _sources() -> dict[str, np.ndarray]:
    try:
        from skimage import data
    except ImportError:
        raise RuntimeError("the photo set needs scikit-image: pip install scikit-image") from None
    return {name: getattr(data, name)() for name in SOURCES}


def _crop(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random crop of 330-500 px a side (the source's side where it is smaller), after a random
    downscale of up to 2x of a large source (so crops of one photo show it at several scales)."""
    from PIL import Image

    h, w = image.shape[:2]
    scale = rng.uniform(max(SIDES[1] / min(h, w), 0.5), 1.0) if min(h, w) > SIDES[1] else 1.0
    if scale < 1.0:
        image = np.asarray(Image.fromarray(image).resize((round(w * scale), round(h * scale)), Image.Resampling.BOX))
        h, w = image.shape[:2]
    ch, cw = (min(side, int(rng.integers(SIDES[0], SIDES[1] + 1))) for side in (h, w))
    top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    return image[top:top + ch, left:left + cw]


def photo_jpegs(n: int, seed: int = 0, quality: int = 90) -> list[tuple[str, bytes]]:
    """``n`` JPEGs cropped from scikit-image's photos, each as ``(source name, encoded bytes)``;
    the same ones for the same ``seed``."""
    from PIL import Image

    sources, rng = _sources(), np.random.default_rng(seed)
    out = []
    for i in range(n):
        name = SOURCES[i % len(SOURCES)]
        buf = io.BytesIO()
        options = {"quality": quality, "subsampling": 0 if i % 5 == 4 else 2, "progressive": i % 7 == 6}
        Image.fromarray(_crop(sources[name], rng)).save(buf, "JPEG", **options)
        out.append((name, buf.getvalue()))
    return out


def write_photo_folder(root: str, n: int, seed: int = 0) -> str:
    """``n`` photo JPEGs as class folders under ``root`` (a class per source photo), written once:
    a folder that already holds ``n`` of them is kept. Returns ``root``."""
    done = os.path.join(root, ".photos-complete")
    if os.path.exists(done) and open(done).read().strip() == f"{n} {seed}":
        return root
    for i, (name, jpeg) in enumerate(photo_jpegs(n, seed)):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        with open(os.path.join(root, name, f"{i:06d}.jpg"), "wb") as f:
            f.write(jpeg)
    with open(done, "w") as f:
        f.write(f"{n} {seed}")
    return root
