"""Is a cell's CPU per delivered image independent of how long its window is?

    python benchmarks/window.py [--schemes ...] [--steps 20,100] [--repeats 3]

A window must count only the work done inside it: the same cell measured over 20 and over 100
steps must give the same CPU per delivered image. This runs every scheme at n = 2 in two regimes,
each at every step count, the runs interleaved (repeat, cell, step count), and prints per cell
the median and range of the cell's own process CPU per delivered image per member at each step
count, each shorter window's error against the longest (``err@K``: median at K steps over median
at the longest, minus 1; target within 10%), the window's accounting error at each step count
(``acct@K``: the largest ``|balance - 1|`` over the repeats, where balance is the images
preprocessed inside the window over the images it had to preprocess: an exact count, so unlike
CPU time it is not blurred by the machine's noise; the default grid's step count should keep
it under 5%: 100 steps gave at most 2% here, 50 steps 8%, 20 steps 10%) and how many steps the
warm-up took:

* ``preprocessing-bound``: alexnet_v2 (inception preprocessing) at the default grid's batch of 64,
  an emulated accelerator far faster than the preprocessing (``--fast-rate``): the queues stay
  empty;
* ``accelerator-bound``: vgg_a, an emulated accelerator at ``--slow-rate`` images/s (the example
  cell of the window-length bug: rate 40, batch 16): the queues are full.
"""
from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

from cells import cpu_per_image, dataset, run_cell, spread

from enspipe.plan.schemes import SCHEME_KINDS

SCHEMES = {name: ["--preprocessors", "1"] if kind.takes_p else [] for name, kind in SCHEME_KINDS.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--regimes", default="preprocessing-bound,accelerator-bound")
    ap.add_argument("--steps", default="20,100")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--fast-batch", type=int, default=64, help="the preprocessing-bound cell's batch")
    ap.add_argument("--slow-batch", type=int, default=16, help="the accelerator-bound cell's batch")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--slow-rate", type=float, default=40.0, help="the accelerator-bound cell's rc (images/s)")
    ap.add_argument("--fast-rate", type=float, default=5000.0, help="the preprocessing-bound cell's rc")
    ap.add_argument("--cores", default=None, help="--cores per member (default: all)")
    ap.add_argument("--images", type=int, default=1000)
    a = ap.parse_args()
    regimes = {"preprocessing-bound": ("alexnet_v2", a.fast_rate, a.fast_batch),
               "accelerator-bound": ("vgg_a", a.slow_rate, a.slow_batch)}
    data = dataset(a.images)
    steps = [int(s) for s in a.steps.split(",")]
    cells = list(itertools.product(a.regimes.split(","), a.schemes.split(",")))
    runs: dict = {}
    failed: list[str] = []
    for rep in range(a.repeats):  # interleaved: every cell and step count once per repeat
        for (regime, scheme), k in itertools.product(cells, steps):
            network, rate, batch = regimes[regime]
            args = ["--network", network, "--scheme", scheme, *SCHEMES[scheme], "--consumer", "emulated",
                    "--rate", rate, "--batch-size", batch, "--steps", k, "--warmup", a.warmup,
                    "--image-size", a.size, *(["--cores", a.cores] if a.cores else [])]
            try:  # a failed run is reported in the table, not allowed to lose the others
                runs.setdefault((regime, scheme, k), []).append(run_cell(data, a.n, args))
            except RuntimeError as e:
                failed.append(str(e).splitlines()[0])
                print(f"  repeat {rep + 1}/{a.repeats}: {regime} {scheme} {k} steps FAILED: {str(e)[-400:]}", flush=True)
                continue
            print(f"  repeat {rep + 1}/{a.repeats}: {regime} {scheme} {k} steps done", flush=True)
    print(f"\nn = {a.n}, batch {a.fast_batch} (preprocessing-bound) / {a.slow_batch} (accelerator-bound), "
          f"{a.size} px, warm-up >= {a.warmup}, cores per member "
          f"{a.cores or 'all'}, {a.repeats} repeats, {os.cpu_count()} CPUs; process CPU ms per delivered image per "
          f"member, median (min-max)")
    longest = max(steps)
    head = "".join(f"{f'{k} steps':>22}" for k in steps) + "".join(f"{f'err@{k}':>9}" for k in steps if k != longest)
    head += "".join(f"{f'acct@{k}':>10}" for k in steps)
    print(f"{'regime':<21}{'scheme':<18}{head}{'warm-up steps':>15}{'img/s/member':>14}")
    for regime, scheme in cells:
        per = {k: runs.get((regime, scheme, k), []) for k in steps}
        if not all(per.values()):
            print(f"{regime:<21}{scheme:<18}  every run of some step count failed", flush=True)
            continue
        cpu = {k: [cpu_per_image(s) for s in per[k]] for k in steps}
        err = "".join(f"{np.median(cpu[k]) / np.median(cpu[longest]) - 1:>+9.1%}" for k in steps if k != longest)
        acct = "".join(f"{max(abs(s['window']['balance'] - 1) for s in per[k]):>10.1%}" for k in steps)
        warm = [s["window"]["warmup_steps"] for k in steps for s in per[k]]
        rate = [s["images_per_second_per_member"] for s in per[longest]]
        cols = "".join(f"{spread(cpu[k], 1000):>22}" for k in steps)
        print(f"{regime:<21}{scheme:<18}{cols}{err}{acct}{f'{min(warm)}-{max(warm)}':>15}"
              f"{np.median(rate):>14.0f}", flush=True)
    if failed:
        print(f"\n{len(failed)} run(s) failed:", *failed, sep="\n  ")


if __name__ == "__main__":
    main()
