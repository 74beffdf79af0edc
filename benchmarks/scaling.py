"""One member's preprocessing across cores, on the paths users run: images/s and CPU per image at
1, 2, ... cores, beside the ceiling (the same per-image function in k independent single-core
processes), on natural photographs.

    python benchmarks/scaling.py [--cores 1,2] [--paths engine,cell,stream,serve] [--images-per-core 2560]
                                 [--size 224] [--repeats 3] [--backends pillow,tf] [--preprocess inception]
                                 [--wire-dtype float32] [--json out.json]

Paths (each a fresh process, pinned to the first k cores with ``taskset``):

* ``engine``: the backend's engine alone (``enspipe.engine.backends``, ``threads=k``: the pillow
  backend's k worker processes, or tf.data's k threads) over slices of 64 photos;
* ``cell``: ``mpiexec -n 1 enspipe run --scheme baseline --consumer peak --batch-size 32 --cores k``,
  its summary's rate and CPU over the measured window;
* ``stream``: ``SharedStream(..., threads=k)``, one member iterated as numpy batches of 32;
* ``serve``: ``enspipe serve --workers k`` and one ``attach`` consumer on the same cores (as a
  stream's member takes its batches on its own) taking batches of 32; CPU is the server's and its
  workers'.

Every path's window holds ``--images-per-core`` x k images (at least 3 s at this machine's rates)
after an unmeasured start (worker start-up, tracing, 10 batches). CPU is the member's: its process
and its worker processes. The ceiling runs k engine processes, each pinned to its own core with
``threads=1``, over the same images in all, started together: its rate is all their images over the
slowest one's time.

Rows run interleaved (every other repeat in reverse order); each cell is the median (min-max) of
the repeats; ``x 1 core`` is the k-core rate over the same path's 1-core rate, paired per repeat,
against the goal 0.85 k; ``of ceiling`` is the rate over the ceiling's, paired per repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from cells import schedule, spread

SLICE = 64
BATCH = 32
WARMUP = 10  # batches before a stream's or a server's window
HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
ENSPIPE = [sys.executable, "-m", "enspipe"]  # installed or from src/ on PYTHONPATH (benchmarks/gpu.sh)
PATHS = ("engine", "cell", "stream", "serve")


def photos(n: int) -> list[bytes]:
    from enspipe.data.photos import photo_jpegs

    return [jpeg for _, jpeg in photo_jpegs(n, seed=7)]


def engine(c: dict) -> dict:
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
    shape, dtype = output_spec(c["preprocess"], c["size"], c["wire_dtype"])
    spec = PrepSpec(manifest=None, preprocessing=c["preprocess"], size=c["size"], fast_mode=False,
                    wire_dtype=c["wire_dtype"], impl="crop-first", order_seed=0, prep_seed=0, shuffle_buffer=0,
                    skip_corrupt=False, batch=SLICE, share=(0, SLICE), unit=1, threads=c["threads"], depth=4,
                    image_shape=shape, image_dtype=dtype)
    slices = 1 + -(-c["images"] // SLICE)
    served = [0]

    class Take:  # the slices as a pipeline's stage hands them out: each ready at once
        def __call__(self):
            if served[0] >= slices:
                raise Stopped
            served[0] += 1
            return {**item, "position": item["position"] + SLICE * served[0]}  # fresh draws per slice

        def poll(self):
            return self() if served[0] < slices else None

    eng = get(c["backend"]).engine(spec)
    try:
        it = eng.run(Take())
        next(it)  # unmeasured: start-up
        t, cpu, done = time.perf_counter(), threadcpu.process_cpu(), 0
        try:
            for _, out, _, _ in it:
                done += len(out)
        except Stopped:
            pass
        return {"seconds": time.perf_counter() - t, "cpu": threadcpu.process_cpu() - cpu, "images": done}
    finally:
        eng.close()


def stream(c: dict) -> dict:
    """In this process (pinned by the caller): one SharedStream member, batches of 32 as numpy."""
    from enspipe import SharedStream
    from enspipe.measure import threadcpu

    s = SharedStream(c["data"], BATCH, threads=c["threads"], preprocess=c["preprocess"], backend=c["backend"],
                     image_size=c["size"], wire_dtype=c["wire_dtype"], scheme="baseline")
    try:
        take = s.next_batch
        for _ in range(WARMUP):
            take()
        n = -(-c["images"] // BATCH)
        t, cpu = time.perf_counter(), threadcpu.process_cpu()
        for _ in range(n):
            take()
        return {"seconds": time.perf_counter() - t, "cpu": threadcpu.process_cpu() - cpu, "images": n * BATCH}
    finally:
        s.close()


def cell(c: dict) -> dict:
    """``enspipe run`` pinned to the first k cores: its summary's window."""
    out = tempfile.mkdtemp(prefix="scaling-cell-")
    cmd = [os.path.join(BIN, "mpiexec"), "-n", "1", *ENSPIPE, "run", "--data", c["data"],
           "--backend", c["backend"], "--preprocess", c["preprocess"], "--image-size", str(c["size"]),
           "--wire-dtype", c["wire_dtype"], "--scheme", "baseline", "--consumer", "peak", "--batch-size", str(BATCH),
           "--steps", str(-(-c["images"] // BATCH)), "--cores", str(len(c["cores"])), "--out", out]
    r = subprocess.run(["taskset", "-c", ",".join(map(str, c["cores"])), *cmd], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(f"{cmd}: {r.stderr[-2000:]}")
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    images = s["window"]["images_needed"]
    return {"seconds": images / s["images_per_second_per_member"], "cpu": s["cpu_seconds_total"], "images": images,
            "oversubscribed": s.get("oversubscribed", False)}


def serve(c: dict) -> dict:
    """``enspipe serve --workers k`` pinned to the first k cores, and one consumer here."""
    import psutil

    from enspipe import attach

    sock = os.path.join(tempfile.mkdtemp(prefix="scaling-serve-"), "s.sock")
    cmd = [*ENSPIPE, "serve", "--data", c["data"], "--batch-size", str(BATCH), "--preprocess",
           c["preprocess"], "--image-size", str(c["size"]), "--wire-dtype", c["wire_dtype"], "--workers",
           str(c["threads"]), "--socket", sock, "--backend", c["backend"], "--max-consumers", "1"]
    server = subprocess.Popen(["taskset", "-c", ",".join(map(str, c["cores"])), *cmd], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        tree = psutil.Process(server.pid)

        def cpu() -> float:
            total = 0.0
            for p in [tree, *tree.children(recursive=True)]:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:  # ended meanwhile
                    pass
            return total

        deadline = time.monotonic() + 120
        while not os.path.exists(sock):  # the server's checks and its workers' start
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd}: no server on {sock}: {server.stderr.read()[-2000:]}")
            time.sleep(0.05)
        mine = os.sched_getaffinity(0)
        os.sched_setaffinity(0, c["cores"])  # the consumer on the server's cores, as a stream's member is
        try:
            s = attach(sock, timeout=120)
            take = s.next_batch
            for _ in range(WARMUP):
                take()
            n = -(-c["images"] // BATCH)
            t, cpu0 = time.perf_counter(), cpu()
            for _ in range(n):
                take()
            seconds, used = time.perf_counter() - t, cpu() - cpu0
            s.close()
        finally:
            os.sched_setaffinity(0, mine)
        return {"seconds": seconds, "cpu": used, "images": n * BATCH}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


RUNS = {"engine": engine, "stream": stream}  # in a pinned process of their own (--one)
LAUNCHES = {"cell": cell, "serve": serve}    # from here: they pin the processes they start


def one(case: dict) -> dict:
    """A fresh process, pinned to ``cores``, measuring ``case``."""
    if case["path"] in LAUNCHES:
        return LAUNCHES[case["path"]](case)
    cmd = [sys.executable, __file__, "--one", json.dumps(case)]
    r = subprocess.run(["taskset", "-c", ",".join(map(str, case["cores"])), *cmd], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(f"{case}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(base: dict, path: str, k: int, ceiling: bool, cpus: list[int]) -> dict:
    base = {**base, "path": path, "images": base["per_core"] * k}
    if not ceiling:
        return one({**base, "threads": k, "cores": cpus[:k]})
    procs = [subprocess.Popen(["taskset", "-c", str(c), sys.executable, __file__, "--one",
                               json.dumps({**base, "path": "engine", "threads": 1, "images": base["per_core"],
                                           "cores": [c]})],
                              stdout=subprocess.PIPE, text=True) for c in cpus[:k]]
    outs = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
    return {"seconds": max(o["seconds"] for o in outs), "cpu": sum(o["cpu"] for o in outs),
            "images": sum(o["images"] for o in outs)}


def rates(rs: list[dict]) -> list[float]:
    """Each measurement's images per second."""
    return [r["images"] / r["seconds"] for r in rs]


def dataset(n: int) -> str:
    """``n`` photos as class folders (cell, stream and serve read them), written once per ``n``."""
    from enspipe.data.photos import write_photo_folder

    return write_photo_folder(os.path.join(tempfile.gettempdir(), f"enspipe-scaling-photos-{n}"), n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--cores", default=None, help="core counts, comma-separated (default: 1, 2, 4, ... up to all)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {', '.join(PATHS)}")
    ap.add_argument("--images-per-core", type=int, default=2560, help="the window's images per core")
    ap.add_argument("--dataset-images", type=int, default=1024, help="photos in the dataset cell/stream/serve read")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backends", default=None, help="default: pillow, and tf where TensorFlow is installed")
    ap.add_argument("--preprocess", default="inception")
    ap.add_argument("--wire-dtype", default="float32", help="the images' dtype (the cell's and the stream's default)")
    ap.add_argument("--json", help="also write every measurement here")
    a = ap.parse_args()
    if a.one:
        c = json.loads(a.one)
        print(json.dumps(RUNS[c["path"]](c)))
        return
    cpus = sorted(os.sched_getaffinity(0))
    ks = [int(k) for k in a.cores.split(",")] if a.cores else sorted({*(2 ** i for i in range(8) if 2 ** i < len(cpus)),
                                                                       len(cpus)})
    from importlib.util import find_spec

    paths = a.paths.split(",")
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        ap.error(f"--paths: no path {unknown[0]!r}; choose from {', '.join(PATHS)}")
    backends = a.backends.split(",") if a.backends else ["pillow", *(["tf"] if find_spec("tensorflow") else [])]
    data = dataset(a.dataset_images) if set(paths) - {"engine"} else None
    todo = [(b, p, path, k, False) for b in backends for p in a.preprocess.split(",") for path in paths
            if not (path == "serve" and b == "tf") for k in ks]
    todo += [(b, p, "ceiling", k, True) for b in backends for p in a.preprocess.split(",") for k in ks if k > 1]
    runs: dict = {case: [] for case in todo}
    for _, case in schedule(todo, a.repeats):
        b, p, path, k, ceiling = case
        base = {"backend": b, "preprocess": p, "size": a.size, "wire_dtype": a.wire_dtype, "data": data,
                "per_core": a.images_per_core}
        runs[case].append(run(base, path, k, ceiling, cpus))
        if a.json:  # after every measurement: a time limit keeps what was measured
            with open(a.json, "w") as f:
                json.dump([{"backend": b, "preprocess": p, "path": path, "cores": k, "ceiling": c, "runs": rs}
                           for (b, p, path, k, c), rs in runs.items()], f, indent=1)
    report(runs, backends, a, paths, ks, len(cpus))


def report(runs: dict, backends: list[str], a, paths: list[str], ks: list[int], ncpu: int) -> None:
    print(f"one member's preprocessing, {a.size} px photos (scikit-image crops, 330-500 px), {a.wire_dtype} out, "
          f"{ncpu} CPUs visible, {a.repeats} repeats interleaved, {a.images_per_core} images per core a window: "
          "median (min-max)")
    print(f"{'backend':<8}{'preprocess':<11}{'path':<8}{'cores':>6}{'img/s':>22}{'CPU ms/img':>20}{'x 1 core':>20}"
          f"{'goal':>7}{'of ceiling':>20}")
    for b in backends:
        for p in a.preprocess.split(","):
            for path in paths:
                if (b, p, path, ks[0], False) not in runs:
                    continue
                one_core = runs[(b, p, path, ks[0], False)] if ks[0] == 1 else None
                for k in ks:
                    rs = runs[(b, p, path, k, False)]
                    rate = rates(rs)
                    scale = spread([x / o for x, o in zip(rate, rates(one_core))]) if one_core else ""
                    ceil = runs.get((b, p, "ceiling", k, True))
                    ceil_rate = rates(ceil) if ceil else None
                    of = spread([x / c for x, c in zip(rate, ceil_rate)]) if ceil_rate else ""
                    note = " oversubscribed" if any(r.get("oversubscribed") for r in rs) else ""
                    print(f"{b:<8}{p:<11}{path:<8}{k:>6}{spread(rate, digits=0):>22}"
                          f"{spread([r['cpu'] / r['images'] for r in rs], 1000):>20}{scale:>20}{0.85 * k:>7.2f}"
                          f"{of:>20}{note}")
            for k in ks:
                ceil = runs.get((b, p, "ceiling", k, True))
                if ceil:
                    print(f"{b:<8}{p:<11}{'ceiling':<8}{k:>6}"
                          f"{spread(rates(ceil), digits=0):>22}"
                          f"{spread([r['cpu'] / r['images'] for r in ceil], 1000):>20}")


if __name__ == "__main__":
    main()
