"""What ``stream.torch()`` adds to a member's CPU over the numpy iteration: one member
(``mpiexec -n 1``, the pillow backend) taking batches as numpy arrays and as torch tensors,
interleaved.

    mpiexec -n 1 python benchmarks/torch_handoff.py [--batches 160] [--image-size 64] [--repeats 3]

The handoff runs in the consumer's thread, so its cost is that thread's CPU (``thread_time``) per
image, exactly; the process's CPU per image (the preprocessing threads included) is the scale it
is compared with. (The process's CPU over one arm alone would also count batches its producers
made ahead for the other arm, up to the queues' depth.) Prints, as the median (min-max) of the
repeats: each way's consumer-thread CPU per image, the process's CPU per image over both ways, and
the handoff's extra CPU as a share of the latter.
"""
from __future__ import annotations

import argparse
import time

from cells import dataset, spread

import enspipe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batches", type=int, default=160, help="batches each way takes per repeat")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--layout", default="channels_last", choices=("NHWC", "NCHW", "channels_last"))
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    stream = enspipe.SharedStream(dataset(a.images), batch_size=a.batch_size, image_size=a.image_size,
                                  wire_dtype="uint8", backend="pillow")
    batches = {"numpy": lambda: stream, "torch": lambda: stream.torch(layout=a.layout)}

    def take(way: str) -> tuple[float, float, int]:
        """``batches`` batches the way: (consumer thread CPU-s, process CPU-s, images)."""
        thread, process, n = time.thread_time(), time.process_time(), 0
        while n < a.batches * a.batch_size:
            for _, labels in batches[way]():
                n += len(labels)
                if n >= a.batches * a.batch_size:
                    break
        return time.thread_time() - thread, time.process_time() - process, n

    for way in batches:  # warm-up
        take(way)
    rows: dict[str, list] = {way: [] for way in batches}
    for rep in range(a.repeats):
        for way in (batches if rep % 2 == 0 else list(batches)[::-1]):
            rows[way].append(take(way))
    stream.close()
    per_image = {way: [t / n for t, _, n in rs] for way, rs in rows.items()}
    process = [(pn[1] + pt[1]) / (pn[2] + pt[2]) for pn, pt in zip(rows["numpy"], rows["torch"])]
    extra = [(t - n) / p for t, n, p in zip(per_image["torch"], per_image["numpy"], process)]
    print(f"one member, batch {a.batch_size}, {a.image_size} px, uint8, torch layout {a.layout}, {a.batches} batches "
          f"a way, {a.repeats} repeats interleaved: median (min-max)")
    print(f"consumer thread CPU ms/img: numpy {spread(per_image['numpy'], 1000, 3)}, torch "
          f"{spread(per_image['torch'], 1000, 3)}; process CPU ms/img {spread(process, 1000)}; the handoff's extra "
          f"CPU: {spread(extra, 100, 1)}% of the process's")


if __name__ == "__main__":
    main()
