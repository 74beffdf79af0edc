"""One member's preprocessing across cores: images/s and CPU per image at 1, 2, ... cores, for
each backend and built-in preprocessing, on natural photographs, beside the ceiling: the same
per-image function in k independent single-core processes.

    python benchmarks/scaling.py [--cores 1,2] [--images-per-core 384] [--size 224] [--repeats 3]
                                 [--backends pillow,tf] [--preprocess inception,vgg] [--json out.json]

Each measurement is a fresh process pinned to the first k cores: the engine the pipeline runs
(``enspipe.engine.backends``, ``threads=k``: the pillow backend's k worker processes, or
tf.data's k threads) preprocesses slices of 64 photos, ``--images-per-core`` times k images after
one unmeasured slice (worker start-up, tracing). CPU is the member's: its process and its worker
processes. The ceiling runs k processes, each pinned to its own core with ``threads=1``, over the
same number of images, started together: its rate is all their images over the slowest one's time.

Rows run interleaved (every other repeat in reverse order); each cell is the median (min-max) of
the repeats; ``x 1 core`` is the k-core rate over the 1-core rate, paired per repeat, against
the goal 0.85 k; ``of ceiling`` is the rate over the ceiling's, paired per repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from cells import schedule, spread

SLICE = 64
HERE = os.path.dirname(os.path.abspath(__file__))


def photos(n: int) -> list[bytes]:
    from enspipe.data.photos import photo_jpegs

    return [jpeg for _, jpeg in photo_jpegs(n, seed=7)]


def measure(backend: str, preprocess: str, size: int, threads: int, images: int) -> dict:
    """In this process (pinned by the caller): the engine over ``images`` photos; wall and CPU."""
    from enspipe.data.pixels import output_spec
    from enspipe.engine.backends import backend as get
    from enspipe.engine.backends.base import PrepSpec, Stopped
    from enspipe.engine.memory import set_malloc
    from enspipe.measure import threadcpu

    set_malloc("keep")  # as a member runs (--malloc keep, the default)
    enc = np.array(photos(SLICE), object)
    item = {"encoded": enc, "id": np.arange(SLICE), "epoch": np.zeros(SLICE, np.int64),
            "position": np.arange(SLICE, dtype=np.int64), "label": np.zeros(SLICE, np.int64),
            "key": np.array([f"photo{i}".encode() for i in range(SLICE)], object)}
    shape, dtype = output_spec(preprocess, size, "uint8")
    spec = PrepSpec(manifest=None, preprocessing=preprocess, size=size, fast_mode=False, wire_dtype="uint8",
                    impl="crop-first", order_seed=0, prep_seed=0, shuffle_buffer=0, skip_corrupt=False, batch=SLICE,
                    share=(0, SLICE), unit=1, threads=threads, depth=4, image_shape=shape, image_dtype=dtype)
    slices = 1 + -(-images // SLICE)
    served = [0]

    def take():
        if served[0] >= slices:
            raise Stopped
        served[0] += 1
        return {**item, "position": item["position"] + SLICE * served[0]}  # fresh draws per slice

    engine = get(backend).engine(spec)
    try:
        it = engine.run(take)
        next(it)  # unmeasured: start-up
        t, cpu, done = time.perf_counter(), threadcpu.process_cpu(), 0
        try:
            for _, out, _, _ in it:
                done += len(out)
        except Stopped:
            pass
        return {"seconds": time.perf_counter() - t, "cpu": threadcpu.process_cpu() - cpu, "images": done}
    finally:
        engine.close()


def one(case: dict) -> dict:
    """A fresh process, pinned to ``cores``, measuring ``case``."""
    cmd = [sys.executable, __file__, "--one", json.dumps(case)]
    r = subprocess.run(["taskset", "-c", ",".join(map(str, case["cores"])), *cmd], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(f"{case}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(backend: str, preprocess: str, size: int, k: int, per_core: int, ceiling: bool, cpus: list[int]) -> dict:
    base = {"backend": backend, "preprocess": preprocess, "size": size, "images": per_core * k}
    if not ceiling:
        return one({**base, "threads": k, "cores": cpus[:k]})
    procs = [subprocess.Popen(["taskset", "-c", str(c), sys.executable, __file__, "--one",
                               json.dumps({**base, "threads": 1, "images": per_core, "cores": [c]})],
                              stdout=subprocess.PIPE, text=True) for c in cpus[:k]]
    outs = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
    return {"seconds": max(o["seconds"] for o in outs), "cpu": sum(o["cpu"] for o in outs),
            "images": sum(o["images"] for o in outs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--cores", default=None, help="core counts, comma-separated (default: 1, 2, 4, ... up to all)")
    ap.add_argument("--images-per-core", type=int, default=384)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default=None, help="default: pillow, and tf where TensorFlow is installed")
    ap.add_argument("--preprocess", default="inception,vgg")
    ap.add_argument("--json", help="also write every measurement here")
    a = ap.parse_args()
    if a.one:
        c = json.loads(a.one)
        print(json.dumps(measure(c["backend"], c["preprocess"], c["size"], c["threads"], c["images"])))
        return
    cpus = sorted(os.sched_getaffinity(0))
    ks = [int(k) for k in a.cores.split(",")] if a.cores else sorted({*(2 ** i for i in range(8) if 2 ** i < len(cpus)),
                                                                       len(cpus)})
    from importlib.util import find_spec

    backends = a.backends.split(",") if a.backends else ["pillow", *(["tf"] if find_spec("tensorflow") else [])]
    todo = [(b, p, k, ceiling) for b in backends for p in a.preprocess.split(",") for k in ks
            for ceiling in ((False, True) if k > 1 else (False,))]
    runs: dict = {case: [] for case in todo}
    for _, case in schedule(todo, a.repeats):
        runs[case].append(run(case[0], case[1], a.size, case[2], a.images_per_core, case[3], cpus))
        if a.json:  # after every measurement: a time limit keeps what was measured
            with open(a.json, "w") as f:
                json.dump([{"backend": b, "preprocess": p, "cores": k, "ceiling": c, "runs": rs}
                           for (b, p, k, c), rs in runs.items()], f, indent=1)
    report(runs, backends, a, ks, len(cpus))


def report(runs: dict, backends: list[str], a, ks: list[int], ncpu: int) -> None:
    print(f"one member's preprocessing, {a.size} px photos (scikit-image crops, 330-500 px), uint8 out, "
          f"{ncpu} CPUs visible, {a.repeats} repeats interleaved: median (min-max)")
    print(f"{'backend':<8}{'preprocess':<11}{'cores':>6}{'img/s':>22}{'CPU ms/img':>20}{'x 1 core':>20}"
          f"{'goal':>7}{'ceiling img/s':>22}{'of ceiling':>20}")
    for b in backends:
        for p in a.preprocess.split(","):
            one_core = runs[(b, p, ks[0], False)] if ks[0] == 1 else None
            for k in ks:
                rs = runs[(b, p, k, False)]
                rate = [r["images"] / r["seconds"] for r in rs]
                scale = spread([x / (o["images"] / o["seconds"]) for x, o in zip(rate, one_core)]) if one_core else ""
                ceil = runs.get((b, p, k, True))
                ceil_rate = [r["images"] / r["seconds"] for r in ceil] if ceil else rate
                print(f"{b:<8}{p:<11}{k:>6}{spread(rate, digits=0):>22}"
                      f"{spread([r['cpu'] / r['images'] for r in rs], 1000):>20}{scale:>20}{0.85 * k:>7.2f}"
                      f"{spread(ceil_rate, digits=0):>22}{spread([x / c for x, c in zip(rate, ceil_rate)]):>20}")


if __name__ == "__main__":
    main()
