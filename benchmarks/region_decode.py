"""What decoding only the crop's region saves each built-in preprocessing on the pillow backend:
every image preprocessed twice, once with the region decode (:mod:`enspipe.data._jpegregion`) and
once with the whole decode it replaces, the two interleaved image by image (their order
alternating), on natural photographs (:mod:`enspipe.data.photos`), one thread, to float32.

    python benchmarks/region_decode.py [--images 256] [--size 224] [--repeats 3]
"""
from __future__ import annotations

import argparse
import time

import cv2
import numpy as np

from enspipe.data import decoding, pixels
from enspipe.data.photos import photo_jpegs


def paired(jpegs: list[bytes], name: str, size: int) -> tuple[float, float]:
    """µs per image with the whole decode and with the region decode, interleaved image by image."""
    region, spent = decoding._jpegregion, [0, 0]
    try:
        for i, b in enumerate(jpegs):
            for way in ((0, 1) if i % 2 else (1, 0)):
                decoding._jpegregion = region if way else None
                t = time.perf_counter_ns()
                pixels.to_wire(name, pixels.PREPROCESSING[name](b, size, pixels.generator(0, i)), "float32")
                spent[way] += time.perf_counter_ns() - t
    finally:
        decoding._jpegregion = region
    return spent[0] / len(jpegs) / 1e3, spent[1] / len(jpegs) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not decoding.REGION_DECODE:
        raise SystemExit("region_decode: enspipe.data._jpegregion is not built (apt-get install libjpeg-dev, reinstall)")
    cv2.setNumThreads(1)
    jpegs = [b for _, b in photo_jpegs(a.images)]
    print(f"{len(jpegs)} photos, {a.size} px, one thread, {a.repeats} repeats: µs per image (min-max)")
    print(f"{'preprocessing':14s} {'whole decode':>14s} {'region decode':>14s} {'region / whole':>16s}")
    for name in ("standard", "inception", "vgg"):
        runs = [paired(jpegs, name, a.size) for _ in range(a.repeats)]
        whole, region = [w for w, _ in runs], [r for _, r in runs]
        ratio = [r / w for w, r in runs]
        print(f"{name:14s} {min(whole):6.0f}-{max(whole):<6.0f} {min(region):6.0f}-{max(region):<6.0f}"
              f" {np.median(ratio):6.2f} ({min(ratio):.2f}-{max(ratio):.2f})")


if __name__ == "__main__":
    main()
