"""TF-Slim-faithful training preprocessing as tf.data-mappable functions.

``inception``: Slim's ``inception_preprocessing.preprocess_for_train``: decode, distorted
bounding-box crop (min object covered 0.1, aspect 3/4..4/3, area 5%..100%, 100 attempts),
resize with a randomly chosen method (bilinear, nearest, bicubic, area; one method in fast mode),
random left-right flip, colour distortion in one of four random orderings (two in fast mode),
clip to [0, 1], scale to [-1, 1]. Slim's ``fast_mode`` is off by default, as in the paper.
Three implementations (:data:`IMPLEMENTATIONS`): ``reference`` is Slim's functions as written
(:func:`inception_train`); ``crop-first`` (:func:`inception_crop_train`) decodes only a JPEG's crop
window and makes only the crop float, with the same values bit for bit; ``fused-colour`` is
crop-first with the colour distortion as one affine map in YIQ, an approximation.

``vgg``: Slim's ``vgg_preprocessing.preprocess_for_train``: aspect-preserving bilinear resize of
the shorter side to a random size in [256, 512], random crop, random flip, channel-mean
subtraction. The side range scales with the output size (exactly [256, 512] at 224 px).

``standard`` and ``standard-jitter``: torchvision's ``RandomResizedCrop`` (scale 0.08-1, ratio
3/4-4/3, ten attempts, then the central fallback), a random flip and ``Normalize`` by ImageNet's
means and deviations; a JPEG decodes its crop window alone. ``standard-jitter`` adds
``ColorJitter(0.4, 0.4, 0.4)``: brightness, contrast and saturation as torchvision blends them,
in a random order. The pillow backend draws from another generator (:mod:`enspipe.data.pixels`).

Randomness is stateless: every element's draws derive from ``(seed, position)``, so the output
for a given element is the same whichever rank preprocesses it and however many threads run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from enspipe.data.pixels import COLOUR_ORDERS, IMAGENET_MEAN, IMAGENET_STD, VGG_MEANS, colour_map

_RESIZE_METHODS = ("bilinear", "nearest", "bicubic", "area")


def _seeds(seed: tf.Tensor, n: int) -> list[tf.Tensor]:
    split = tf.random.experimental.stateless_split(seed, num=n)
    return [split[i] for i in range(n)]


def _choice(seed: tf.Tensor, n: int) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed, minval=0, maxval=n, dtype=tf.int32)


def _distort_color(image: tf.Tensor, ordering: int, fast_mode: bool, seed: tf.Tensor) -> tf.Tensor:
    s = _seeds(seed, 4)
    ops = {
        "b": lambda x: tf.image.stateless_random_brightness(x, 32.0 / 255.0, s[0]),
        "s": lambda x: tf.image.stateless_random_saturation(x, 0.5, 1.5, s[1]),
        "h": lambda x: tf.image.stateless_random_hue(x, 0.2, s[2]),
        "c": lambda x: tf.image.stateless_random_contrast(x, 0.5, 1.5, s[3]),
    }
    for op in COLOUR_ORDERS[fast_mode][ordering]:
        image = ops[op](image)
    return tf.clip_by_value(image, 0.0, 1.0)


def _fused_colour(image: tf.Tensor, ordering: int, fast_mode: bool, seed: tf.Tensor) -> tf.Tensor:
    """Slim's colour distortion (its draws, its order) as one affine map in YIQ
    (:func:`enspipe.data.pixels.colour_map`), clipped to [0, 1] once at the end as Slim clips."""
    s = _seeds(seed, 4)
    draws = {"b": tf.random.stateless_uniform([], s[0], minval=-32.0 / 255.0, maxval=32.0 / 255.0),
             "s": tf.random.stateless_uniform([], s[1], minval=0.5, maxval=1.5),
             "h": tf.random.stateless_uniform([], s[2], minval=-0.2, maxval=0.2),
             "c": tf.random.stateless_uniform([], s[3], minval=0.5, maxval=1.5)}
    a, b = colour_map(COLOUR_ORDERS[fast_mode][ordering], draws, tf.reshape(tf.reduce_mean(image, axis=[0, 1]), [3, 1]), _TfMatrices)
    out = tf.reshape(image, [-1, 3]) @ tf.transpose(a) + tf.reshape(b, [1, 3])
    return tf.clip_by_value(tf.reshape(out, tf.shape(image)), 0.0, 1.0)


class _TfMatrices:
    """The 3x3 helpers :func:`enspipe.data.pixels.colour_map` takes, in TensorFlow (float32)."""

    @staticmethod
    def constant(x):
        return tf.constant(x, tf.float32)

    @staticmethod
    def rotation(c, s):
        one, zero = tf.ones([]), tf.zeros([])
        return tf.stack([tf.stack([one, zero, zero]), tf.stack([zero, c, -s]), tf.stack([zero, s, c])])

    cos, sin = tf.cos, tf.sin


def _switch(index: tf.Tensor, branches: list[Callable[[], tf.Tensor]]) -> tf.Tensor:
    return branches[0]() if len(branches) == 1 else tf.switch_case(index, branches)


def _crop_box(shape: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Slim's distorted bounding box for an image of ``shape`` (``[h, w, 3]``): ``(begin, size)``."""
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        min_object_covered=0.1, aspect_ratio_range=(0.75, 1.33), area_range=(0.05, 1.0),
        max_attempts=100, use_image_if_no_bounding_boxes=True)
    return begin, crop


def _resize(image: tf.Tensor, size: int, seed: tf.Tensor, fast_mode: bool) -> tf.Tensor:
    """The crop resized to ``size`` with Slim's randomly chosen method (bilinear alone in fast mode)."""
    methods = _RESIZE_METHODS[:1] if fast_mode else _RESIZE_METHODS
    return _switch(_choice(seed, len(methods)),
                   [lambda m=m: tf.cast(tf.image.resize(image, [size, size], method=m), tf.float32) for m in methods])


def _flip_and_colour(image: tf.Tensor, size: int, s: list[tf.Tensor], fast_mode: bool,
                     fused: bool = False) -> tf.Tensor:
    """Slim's random flip and colour distortion of the resized crop (float in [0, 1]) -> [-1, 1];
    ``fused``: the distortion as one affine map in YIQ (an approximation)."""
    image = tf.image.stateless_random_flip_left_right(image, s[2])
    orderings = len(COLOUR_ORDERS[fast_mode])
    distort = _fused_colour if fused else _distort_color
    image = _switch(_choice(s[3], orderings),
                    [lambda o=o: distort(image, o, fast_mode, s[4]) for o in range(orderings)])
    image.set_shape([size, size, 3])
    return (image - 0.5) * 2.0


def inception_train(image: tf.Tensor, size: int, seed: tf.Tensor, fast_mode: bool = False) -> tf.Tensor:
    """Slim inception training preprocessing of a decoded uint8 image -> float32 in [-1, 1], as
    Slim writes it (the whole image to float, then the crop): the oracle of :func:`inception_crop_train`."""
    s = _seeds(seed, 5)
    image = tf.image.convert_image_dtype(image, tf.float32)
    begin, crop = _crop_box(tf.shape(image), s[0])
    image = _resize(tf.slice(image, begin, crop), size, s[1], fast_mode)
    return _flip_and_colour(image, size, s, fast_mode)


# Columns decoded either side of a JPEG crop window and then cut off: libjpeg-turbo's cropped
# decode treats the window's edges as the image's, and its fancy chroma upsampling then differs from
# a whole decode's in the edge columns (by up to 17/255 on the embedded JPEGs); with chroma
# neighbours on both sides the window's pixels are the whole decode's, bit for bit (tested).
_JPEG_MARGIN = 8


def _window(encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """The uint8 pixels of Slim's crop window alone: a JPEG decodes only the window (and a margin
    cut off after), other formats decode whole and are sliced."""
    def jpeg() -> tf.Tensor:
        hw = tf.image.extract_jpeg_shape(encoded)[:2]
        begin, crop = _crop_box(tf.concat([hw, [3]], 0), seed)
        left = tf.maximum(begin[1] - _JPEG_MARGIN, 0)
        right = tf.minimum(begin[1] + crop[1] + _JPEG_MARGIN, hw[1])
        window = tf.io.decode_and_crop_jpeg(encoded, tf.stack([begin[0], left, crop[0], right - left]), channels=3)
        return window[:, begin[1] - left:begin[1] - left + crop[1]]

    def other() -> tf.Tensor:
        image = decode(encoded)
        return tf.slice(image, *_crop_box(tf.shape(image), seed))

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def crop_train(crop: tf.Tensor, size: int, seed: tf.Tensor, fast_mode: bool = False,
               fused: bool = False) -> tf.Tensor:
    """Slim inception training preprocessing from its crop window's uint8 pixels on: the crop alone
    to float, resized, flipped, colour-distorted -> float32 in [-1, 1]. The float arithmetic is
    Slim's, in its order: TensorFlow's saturation and hue kernels are discontinuous at near-grey
    pixels (an input one float ulp apart moved an output by 0.33), so resizing the uint8 crop and
    scaling after, 1 ulp off, is not done. ``fused``: the colour distortion fused (an approximation)."""
    s = _seeds(seed, 5)
    image = _resize(tf.image.convert_image_dtype(crop, tf.float32), size, s[1], fast_mode)
    return _flip_and_colour(image, size, s, fast_mode, fused)


def inception_crop_train(encoded: tf.Tensor, size: int, seed: tf.Tensor, fast_mode: bool = False,
                         fused: bool = False) -> tf.Tensor:
    """Slim inception training preprocessing of an encoded image, the crop first: a JPEG decodes
    its crop window alone, and only the crop becomes float. Its values are :func:`inception_train`'s
    of the decoded image, bit for bit (tested on every image of the embedded and photo sets)."""
    return crop_train(_window(encoded, _seeds(seed, 5)[0]), size, seed, fast_mode, fused)


def vgg_train(image: tf.Tensor, size: int, seed: tf.Tensor, fast_mode: bool = False) -> tf.Tensor:
    """Slim VGG training preprocessing of a decoded uint8 image -> float32, channel means removed."""
    del fast_mode  # Slim's vgg preprocessing has no fast mode
    s = _seeds(seed, 3)
    side_min, side_max = round(256 * size / 224), round(512 * size / 224)
    side = tf.random.stateless_uniform([], s[0], minval=side_min, maxval=side_max + 1, dtype=tf.int32)
    shape = tf.shape(image)
    h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    scale = tf.cast(side, tf.float32) / tf.minimum(h, w)
    new_hw = tf.cast(tf.math.rint(tf.stack([h * scale, w * scale])), tf.int32)
    image = tf.image.resize(image, new_hw, method="bilinear")
    image = tf.image.stateless_random_crop(image, [size, size, 3], s[1])
    image = tf.image.stateless_random_flip_left_right(image, s[2])
    return image - tf.constant(VGG_MEANS, tf.float32)


def inception_eval(image: tf.Tensor, size: int) -> tf.Tensor:
    """Slim inception evaluation preprocessing: central crop of 87.5%, bilinear resize, [-1, 1]."""
    image = tf.image.central_crop(tf.image.convert_image_dtype(image, tf.float32), 0.875)
    image = tf.image.resize(image, [size, size], method="bilinear")
    return (image - 0.5) * 2.0


def vgg_eval(image: tf.Tensor, size: int) -> tf.Tensor:
    """Slim VGG evaluation preprocessing: shorter side to 256 (scaled with the size), central crop,
    channel-mean subtraction."""
    side = round(256 * size / 224)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    new_hw = tf.cast(tf.math.rint(shape * side / tf.reduce_min(shape)), tf.int32)
    image = tf.image.resize(image, new_hw, method="bilinear")
    top, left = (new_hw[0] - size) // 2, (new_hw[1] - size) // 2
    image = tf.slice(image, [top, left, 0], [size, size, 3])
    return image - tf.constant(VGG_MEANS, tf.float32)


def _resized_crop_box(hw: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """torchvision's ``RandomResizedCrop`` box of an image of ``hw`` (``[h, w]``): its ten
    attempts drawn at once, the first that fits, else its central fallback. ``(begin, size)``."""
    s = _seeds(seed, 3)
    hf, wf = tf.cast(hw[0], tf.float32), tf.cast(hw[1], tf.float32)
    target = hf * wf * tf.random.stateless_uniform([10], s[0], 0.08, 1.0)
    aspect = tf.exp(tf.random.stateless_uniform([10], s[1], math.log(3 / 4), math.log(4 / 3)))
    w = tf.cast(tf.math.round(tf.sqrt(target * aspect)), tf.int32)
    h = tf.cast(tf.math.round(tf.sqrt(target / aspect)), tf.int32)
    fits = (w > 0) & (w <= hw[1]) & (h > 0) & (h <= hw[0])
    i = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
    ratio = wf / hf
    fall_w = tf.where(ratio > 4 / 3, tf.cast(tf.math.round(hf * 4 / 3), tf.int32), hw[1])
    fall_h = tf.where(ratio < 3 / 4, tf.cast(tf.math.round(wf * 4 / 3), tf.int32), hw[0])
    ch, cw = (tf.where(tf.reduce_any(fits), h[i], fall_h), tf.where(tf.reduce_any(fits), w[i], fall_w))
    u = tf.random.stateless_uniform([2], s[2])
    drawn = tf.cast(u * tf.cast(tf.stack([hw[0] - ch + 1, hw[1] - cw + 1]), tf.float32), tf.int32)
    top = tf.where(tf.reduce_any(fits), drawn[0], (hw[0] - ch) // 2)
    left = tf.where(tf.reduce_any(fits), drawn[1], (hw[1] - cw) // 2)
    return tf.stack([top, left]), tf.stack([ch, cw])


def _standard_window(encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """The uint8 pixels of the random resized crop: a JPEG decodes its window alone."""
    def jpeg() -> tf.Tensor:
        begin, size = _resized_crop_box(tf.image.extract_jpeg_shape(encoded)[:2], seed)
        return tf.io.decode_and_crop_jpeg(encoded, tf.concat([begin, size], 0), channels=3)

    def other() -> tf.Tensor:
        image = decode(encoded)
        begin, size = _resized_crop_box(tf.shape(image)[:2], seed)
        return tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([size, [3]], 0))

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def _jitter(image: tf.Tensor, seed: tf.Tensor, strength: float = 0.4) -> tf.Tensor:
    """torchvision's ``ColorJitter(strength, strength, strength)`` of a float image in [0, 1]:
    brightness, contrast (about the grey image's mean) and saturation (towards the grey image) by
    factors in [1 - s, 1 + s], in one of the six orders drawn at random."""
    s = _seeds(seed, 2)
    f = tf.random.stateless_uniform([3], s[0], 1 - strength, 1 + strength)
    grey = lambda x: tf.image.rgb_to_grayscale(x)  # noqa: E731
    ops = (lambda x: x * f[0], lambda x: (x - tf.reduce_mean(grey(x))) * f[1] + tf.reduce_mean(grey(x)),
           lambda x: grey(x) + (x - grey(x)) * f[2])
    orders = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))

    def apply(order):
        x = image
        for k in order:
            x = tf.clip_by_value(ops[k](x), 0.0, 1.0)
        return x

    return _switch(_choice(s[1], len(orders)), [lambda o=o: apply(o) for o in orders])


def standard_crop_train(crop: tf.Tensor, size: int, seed: tf.Tensor, jitter: bool = False) -> tf.Tensor:
    """The standard transform from its crop's uint8 pixels on: resized (bilinear, antialiased),
    flipped, ``jitter``: ColorJitter, normalised -> float32."""
    s = _seeds(seed, 3)
    image = tf.image.resize(tf.image.convert_image_dtype(crop, tf.float32), [size, size], "bilinear", antialias=True)
    image = tf.image.stateless_random_flip_left_right(tf.clip_by_value(image, 0.0, 1.0), s[1])
    if jitter:
        image = _jitter(image, s[2])
    image.set_shape([size, size, 3])
    return (image - tf.constant(IMAGENET_MEAN)) / tf.constant(IMAGENET_STD)


def standard_train(image: tf.Tensor, size: int, seed: tf.Tensor, fast_mode: bool = False,
                   jitter: bool = False) -> tf.Tensor:
    """The standard transform of a decoded uint8 image."""
    del fast_mode
    begin, crop = _resized_crop_box(tf.shape(image)[:2], _seeds(seed, 3)[0])
    return standard_crop_train(tf.slice(image, tf.concat([begin, [0]], 0), tf.concat([crop, [3]], 0)), size, seed,
                               jitter)


def standard_eval(image: tf.Tensor, size: int) -> tf.Tensor:
    """torchvision's evaluation transform: the shorter side to ``size / 0.875``, the central crop,
    normalised."""
    side = round(size / 0.875)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    new_hw = tf.cast(tf.math.rint(shape * side / tf.reduce_min(shape)), tf.int32)
    image = tf.image.resize(tf.image.convert_image_dtype(image, tf.float32), new_hw, "bilinear", antialias=True)
    top, left = (new_hw[0] - size) // 2, (new_hw[1] - size) // 2
    image = tf.slice(image, [top, left, 0], [size, size, 3])
    return (image - tf.constant(IMAGENET_MEAN)) / tf.constant(IMAGENET_STD)


PREPROCESSING: dict[str, Callable[..., tf.Tensor]] = {
    "inception": inception_train, "vgg": vgg_train, "standard": standard_train,
    "standard-jitter": lambda image, size, seed, fast_mode=False: standard_train(image, size, seed, fast_mode, True)}
EVAL_PREPROCESSING: dict[str, Callable[..., tf.Tensor]] = {"inception": inception_eval, "vgg": vgg_eval,
                                                           "standard": standard_eval, "standard-jitter": standard_eval}
IMPLEMENTATIONS = ("crop-first", "reference", "fused-colour")  # enspipe.engine.config.IMPLEMENTATIONS

def decode(encoded: tf.Tensor) -> tf.Tensor:
    """Decode an image (JPEG, as Slim's ``image/format`` is; PNG, GIF or BMP too) to uint8 HxWx3; a
    JPEG is decoded exactly as ``tf.io.decode_jpeg`` does."""
    return tf.io.decode_image(encoded, channels=3, expand_animations=False)


def make_preprocess_fn(name: str, size: int, fast_mode: bool = False,
                       impl: str = "crop-first") -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``fn(encoded_jpeg, seed[2]) -> float32 [size, size, 3]`` for tf.data ``map``. ``impl``:
    ``crop-first`` (inception's crop window decoded alone, and only it made float; vgg has one path)
    or ``reference`` (Slim's functions as written, on the whole decoded image): the two give the
    same values, bit for bit; ``fused-colour``: crop-first with the colour distortion fused into one
    affine map in YIQ, an approximation (:func:`enspipe.data.pixels.colour_map`)."""
    if name not in PREPROCESSING:
        raise ValueError(f"unknown preprocessing {name!r}; choose one of {', '.join(PREPROCESSING)}")
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown preprocessing implementation {impl!r}; choose one of {', '.join(IMPLEMENTATIONS)}")
    if impl != "reference" and name == "inception":
        fused = impl == "fused-colour"
        return lambda encoded, seed: inception_crop_train(encoded, size, seed, fast_mode, fused)
    if name.startswith("standard"):
        jitter = name == "standard-jitter"
        return lambda encoded, seed: standard_crop_train(_standard_window(encoded, _seeds(seed, 3)[0]), size, seed,
                                                         jitter)
    train = PREPROCESSING[name]

    def fn(encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return train(decode(encoded), size, seed, fast_mode)

    return fn


def make_decoded_fn(name: str, size: int, fast_mode: bool = False,
                    impl: str = "crop-first") -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """``fn(image, seed[2])`` of a decoded uint8 image (the decode cache's): the same values as
    :func:`make_preprocess_fn`'s of its JPEG."""
    if impl != "reference" and name == "inception":
        def crop_first(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
            crop = tf.slice(image, *_crop_box(tf.shape(image), _seeds(seed, 5)[0]))
            return crop_train(crop, size, seed, fast_mode, impl == "fused-colour")

        return crop_first
    return lambda image, seed: PREPROCESSING[name](image, size, seed, fast_mode)


@dataclass(frozen=True)
class UserPreprocess:
    """A user's preprocessing: ``fn(image, seed) -> tensor`` on one decoded image (uint8, H x W x 3)
    and its per-sample stateless seed (int64 ``[2]``: use ``tf.random.stateless_*`` ops with it, so
    a sample comes out the same whichever member preprocesses it), returning a tensor of
    ``shape`` and ``dtype`` for every sample (checked where it runs)."""

    fn: Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str | None = "HWC"  # of one sample: enspipe.data.transforms.sample_layout

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def encoded_fn(self) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
        """``fn(encoded_jpeg, seed) -> tensor`` for tf.data ``map``, its output checked against
        ``shape`` and ``dtype``."""
        checked = self.decoded_fn()
        return lambda encoded, seed: checked(decode(encoded), seed)

    def decoded_fn(self) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
        """``fn(image, seed) -> tensor`` of a decoded image, its output checked as
        :meth:`encoded_fn`'s."""
        dtype = tf.as_dtype(self.dtype)

        def fn(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
            out = tf.convert_to_tensor(self.fn(image, seed))
            if out.dtype != dtype:
                raise TypeError(f"preprocess {self.name} returned {out.dtype.name} here, {dtype.name} for the first "
                                "sample: return one dtype for every sample")
            return tf.ensure_shape(out, self.shape, name="preprocess_output_shape")

        return fn
