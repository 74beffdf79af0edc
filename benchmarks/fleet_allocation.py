"""How far is FLEET's greedy allocation from the optimum, and from the arms it is compared with?

    python benchmarks/fleet_allocation.py [--instances 50] [--seed 0] [--sizes 4:4,6:4,8:8,10:8]

Random heterogeneous ensembles (SIMULATED: emulated profiles and the lockstep time model of
``enspipe.plan.fleet``; nothing is trained): N members whose one-accelerator rates are drawn
log-uniformly over 20-200 images/s (a 10x spread), scaling efficiency 0.7-1.0 per doubling of
accelerators, and 10-30 epochs of a 1000-image dataset to converge (a 3x spread). For each size
N:M (members : accelerators) it prints, over the instances, the greedy's time over the exact
optimum's (:func:`optimal_schedule`; median, mean, max: the optimality gap), and the greedy's
speed-up over two arms timed by the same model:

* ``default``: every member its own pipeline on one accelerator; an accelerator that frees up
  takes the next member (list scheduling), no lockstep;
* ``homogeneous`` (SC'18 sharing): members in random groups of M, one accelerator each, each
  group in lockstep at its slowest member's pace, the next group when the whole group is done.

and how long the greedy and the exact solver took.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from enspipe.plan.ensemble import list_schedule  # noqa: E402
from enspipe.plan.fleet import (Member, efficiency_per_doubling, emulated_profile, flotilla_time,  # noqa: E402
                                greedy_schedule, optimal_schedule, schedule_time)


def instance(rng: random.Random, n: int, m: int) -> list[Member]:
    return [Member(emulated_profile(f"m{i}", 20 * 10 ** rng.random(), m, efficiency_per_doubling(rng.uniform(0.7, 1.0))),
                   rng.uniform(10, 30) * 1000) for i in range(n)]


def default_time(members: list[Member], m: int) -> float:
    return list_schedule([mem.work / mem.profile.rate(1) for mem in members], m)


def homogeneous_time(members: list[Member], m: int, rng: random.Random) -> float:
    order = list(range(len(members)))
    rng.shuffle(order)
    total = 0.0
    for k in range(0, len(order), m):
        group = order[k:k + m]
        total += flotilla_time([members[i].work for i in group], [members[i].profile.rate(1) for i in group])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sizes", default="4:4,6:4,8:8,10:8", help="N:M pairs (members : accelerators)")
    ap.add_argument("--tolerance", type=float, default=0.15, help="the greedy's rate tolerance, relative")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print("SIMULATED (emulated profiles, the lockstep time model); greedy vs exact optimum and vs the arms")
    print(f"{'N:M':>6}{'inst':>6}{'gap med':>9}{'gap mean':>10}{'gap max':>9}{'optimal':>9}"
          f"{'vs default':>12}{'vs homog.':>11}{'greedy ms':>11}{'exact ms':>10}")
    for size in a.sizes.split(","):
        n, m = map(int, size.split(":"))
        gaps, vs_default, vs_homog, tg, te = [], [], [], [], []
        for _ in range(a.instances):
            members = instance(rng, n, m)
            t0 = time.perf_counter()
            g = schedule_time(greedy_schedule(members, m, tolerance=a.tolerance))
            t1 = time.perf_counter()
            o = schedule_time(optimal_schedule(members, m))
            t2 = time.perf_counter()
            gaps.append(g / o - 1)
            vs_default.append(default_time(members, m) / g)
            vs_homog.append(homogeneous_time(members, m, rng) / g)
            tg.append((t1 - t0) * 1e3)
            te.append((t2 - t1) * 1e3)
        exact = sum(1 for x in gaps if x < 1e-9) / len(gaps)
        print(f"{size:>6}{len(gaps):>6}{statistics.median(gaps):>9.1%}{statistics.mean(gaps):>10.1%}{max(gaps):>9.1%}"
              f"{exact:>9.0%}{statistics.median(vs_default):>11.2f}x{statistics.median(vs_homog):>10.2f}x"
              f"{statistics.median(tg):>11.2f}{statistics.median(te):>10.1f}")


if __name__ == "__main__":
    main()
