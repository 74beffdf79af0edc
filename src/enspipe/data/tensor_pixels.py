"""The built-in training preprocessings as torch tensor ops on a decoded image, on any device:
the ``gpu`` backend's augmentation (:mod:`enspipe.engine.backends.gpu`), run where the image was
decoded.

They match :mod:`enspipe.data.pixels` (the pillow backend), whose draws they share (the same
Philox generator per sample, the same boxes, methods, flips and colour draws in the same order),
so a sample is cut and flipped alike on either backend. The values differ a little, because the
decode and the resize differ:

* the pillow backend decodes the crop at the smallest DCT scale that keeps its size; this module
  cuts the crop from the whole image;
* ``standard``: Pillow's antialiased bilinear there, torch's here (``interpolate(...,
  antialias=True)``, torchvision's tensor resize);
* ``inception`` and ``vgg``: OpenCV's fixed-point kernels there (bilinear, nearest, bicubic with
  a = -0.75, area), torch's float kernels of the same definitions here (area as the exact
  box-overlap weights, one matrix per axis);
* ``inception``'s colour distortion: the same float32 steps, with HSV converted by OpenCV's
  formulas written as tensor ops.

``tests/test_gpu_backend.py`` measures the difference.

Images are ``(3, H, W)`` uint8 tensors; each function returns float ``(3, size, size)`` in
[0, 255], rounded as the uint8 image the pillow backend's steps return; :func:`to_wire` makes a
batch of them ``(n, size, size, 3)`` in the wire dtype, like :func:`enspipe.data.pixels.to_wire`.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from enspipe.data.pixels import (IMAGENET_MEAN, IMAGENET_STD, OUTPUT_RANGE, VGG_MEANS, colour_draws,
                                 colour_map, resized_crop_box, sample_crop, vgg_box)

RESIZE_MODES = ("bilinear", "nearest", "bicubic", "area")  # Slim's four methods, in pixels._CV_METHODS's order


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
    """A batch ``(n, 3, S, S)`` of rounded [0, 255] floats -> ``(n, S, S, 3)`` as it travels, in
    the preprocessing's own range (``inception``: x / 127.5 - 1; ``vgg``: the channel means
    subtracted; ``standard``: Normalize(mean, std)) in float32, or uint8 quantised over that range,
    rounded half to even and saturated (:func:`enspipe.data.pixels.to_wire`)."""
    import torch

    x = batch.permute(0, 2, 3, 1)
    if name == "inception" and wire_dtype == "uint8":
        return x.to(torch.uint8).contiguous()  # x / 127.5 - 1 quantised over [-1, 1] is x itself
    if name == "inception":
        x = x / 127.5 - 1
    elif name == "vgg":
        x = x - torch.tensor(VGG_MEANS, device=batch.device)
    else:
        x = (x / 255 - torch.tensor(IMAGENET_MEAN, device=batch.device)) / torch.tensor(IMAGENET_STD,
                                                                                         device=batch.device)
    if wire_dtype == "float32":
        return x.contiguous()
    lo, hi = OUTPUT_RANGE[name]
    scale = 255.0 / (hi - lo)
    return (x.clamp(min=lo) * scale - lo * scale).round_().clamp_(0, 255).to(torch.uint8).contiguous()


def inception_train(image, size: int, rng: np.random.Generator, fast_mode: bool = False, fused: bool = False):
    """Slim's inception training preprocessing (:func:`enspipe.data.pixels.inception_train`'s
    draws): the distorted bounding box, resized by one of the four methods (bilinear alone in fast
    mode), flipped, colour-distorted in one of Slim's orders; ``fused``: the distortion as one
    affine map in YIQ (:func:`enspipe.data.pixels.colour_map`)."""
    _, h, w = image.shape
    left, top, cw, ch = sample_crop(rng, w, h)
    mode = RESIZE_MODES[0 if fast_mode else int(rng.integers(0, len(RESIZE_MODES)))]
    x = _flipped(_resized(image[:, top:top + ch, left:left + cw], size, mode), rng)
    return _fused_colour(x, rng, fast_mode) if fused else _colour(x, rng, fast_mode)


def vgg_train(image, size: int, rng: np.random.Generator):
    """Slim's VGG training preprocessing (:func:`enspipe.data.pixels.vgg_train`'s draws): the box
    of the randomly resized image cut from the source at its pixel bounds, resized once
    (bilinear), flipped; the means are subtracted by :func:`to_wire`."""
    _, h, w = image.shape
    x0, y0, x1, y1 = (int(round(v)) for v in vgg_box(rng, w, h, size))
    return _flipped(_resized(image[:, y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)], size, "bilinear"), rng)


TRAIN = {"inception": inception_train, "vgg": vgg_train, "standard": standard_train,
         "standard-jitter": partial(standard_train, jitter=True)}
TENSOR_PREPROCESSING = tuple(TRAIN)  # what this module makes


def train(name: str, fast_mode: bool = False, fused: bool = False):
    """The preprocessing ``name`` as ``f(image, size, rng)`` (``fast_mode`` and ``fused``:
    inception's options; Slim's vgg and the standard ones have none)."""
    return partial(inception_train, fast_mode=fast_mode, fused=fused) if name == "inception" else TRAIN[name]


def _flipped(x, rng: np.random.Generator):
    import torch

    return torch.flip(x, dims=(2,)) if rng.random() < 0.5 else x


def _resized(crop, size: int, mode: str):
    """A ``(3, h, w)`` uint8 crop resized to ``size`` by TensorFlow's kernel ``mode`` (half-pixel
    centres, no antialiasing) -> float, rounded and saturated as an 8-bit resize returns it."""
    import torch.nn.functional as F

    x = crop.float()
    if mode == "area":
        x = _area_weights(crop.shape[1], size, x.device) @ x @ _area_weights(crop.shape[2], size, x.device).T
    else:
        options = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
        x = F.interpolate(x.unsqueeze(0), size=(size, size), mode=mode, **options)[0]
    return x.round_().clamp_(0, 255)


def _area_weights(n_in: int, n_out: int, device):
    """``(n_out, n_in)``: each output pixel the mean of the input it covers, each input pixel
    weighted by the part of it covered (OpenCV's INTER_AREA: exact in both directions)."""
    import torch

    edges = np.arange(n_out + 1) * (n_in / n_out)
    lo, hi = edges[:-1, None], edges[1:, None]
    j = np.arange(n_in)[None, :]
    covered = np.clip(np.minimum(hi, j + 1) - np.maximum(lo, j), 0, None)
    return torch.tensor(covered / (n_in / n_out), dtype=torch.float32, device=device)


def _colour(x, rng: np.random.Generator, fast_mode: bool):
    """:func:`enspipe.data.pixels._colour`: the steps in float32 in [0, 1] units, adjacent
    saturation and hue steps in one HSV conversion, clipped once and rounded."""
    order, factors = colour_draws(rng, fast_mode)
    x, i = x * (1 / 255), 0
    while i < len(order):
        if order[i] == "b":
            x = x + factors["b"]
        elif order[i] == "c":
            mean = x.double().mean(dim=(1, 2), keepdim=True).float()
            x = x * factors["c"] + mean * (1 - factors["c"])
        else:
            h, s, v = _rgb_to_hsv(x)
            while i < len(order) and order[i] in "sh":
                if order[i] == "s":
                    s = (s * factors["s"]).clamp_(max=1)
                else:
                    h = h + 360 * (factors["h"] % 1.0)
                i += 1
            x = _hsv_to_rgb(h, s, v)
            continue
        i += 1
    return (x.clamp(min=0) * 255).round_().clamp_(0, 255)


def _rgb_to_hsv(x):
    """OpenCV's float RGB -> HSV (H in degrees, its epsilons kept)."""
    r, g, b = x[0], x[1], x[2]
    v, vmin = x.max(dim=0).values, x.min(dim=0).values
    diff = v - vmin
    s = diff / (v.abs() + np.float32(np.finfo(np.float32).eps))
    k = 60 / (diff + np.float32(np.finfo(np.float32).eps))
    h = (r - g) * k + 240
    h = h.where(v != g, (b - r) * k + 120)
    h = h.where(v != r, (g - b) * k)
    return h.where(h >= 0, h + 360), s, v


def _hsv_to_rgb(h, s, v):
    """OpenCV's float HSV -> RGB: any H >= 0, taken modulo 360."""
    import torch

    h = torch.remainder(h / 60, 6)
    sector = h.floor().clamp_(0, 5)
    f = h - sector
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    sector = sector.long()
    # r, g and b in each of the six sectors
    table = torch.stack([v, q, p, p, t, v, t, v, v, q, p, p, p, p, t, v, v, q]).view(3, 6, *v.shape)
    return table.gather(1, sector.unsqueeze(0).unsqueeze(0).expand(3, 1, *v.shape)).squeeze(1)


def _fused_colour(x, rng: np.random.Generator, fast_mode: bool):
    """:func:`enspipe.data.pixels._fused_colour`: one affine map of the pixels, rounded and
    clipped once as Pillow's matrix conversion does."""
    import torch

    order, factors = colour_draws(rng, fast_mode)
    factors["b"] *= 255
    means = x.double().mean(dim=(1, 2)).cpu().numpy()[:, None]
    a, b = colour_map(order, factors, means)
    a, b = (torch.tensor(m, dtype=torch.float32, device=x.device) for m in (a, b))
    y = (a @ x.reshape(3, -1) + b).reshape(x.shape)
    return (y + 0.5).clamp_(0, 255).floor_()
