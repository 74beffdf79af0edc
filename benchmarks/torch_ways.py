"""PyTorch models trained side by side, each fed a different way, with no TensorFlow: enspipe's
shared stream on the pillow backend, each member's own ``torch.utils.data.DataLoader`` (the status
quo, with enspipe's function or with torchvision's transform in its workers), and TensorSocket
(one producer, the members its consumers).

    python benchmarks/torch_ways.py [--epochs 2] [--images 512] [--image-size 224] [--repeats 3]
                                    [--members 3] [--preprocess inception|standard]

Every way trains the same cheap models (an 8 x 8 average pool, then an MLP of width 32, 64 or 128:
the input pipeline matters, as it does beside a GPU) for ``--epochs`` epochs of the same synthetic
dataset, batch 32, with the same augmentation (the pillow backend's ``inception``: random crop,
flip, colour distortion; or ``standard``: torchvision's RandomResizedCrop, flip and Normalize):

* ``enspipe``: ``mpiexec -n N``; ``SharedStream(scheme="all_shared", backend="pillow").torch()``,
  uint8 batches: each member preprocesses 1/N of every batch and all-gathers;
* ``own DataLoader``: ``mpiexec -n N`` (MPI unused); each member's ``DataLoader`` with its share of
  the cores (C/N, at least 1) as worker processes reads the records and runs enspipe's function on
  every image itself (uint8 out of the workers);
* ``torchvision DataLoader``: the same, with torchvision's transform in the workers as its
  ImageNet reference script has it (``decode_jpeg``, ``transforms.v2`` RandomResizedCrop
  antialiased, flip, ToDtype and Normalize: float32 CHW out of the workers; ``standard`` only);
* ``torchvision DataLoader, uint8``: the same with uint8 out of the workers, ToDtype and Normalize
  in the training loop;
* ``DALI pipeline``: the same, each member's own DALI CPU pipeline (``device_id=None``) with its
  share of the cores as DALI's threads, fed the records' bytes by ``external_source`` in a
  shuffled order per epoch: ``decoders.image_random_crop`` (its ROI decode), ``resize``
  (antialiased linear), ``crop_mirror_normalize`` (flip, float32 CHW), as DALI's ImageNet
  example has it on a GPU (``standard`` only; it needs ``nvidia-dali-cuda130`` in the venv);
* ``TensorSocket``: ``mpiexec -n N+1`` (MPI unused): rank 0 runs one ``own DataLoader`` inside a
  ``TensorProducer`` with all the cores' workers, ranks 1-N train from ``TensorConsumer`` s.

It prints, per way, the job's wall time (launch to exit), the training loops' time (the slowest
member's), the CPU of every process of the job (user + system, their worker processes included)
and the images/s per member, as the median (min-max) of the repeats, the ways interleaved and
counterbalanced within the repeats, with each way's ratio to enspipe paired per repeat. A way
that cannot run here gets a row that says why; one whose members saw fewer images than their
epochs hold says SHORT, and how many.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import traceback

from cells import MPIEXEC, dataset, schedule, spread

WAYS = ("enspipe", "own DataLoader", "torchvision DataLoader", "torchvision DataLoader, uint8", "DALI pipeline",
        "TensorSocket")
TORCHVISION = {"torchvision DataLoader": "float32", "torchvision DataLoader, uint8": "uint8"}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ONLY = os.environ.get("TORCH_WAYS_ONLY")  # ways' names, comma-separated: those alone, beside enspipe
WIDTHS = (32, 64, 128)
PORTS = (5761, 5762, (5763, 5764))  # TensorSocket's data, acknowledgement and heartbeat ports


def model(width: int, num_classes: int):
    import torch.nn as nn

    return nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 64, width), nn.ReLU(),
                         nn.Linear(width, num_classes))


class Records:
    """A map-style ``torch`` dataset over the manifest's records: each item read by its offset,
    parsed, and augmented as the pillow backend augments it (seeded per epoch and index)."""

    def __init__(self, data: str, size: int, seed: int, preprocess: str = "inception"):
        from enspipe.data.build import load_manifest

        self.m, self.size, self.seed, self.epoch, self._reader = load_manifest(data), size, seed, 0, None
        self.preprocess = preprocess
        self.numbers = [(s, r) for s, c in enumerate(self.m.counts) for r in range(c)]

    def __len__(self) -> int:
        return len(self.numbers)

    def encoded(self, i: int) -> tuple[bytes, int]:
        """Record ``i``'s encoded image and label (its reader opened once per worker process)."""
        from enspipe.data.order import RecordReader
        from enspipe.data.records import parse_slim

        if self._reader is None:
            self._reader = RecordReader(self.m, False)
        return parse_slim(self._reader.read(*self.numbers[i]))

    def __getitem__(self, i: int):
        import torch

        from enspipe.data import pixels

        encoded, label = self.encoded(i)
        image = pixels.PREPROCESSING[self.preprocess](encoded, self.size,
                                                      pixels.generator(self.seed, self.epoch * len(self) + i))
        return torch.from_numpy(pixels.to_wire(self.preprocess, image, "uint8").copy()), label


class TorchvisionRecords(Records):
    """The records as torchvision's ImageNet reference script feeds them: ``decode_jpeg``, then
    ``transforms.v2``' RandomResizedCrop (antialiased) and flip, and, for ``float32``, ToDtype and
    Normalize in the worker (CHW tensors); ``uint8`` leaves those to the training loop."""

    def __init__(self, data: str, size: int, seed: int, out: str):
        super().__init__(data, size, seed, "standard")
        self.out, self._transform = out, None

    def __getitem__(self, i: int):
        import torch
        from torchvision.io import decode_jpeg
        from torchvision.transforms import v2

        if self._transform is None:  # one per worker process
            steps = [v2.RandomResizedCrop(self.size, antialias=True), v2.RandomHorizontalFlip()]
            if self.out == "float32":
                steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
            self._transform = v2.Compose(steps)
        encoded, label = self.encoded(i)
        return self._transform(decode_jpeg(torch.frombuffer(bytearray(encoded), dtype=torch.uint8))), label


def _loader(data: str, batch: int, size: int, seed: int, workers: int, preprocess: str, way: str = ""):
    import torch

    items = TorchvisionRecords(data, size, seed, TORCHVISION[way]) if way in TORCHVISION else \
        Records(data, size, seed, preprocess)
    return torch.utils.data.DataLoader(items, batch_size=batch, shuffle=True,
                                       drop_last=True, num_workers=workers, persistent_workers=workers > 0,
                                       generator=torch.Generator().manual_seed(seed))


def _dali(data: str, batch: int, size: int, seed: int, threads: int):
    """One member's DALI CPU pipeline over the records: a callable giving an epoch's batches
    (float32 CHW images and labels as torch tensors), shuffled by ``seed`` and the epoch."""
    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types

    records, todo = Records(data, size, seed), iter(())

    def source():
        chunk = [records.encoded(i) for i in next(todo)]
        return [np.frombuffer(e, np.uint8) for e, _ in chunk], [np.array(label, np.int64) for _, label in chunk]

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=seed)
    def pipe():
        encoded, labels = fn.external_source(source=source, num_outputs=2, batch=True)
        images = fn.decoders.image_random_crop(encoded, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
        images = fn.resize(images, resize_x=size, resize_y=size, antialias=True, interp_type=types.INTERP_LINEAR)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[x * 255 for x in MEAN], std=[x * 255 for x in STD],
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    p = pipe(prefetch_queue_depth=1)  # no batch asked ahead of the epoch's last: the source runs dry only then
    p.build()

    def epoch(e: int):
        nonlocal todo
        order = np.random.default_rng([seed, e]).permutation(len(records))
        todo = iter(order[k:k + batch] for k in range(0, len(order) // batch * batch, batch))
        for _ in range(len(order) // batch):
            images, labels = p.run()
            yield torch.from_numpy(images.as_array()), torch.from_numpy(labels.as_array()).view(-1)
    return epoch


def _train(batches, net, optimizer, preprocess: str) -> int:
    import torch

    from enspipe.data.pixels import OUTPUT_RANGE

    lo, hi = OUTPUT_RANGE[preprocess]
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    seen = 0
    for images, labels in batches:
        if images.dtype == torch.float32:  # torchvision's, normalised in its workers
            x = images
        elif images.shape[-1] == 3:  # the uint8 wire (HWC)
            x = images.permute(0, 3, 1, 2).float() * ((hi - lo) / 255) + lo  # the uint8 wire's values
        else:  # torchvision's uint8 (CHW): ToDtype and Normalize here
            x = (images.float() / 255 - mean) / std
        loss = torch.nn.functional.cross_entropy(net(x), labels.long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen += len(labels)
    return seen


def worker(a: argparse.Namespace) -> None:
    """One process of one way: train its model for the epochs (or produce), write its numbers."""
    import torch
    from mpi4py import MPI

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    cores = os.cpu_count() or 1
    stream = None
    if a.way == "TensorSocket" and rank == 0:
        return _produce(a, comm)
    member = rank - 1 if a.way == "TensorSocket" else rank
    torch.manual_seed(member)
    if a.way == "enspipe":
        import enspipe

        stream = enspipe.SharedStream(a.data, a.batch_size, scheme="all_shared", image_size=a.image_size,
                                      wire_dtype="uint8", backend="pillow", preprocess=a.preprocess)
        classes = stream.num_classes
    else:
        from enspipe.data.build import load_manifest

        classes = load_manifest(a.data).num_classes
    net = model(WIDTHS[member % len(WIDTHS)], classes)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    t0, seen = time.perf_counter(), 0
    if a.way == "enspipe":
        for _ in range(a.epochs):
            seen += _train(stream.torch(), net, optimizer, a.preprocess)
        stream.close()
    elif a.way == "own DataLoader" or a.way in TORCHVISION:
        loader = _loader(a.data, a.batch_size, a.image_size, member, max(1, cores // n), a.preprocess, a.way)
        for epoch in range(a.epochs):
            loader.dataset.epoch = epoch
            seen += _train(loader, net, optimizer, a.preprocess)
        del loader  # its worker processes exit: their CPU is counted as this process's children's
    elif a.way == "DALI pipeline":
        epoch = _dali(a.data, a.batch_size, a.image_size, member, max(1, cores // n))
        for e in range(a.epochs):
            seen += _train(epoch(e), net, optimizer, a.preprocess)
    else:
        from tensorsocket.consumer import TensorConsumer

        consumer = TensorConsumer(*PORTS[:2], heart_ports=PORTS[2], batch_size=a.batch_size)
        for _ in range(a.epochs):
            seen += _train(consumer, net, optimizer, a.preprocess)
    _write(a, rank, time.perf_counter() - t0, seen)


def _produce(a: argparse.Namespace, comm) -> None:
    """TensorSocket's rank 0: one DataLoader with all the cores' workers inside a TensorProducer."""
    from tensorsocket.producer import TensorProducer

    # two loader batches of half a batch each per producer batch: with one (producer_batch_size=1),
    # TensorSocket 0.0.5 fails once its consumers have caught up (below)
    producer = TensorProducer(_loader(a.data, a.batch_size // 2, a.image_size, 0, os.cpu_count() or 1, a.preprocess),
                              *PORTS[:2],
                              heart_ports=PORTS[2], rubber_band_pct=0.5, producer_batch_size=2)
    t0 = time.perf_counter()
    try:
        for _ in range(a.epochs):
            for _ in producer:
                pass
        producer.join()
    except Exception as e:  # noqa: BLE001 - its consumers would wait for ever: say why and where, end the job
        where = " <- ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}"
                            for f in reversed(traceback.extract_tb(e.__traceback__)[-3:]))
        print(f"torch_ways: the TensorSocket producer failed: {type(e).__name__}: {e} at {where}", file=sys.stderr,
              flush=True)
        comm.Abort(1)
    _write(a, 0, time.perf_counter() - t0, 0)


def _write(a, rank: int, seconds: float, seen: int) -> None:
    cpu = sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                resource.getrusage(resource.RUSAGE_CHILDREN)))
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as f:
        json.dump({"seconds": seconds, "cpu_seconds": cpu, "images": seen}, f)


def way(a: argparse.Namespace, name: str) -> dict:
    if (name in TORCHVISION or name == "DALI pipeline") and a.preprocess != "standard":
        return {"failed": f"{name.split()[0]}'s transform is standard's: run with --preprocess standard"}
    n = a.members + 1 if name == "TensorSocket" else a.members
    with tempfile.TemporaryDirectory() as out:
        cmd = [MPIEXEC, "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker", name, "--out", out,
               "--data", a.data, "--epochs", str(a.epochs), "--image-size", str(a.image_size),
               "--batch-size", str(a.batch_size), "--preprocess", a.preprocess]
        t0 = time.perf_counter()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            return {"failed": f"did not finish in {a.timeout} s"}
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            said = [x for x in r.stderr.splitlines() if x.startswith("torch_ways:")] or r.stderr.strip().splitlines()
            return {"failed": f"exit {r.returncode}: {said[-1][:200] if said else ''}"}
        ranks = [json.load(open(os.path.join(out, f"rank{k}.json"))) for k in range(n)]
    members = [x for x in ranks if x["images"]]
    want = a.images // a.batch_size * a.batch_size * a.epochs  # each member's epochs, whole batches
    if len(members) != a.members:
        return {"failed": f"{len(members)} of its {a.members} members trained"}
    short = sorted({x["images"] for x in members if x["images"] != want})
    return {"wall": wall, "train": max(x["seconds"] for x in members), "cpu": sum(x["cpu_seconds"] for x in ranks),
            "rate": min(x["images"] / x["seconds"] for x in members),
            "short": f"SHORT: members saw {'/'.join(map(str, short))} of {want} images" if short else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--images", type=int, default=512, help="the synthetic dataset's size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--members", type=int, default=3, help="the models trained side by side (n)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a way may run")
    ap.add_argument("--preprocess", default="inception", choices=("inception", "standard"),
                    help="every way's augmentation: Slim's inception, or torchvision's standard transform")
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=WAYS, default=None, dest="way", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.way:
        return worker(a)
    a.data = dataset(a.images)
    got: dict[str, list] = {w: [None] * a.repeats for w in WAYS}
    for rep, name in schedule([w for w in WAYS if not ONLY or w in ("enspipe", *ONLY.split(","))], a.repeats):
        got[name][rep] = g = way(a, name)
        print(f"repeat {rep} {name}: {g}", flush=True)
    print(f"\n{a.members} members (pooled MLPs of width {', '.join(map(str, WIDTHS[:a.members]))}), {a.epochs} epochs "
          f"of {a.images} images, batch {a.batch_size}, {a.image_size} px, {a.preprocess}, {os.cpu_count()} cores, "
          f"{a.repeats} repeats, own DataLoaders with C/n = {max(1, (os.cpu_count() or 1) // a.members)} workers "
          "each, median (min-max)\n")
    print("| way | job wall s | training s | CPU s, all processes | img/s per member | CPU vs enspipe | "
          "wall vs enspipe |\n|---|---|---|---|---|---|---|")
    base = got["enspipe"]
    for name in (w for w in WAYS if got[w][0] is not None):
        rows = got[name]
        failed = next((r["failed"] for r in rows if "failed" in r), None)
        if failed or any(b is None or "failed" in b for b in base):
            print(f"| {name} | could not run here: {failed or ('enspipe did not run' if base[0] is None else 'enspipe failed')} | | | | | |")
            continue
        short = next((r["short"] for r in rows if r.get("short")), "")
        print(f"| {name}{' (' + short + ')' if short else ''} | {spread([r['wall'] for r in rows], 1, 1)} | {spread([r['train'] for r in rows], 1, 1)} | "
              f"{spread([r['cpu'] for r in rows], 1, 1)} | {spread([r['rate'] for r in rows], 1, 0)} | "
              f"{spread([r['cpu'] / b['cpu'] for r, b in zip(rows, base)])} | "
              f"{spread([r['wall'] / b['wall'] for r, b in zip(rows, base)])} |")
    goals(a, got)


TV = "torchvision DataLoader"
RATE_GOAL, CPU_GOAL = 1.3, 0.5  # n = 1: enspipe's images/s over torchvision's DataLoader's; n > 1: its job's CPU


def goals(a, got: dict) -> None:
    """The performance goals (issue 68's), met or not, each from ratios paired per repeat: at
    n = 1 enspipe's rate at least RATE_GOAL x the torchvision DataLoader's, at n > 1 its job's CPU
    at most CPU_GOAL x theirs."""
    pairs = [(e, t) for e, t in zip(got["enspipe"], got[TV]) if e and t and "failed" not in e and "failed" not in t]
    if not pairs:
        print(f"\ngoal: not judged: enspipe and the {TV} did not both run")
        return
    if a.members == 1:
        ratios, want, what = [e["rate"] / t["rate"] for e, t in pairs], RATE_GOAL, "images/s per member"
        met = min(ratios) >= want
    else:
        ratios, want, what = [e["cpu"] / t["cpu"] for e, t in pairs], CPU_GOAL, "job's CPU"
        met = max(ratios) <= want
    median = sorted(ratios)[len(ratios) // 2]
    verdict = "met" if met else ("met at the median, not in every repeat" if (
        median >= want if a.members == 1 else median <= want) else "not met")
    print(f"\ngoal: enspipe's {what} {'at least' if a.members == 1 else 'at most'} {want}x the {TV}'s, n = "
          f"{a.members}: {median:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} repeats): {verdict}")


if __name__ == "__main__":
    main()
