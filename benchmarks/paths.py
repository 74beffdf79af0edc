"""The whole cell on each preprocessing path: CPU per delivered image per member for baseline and
All-Shared at n = 1, 2, 4, with Slim's functions as written (``reference``), the crop-first path,
the crop-first path with a warm decode cache, and the fused-colour approximation with a warm cache.

    python benchmarks/paths.py [--ns 1,2,4] [--steps 24] [--warmup 12] [--batch 32] [--size 224]
                               [--images 256] [--repeats 3] [--backend tf]

Every cell runs ``enspipe run --consumer peak`` under ``mpiexec -n N`` on the embedded dataset,
``--repeats`` times, interleaved (every other repeat in reverse order). The warm-up (``--warmup``
steps of ``--batch``) covers at least one epoch, so the cache cells' measured window reads a warm
cache (the summary's hit rates say so). Printed per scheme and N: the cell's own process CPU per
delivered image per member, ``median (min-max)``, each path's against the reference path's in the
same repeat (``vs reference``), the measured window's cache hit rate, and whether members shared
cores (``oversubscribed``: n members on fewer cores than n). Ends with the goals' verdicts.
"""
from __future__ import annotations

import argparse
import os

from cells import cpu_per_image, dataset, run_cell, schedule, spread

PATHS = {"reference": ["--preprocess-impl", "reference"], "crop-first": ["--preprocess-impl", "crop-first"],
         "crop-first + warm cache": ["--preprocess-impl", "crop-first", "--decode-cache", "2GB"],
         "fused-colour + warm cache (APPROX.)": ["--preprocess-impl", "fused-colour", "--decode-cache", "2GB"]}


def window_hit_rate(s: dict) -> str:
    """The hit rate of the epochs the measured window reached (after the first), or ``-``."""
    c = s.get("decode_cache")
    if not c:
        return "-"
    later = [e for e in c["epochs"] if e["epoch"] >= 1]
    lookups = sum(e["lookups"] for e in later)
    return f"{sum(e['hit_rate'] * e['lookups'] for e in later) / lookups:.2f}" if lookups else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,2,4")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="tf", choices=("tf", "pillow"))
    a = ap.parse_args()
    if a.warmup * a.batch < a.images:
        ap.error(f"--warmup {a.warmup} x --batch {a.batch} does not cover an epoch of {a.images} images: the cache "
                 "would not be warm in the window")
    data = dataset(a.images)
    ns = [int(n) for n in a.ns.split(",")]
    todo = [(scheme, n, path) for scheme in ("baseline", "all_shared") for n in ns for path in PATHS
            if not (a.backend == "pillow" and path == "reference")]
    common = ["--consumer", "peak", "--network", "alexnet_v2", "--batch-size", a.batch, "--image-size", a.size,
              "--steps", a.steps, "--warmup", a.warmup, "--cpu-monitor", "none", "--backend", a.backend]
    print(f"{a.images} synthetic JPEGs, {a.backend} backend, inception at {a.size} px, batch {a.batch}, "
          f"{a.warmup}+{a.steps} steps, {os.cpu_count()} CPUs, {a.repeats} repeats interleaved")
    runs: dict = {t: [] for t in todo}
    for _, (scheme, n, path) in schedule(todo, a.repeats):
        runs[(scheme, n, path)].append(run_cell(data, n, ["--scheme", scheme, *common, *PATHS[path]]))
    first = "reference" if a.backend == "tf" else "crop-first"
    print(f"\n{'scheme':<12}{'n':>3}  {'path':<36}{'CPU ms/img/member':>22}{'vs ' + first:>22}{'hit rate':>10}"
          f"  oversubscribed")
    for scheme, n, path in todo:
        rs, base = runs[(scheme, n, path)], runs[(scheme, n, first)]
        ratio = [cpu_per_image(r) / cpu_per_image(b) for r, b in zip(rs, base)]
        over = n > (os.cpu_count() or 1)
        print(f"{scheme:<12}{n:>3}  {path:<36}{spread([cpu_per_image(r) for r in rs], 1000):>22}"
              f"{spread(ratio):>22}{window_hit_rate(rs[0]):>10}  {'yes' if over else 'no'}")
    if a.backend == "tf" and max(ns) >= 4:
        ref = [cpu_per_image(r) for r in runs[("all_shared", 4, "reference")]]
        for path, goal in (("crop-first", 0.55), ("crop-first + warm cache", 0.35),
                           ("fused-colour + warm cache (APPROX.)", 0.35)):
            got = sorted(cpu_per_image(r) / b for r, b in zip(runs[("all_shared", 4, path)], ref))[a.repeats // 2]
            print(f"goal: All-Shared n=4 {path} at most {goal}x the reference path's CPU per image per member: "
                  f"{got:.2f}x, {'met' if got <= goal else 'NOT met'}")


if __name__ == "__main__":
    main()
