"""The two preprocessing backends side by side: CPU ms and wall time per image of TensorFlow's
(tf.data and Slim's ops, the pipeline's own per-sample function) and of the pillow backend's
(Pillow and numpy, the pipeline's own engine: its worker processes past one thread), on the same
encoded images, for each built-in
preprocessing and thread count, and each backend's bare JPEG decode as the floor.

    python benchmarks/backends.py [--images 256] [--size 224] [--repeats 3]

Every row runs after a warm-up pass; the rows run interleaved (every other repeat in reverse
order), and each cell is the median (min-max) of the repeats. ``pillow / tf`` is the ratio of the
two backends' CPU per image, taken within each repeat. Output is uint8 on the wire for both, as
``--wire-dtype uint8`` sends it. Needs TensorFlow (for its rows).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from cells import dataset, schedule, spread

from enspipe.data.build import load_manifest
from enspipe.data.order import NumpyOrder, read_share
from enspipe.data.parse import resolve

CASES = [("decode", False), ("inception", False), ("inception", True), ("vgg", False)]


def encoded_images(n: int) -> list[bytes]:
    m = load_manifest(dataset(n))
    return list(next(read_share(m, NumpyOrder(m, 0, 0), resolve(None), False, n, 0, n))["encoded"])


def run_tf(encoded: list[bytes], name: str, size: int, threads: int, fast: bool) -> tuple[float, float]:
    import tensorflow as tf

    from enspipe.data.preprocessing import decode
    from enspipe.engine.backends.tf import element_fn, tf_data_options

    n = len(encoded)
    ds = tf.data.Dataset.from_tensor_slices({"encoded": encoded, "id": np.arange(n), "epoch": np.zeros(n, np.int64),
                                             "position": np.arange(n), "label": np.zeros(n, np.int64)})
    one = (lambda e: decode(e["encoded"])) if name == "decode" else element_fn(name, size, fast, "uint8", 0)
    ds = ds.map(one, num_parallel_calls=threads, deterministic=True).with_options(tf_data_options(threads))
    t, cpu = time.perf_counter(), time.process_time()
    for _ in ds:
        pass
    return time.perf_counter() - t, time.process_time() - cpu


def run_pillow(encoded: list[bytes], name: str, size: int, threads: int, fast: bool) -> tuple[float, float]:
    """The pillow backend's engine over the images as one slice: its ``threads`` worker
    processes (one: in this thread); ``decode``: Pillow's whole decode in this thread alone.
    CPU is this process's and its workers' (:func:`enspipe.measure.threadcpu.process_cpu`)."""
    from enspipe.data import pixels
    from enspipe.engine.backends.pillow import PillowEngine
    from enspipe.measure.threadcpu import process_cpu

    if name == "decode":
        t, cpu = time.perf_counter(), process_cpu()
        for e in encoded:
            pixels.decode(e)
        return time.perf_counter() - t, process_cpu() - cpu
    n = len(encoded)
    item = {"encoded": np.array(encoded, object), "id": np.arange(n), "epoch": np.zeros(n, np.int64),
            "position": np.arange(n), "label": np.zeros(n, np.int64), "key": np.array([b"x"] * n, object)}
    engine = PillowEngine(name, size, fast, "uint8", 0, threads, False)
    try:
        it = engine.run(lambda: item)
        next(it)  # its workers start
        t, cpu = time.perf_counter(), process_cpu()
        next(it)
        return time.perf_counter() - t, process_cpu() - cpu
    finally:
        engine.close()


RUNNERS = {"tf": run_tf, "pillow": run_pillow}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", default="1,2", help="pool sizes, comma-separated")
    a = ap.parse_args()
    encoded = encoded_images(a.images)
    todo = [(backend, name, fast, int(t)) for name, fast in CASES for t in a.threads.split(",")
            for backend in RUNNERS]
    for backend, name, fast, threads in todo:  # warm-up: tracing, pools, caches
        RUNNERS[backend](encoded[:32], name, a.size, threads, fast)
    runs: dict = {case: [] for case in todo}
    for _, case in schedule(todo, a.repeats):
        backend, name, fast, threads = case
        runs[case].append(RUNNERS[backend](encoded, name, a.size, threads, fast))
    mean_kb = np.mean([len(e) for e in encoded]) / 1024
    print(f"{a.images} synthetic JPEGs ({mean_kb:.0f} KB mean), {a.size} px, uint8 out, {os.cpu_count()} CPUs "
          f"visible, {a.repeats} repeats interleaved: median (min-max)")
    print(f"{'preprocessing':<20}{'threads':>8}{'backend':>8}{'img/s':>20}{'CPU ms/img':>20}{'pillow / tf CPU':>20}")
    for name, fast in CASES:
        for threads in (int(t) for t in a.threads.split(",")):
            tf_runs = runs[("tf", name, fast, threads)]
            for backend in RUNNERS:
                rs = runs[(backend, name, fast, threads)]
                ratio = spread([p[1] / q[1] for p, q in zip(rs, tf_runs)]) if backend == "pillow" else ""
                label = f"{name}{' (fast)' if fast else ''}"
                print(f"{label:<20}{threads:>8}{backend:>8}{spread([a.images / r[0] for r in rs], digits=0):>20}"
                      f"{spread([r[1] for r in rs], 1000 / a.images):>20}{ratio:>20}")


if __name__ == "__main__":
    main()
