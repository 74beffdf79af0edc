"""Training preprocessing without TensorFlow (the ``pillow`` backend): Pillow decodes and resizes,
OpenCV (float32) and numpy do the colour, one image per call, in a member's worker processes
(:mod:`enspipe.engine.backends.pillow`).

``inception``: the standard ImageNet training augmentation, with Slim's
``inception_preprocessing.preprocess_for_train`` parameters: a random crop of 5%..100% of the
image's area with aspect ratio 3/4..4/3 covering at least 10% of it (100 attempts, else the whole
image), resized with one of four methods drawn at random (bilinear, nearest, bicubic, box; bilinear
alone in fast mode), a random left-right flip, and colour distortion (brightness +-32/255,
saturation and contrast x0.5..1.5, hue +-0.2) in one of four orders drawn at random (brightness
and saturation in two orders in fast mode); values in [-1, 1]. Where it differs from Slim's, which
runs in TensorFlow: a JPEG is decoded at 1/2, 1/4 or 1/8 scale where the crop still has the output's
size at that scale (libjpeg's DCT scaling: what the crop needs, not the whole image; with the decode
cache, whose images are decoded whole, never); Pillow's
``box`` resampling stands in for ``area``; the colour steps run in float32 as TensorFlow's
``adjust_*`` define them (HSV's by OpenCV's conversions), clipped at the end as Slim clips, and
the image is rounded to 8 bits once.

``vgg``: Slim's ``vgg_preprocessing.preprocess_for_train``: the shorter side resized to a random
size in [256, 512] (scaled with the output size), a random crop, a random flip, channel means
subtracted. The crop is cut from the source image and resized once (bilinear).

``standard``: the transform most PyTorch users train with, torchvision's ``RandomResizedCrop(size,
scale=(0.08, 1), ratio=(3/4, 4/3))`` (its ten attempts, then its central fallback), a random flip,
and ``Normalize`` by ImageNet's channel means and deviations; ``standard-jitter`` adds
``ColorJitter(0.4, 0.4, 0.4)`` (brightness, contrast and saturation in a random order, by
Pillow's ``ImageEnhance``, as torchvision's PIL path does). The crop is resized once (bilinear,
antialiased: :func:`antialiased`), from the crop's region of a JPEG decoded at the DCT scale it
needs, as above.

Where a C compiler was at install, :mod:`enspipe.data._pixels` (:data:`KERNELS`) resizes the
crop (Pillow's arithmetic, without its copies) and makes the wire's values by a table of each
8-bit value's (:func:`to_wire`); without it Pillow, numpy and OpenCV do, with the same values but
for Pillow 13's pass order (:func:`antialiased`).

Every draw comes from a Philox generator keyed by ``(seed, position)``: a sample comes out the
same whichever member preprocesses it and however many threads run. The two backends draw from
different generators, so their images for one sample differ.
"""
from __future__ import annotations

import functools
import math

import cv2
import numpy as np
from PIL import Image, ImageEnhance, ImageStat

from enspipe.data.decoding import Undecodable, decode, decoded_box, open_image  # noqa: F401 - the backend's API
from enspipe.data.decoding import drafted as _drafted, opened as _opened, rgb as _rgb  # noqa: F401

try:
    from enspipe.data import _pixels
except ImportError:  # built without a C compiler: Pillow resizes
    _pixels = None

KERNELS = _pixels is not None

cv2.setNumThreads(0)  # one image per thread or worker process: OpenCV's own pool would only contend

VGG_MEANS = (123.68, 116.78, 103.94)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # torchvision's Normalize
_STANDARD_RANGE = (min(-m / d for m, d in zip(IMAGENET_MEAN, IMAGENET_STD)),
                   max((1 - m) / d for m, d in zip(IMAGENET_MEAN, IMAGENET_STD)))
OUTPUT_RANGE = {"inception": (-1.0, 1.0), "vgg": (-max(VGG_MEANS), 255.0 - min(VGG_MEANS)),
                "standard": _STANDARD_RANGE, "standard-jitter": _STANDARD_RANGE}
_CV_METHODS = (cv2.INTER_LINEAR, cv2.INTER_NEAREST, cv2.INTER_CUBIC, cv2.INTER_AREA)  # Slim's resize methods
_MASK64 = 2**64 - 1


def generator(seed: int, position: int) -> np.random.Generator:
    """The generator of one sample's draws: Philox keyed by ``(seed, position)``."""
    return np.random.Generator(np.random.Philox(key=[int(seed) & _MASK64, int(position) & _MASK64]))


def sample_crop(rng: np.random.Generator, width: int, height: int) -> tuple[int, int, int, int]:
    """Slim's distorted bounding box for the whole image: ``(left, top, width, height)``."""
    area = width * height
    for _ in range(100):
        target = area * rng.uniform(0.05, 1.0)
        ratio = rng.uniform(0.75, 1.33)
        w = int(round(math.sqrt(target * ratio)))
        h = int(round(math.sqrt(target / ratio)))
        if 0 < w <= width and 0 < h <= height and w * h >= 0.1 * area:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    return 0, 0, width, height


# RGB -> YIQ (NTSC), and its inverse: the colour space of the fused colour distortion
YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
YIQ_INV = np.linalg.inv(YIQ)


class NumpyMatrices:
    """The 3x3 helpers :func:`colour_map` takes, in numpy (float64)."""

    constant = staticmethod(np.asarray)
    cos, sin = np.cos, np.sin

    @staticmethod
    def rotation(c, s):
        return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def colour_map(order: str, factors: dict, means, xp=NumpyMatrices):
    """Slim's colour distortion in ``order`` fused into one affine map ``x -> A x + b`` of the
    pixels (``b`` a column), with hue and saturation as DALI's ``Hsv`` does them: a rotation and a
    scaling of YIQ's chroma (HSV's steps keep value and saturation instead, so the two differ).
    ``b``rightness adds, ``c``ontrast scales about the image's current channel means (``means``:
    the input's, a column in its units). An approximation, opt-in (``fused-colour``). ``xp``: the
    array helpers (numpy's, or TensorFlow's in :mod:`enspipe.data.preprocessing`)."""
    yiq, yiq_inv = xp.constant(YIQ), xp.constant(YIQ_INV)
    a, b = xp.constant(np.eye(3)), xp.constant(np.zeros((3, 1)))
    for op in order:
        f = factors[op]
        if op == "b":
            b = b + f
        elif op == "c":
            a, b = f * a, f * b + (1 - f) * (a @ means + b)
        else:
            theta, scale = (-2 * np.pi * f, 1.0) if op == "h" else (0.0 * f, f)
            m = yiq_inv @ xp.rotation(xp.cos(theta) * scale, xp.sin(theta) * scale) @ yiq
            a, b = m @ a, m @ b
    return a, b


# Slim's colour orderings (b: brightness, s: saturation, h: hue, c: contrast), by fast_mode
COLOUR_ORDERS = {False: ("bshc", "sbch", "chbs", "hscb"), True: ("bs", "sb")}


def colour_draws(rng: np.random.Generator, fast_mode: bool) -> tuple[str, dict]:
    """One image's colour ordering and factors, drawn in Slim's order (brightness in [0, 1] units)."""
    orders = COLOUR_ORDERS[fast_mode]
    order = orders[int(rng.integers(0, len(orders)))]
    return order, dict(zip("bshc", (rng.uniform(-32 / 255, 32 / 255), rng.uniform(0.5, 1.5), rng.uniform(-0.2, 0.2),
                                    rng.uniform(0.5, 1.5))))


def _fused_colour(im: Image.Image, rng: np.random.Generator, fast_mode: bool) -> Image.Image:
    """:func:`_colour`'s draws and order as one affine map in YIQ, applied by Pillow in C (rounded
    and clipped once)."""
    order, factors = colour_draws(rng, fast_mode)
    factors["b"] *= 255  # the pixels' units
    a, b = colour_map(order, factors, np.asarray(ImageStat.Stat(im).mean)[:, None])
    return im.convert("RGB", tuple(np.concatenate([a, b], axis=1).ravel().tolist()))


def _colour(pixels: np.ndarray, rng: np.random.Generator, fast_mode: bool) -> np.ndarray:
    """Slim's colour distortion in one of its orderings, in float32 as TensorFlow's ops define each
    step (:func:`colour_op`), clipped to [0, 1] once at the end as Slim clips, and rounded to
    8 bits once. Adjacent saturation and hue steps share one HSV conversion."""
    order, factors = colour_draws(rng, fast_mode)
    x = pixels.astype(np.float32) * np.float32(1 / 255)
    i = 0
    while i < len(order):
        if order[i] in "bc":
            x = colour_op(x, order[i], factors[order[i]])
            i += 1
            continue
        hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
        while i < len(order) and order[i] in "sh":
            _hsv_step(hsv, order[i], factors[order[i]])
            i += 1
        x = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    return cv2.convertScaleAbs(cv2.max(x, 0.0), alpha=255)  # x 255, rounded, clipped to [0, 255]


def _hsv_step(hsv: np.ndarray, op: str, value: float) -> None:
    """Saturation times ``value`` (at most 1), or hue turned by ``value`` of a turn, in place in
    OpenCV's float HSV (H in degrees; its HSV to RGB takes any H >= 0 modulo 360, so a turn
    back is made as the turn forward it equals)."""
    if op == "s":
        np.minimum(hsv[..., 1] * np.float32(value), np.float32(1), out=hsv[..., 1])
    else:
        hsv[..., 0] += np.float32(360 * (value % 1.0))


def colour_op(x: np.ndarray, op: str, value: float) -> np.ndarray:
    """One of Slim's colour steps on a float32 RGB image in [0, 1] units, as TensorFlow's
    ``adjust_*`` defines it: ``b``rightness (+value), ``c``ontrast (x value about each channel's
    mean), ``s``aturation (HSV's S x value, at most 1) and ``h``ue (HSV's H + value of a turn)."""
    if op == "b":
        return x + np.float32(value)
    if op == "c":  # OpenCV adds a per-channel scalar at numpy's whole-array speed
        mean = cv2.mean(x)
        return cv2.add(x * np.float32(value), tuple(m * (1 - value) for m in mean))
    hsv = cv2.cvtColor(x, cv2.COLOR_RGB2HSV)
    _hsv_step(hsv, op, value)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


def _resized(source: "bytes | np.ndarray", im: Image.Image, box: tuple, size: int, method: int | None) -> np.ndarray:
    """The ``box`` of the image (``im``: its header) decoded at the DCT scale it allows and resized
    to ``size``: by OpenCV's ``method`` at the box's pixel bounds (TensorFlow's kernels: half-pixel
    centres, no antialiasing), or, ``None``, by Pillow's antialiased bilinear at its exact bounds
    (torchvision's, on PIL images)."""
    pixels, box = decoded_box(source, im, box, size)
    if method is None:
        return antialiased(pixels, box, size)
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    return cv2.resize(pixels[y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)], (size, size), interpolation=method)


def antialiased(pixels: np.ndarray, box: tuple, size: int) -> np.ndarray:
    """``box`` of ``pixels`` (uint8 RGB) resized to ``size`` by the antialiased bilinear filter of
    Pillow's ``resize(..., BILINEAR, box)``: :mod:`enspipe.data._pixels` (Pillow's arithmetic
    before Pillow 13, which orders its two passes otherwise: at most 1 level apart in 0.5% of the
    values), else Pillow itself."""
    if _pixels is None:
        return np.asarray(Image.fromarray(pixels).resize((size, size), Image.Resampling.BILINEAR, box=box))
    return np.frombuffer(_pixels.resize(pixels, *box, size, size), np.uint8).reshape(size, size, 3)


def _flipped(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return cv2.flip(pixels, 1) if rng.random() < 0.5 else pixels


def inception_train(encoded: "bytes | np.ndarray", size: int, rng: np.random.Generator,
                    fast_mode: bool = False, fused: bool = False) -> np.ndarray:
    """Slim-style inception training preprocessing -> uint8 ``size x size x 3`` (the values in
    [-1, 1] are ``x / 127.5 - 1``: see :func:`to_wire`); ``fused``: the colour distortion as one
    affine map in YIQ (:func:`colour_map`, an approximation). The crop is resized by OpenCV with
    TensorFlow's kernels (its bicubic is Keys' with a = -0.75 where TensorFlow's has -0.5)."""
    im = _opened(encoded)
    left, top, w, h = sample_crop(rng, *im.size)
    method = 0 if fast_mode else int(rng.integers(0, len(_CV_METHODS)))
    small = _flipped(_resized(encoded, im, (left, top, left + w, top + h), size, _CV_METHODS[method]), rng)
    if fused:
        return np.asarray(_fused_colour(Image.fromarray(small), rng, fast_mode))
    return _colour(small, rng, fast_mode)


def vgg_train(encoded: "bytes | np.ndarray", size: int, rng: np.random.Generator,
              fast_mode: bool = False) -> np.ndarray:
    """Slim-style VGG training preprocessing -> uint8 ``size x size x 3`` before the means are
    subtracted (see :func:`to_wire`): the random crop of the image resized to a random side, cut
    from the source and resized once (bilinear, TensorFlow's kernel)."""
    del fast_mode  # Slim's vgg preprocessing has no fast mode
    im = _opened(encoded)
    return _flipped(_resized(encoded, im, vgg_box(rng, *im.size, size), size, cv2.INTER_LINEAR), rng)


def vgg_box(rng: np.random.Generator, width: int, height: int, size: int) -> tuple[float, float, float, float]:
    """Slim's VGG crop drawn for a ``width x height`` image: the shorter side resized to a random
    side in [256, 512] (scaled with ``size``), a ``size`` square at a random place in it, as a box
    ``(x0, y0, x1, y1)`` of the source image."""
    side = int(rng.integers(round(256 * size / 224), round(512 * size / 224) + 1))
    scale = side / min(width, height)
    nw, nh = max(size, int(round(width * scale))), max(size, int(round(height * scale)))
    left, top = int(rng.integers(0, nw - size + 1)), int(rng.integers(0, nh - size + 1))
    return left * width / nw, top * height / nh, (left + size) * width / nw, (top + size) * height / nh


def inception_eval(encoded: "bytes | np.ndarray", size: int) -> np.ndarray:
    """Slim's inception evaluation transform: the central 87.5%, resized (bilinear) -> uint8."""
    im = _opened(encoded)
    w0, h0 = im.size
    dw, dh = w0 * 0.0625, h0 * 0.0625
    return _resized(encoded, im, (dw, dh, w0 - dw, h0 - dh), size, cv2.INTER_LINEAR)


def vgg_eval(encoded: "bytes | np.ndarray", size: int) -> np.ndarray:
    """Slim's VGG evaluation transform: the shorter side to 256 (scaled with the size), the
    central crop -> uint8 (the means are subtracted by :func:`to_wire`)."""
    im = _opened(encoded)
    w0, h0 = im.size
    scale = round(256 * size / 224) / min(w0, h0)
    nw, nh = max(size, int(round(w0 * scale))), max(size, int(round(h0 * scale)))
    left, top = (nw - size) // 2, (nh - size) // 2
    box = (left * w0 / nw, top * h0 / nh, (left + size) * w0 / nw, (top + size) * h0 / nh)
    return _resized(encoded, im, box, size, cv2.INTER_LINEAR)


def resized_crop_box(rng: np.random.Generator, width: int, height: int) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3): ``(left,
    top, width, height)``, its draws in its order."""
    area, lo, hi = width * height, math.log(3 / 4), math.log(4 / 3)
    for _ in range(10):
        target, aspect = area * rng.uniform(0.08, 1.0), math.exp(rng.uniform(lo, hi))
        w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            return int(rng.integers(0, width - w + 1)), top, w, h
    ratio = width / height
    if ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif ratio > 4 / 3:
        w, h = int(round(height * (4 / 3))), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def _jitter(im: Image.Image, rng: np.random.Generator, strength: float = 0.4) -> Image.Image:
    """torchvision's ``ColorJitter(strength, strength, strength)``: brightness, contrast and
    saturation factors in [1 - s, 1 + s], applied in a random order."""
    enhance = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)
    order = rng.permutation(3)
    factors = rng.uniform(1 - strength, 1 + strength, 3)
    for i in order:
        im = enhance[i](im).enhance(float(factors[i]))
    return im


def standard_train(encoded: "bytes | np.ndarray", size: int, rng: np.random.Generator,
                   fast_mode: bool = False, jitter: bool = False) -> np.ndarray:
    """The standard PyTorch training transform before ``Normalize`` (see :func:`to_wire`) ->
    uint8 ``size x size x 3``: a random resized crop, a random flip, ``jitter``: ColorJitter."""
    del fast_mode  # torchvision's transform has no fast mode
    im = _opened(encoded)
    left, top, w, h = resized_crop_box(rng, *im.size)
    small = _flipped(_resized(encoded, im, (left, top, left + w, top + h), size, None), rng)
    return np.asarray(_jitter(Image.fromarray(small), rng)) if jitter else small


def standard_jitter_train(encoded: "bytes | np.ndarray", size: int, rng: np.random.Generator,
                          fast_mode: bool = False) -> np.ndarray:
    return standard_train(encoded, size, rng, fast_mode, jitter=True)


def standard_eval(encoded: "bytes | np.ndarray", size: int) -> np.ndarray:
    """torchvision's evaluation transform: the shorter side to ``size / 0.875`` (256 for 224),
    the central ``size`` crop (bilinear) -> uint8 (normalised by :func:`to_wire`)."""
    im = _opened(encoded)
    w0, h0 = im.size
    scale = round(size / 0.875) / min(w0, h0)
    nw, nh = max(size, int(round(w0 * scale))), max(size, int(round(h0 * scale)))
    left, top = (nw - size) // 2, (nh - size) // 2
    box = (left * w0 / nw, top * h0 / nh, (left + size) * w0 / nw, (top + size) * h0 / nh)
    return _resized(encoded, im, box, size, None)


PREPROCESSING = {"inception": inception_train, "vgg": vgg_train, "standard": standard_train,
                 "standard-jitter": standard_jitter_train}
EVAL_PREPROCESSING = {"inception": inception_eval, "vgg": vgg_eval, "standard": standard_eval,
                      "standard-jitter": standard_eval}


# Normalize(mean, std) of [0, 1] values as one multiply and add per channel (OpenCV's scalars: a
# numpy broadcast over the 3 channels runs a 3-element inner loop, several times slower)
_STD_SCALE = tuple(1 / (255 * d) for d in IMAGENET_STD) + (0.0,)
_STD_SHIFT = tuple(-m / d for m, d in zip(IMAGENET_MEAN, IMAGENET_STD)) + (0.0,)
_NEG_VGG_MEANS = tuple(-m for m in VGG_MEANS) + (0.0,)


def to_wire(name: str, pixels: np.ndarray, wire_dtype: str) -> np.ndarray:
    """A preprocessed image as it travels: float32 in the preprocessing's own range, or uint8
    quantised over that range (:data:`OUTPUT_RANGE`) as the TensorFlow backend quantises it. An
    8-bit image goes through a table of what :func:`_wire_values` gives each value of each channel
    (:mod:`enspipe.data._pixels`' ``lookup``: one pass, the same values)."""
    if name == "inception" and wire_dtype == "uint8" and pixels.dtype == np.uint8:
        return pixels  # x / 127.5 - 1 quantised over [-1, 1] is x itself
    if _pixels is None or pixels.dtype != np.uint8:
        return _wire_values(name, pixels, wire_dtype)
    table = _wire_table(name, wire_dtype)
    return np.frombuffer(_pixels.lookup(pixels, table), table.dtype).reshape(pixels.shape)


@functools.cache
def _wire_table(name: str, wire_dtype: str) -> np.ndarray:
    """:func:`_wire_values` of every 8-bit value in each channel, 3 x 256."""
    every = np.repeat(np.arange(256, dtype=np.uint8)[:, None, None], 3, axis=2)  # 256 x 1 x 3
    return np.ascontiguousarray(_wire_values(name, every, wire_dtype)[:, 0, :].T)


def _wire_values(name: str, pixels: np.ndarray, wire_dtype: str) -> np.ndarray:
    lo, hi = OUTPUT_RANGE[name]
    x = pixels.astype(np.float32)
    if name == "inception":
        x = x / np.float32(127.5) - 1
    elif name == "vgg":
        x = cv2.add(x, _NEG_VGG_MEANS)
    else:  # Normalize(mean, std) of [0, 1] values, as one multiply and add
        x = cv2.add(cv2.multiply(x, _STD_SCALE), _STD_SHIFT)
    if wire_dtype == "float32":
        return x
    scale = 255.0 / (hi - lo)  # (x - lo) / (hi - lo) * 255, rounded half to even and saturated, in one pass
    return cv2.convertScaleAbs(np.maximum(x, np.float32(lo)), alpha=scale, beta=-lo * scale)


def output_spec(preprocessing, size: int, wire_dtype: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and element type of one preprocessed image as it travels between members: a
    built-in's (``preprocessing`` its name), or a user's (its ``shape`` and ``dtype``)."""
    if not isinstance(preprocessing, str):
        return tuple(preprocessing.shape), np.dtype(preprocessing.dtype)
    return (size, size, 3), np.dtype(np.uint8 if wire_dtype == "uint8" else np.float32)
