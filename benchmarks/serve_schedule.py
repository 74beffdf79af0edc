"""The attach server's bookkeeping on its own (``enspipe.serve.schedule.Scheduler``), at dataset
sizes up to ImageNet's: the CPU per batch of one take and the plan after it, with 4 consumers
attached at once, every copy made at once (no pixels).

    python benchmarks/serve_schedule.py [--batch 64] [--consumers 4] [--batches 200] [--repeats 3]

Printed per size: milliseconds per batch (median and range over repeats, ``process_time``) and that
as microseconds per image; read it against a sample's preprocessing (a few ms on one core).
"""
from __future__ import annotations

import argparse
import time

from cells import spread


def one(n: int, batch: int, consumers: int, batches: int, seed: int) -> float:
    from enspipe.serve.schedule import Scheduler

    s = Scheduler(n, slots=batch * consumers * 8, batch=batch, seed=seed)
    for cid in range(consumers):
        s.attach(cid)
        for _, slot in s.plan(cid, s.wanted(cid, 2)):  # each one's epoch begun, before the clock
            s.made_one(slot)
    cpu0 = time.process_time()
    for i in range(batches):
        cid = i % consumers
        while (t := s.take(cid)) is None:
            for _, slot in s.plan(cid, s.wanted(cid, 2)):
                s.made_one(slot)
        s.release(cid, t.slots)
        for _, slot in s.plan(cid, s.wanted(cid, 2)):
            s.made_one(slot)
    return 1e3 * (time.process_time() - cpu0) / batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--consumers", type=int, default=4)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    print(f"| samples | ms per batch of {a.batch} (take + plan, {a.consumers} consumers) | us per image |")
    print("|---|---|---|")
    for n in (10_000, 100_000, 1_281_167):
        ms = [one(n, a.batch, a.consumers, a.batches, seed) for seed in range(a.repeats)]
        print(f"| {n} | {spread(ms, digits=2)} | {spread([1e3 * m / a.batch for m in ms], digits=1)} |")


if __name__ == "__main__":
    main()
