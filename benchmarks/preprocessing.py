"""Preprocessing cost per image: images/s per core and CPU ms per image, per preprocessing and
thread count, on the embedded synthetic dataset (real JPEG decode + Slim augmentation).

    python benchmarks/preprocessing.py [--images 256] [--size 224] [--repeats 3]

Each row runs the tf.data map over the same encoded images with a private pool of T threads,
after one warm-up pass; it reports the median of the repeats and their spread.

    python benchmarks/preprocessing.py --layouts 1x2,2x1,4x1 [--passes 8]

The machine's own cost of members that share cores: each layout PxT runs P processes of T
threads at once (each after a warm-up, all started together), each preprocessing its share of
``--passes`` passes over the images as a member does (its per-sample function, batches of 32,
freed memory kept as ``--malloc keep`` keeps it), and nothing else. Per layout: the node's images/s, the CPU per image of all P processes, and
both against the first layout (one process, as one member with the cores to itself), as the
median (min-max) of ratios taken within each repeat; the layouts run interleaved, every other
repeat in reverse order. This is the ceiling of ``benchmarks/sharing.py``'s ``vs N=1``: N members
on the cores of one pay at least what N processes of nothing but preprocessing pay.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf
from cells import dataset, schedule, spread

from enspipe.data.build import load_manifest
from enspipe.data.shards import read_slices
from enspipe.data.preprocessing import make_preprocess_fn


def encoded_images(n: int) -> list[bytes]:
    m = load_manifest(dataset(n))
    return tf.constant(next(read_slices(m, 0, 0, False, n, 0, n))["encoded"])


def measure(encoded, name: str, size: int, threads: int, fast: bool) -> tuple[float, float]:
    fn = make_preprocess_fn(name, size, fast)
    ds = tf.data.Dataset.from_tensor_slices(encoded).enumerate()
    ds = ds.map(lambda i, e: fn(e, tf.stack([tf.constant(0, tf.int64), i])), num_parallel_calls=threads)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    opts.threading.max_intra_op_parallelism = 1
    ds = ds.with_options(opts)
    t, cpu = time.perf_counter(), time.process_time()
    for _ in ds:
        pass
    return time.perf_counter() - t, time.process_time() - cpu


def worker(images: int, size: int, threads: int, passes: int, procs: int) -> None:
    """One process of a layout: preprocess as a member does (its per-sample function, batches of
    32, a private pool of ``threads``, freed memory kept) after a warm-up, say ``ready``, wait for
    the go (a line on stdin), then preprocess its 1/``procs`` share of ``passes`` passes over the
    images; print its wall and CPU seconds."""
    from enspipe.engine.memory import set_malloc
    from enspipe.engine.backends.tf import element_fn, tf_data_options

    set_malloc("keep")
    encoded = encoded_images(images)
    one = element_fn("inception", size, False, "float32", 0)
    ds = tf.data.Dataset.range(2**62).map(lambda i: {
        "encoded": tf.gather(encoded, i % len(encoded)), "id": i, "epoch": i // len(encoded), "position": i, "label": i})
    it = iter(ds.map(one, num_parallel_calls=threads, deterministic=True).batch(32).with_options(
        tf_data_options(threads)))
    for _ in range(4):  # warm-up: tracing, pools, malloc's heaps
        next(it)[0].numpy()
    print("ready", flush=True)
    sys.stdin.readline()
    batches = max(1, passes * images // procs // 32)
    t, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)[0].numpy()
    print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - cpu, "images": 32 * batches}),
          flush=True)


def run_layout(procs: int, threads: int, a) -> dict:
    """P processes of T threads at once: the node's images/s and the CPU per image of them all."""
    dataset(a.images)  # made here, not by P workers at once
    cmd = [sys.executable, __file__, "--worker", str(threads), "--images", str(a.images), "--size", str(a.size),
           "--passes", str(a.passes), "--procs", str(procs)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    ps = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(procs)]
    try:
        for p in ps:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {procs}x{threads} worker failed to start (exit {p.wait()})")
        for p in ps:  # all start together
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline()) for p in ps]
    except BaseException:
        for p in ps:
            p.kill()
        raise
    for p in ps:
        p.wait()
    images = sum(o["images"] for o in outs)
    return {"rate": images / max(o["wall"] for o in outs), "cpu": sum(o["cpu"] for o in outs) / images}


def layouts(a) -> None:
    todo = [tuple(int(x) for x in spec.split("x")) for spec in a.layouts.split(",")]
    print(f"{a.images} synthetic JPEGs, inception, {a.size} px, {a.passes} passes per layout, {os.cpu_count()} CPUs "
          f"visible, {a.repeats} repeats interleaved (every other one in reverse order)")
    runs: dict = {lay: [] for lay in todo}
    for _, lay in schedule(todo, a.repeats):
        runs[lay].append(run_layout(*lay, a))
    first = todo[0]
    print(f"{'processes x threads':<21}{'node img/s':>18}{'CPU ms/img':>20}{'rate vs ' + 'x'.join(map(str, first)):>18}"
          f"{'CPU vs ' + 'x'.join(map(str, first)):>18}")
    for lay in todo:
        rs = runs[lay]
        rate = [r["rate"] / f["rate"] for r, f in zip(rs, runs[first])]
        cpu = [r["cpu"] / f["cpu"] for r, f in zip(rs, runs[first])]
        print(f"{'x'.join(map(str, lay)):<21}{spread([r['rate'] for r in rs], digits=0):>18}"
              f"{spread([r['cpu'] for r in rs], 1000):>20}{spread(rate):>18}{spread(cpu):>18}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--layouts", default="", help="comma-separated PxT: P processes of T threads at once")
    ap.add_argument("--passes", type=int, default=8, help="passes over the images per layout, split among its processes")
    ap.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)  # a layout's process, its threads
    ap.add_argument("--procs", type=int, default=1, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.images, a.size, a.worker, a.passes, a.procs)
    if a.layouts:
        return layouts(a)
    encoded = encoded_images(a.images)
    print(f"{a.images} synthetic JPEGs, {a.size} px, {os.cpu_count()} CPUs visible, median of {a.repeats}")
    print(f"{'preprocessing':<22}{'threads':>8}{'img/s':>10}{'img/s/core':>12}{'CPU ms/img':>12}{'spread':>9}")
    for name, fast in (("inception", False), ("inception", True), ("vgg", False)):
        for threads in (1, 2):
            measure(encoded, name, a.size, threads, fast)  # warm-up: tracing, caches
            runs = [measure(encoded, name, a.size, threads, fast) for _ in range(a.repeats)]
            walls, cpus = np.array([r[0] for r in runs]), np.array([r[1] for r in runs])
            rate = a.images / np.median(walls)
            label = f"{name}{' (fast_mode)' if fast else ''}"
            print(f"{label:<22}{threads:>8}{rate:>10.1f}{rate / threads:>12.1f}"
                  f"{1000 * np.median(cpus) / a.images:>12.2f}{(walls.max() - walls.min()) / np.median(walls):>8.0%}")


if __name__ == "__main__":
    main()
