"""What regrouping the global batches into a DataLoader's epochs costs (enspipe.api.epochs).

    python benchmarks/epochs.py [--batch 64] [--size 224] [--dtype float32] [--repeats 5]

Feeds :class:`~enspipe.api.epochs.EpochBatches` fixed-size global batches as the pipeline hands
them, node-shared (``volatile``: copied out of the window either way) or private (the exchange's
own buffers), at a dataset size the batch divides and one it does not (every batch then straddles
two global batches and is assembled by a copy). Prints the process CPU per batch and per image,
median and range over the repeats, interleaved. The stream's whole cost per image is the
preprocessing's (about 1 ms per image on a core): this is what the regrouping adds to it.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from enspipe.api.epochs import EpochBatches
from enspipe.data.ledger import EpochLedger
from enspipe.exchange.engine import BufferRing


def cpu_per_batch(batch: int, shape: tuple, dtype, images: int, volatile: bool, steps: int = 60) -> float:
    """Milliseconds of this process's CPU per batch delivered, over ``steps`` batches."""
    source = np.zeros((batch, *shape), dtype)
    source[...] = 1  # touched: the copies read real pages
    at = [0]

    def fetch():
        p = np.arange(at[0], at[0] + batch)
        at[0] += batch
        return source, np.stack([p % images, p // images, p, p % 10], axis=1).astype(np.int64), volatile

    epochs = EpochBatches(fetch, batch, images, BufferRing(2, batch, shape, dtype), EpochLedger(images))
    for _ in range(5):
        epochs.next()
    t = time.process_time()
    for _ in range(steps):
        epochs.next()
    return (time.process_time() - t) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--dtype", default="float32", choices=["float32", "uint8"])
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    shape, dtype = (a.size, a.size, 3), np.dtype(a.dtype)
    cases = [(volatile, n) for volatile in (True, False) for n in (a.batch * 20, a.batch * 20 + 7)]
    got: dict = {c: [] for c in cases}
    for _ in range(a.repeats):  # interleaved
        for volatile, n in cases:
            got[(volatile, n)].append(cpu_per_batch(a.batch, shape, dtype, n, volatile))
    print(f"batch {a.batch}, {a.size} px {a.dtype}, {a.repeats} repeats (median, min-max)")
    print("| batches | dataset | ms CPU per batch | ms CPU per image |")
    print("|---|---|---|---|")
    for (volatile, n), v in got.items():
        kind = "node-shared" if volatile else "private"
        fit = "divides" if n % a.batch == 0 else "does not divide"
        med = statistics.median(v)
        print(f"| {kind} | {n} (batch {fit}) | {med:.2f} ({min(v):.2f}-{max(v):.2f}) | {med / a.batch:.4f} |")


if __name__ == "__main__":
    main()
