"""Conversion of an image folder into Slim TFRecord shards at scale: files/s, MB/s and peak
resident memory per worker count, on generated ImageNet-like JPEGs.

    python benchmarks/convert.py [--files 20000] [--workers 1,2] [--repeats 3] [--dir /tmp/enspipe-convert-bench]

It writes ``--files`` JPEGs into 100 class folders (``--distinct`` different images, each written
under several names: the converter's cost does not depend on the content repeating), then runs
``enspipe convert`` once per worker count and repeat, interleaved (every other repeat in reverse
order), each into a fresh folder. Per run: wall time, files/s and MB/s of source JPEGs, and peak
resident memory sampled every 0.1 s (the whole process tree summed, and its largest process).
The source files were just written, so they are read from the page cache: a cold disk adds its
own read time. Each row is the median (min-max) of the repeats.
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import psutil


def make_folder(root: str, files: int, distinct: int) -> int:
    """``files`` JPEGs (synthetic ImageNet-like, quality 90) in 100 class folders; returns their bytes."""
    from PIL import Image

    from enspipe.data.synthetic import synthetic_image

    done = root.rstrip("/") + ".complete"
    if os.path.exists(done) and int(open(done).read()) == files:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    shutil.rmtree(root, ignore_errors=True)
    encoded = []
    for i in range(distinct):
        b = io.BytesIO()
        Image.fromarray(synthetic_image(0, i, 100)[0]).save(b, "JPEG", quality=90)
        encoded.append(b.getvalue())
    total = 0
    for i in range(files):
        cls = os.path.join(root, f"n{i % 100:08d}")
        os.makedirs(cls, exist_ok=True)
        data = encoded[i % distinct]
        with open(os.path.join(cls, f"n{i % 100:08d}_{i}.JPEG"), "wb") as f:
            f.write(data)
        total += len(data)
    with open(done, "w") as f:
        f.write(str(files))
    return total


def run_once(src: str, out: str, workers: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "enspipe", "convert", "--jpeg-dir", src, "--out", out, "--workers", str(workers)]
    start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root, tree_peak, one_peak = psutil.Process(p.pid), 0, 0
    while p.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            rss = [q.memory_info().rss for q in procs]
            tree_peak, one_peak = max(tree_peak, sum(rss)), max(one_peak, max(rss))
        except psutil.Error:
            pass
        time.sleep(0.1)
    wall = time.monotonic() - start
    out_text, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"convert failed: {err[-2000:]}")
    return {"wall": wall, "tree_mb": tree_peak / 2**20, "one_mb": one_peak / 2**20, "last": out_text.strip()}


def spread(values) -> str:
    v = sorted(values)
    return f"{np.median(v):.1f} ({v[0]:.1f}-{v[-1]:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=20000, help="JPEGs to convert")
    ap.add_argument("--distinct", type=int, default=500, help="different images among them")
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/enspipe-convert-bench", help="where the folder and shards go")
    a = ap.parse_args()
    src = os.path.join(a.dir, "images")
    nbytes = make_folder(src, a.files, a.distinct)
    counts = [int(w) for w in a.workers.split(",")]
    runs: dict[int, list[dict]] = {w: [] for w in counts}
    for r in range(a.repeats):
        for w in counts if r % 2 == 0 else counts[::-1]:
            runs[w].append(run_once(src, os.path.join(a.dir, "shards"), w))
            print(f"repeat {r} workers {w}: {runs[w][-1]['wall']:.1f} s", file=sys.stderr, flush=True)
    print(f"{a.files} JPEGs ({nbytes / 1e6:.0f} MB, {nbytes / a.files / 1e3:.0f} KB each) on {os.cpu_count()} "
          f"cores; median (min-max) of {a.repeats} interleaved repeats; every image decoded once to check it")
    print("| workers | wall s | files/s | MB/s | peak RSS, tree MB | peak RSS, largest process MB |")
    print("|---|---|---|---|---|---|")
    for w in counts:
        rs = runs[w]
        print(f"| {w} | {spread([x['wall'] for x in rs])} | {spread([a.files / x['wall'] for x in rs])} | "
              f"{spread([nbytes / 1e6 / x['wall'] for x in rs])} | {spread([x['tree_mb'] for x in rs])} | "
              f"{spread([x['one_mb'] for x in rs])} |")
    print(f"\nlast line of the last run: {runs[counts[-1]][-1]['last'].splitlines()[-1]}")


if __name__ == "__main__":
    main()
