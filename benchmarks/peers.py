"""enspipe's preprocessing beside the CPU loaders people use, on the same images and machine: CPU
per image on one thread, then images/s and CPU per image on all the node's cores.

    python benchmarks/peers.py [--images 256] [--size 224] [--repeats 3] [--sets synthetic,photos]

Rows (what each does is in its row; Slim's augmentation is inception's: a random crop of 5-100% of
the area, one of four resize methods, a flip and four colour distortions in a random order):

* enspipe tf reference / crop-first / crop-first with a warm decode cache (Slim's augmentation);
* enspipe pillow, and with a warm decode cache (Slim's augmentation, Pillow's arithmetic);
* enspipe's ``fused-colour`` path on both backends: Slim's draws, the colour distortion as one
  affine map in YIQ (an approximation; its error is in the summary of a cell that uses it);
* TensorFlow Model Garden's ResNet ImageNet training input (``imagenet_preprocessing.py``, written
  here from its published description): fused decode-and-crop of a distorted box, a flip, a
  bilinear resize, channel means subtracted; no colour distortion;
* the same steps with Pillow and numpy, and with OpenCV;
* enspipe's ``standard`` on both backends (torchvision's RandomResizedCrop, flip and Normalize),
  and the same steps with OpenCV;
* albumentations (RandomResizedCrop, HorizontalFlip, ColorJitter, Normalize) on OpenCV's decode;
* torchvision's transforms (decode_jpeg, RandomResizedCrop, RandomHorizontalFlip, ColorJitter),
  where torchvision loads (not with this machine's CPU build of torch: the row says why).

The second pair of columns runs each Python row on a thread pool of the node's cores in one
process (the GIL's share included), not on enspipe's engine, whose worker processes
``benchmarks/scaling.py`` measures. A row's CPU is the process's (``process_time``) over a pass of the images after a warm-up pass,
the median of the repeats; ``x decode`` divides it by TensorFlow's decode of the whole image alone
on the same images (libjpeg-turbo, as Pillow's and OpenCV's). A warm cache row fills the cache in
its warm-up pass (one process: a node of one member).
"""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from steps import images_of, tf_cpu, tf_iterator

SLIM = "Slim inception (crop, 4 resize methods, flip, colour x4)"
CROP_FLIP = "crop, bilinear resize, flip; no colour"
FUSED = "Slim's draws, colour x4 as one affine map in YIQ (an approximation)"
STANDARD = "torchvision's standard: RandomResizedCrop, flip, Normalize"
MEANS = np.array([123.68, 116.78, 103.94], np.float32)


def tf_rate(encoded, fn, threads: int, repeats: int) -> tuple[float, float]:
    """Images/s and CPU s per image of ``fn(encoded, seed)`` on a private pool of ``threads``."""
    it = tf_iterator(encoded, fn, threads)
    runs = []
    for _ in range(repeats):
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(len(encoded)):
            next(it)
        runs.append((time.perf_counter() - t, time.process_time() - cpu))
    wall, cpu = np.median([r[0] for r in runs]), np.median([r[1] for r in runs])
    return len(encoded) / wall, cpu / len(encoded)


def py_rate(encoded, fn, threads: int, repeats: int) -> tuple[float, float]:
    """As :func:`tf_rate` for ``fn(encoded, index)`` in Python, on a pool of ``threads``."""
    jobs = list(enumerate(encoded))
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda j: fn(j[1], j[0]), jobs))
        runs = []
        for _ in range(repeats):
            t, cpu = time.perf_counter(), time.process_time()
            list(pool.map(lambda j: fn(j[1], j[0]), jobs))
            runs.append((time.perf_counter() - t, time.process_time() - cpu))
    wall, cpu = np.median([r[0] for r in runs]), np.median([r[1] for r in runs])
    return len(encoded) / wall, cpu / len(encoded)


def model_garden(size: int):
    """Model Garden's ResNet ImageNet training preprocessing, from its description."""
    import tensorflow as tf

    def fn(encoded, seed):
        shape = tf.image.extract_jpeg_shape(encoded)
        begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed, min_object_covered=0.1,
            aspect_ratio_range=[0.75, 1.33], area_range=[0.05, 1.0], max_attempts=100,
            use_image_if_no_bounding_boxes=True)
        image = tf.io.decode_and_crop_jpeg(encoded, tf.stack([begin[0], begin[1], crop[0], crop[1]]), channels=3)
        image = tf.image.stateless_random_flip_left_right(image, seed)
        image = tf.image.resize(image, [size, size], method="bilinear")
        return image - tf.constant(MEANS)

    return fn


def _box(rng, w, h):
    from enspipe.data.pixels import sample_crop

    left, top, cw, ch = sample_crop(rng, w, h)
    return left, top, cw, ch


def pillow_steps(size: int):
    """The Model Garden's steps with Pillow and numpy (whole decode, as torchvision's PIL path)."""
    from PIL import Image

    from enspipe.data.pixels import _rgb, generator, open_image

    def fn(encoded, i):
        rng = generator(0, i)
        im = _rgb(open_image(encoded))
        left, top, w, h = _box(rng, *im.size)
        im = im.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(im, np.float32) - MEANS

    return fn


def opencv_steps(size: int):
    """The Model Garden's steps with OpenCV."""
    import cv2

    cv2.setNumThreads(1)

    from enspipe.data.pixels import generator

    def fn(encoded, i):
        rng = generator(0, i)
        image = cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        left, top, w, h = _box(rng, image.shape[1], image.shape[0])
        image = cv2.resize(image[top:top + h, left:left + w], (size, size), interpolation=cv2.INTER_LINEAR)
        if rng.random() < 0.5:
            image = image[:, ::-1]
        return image.astype(np.float32) - MEANS

    return fn


def opencv_standard(size: int, interpolation: str = "linear"):
    """torchvision's standard transform's steps with OpenCV: its RandomResizedCrop box
    (:func:`enspipe.data.pixels.resized_crop_box`), OpenCV's resize (``linear``: bilinear, as
    albumentations' RandomResizedCrop does it, no antialiasing; ``area``: OpenCV's antialiased
    shrink), a flip, Normalize in float32."""
    import cv2

    from enspipe.data.pixels import IMAGENET_MEAN, IMAGENET_STD, generator, resized_crop_box

    cv2.setNumThreads(1)
    method = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA}[interpolation]
    scale = tuple(1 / (255 * d) for d in IMAGENET_STD) + (0.0,)  # per-channel scalars: OpenCV's fast path
    shift = tuple(-m / d for m, d in zip(IMAGENET_MEAN, IMAGENET_STD)) + (0.0,)

    def fn(encoded, i):
        rng = generator(0, i)
        image = cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        left, top, w, h = resized_crop_box(rng, image.shape[1], image.shape[0])
        image = cv2.resize(image[top:top + h, left:left + w], (size, size), interpolation=method)
        if rng.random() < 0.5:
            image = cv2.flip(image, 1)
        return cv2.add(cv2.multiply(image.astype(np.float32), scale), shift)

    return fn


def albumentations_row(size: int):
    import albumentations as A
    import cv2

    cv2.setNumThreads(1)
    pipe = A.Compose([A.RandomResizedCrop(size=(size, size), scale=(0.05, 1.0), ratio=(0.75, 1.33)),
                      A.HorizontalFlip(p=0.5),
                      A.ColorJitter(brightness=32 / 255, contrast=0.5, saturation=0.5, hue=0.2, p=1.0),
                      A.Normalize()])

    def fn(encoded, i):
        image = cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        return pipe(image=image)["image"]

    return fn


def torchvision_row(size: int):
    """torchvision's transforms, or why they do not load here."""
    try:
        import torch
        import torchvision
        from torchvision.io import decode_jpeg
        from torchvision.transforms import v2
    except Exception as e:  # noqa: BLE001 - the CPU build of torch with PyPI's torchvision raises RuntimeError
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"
    torch.set_num_threads(1)
    pipe = v2.Compose([v2.RandomResizedCrop(size, scale=(0.05, 1.0), antialias=True), v2.RandomHorizontalFlip(),
                       v2.ColorJitter(32 / 255, 0.5, 0.5, 0.2), v2.ToDtype(torch.float32, scale=True)])

    def fn(encoded, i):
        return pipe(decode_jpeg(torch.frombuffer(bytearray(encoded), dtype=torch.uint8)))

    return fn, f"torchvision {torchvision.__version__}"


def enspipe_rows(size: int):
    """enspipe's own paths: ``(row, kind, fn, augmentation, warm cache)``."""
    from enspipe.data.preprocessing import make_preprocess_fn

    return [("enspipe tf reference", "tf", make_preprocess_fn("inception", size, False, "reference"), SLIM, False),
            ("enspipe tf crop-first", "tf", make_preprocess_fn("inception", size), SLIM, False),
            ("enspipe tf crop-first + warm cache", "tf", None, SLIM, True),
            ("enspipe tf fused-colour (APPROX.)", "tf", make_preprocess_fn("inception", size, False, "fused-colour"),
             FUSED, False),
            ("enspipe pillow", "py", _pillow(size, None), SLIM + ", float32 colour (OpenCV)", False),
            ("enspipe pillow + warm cache", "py", None, SLIM + ", float32 colour (OpenCV)", True),
            ("enspipe pillow fused-colour (APPROX.)", "py", _pillow(size, None, fused=True), FUSED, False),
            ("enspipe tf standard", "tf", make_preprocess_fn("standard", size), STANDARD, False),
            ("enspipe pillow standard", "py", _standard(size), STANDARD + " (Pillow's antialiased resize)", False)]


def _standard(size: int):
    from enspipe.data import pixels as px

    def fn(encoded, i):
        return px.to_wire("standard", px.standard_train(encoded, size, px.generator(0, i)), "float32")

    return fn


def _pillow(size: int, cache, fused: bool = False):
    from enspipe.data import pixels as px

    def fn(encoded, i):
        source = encoded if cache is None else cache.decoded(i, 0, lambda: px.decode(encoded))
        return px.to_wire("inception", px.inception_train(source, size, px.generator(0, i), False, fused), "float32")

    return fn


def warm_cache(images: int):
    """A decode cache of one process (a node of one member), big enough for the images."""
    from mpi4py import MPI

    from enspipe.engine.decode_cache import DecodeCache

    return DecodeCache(MPI, MPI.COMM_SELF, 2 * images * 1_600_000, images)


def cached_tf(size: int, cache):
    import tensorflow as tf

    from enspipe.engine.backends.tf import element_fn

    one = element_fn("inception", size, False, "float32", 0, "crop-first", cache)

    def fn(encoded, seed):
        e = {"encoded": encoded, "id": seed[1], "epoch": tf.constant(0, tf.int64), "position": seed[1],
             "label": seed[1]}
        return one(e)[0]

    return fn


def measure_set(name: str, a, threads: int) -> None:
    import tensorflow as tf

    from enspipe.data.preprocessing import decode

    encoded = images_of(name, a.images)
    tensor = tf.constant(encoded)
    decode_alone = tf_cpu(tensor, lambda e, s: decode(e), a.repeats)
    print(f"\n=== {len(encoded)} {name} JPEGs; tf.io.decode_image alone: {decode_alone * 1e6:.0f} µs/image "
          f"(one thread); {threads} threads for the node's cores")
    print(f"{'row':<38}{'µs/img 1 thr':>13}{'x decode':>9}{f'img/s {threads} thr':>13}{f'µs/img {threads} thr':>13}"
          f"  augmentation")
    rows = enspipe_rows(a.size) + [
        ("Model Garden ResNet (tf)", "tf", model_garden(a.size), CROP_FLIP + "; means subtracted", False),
        ("Pillow + numpy, same steps", "py", pillow_steps(a.size), CROP_FLIP + "; means subtracted", False),
        ("OpenCV, same steps", "py", opencv_steps(a.size), CROP_FLIP + "; means subtracted", False),
        ("OpenCV, standard's steps", "py", opencv_standard(a.size), STANDARD + " (OpenCV's bilinear resize)", False),
        ("OpenCV, standard's steps, area", "py", opencv_standard(a.size, "area"),
         STANDARD + " (OpenCV's antialiased INTER_AREA)", False),
        ("albumentations (OpenCV decode)", "py", albumentations_row(a.size),
         "RandomResizedCrop (bilinear), flip, ColorJitter (x4, one order), Normalize", False)]
    tv, why = torchvision_row(a.size)
    rows.append(("torchvision transforms v2", "py", tv, why + "; RandomResizedCrop, flip, ColorJitter", False))
    for row, kind, fn, what, cached in rows:
        if fn is None and not cached:
            print(f"{row:<38}{'not run':>13}{'':>9}{'':>13}{'':>13}  {what}")
            continue
        if cached:
            cache = warm_cache(len(encoded))
            fn = cached_tf(a.size, cache) if kind == "tf" else _pillow(a.size, cache)
        measure = tf_rate if kind == "tf" else py_rate
        one = measure(tensor if kind == "tf" else encoded, fn, 1, a.repeats)
        node = measure(tensor if kind == "tf" else encoded, fn, threads, a.repeats)
        print(f"{row:<38}{one[1] * 1e6:>13.0f}{one[1] / decode_alone:>9.2f}{node[0]:>13.0f}{node[1] * 1e6:>13.0f}"
              f"  {what}")
        if cached:
            cache.free()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sets", default="synthetic,photos")
    a = ap.parse_args()
    threads = os.cpu_count() or 1
    print(f"preprocessing at {a.size} px, median of {a.repeats} passes after a warm-up pass, {threads} CPUs visible")
    for name in a.sets.split(","):
        measure_set(name, a, threads)


if __name__ == "__main__":
    main()
