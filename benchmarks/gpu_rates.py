"""The rates that decide the paper's regimes on a GPU machine, with no enspipe run in between:
rc, the accelerator's training rate, and rp, the CPU's preprocessing rate.

    python benchmarks/gpu_rates.py --out gpu_rates.json [--steps 20] [--repeats 3] [--seconds 2]

* ``rc``: images/s of training steps (forward, backward, SGD) on one batch already on the device,
  at the paper's batch sizes (AlexNet 128, Inception v1 and VGG-A 32), for torchvision's
  ``alexnet``, ``googlenet`` and ``vgg11`` in fp32 (TF32 off), TF32 and bf16 autocast, and for
  enspipe's own ``torch.nn`` definitions (``enspipe calibrate-rc --trainer torch``: torch's
  default precision), each step waited for as the paper times a step. The median of
  ``--repeats`` runs, with the range.
* ``rp``: images/s of training preprocessing on 1, 2, 4, 8 and 16 cores (one worker process
  pinned to each core, one thread each), for 224 px outputs from natural-photo JPEGs
  (``enspipe.data.photos``): the standard ImageNet transform (RandomResizedCrop, flip,
  normalise to float32) in Pillow, OpenCV and torchvision (``decode_jpeg`` and ``transforms.v2``),
  and enspipe's pillow backend (TF-Slim's inception preprocessing, colour distortion included).

Without a GPU the rc rows run on the CPU and say so. The JSON holds every row, the device, the
library versions and the command.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import signal
import statistics
import sys
import time

import numpy as np

from cells import spread

NETWORKS = {  # enspipe's name -> (torchvision's, the paper's batch)
    "alexnet_v2": ("alexnet", 128),
    "inception_v1": ("googlenet", 32),
    "vgg_a": ("vgg11", 32),
}
MODES = ("fp32", "tf32", "bf16")
LIBRARIES = ("pillow", "opencv", "torchvision", "enspipe-pillow")
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32) * 255, np.array([0.229, 0.224, 0.225], np.float32) * 255


# -- rc -------------------------------------------------------------------------------------------
def torchvision_model(name: str):
    import torchvision.models as tvm

    if name == "googlenet":
        return tvm.googlenet(weights=None, aux_logits=False, init_weights=True)
    return getattr(tvm, name)(weights=None)


def _precision(torch, mode: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = mode != "fp32"
    torch.backends.cudnn.allow_tf32 = mode != "fp32"


def train_rate(model, batch: int, steps: int, warmup: int, mode: str, size: int = 224) -> tuple[float, str]:
    """Images/s of ``steps`` SGD steps on one batch on the device, each step waited for."""
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    _precision(torch, mode)
    model = model.to(dev, memory_format=torch.channels_last).train()
    x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device=dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=mode == "bf16"):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()  # waits for the step

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps / (time.perf_counter() - t0), ("GPU " + torch.cuda.get_device_name(0)
                                                       if dev.type == "cuda" else "CPU")


def rc_rows(rows: list[dict], steps: int, warmup: int, repeats: int, batch_scale: float = 1.0) -> None:
    """Appends a row per network and implementation (torchvision in each mode, enspipe's in torch's
    default) to ``rows`` as each is measured."""
    import torch

    from enspipe.run.calibration import measure_accelerator_rate

    for net, (tv_name, paper_batch) in NETWORKS.items():
        batch = max(1, round(paper_batch * batch_scale))
        for mode in MODES:
            rates, device = [], ""
            try:
                for _ in range(repeats):
                    torch.manual_seed(0)
                    rate, device = train_rate(torchvision_model(tv_name), batch, steps, warmup, mode)
                    rates.append(rate)
            except Exception as e:  # noqa: BLE001 - torchvision that does not load here: say so
                rows.append({"network": net, "implementation": f"torchvision {tv_name}", "precision": mode,
                             "rc": None, "why": f"{type(e).__name__}: {e}"[:200]})
                print(f"rc {net:13s} torchvision {tv_name:9s} {mode}: {rows[-1]['why']}", flush=True)
                continue
            rows.append(_rc_row(net, f"torchvision {tv_name}", mode, batch, rates, device))
            print(f"rc {net:13s} torchvision {tv_name:9s} {mode}: {spread(rates, digits=1)} images/s", flush=True)
        _precision(torch, "tf32")
        torch.backends.cuda.matmul.allow_tf32 = False  # torch's defaults: TF32 in cuDNN only
        rates = []
        for _ in range(repeats):
            r = measure_accelerator_rate(net, batch, 224, steps, warmup, 1000, trainer="torch")
            rates.append(r["rc"])
        rows.append(_rc_row(net, "enspipe torch.nn", "default", batch, rates, r["device"]))
        print(f"rc {net:13s} enspipe torch.nn     default: {spread(rates, digits=1)} images/s", flush=True)


def _rc_row(net: str, impl: str, mode: str, batch: int, rates: list[float], device: str) -> dict:
    return {"network": net, "implementation": impl, "precision": mode, "batch_size": batch,
            "rc": statistics.median(rates), "rc_min": min(rates), "rc_max": max(rates), "device": device}


# -- rp -------------------------------------------------------------------------------------------
def crop_box(rng: np.random.Generator, w: int, h: int) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3): left, top, width, height."""
    area = w * h
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1)), cw, ch
    side = min(w, h)
    return (w - side) // 2, (h - side) // 2, side, side


def _normalised(hwc: np.ndarray) -> np.ndarray:
    return ((hwc.astype(np.float32) - MEAN) / STD).transpose(2, 0, 1)


def _pillow(encoded: bytes, rng: np.random.Generator, size: int) -> np.ndarray:
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(encoded)).convert("RGB")
    x, y, w, h = crop_box(rng, *im.size)
    im = im.resize((size, size), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return _normalised(np.asarray(im))


def _opencv(encoded: bytes, rng: np.random.Generator, size: int) -> np.ndarray:
    import cv2

    im = cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    x, y, w, h = crop_box(rng, im.shape[1], im.shape[0])
    im = cv2.resize(im[y:y + h, x:x + w], (size, size), interpolation=cv2.INTER_LINEAR)
    if rng.random() < 0.5:
        im = im[:, ::-1]
    return _normalised(im)


def _torchvision(size: int):
    import torch
    from torchvision.io import ImageReadMode, decode_jpeg
    from torchvision.transforms import v2

    t = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
                    v2.ToDtype(torch.float32, scale=True), v2.Normalize((MEAN / 255).tolist(), (STD / 255).tolist())])
    return lambda encoded, rng, size: t(decode_jpeg(torch.frombuffer(encoded, dtype=torch.uint8),
                                                    mode=ImageReadMode.RGB)).numpy()


def _enspipe(encoded: bytes, rng: np.random.Generator, size: int) -> np.ndarray:
    from enspipe.data.pixels import inception_train

    return inception_train(encoded, size, rng)


def transform(library: str, size: int):
    """The per-image function of ``library``: ``f(encoded, rng, size) -> preprocessed array``."""
    return {"pillow": _pillow, "opencv": _opencv, "enspipe-pillow": _enspipe}.get(library) or _torchvision(size)


def _single_threaded() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        import cv2

        cv2.setNumThreads(0)
    except ImportError:
        pass
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def _worker(library, core, jpegs, size, ready, start, seconds, out) -> None:
    os.sched_setaffinity(0, {core})
    _single_threaded()
    f, rng, n = transform(library, size), np.random.default_rng(core), 0
    f(jpegs[0], rng, size)  # imports and first-call set-up outside the window
    ready.wait()  # every worker is set up before the start time is set
    c0 = time.process_time()
    while time.time() < start.value:
        time.sleep(0.0005)
    end = start.value + seconds
    while time.time() < end:
        f(jpegs[n % len(jpegs)], rng, size)
        n += 1
    out.put((n, time.process_time() - c0))


def preprocessing_rate(library: str, cores: list[int], jpegs: list[bytes], size: int, seconds: float) -> dict:
    """Images/s of ``len(cores)`` pinned single-thread workers running ``library``'s transform for
    ``seconds`` (each counts its whole images started inside the window)."""
    transform(library, size)(jpegs[0], np.random.default_rng(0), size)  # fails here if the library does not load
    ctx = mp.get_context("fork")
    start, out, ready = ctx.Value("d", time.time() + 3600), ctx.Queue(), ctx.Barrier(len(cores) + 1)
    procs = [ctx.Process(target=_worker, args=(library, c, jpegs, size, ready, start, seconds, out)) for c in cores]
    for p in procs:
        p.start()
    ready.wait(timeout=120)
    start.value = time.time() + 0.05
    got = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    images, cpu = sum(g[0] for g in got), sum(g[1] for g in got)
    return {"library": library, "cores": len(cores), "rp": images / seconds, "images": images,
            "cpu_ms_per_image": 1000 * cpu / max(images, 1)}


def rp_rows(rows: list[dict], core_counts: list[int], jpegs: list[bytes], size: int, seconds: float) -> None:
    """Appends a row per core count and library to ``rows`` as each is measured."""
    allowed = sorted(os.sched_getaffinity(0))
    for k in [k for k in core_counts if k <= len(allowed)]:
        for library in LIBRARIES:
            try:
                row = preprocessing_rate(library, allowed[:k], jpegs, size, seconds)
            except Exception as e:  # noqa: BLE001 - a library that does not load here gets a row saying so
                row = {"library": library, "cores": k, "rp": None, "why": f"{type(e).__name__}: {e}"[:200]}
            rows.append(row)
            print(f"rp {library:15s} {k:2d} cores: "
                  + (f"{row['rp']:8.1f} images/s" if row["rp"] else row["why"]), flush=True)


def versions() -> dict:
    out = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()}
    for mod in ("torch", "torchvision", "PIL", "cv2", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            out[mod] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-scale", type=float, default=1.0, help="batches x this (a CPU check: 0.05)")
    ap.add_argument("--seconds", type=float, default=2.0, help="each rp measurement's window")
    ap.add_argument("--cores", default="1,2,4,8,16")
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: rc, rp")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a time limit still writes what was measured
    skip = set(a.skip.split(","))
    result = {"command": " ".join(sys.argv), "versions": versions(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    try:
        if "rp" not in skip:
            from enspipe.data.photos import photo_jpegs

            jpegs = [j for _, j in photo_jpegs(a.images)]
            result["jpegs"] = {"count": len(jpegs), "mean_bytes": float(np.mean([len(j) for j in jpegs]))}
            rp_rows(result.setdefault("rp", []), [int(c) for c in a.cores.split(",")], jpegs, 224, a.seconds)
        if "rc" not in skip:
            rc_rows(result.setdefault("rc", []), a.steps, a.warmup, a.repeats, a.batch_scale)
    finally:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
