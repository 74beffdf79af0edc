"""The ``standard`` preprocessings as torch tensor ops on a decoded image, on any device: the
``gpu`` backend's augmentation (:mod:`enspipe.engine.backends.gpu`), run where the image was
decoded.

They match :mod:`enspipe.data.pixels` (the pillow backend), whose draws they share (the same
Philox generator per sample, the same crop box, flip and jitter draws in the same order), so a
sample is cut and flipped alike on either backend. The values differ a little, because the
resize differs:

* the pillow backend decodes the crop at the smallest DCT scale that keeps its size and resizes
  with Pillow's antialiased bilinear;
* this module cuts the crop from the whole image and resizes with torch's antialiased bilinear
  (``interpolate(..., antialias=True)``, torchvision's tensor resize).

``tests/test_gpu_backend.py`` measures the difference.

Images are ``(3, H, W)`` uint8 tensors; outputs ``(size, size, 3)`` in the wire dtype, like
:func:`enspipe.data.pixels.to_wire`'s.
"""
from __future__ import annotations

import numpy as np

from enspipe.data.pixels import IMAGENET_MEAN, IMAGENET_STD, OUTPUT_RANGE, resized_crop_box

TENSOR_PREPROCESSING = ("standard", "standard-jitter")  # what this module makes


def standard_train(image, size: int, rng: np.random.Generator, jitter: bool = False):
    """torchvision's RandomResizedCrop, flip and (``jitter``) ColorJitter(0.4, 0.4, 0.4) ->
    float ``(3, size, size)`` in [0, 255], rounded as the uint8 image Pillow's steps return."""
    import torch
    import torch.nn.functional as F

    _, h, w = image.shape
    left, top, cw, ch = resized_crop_box(rng, w, h)
    crop = image[:, top:top + ch, left:left + cw].unsqueeze(0).float()
    x = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
    x = x.round_().clamp_(0, 255)
    if rng.random() < 0.5:
        x = torch.flip(x, dims=(2,))
    return _jitter(x, rng) if jitter else x


def _jitter(x, rng: np.random.Generator, strength: float = 0.4):
    """Pillow's ImageEnhance steps, with :func:`enspipe.data.pixels._jitter`'s draws. Each blends
    the image with a degenerate one: black (brightness), the grey image's rounded mean
    (contrast), the grey image (saturation). Each is truncated to 8 bits in float32, as Pillow's
    ``Image.blend`` does."""
    order, factors = rng.permutation(3), rng.uniform(1 - strength, 1 + strength, 3)
    for i in order:
        f = float(factors[i])
        if i == 0:
            degenerate = 0.0
        elif i == 1:
            degenerate = float(int(_grey(x).double().mean().item() + 0.5))  # ImageStat's mean, rounded
        else:
            degenerate = _grey(x)
        x = (degenerate + f * (x - degenerate)).clamp_(0, 255).floor_()
    return x


def _grey(x):
    """Pillow's ``convert("L")`` of a ``(3, H, W)`` image of 8-bit values: its fixed-point
    weights, rounded (``(19595 R + 38470 G + 7471 B + 2^15) >> 16``), ``(1, H, W)`` float."""
    import torch

    v = x.to(torch.int32)
    return ((v[0:1] * 19595 + v[1:2] * 38470 + v[2:3] * 7471 + 32768) >> 16).to(x.dtype)


def to_wire(name: str, batch, wire_dtype: str):
    """A batch ``(n, 3, S, S)`` of rounded [0, 255] floats -> ``(n, S, S, 3)`` as it travels:
    Normalize(mean, std) in float32, or uint8 quantised over the output's range, rounded half to
    even and saturated (:func:`enspipe.data.pixels.to_wire`)."""
    import torch

    mean = torch.tensor(IMAGENET_MEAN, device=batch.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=batch.device).view(1, 3, 1, 1)
    x = ((batch / 255 - mean) / std).permute(0, 2, 3, 1)
    if wire_dtype == "float32":
        return x.contiguous()
    lo, hi = OUTPUT_RANGE[name]
    scale = 255.0 / (hi - lo)
    return (x.clamp(min=lo) * scale - lo * scale).round_().clamp_(0, 255).to(torch.uint8).contiguous()
