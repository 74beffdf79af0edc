"""Where ``standard``'s CPU goes, step by step, beside torchvision's own transform and other
libraries' ways of doing each step, on natural photographs (:mod:`enspipe.data.photos`), one
thread, the same crop boxes and flips for every row.

    python benchmarks/standard_steps.py [--images 256] [--size 224] [--repeats 3]

Needs torch and torchvision (``.venv-notf`` has them); simplejpeg's row runs where it is installed.
Every row is a pass over the images on the thread's CPU clock, the rows interleaved within each
repeat; the table shows each row's median over the repeats and its range, and, for a resize, its
difference from torchvision's ``resized_crop(antialias=True)`` on the same decoded pixels (the
values ``RandomResizedCrop`` gives): the mean absolute difference, its 99th percentile and its
largest, in 8-bit levels.
"""
from __future__ import annotations

import argparse
import time

import cv2
import numpy as np
import torch
from PIL import Image
from torchvision.io import decode_jpeg
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from enspipe.data import decoding, pixels
from enspipe.data.photos import photo_jpegs

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def rows(jpegs: list[bytes], size: int) -> dict:
    """Each row's function of the image's index, and the resize rows' outputs' reference."""
    rng = np.random.default_rng(0)
    rgb = [cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB) for b in jpegs]
    boxes = [pixels.resized_crop_box(rng, im.shape[1], im.shape[0]) for im in rgb]
    flips = rng.random(len(jpegs)) < 0.5
    tensors = [torch.from_numpy(im).permute(2, 0, 1) for im in rgb]
    parts = [decoding.decoded_box(b, decoding.open_image(b), (l, t, l + w, t + h), size)
             for b, (l, t, w, h) in zip(jpegs, boxes)]
    made = [np.asarray(Image.fromarray(p).resize((size, size), Image.Resampling.BILINEAR, box=box)) for p, box in parts]
    tv = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    norm = v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    made_chw = [torch.from_numpy(m.copy()).permute(2, 0, 1) for m in made]  # torch's own layout, writable

    def crop(i):
        l, t, w, h = boxes[i]
        return rgb[i][t:t + h, l:l + w]

    def tv_resize(i):
        l, t, w, h = boxes[i]
        return F.resized_crop(tensors[i], t, l, h, w, [size, size], antialias=True).permute(1, 2, 0).numpy()

    def cv_resize(i, method):
        return cv2.resize(crop(i), (size, size), interpolation=method)

    table = {
        "header (Pillow's Image.open)": ("decode", lambda i: decoding.open_image(jpegs[i]).size),
        "whole decode, OpenCV (BGR)": ("decode", lambda i: cv2.imdecode(np.frombuffer(jpegs[i], np.uint8),
                                                                          cv2.IMREAD_COLOR)),
        "whole decode, torchvision (RGB)": ("decode", lambda i: decode_jpeg(torch.frombuffer(bytearray(jpegs[i]),
                                                                                              dtype=torch.uint8))),
        "enspipe: header, crop's DCT-scale decode, RGB": ("decode", lambda i: decoding.decoded_box(
            jpegs[i], decoding.open_image(jpegs[i]), (boxes[i][0], boxes[i][1], boxes[i][0] + boxes[i][2],
                                                      boxes[i][1] + boxes[i][3]), size)),
        "enspipe: resize (Pillow, antialiased, box)": ("resize", lambda i: np.asarray(Image.fromarray(parts[i][0]).resize(
            (size, size), Image.Resampling.BILINEAR, box=parts[i][1]))),
        "torchvision: resized_crop (antialias)": ("resize", tv_resize),
        "OpenCV: INTER_AREA down, INTER_LINEAR up": ("resize", lambda i: cv_resize(
            i, cv2.INTER_AREA if max(boxes[i][2:]) > size else cv2.INTER_LINEAR)),
        "OpenCV: INTER_LINEAR (no antialiasing)": ("resize", lambda i: cv_resize(i, cv2.INTER_LINEAR)),
        "enspipe: flip (OpenCV)": ("flip", lambda i: cv2.flip(made[i], 1) if flips[i] else made[i]),
        "enspipe: to float32, Normalize (OpenCV)": ("normalise", lambda i: pixels.to_wire("standard", made[i],
                                                                                          "float32")),
        "torchvision: ToDtype, Normalize": ("normalise", lambda i: norm(made_chw[i])),
        "enspipe standard, whole": ("whole", lambda i: pixels.to_wire("standard", pixels.standard_train(
            jpegs[i], size, np.random.default_rng(i)), "float32")),
        "torchvision standard, whole": ("whole", lambda i: tv(decode_jpeg(torch.frombuffer(bytearray(jpegs[i]),
                                                                                            dtype=torch.uint8)))),
    }
    try:
        import simplejpeg

        table["whole decode, simplejpeg (RGB)"] = ("decode", lambda i: simplejpeg.decode_jpeg(jpegs[i], "RGB"))
    except ImportError:
        pass
    return table, [tv_resize(i) for i in range(len(jpegs))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    jpegs = [b for _, b in photo_jpegs(a.images)]
    table, reference = rows(jpegs, a.size)
    times = {name: [] for name in table}
    outputs = {}
    for _ in range(a.repeats):
        for name, (_, fn) in table.items():
            t = time.process_time()
            outputs[name] = [fn(i) for i in range(len(jpegs))]
            times[name].append((time.process_time() - t) / len(jpegs) * 1e6)
    print(f"{len(jpegs)} photos (330-500 px), {a.size} px, one thread, torch {torch.__version__}, "
          f"{a.repeats} repeats interleaved: median (min-max) µs of CPU per image")
    print(f"{'step':10s} {'row':48s} {'µs/img':>18s}  vs torchvision's resize: |diff| mean, p99, max")
    for name, (step, _) in table.items():
        t = times[name]
        line = f"{step:10s} {name:48s} {np.median(t):6.0f} ({min(t):.0f}-{max(t):.0f})"
        if step == "resize":
            d = np.concatenate([np.abs(o.astype(np.int16) - r.astype(np.int16)).ravel()
                                for o, r in zip(outputs[name], reference)])
            line += f"  {d.mean():.3f}, {np.percentile(d, 99):.0f}, {d.max()}"
        print(line)


if __name__ == "__main__":
    main()
