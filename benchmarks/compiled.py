"""What enspipe's compiled parts save each built-in preprocessing on the pillow backend: every image
preprocessed with and without each of them (the region decode, :mod:`enspipe.data._jpegregion`;
the antialiased resize, :mod:`enspipe.data._pixels`), the ways interleaved image by image in
an order that rotates, on natural photographs (:mod:`enspipe.data.photos`), one thread, to float32.

    python benchmarks/compiled.py [--images 256] [--size 224] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import cv2
import numpy as np

from enspipe.data import decoding, pixels
from enspipe.data.photos import photo_jpegs

WAYS = {"neither": (False, False), "region decode": (True, False), "C resize": (False, True), "both": (True, True)}


def timed(jpegs: list[bytes], name: str, size: int) -> dict[str, float]:
    """µs per image each way, the ways interleaved image by image."""
    built = decoding._jpegregion, pixels._pixels
    spent = dict.fromkeys(WAYS, 0)
    order = list(WAYS)
    try:
        for i, b in enumerate(jpegs):
            for way in order[i % 4:] + order[:i % 4]:
                region, resample = WAYS[way]
                decoding._jpegregion = built[0] if region else None
                pixels._pixels = built[1] if resample else None
                t = time.perf_counter_ns()
                pixels.to_wire(name, pixels.PREPROCESSING[name](b, size, pixels.generator(0, i)), "float32")
                spent[way] += time.perf_counter_ns() - t
    finally:
        decoding._jpegregion, pixels._pixels = built
    return {way: ns / len(jpegs) / 1e3 for way, ns in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not (decoding.REGION_DECODE and pixels.KERNELS):
        raise SystemExit(f"compiled: built here: region decode {decoding.REGION_DECODE}, resize {pixels.KERNELS}; "
                         "both are needed (apt-get install gcc libjpeg-dev, then reinstall enspipe)")
    cv2.setNumThreads(1)
    jpegs = [b for _, b in photo_jpegs(a.images)]
    print(f"{len(jpegs)} photos, {a.size} px, one thread, to float32, {a.repeats} repeats: µs per image, "
          "median (min-max); x: against neither, the median of each repeat's ratio")
    print(f"{'preprocessing':14s}" + "".join(f" {w:>24s}" for w in WAYS))
    for name in ("standard", "inception", "vgg"):
        runs = [timed(jpegs, name, a.size) for _ in range(a.repeats)]
        cells = []
        for way in WAYS:
            t = [r[way] for r in runs]
            x = np.median([r[way] / r["neither"] for r in runs])
            cells.append(f"{np.median(t):5.0f} ({min(t):.0f}-{max(t):.0f}) x{x:.2f}")
        print(f"{name:14s}" + "".join(f" {c:>24s}" for c in cells))


if __name__ == "__main__":
    main()
