"""Where each image's CPU goes: the built-in preprocessings' steps, µs of CPU per image and their
share of the whole, one thread, on the embedded synthetic JPEGs and on natural photographs
(:mod:`enspipe.data.photos`, crops of scikit-image's photos re-encoded at quality 90).

    python benchmarks/steps.py [--images 256] [--size 224] [--repeats 3] [--sets synthetic,photos]

TensorFlow's steps run as tf.data maps on one thread (a private pool of 1, one thread per op; one
iterator over the images repeated, so its setup is not counted), and
a step's cost is the difference between the pipeline up to it and the pipeline up to the step
before, taken within each repeat (every pipeline's pass runs once per repeat, interleaved), the
median over the repeats: a step's row is the CPU it adds. A
step drawn at random per image (the resize method; the colour ordering) is measured per draw: the
resize row is the mean of the four methods (one is drawn per image), a colour op's row is that op
added after the flip (every image gets each of the four ops in full mode). The pillow backend's
steps are timed one by one with the thread's CPU clock. ``sum`` adds the rows; ``whole`` is the
preprocessing run as the members run it: their difference is what the split does not see (the
random branches' switching, for one) and the noise of the differences.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from cells import dataset

SETS = ("synthetic", "photos")


def images_of(name: str, n: int) -> list[bytes]:
    """The set's first ``n`` encoded images."""
    if name == "photos":
        from enspipe.data.photos import photo_jpegs

        return [jpeg for _, jpeg in photo_jpegs(n)]
    from enspipe.data.build import load_manifest
    from enspipe.data.shards import read_slices

    m = load_manifest(dataset(n))
    return list(next(read_slices(m, 0, 0, False, n, 0, n))["encoded"])


def tf_iterator(encoded, fn, threads: int = 1):
    """An iterator of ``fn(encoded, seed)`` mapped over the images, repeated, on a private pool of
    ``threads`` (one iterator, so its setup is not counted), after a warm-up pass."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(encoded).enumerate()
    ds = ds.map(lambda i, e: fn(e, tf.stack([tf.constant(0, tf.int64), i])), num_parallel_calls=threads)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    opts.threading.max_intra_op_parallelism = 1
    it = iter(ds.repeat().with_options(opts))
    for _ in range(len(encoded)):  # warm-up: tracing, the pool
        next(it)
    return it


def one_pass(it, n: int) -> float:
    """CPU seconds per image of the iterator's next ``n`` elements."""
    cpu = time.process_time()
    for _ in range(n):
        next(it)
    return (time.process_time() - cpu) / n


def tf_cpu(encoded, fn, repeats: int) -> float:
    """Median CPU seconds per image of ``fn(encoded, seed)`` mapped over the images on one thread."""
    it = tf_iterator(encoded, fn)
    return float(np.median([one_pass(it, len(encoded)) for _ in range(repeats)]))


def tf_prefixes(impl: str, size: int) -> list[tuple[str, str, object]]:
    """The TensorFlow inception's steps as ``(row, mode, prefix)``: ``prefix(e, seed)`` runs the
    pipeline up to and including the row's step; mode ``step`` is measured against the previous
    ``step`` row, ``mean`` and ``each`` rows against the last ``step`` row before them."""
    import tensorflow as tf

    from enspipe.data import preprocessing as P

    def seeds(seed):
        return P._seeds(seed, 5)

    def decoded(e, seed):
        if impl == "reference":
            return P.decode(e)
        return P._window(e, seeds(seed)[0])

    def floated(e, seed):
        return tf.image.convert_image_dtype(decoded(e, seed), tf.float32)

    def cropped(e, seed):
        image = floated(e, seed)
        if impl == "reference":
            image = tf.slice(image, *P._crop_box(tf.shape(image), seeds(seed)[0]))
        return image

    def resized(method):
        return lambda e, seed: tf.image.resize(cropped(e, seed), [size, size], method=method)

    def flipped(e, seed):
        return tf.image.stateless_random_flip_left_right(resized("bilinear")(e, seed), seeds(seed)[2])

    def coloured(op):
        ops = {"brightness": lambda x, s: tf.image.stateless_random_brightness(x, 32.0 / 255.0, s),
               "saturation": lambda x, s: tf.image.stateless_random_saturation(x, 0.5, 1.5, s),
               "hue": lambda x, s: tf.image.stateless_random_hue(x, 0.2, s),
               "contrast": lambda x, s: tf.image.stateless_random_contrast(x, 0.5, 1.5, s)}
        return lambda e, seed: ops[op](flipped(e, seed), seeds(seed)[4])

    def scaled(e, seed):
        return (tf.clip_by_value(flipped(e, seed), 0.0, 1.0) - 0.5) * 2.0

    decode_row = "decode (whole image)" if impl == "reference" else "decode the crop window (JPEG)"
    rows = [(decode_row, "step", decoded), ("to float" + (" (whole image)" if impl == "reference" else " (crop)"),
                                             "step", floated)]
    if impl == "reference":
        rows += [("bounding box + crop", "step", cropped)]
    rows += [(f"resize {m}", "mean", resized(m)) for m in P._RESIZE_METHODS]
    rows += [("resize (mean of 4)", "step", resized("bilinear")), ("flip", "step", flipped)]
    rows += [(f"colour: {op}", "each", coloured(op)) for op in ("brightness", "saturation", "hue", "contrast")]
    return rows + [("clip + scale to [-1, 1]", "step", scaled)]


def profile_tf(encoded, impl: str, size: int, repeats: int) -> list[tuple[str, float]]:
    """``(row, CPU seconds per image)`` of each step, plus ``whole``: every prefix's pass runs once
    per repeat, all of them interleaved, and a step's cost is the median over the repeats of its
    difference within the repeat (a drift of the machine's speed cancels)."""
    from enspipe.data.preprocessing import make_preprocess_fn

    rows = tf_prefixes(impl, size)
    its = [tf_iterator(encoded, prefix) for _, _, prefix in rows]
    whole_it = tf_iterator(encoded, make_preprocess_fn("inception", size, False, impl))
    passes = []
    for _ in range(repeats):
        passes.append(([one_pass(it, len(encoded)) for it in its], one_pass(whole_it, len(encoded))))
    out = []
    for r, (name, mode, _) in enumerate(rows):  # a method's row is indented: the mean row adds them
        out.append(("  " * (mode == "mean") + name, float(np.median([_step(rows, costs, r) for costs, _ in passes]))))
    return out + [("whole", float(np.median([w for _, w in passes])))]


def _step(rows, costs: list[float], r: int) -> float:
    """Row ``r``'s cost in one repeat: its prefix less the last ``step`` prefix before it (a
    ``resize`` step row: the mean of the methods' rows before it)."""
    name, mode, _ = rows[r]
    base = next((costs[k] for k in range(r - 1, -1, -1) if rows[k][1] == "step"), 0.0)
    if mode == "step" and name.startswith("resize"):
        return float(np.mean([costs[k] - base for k in range(r) if rows[k][1] == "mean"]))
    return costs[r] - base


def profile_pillow(encoded, size: int, repeats: int) -> list[tuple[str, float]]:
    """The pillow backend's inception, step by step on the thread's CPU clock."""
    from enspipe.data import pixels as px

    steps: dict[str, list[float]] = {}

    def timed(name, fn, *args):
        t = time.thread_time()
        out = fn(*args)
        steps.setdefault(name, []).append(time.thread_time() - t)
        return out

    colour = {"b": ("colour: brightness", 16 / 255), "s": ("colour: saturation", 1.25), "h": ("colour: hue", 0.1),
              "c": ("colour: contrast", 1.25)}
    names = ("bilinear", "nearest", "bicubic", "area")
    for _ in range(repeats):
        for i, e in enumerate(encoded):
            rng = px.generator(0, i)
            im = timed("open + bounding box", px.open_image, e)
            left, top, w, h = timed("open + bounding box", px.sample_crop, rng, *im.size)
            pixels, box = timed("decode (DCT-scaled) + crop", px.decoded_box, e, im, (left, top, left + w, top + h),
                                size)
            x0, y0, x1, y1 = (int(round(v)) for v in box)
            crop = pixels[y0:max(y1, y0 + 1), x0:max(x1, x0 + 1)]
            for name, method in zip(names, px._CV_METHODS):
                small = timed(f"  resize {name}", lambda m=method: px.cv2.resize(crop, (size, size), interpolation=m))
            small = timed("flip", px.cv2.flip, small, 1)
            x = timed("to float", lambda: small.astype(np.float32) * np.float32(1 / 255))
            for op, (name, value) in colour.items():
                timed(name, px.colour_op, x, op, value)
            timed("to the wire (float)", px.to_wire, "inception", small, "float32")
    per = {k: sum(v) / repeats / len(encoded) for k, v in steps.items()}
    resize = float(np.mean([v for k, v in per.items() if k.startswith("  resize")]))
    rows = [(k, v) for k, v in per.items() if not k.startswith("colour") and k != "flip" and not k.startswith("to")]
    rows += [("resize (mean of 4)", resize)] + [(k, v) for k, v in per.items()
                                               if k.startswith(("flip", "colour", "to "))]
    whole = []
    for _ in range(repeats):
        t = time.thread_time()
        for i, e in enumerate(encoded):
            px.to_wire("inception", px.inception_train(e, size, px.generator(0, i)), "float32")
        whole.append((time.thread_time() - t) / len(encoded))
    return rows + [("whole", float(np.median(whole)))]


def print_profile(title: str, rows: list[tuple[str, float]], decode: float) -> None:
    whole = rows[-1][1]
    print(f"\n{title}")
    print(f"{'step':<34}{'µs/image':>10}{'share':>8}")
    for name, cost in rows[:-1]:
        share = "" if name.startswith("  ") else f"{cost / whole:>8.0%}"
        print(f"{name:<34}{cost * 1e6:>10.0f}{share}")
    counted = sum(c for n, c in rows[:-1] if not n.startswith("  "))
    print(f"{'sum of the steps':<34}{counted * 1e6:>10.0f}{counted / whole:>8.0%}")
    print(f"{'whole':<34}{whole * 1e6:>10.0f}{1:>8.0%}   {whole / decode:.2f}x decode alone")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--backends", default="tf,pillow")
    a = ap.parse_args()
    backends = a.backends.split(",")
    print(f"inception at {a.size} px, one thread, {os.cpu_count()} CPUs visible, median of {a.repeats}")
    for name in a.sets.split(","):
        encoded = images_of(name, a.images)
        print(f"\n=== {len(encoded)} {name} JPEGs")
        if "tf" in backends:
            import tensorflow as tf

            from enspipe.data.preprocessing import decode

            tensor = tf.constant(encoded)
            decode_alone = tf_cpu(tensor, lambda e, s: decode(e), a.repeats)
            print(f"tf.io.decode_image alone: {decode_alone * 1e6:.0f} µs/image")
            for impl in ("reference", "crop-first"):
                print_profile(f"tf backend, {impl}", profile_tf(tensor, impl, a.size, a.repeats), decode_alone)
        if "pillow" in backends:
            from enspipe.data import pixels as px

            t = time.thread_time()
            for _ in range(a.repeats):
                for e in encoded:
                    px.decode(e)
            pil_decode = (time.thread_time() - t) / a.repeats / len(encoded)
            print(f"\nPillow whole decode alone: {pil_decode * 1e6:.0f} µs/image")
            print_profile("pillow backend", profile_pillow(encoded, a.size, a.repeats), pil_decode)


if __name__ == "__main__":
    main()
