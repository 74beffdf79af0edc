"""Does the library cost what the measured cell does? ``enspipe.SharedStream`` in a member's own
script against ``enspipe run``, the same cell side by side.

    python benchmarks/library.py [--n 3] [--scheme all_shared] [--repeats 3] [--steps 60]

Both arms run N members under mpiexec with a peak consumer (each batch taken as soon as it is
there), alexnet_v2's inception preprocessing, the same batch, image size, seed and block size.
``enspipe run`` measures its window after its warm-up and drain; the library's worker
(``--worker``, this file) takes ``--warmup`` unmeasured batches, then times ``--steps`` batches
with its process CPU (``time.process_time``) at the window's edges. Both are each member's own
process CPU per delivered image, averaged over the members. The arms alternate (run, library;
library, run; ...) and the ratio library/run is paired within each repeat: its median and range
are printed, with the goal (within 10%).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from cells import MPIEXEC, dataset, run_cell, schedule, spread


def worker(a: argparse.Namespace) -> None:
    """One member of the library arm: warm up, time a window, write this member's numbers."""
    import enspipe

    stream = enspipe.SharedStream(a.data, a.batch_size, scheme=a.scheme, image_size=a.image_size,
                                  preprocessors=a.preprocessors, block_images=a.block_images)
    for _ in range(a.warmup):
        stream.next_batch()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        images, labels = stream.next_batch()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    images = a.steps * a.batch_size
    stream.close()
    with open(os.path.join(a.out, f"member{stream.member}.json"), "w") as f:
        json.dump({"images": images, "seconds": seconds, "cpu_seconds": cpu}, f)


def library_cell(a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [MPIEXEC, "-n", str(a.n), sys.executable, os.path.abspath(__file__), "--worker", "--out", out,
               *_shared_args(a)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        members = [json.load(open(os.path.join(out, f"member{k}.json"))) for k in range(a.n)]
    return {"cpu_ms": 1e3 * float(np.mean([m["cpu_seconds"] / m["images"] for m in members])),
            "rate": float(np.mean([m["images"] / m["seconds"] for m in members]))}


def run_arm(a: argparse.Namespace) -> dict:
    s = run_cell(a.data, a.n, ["--network", "alexnet_v2", "--scheme", a.scheme, "--batch-size", a.batch_size,
                               "--image-size", a.image_size, "--steps", a.steps, "--warmup", a.warmup,
                               "--block-images", a.block_images, "--consumer", "peak", "--cpu-monitor", "none",
                               *(["--preprocessors", a.preprocessors] if a.preprocessors else [])])
    return {"cpu_ms": 1e3 * float(np.mean([r["cpu_seconds_per_image"] for r in s["ranks"]])),
            "rate": s["images_per_second_per_member"]}


def _shared_args(a: argparse.Namespace) -> list[str]:
    return ["--data", a.data, "--scheme", a.scheme, "--batch-size", str(a.batch_size), "--image-size",
            str(a.image_size), "--steps", str(a.steps), "--warmup", str(a.warmup), "--block-images",
            str(a.block_images), *(["--preprocessors", str(a.preprocessors)] if a.preprocessors else [])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3, help="members (default 3)")
    ap.add_argument("--scheme", default="all_shared", help="the scheme (default all_shared)")
    ap.add_argument("--preprocessors", type=int, default=None, help="P, for the schemes that take it")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--block-images", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60, help="measured batches per member")
    ap.add_argument("--warmup", type=int, default=20, help="unmeasured batches before them")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--images", type=int, default=1000, help="the synthetic dataset's size")
    ap.add_argument("--data", default=None, help="a dataset (default: the synthetic one, made once)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    a.data = a.data or dataset(a.images)
    arms = {"enspipe run": run_arm, "library": library_cell}
    got: dict[str, list[dict]] = {k: [None] * a.repeats for k in arms}
    for rep, name in schedule(list(arms), a.repeats):
        got[name][rep] = arms[name](a)
        print(f"repeat {rep} {name}: {got[name][rep]['cpu_ms']:.2f} CPU ms/img, {got[name][rep]['rate']:.0f} img/s "
              "per member", flush=True)
    print(f"\n{a.scheme} N={a.n}, batch {a.batch_size}, {a.image_size} px, peak consumer, {a.repeats} repeats, "
          f"median (min-max)\n")
    print("| arm | CPU ms/img per member | img/s per member |\n|---|---|---|")
    for name in arms:
        print(f"| {name} | {spread([g['cpu_ms'] for g in got[name]])} | {spread([g['rate'] for g in got[name]], 1, 0)} |")
    ratios = [lib["cpu_ms"] / run["cpu_ms"] for lib, run in zip(got["library"], got["enspipe run"])]
    ok = abs(np.median(ratios) - 1) <= 0.10
    print(f"\nlibrary / enspipe run, CPU per image, paired per repeat: {spread(ratios)}; goal within 10%: "
          f"{'met' if ok else 'missed'}")


if __name__ == "__main__":
    main()
