"""The ``standard`` transform (RandomResizedCrop to 224 px, a flip, Normalize to float32) as each
library a PyTorch user might pick does it, beside enspipe's, on the same natural photographs, on 1
and 2 cores: CPU per image and images/s.

    python benchmarks/standard_peers.py [--images 256] [--repeats 3] [--cores 1,2] [--cell]
                                         [--python ROW=PYTHON ...] [--json out.json]

``--python`` runs a row's processes in another environment's Python (the peers need not share
enspipe's venv): ``--python dali=/venvs/peers/bin/python --python pillow-simd=/venvs/simd/bin/python``.

Each row is a fresh process per core, pinned to its own core (``taskset``), over its share of the
images after an unmeasured pass over them: k cores are k such processes started together, as k
``DataLoader`` workers or k pool processes would be, with no transfer or collation (``--cell``
adds a one-member enspipe cell for each of standard, inception and vgg, which has its own). A
row's CPU is its processes' (``process_time``: every thread of each), its rate all the images
over the slowest process's wall time. Rows run
interleaved, in an order that rotates each repeat; each cell is the median (min-max) of the
repeats; ``x floor`` is the row's CPU per image over the whole-image decode's, timed in the same
processes in passes either side of the row's (the cell's: over the whole decode's one-core row
in the same repeat).

Rows (a row that cannot run here keeps its place and says why):

* torchvision: ``decode_jpeg``, ``transforms.v2``: RandomResizedCrop(antialias), RandomHorizontalFlip,
  ToDtype(float32, scale), Normalize;
* DALI: its CPU pipeline (``device_id=None``, one thread): ``decoders.image_random_crop`` (its ROI
  decode), ``resize`` (antialiased linear), ``crop_mirror_normalize``, batches of 32;
* SPDL: FFmpeg's decode and filter graph (``crop``, ``scale`` bilinear, ``hflip``), numpy's Normalize;
* Pillow-SIMD: decode, ``resize(box=)`` bilinear (antialiased), flip, numpy's Normalize, in a
  venv with ``pip install pillow-simd numpy`` given by ``--python pillow-simd=...`` (the row says
  which Pillow it ran);
* OpenCV: ``imdecode``, RGB, ``resize`` (INTER_AREA down, INTER_LINEAR up), flip, Normalize;
* enspipe ``standard``, the per-image function of the pillow backend's workers, with its compiled
  parts (the crop's region decode, the C resize and the wire's table) and without them; and
  enspipe's ``inception`` and ``vgg`` functions with theirs (no peer row: their augmentations are
  Slim's and VGG's, not torchvision's);
* the floor: the whole image decoded (OpenCV's libjpeg-turbo), and the crop's region alone at its
  DCT scale (enspipe's region decode).

The crops are torchvision's distribution everywhere (DALI and torchvision draw their own).
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

SIZE = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
HERE = os.path.dirname(os.path.abspath(__file__))


def _scaled(x: np.ndarray) -> np.ndarray:
    """Normalize(MEAN, STD) of ToDtype(float32, scale=True), in numpy."""
    return (x.astype(np.float32) * np.float32(1 / 255) - np.array(MEAN, np.float32)) / np.array(STD, np.float32)


def _boxes(jpegs: list[bytes]) -> list[tuple]:
    """torchvision's RandomResizedCrop box and a flip per image (the rows that take boxes)."""
    from enspipe.data.decoding import open_image
    from enspipe.data.pixels import generator, resized_crop_box

    out = []
    for i, b in enumerate(jpegs):
        rng = generator(1, i)
        out.append((*resized_crop_box(rng, *open_image(b).size), bool(rng.random() < 0.5)))
    return out


def torchvision_row():
    import torch
    import torchvision
    from torchvision.io import decode_jpeg
    from torchvision.transforms import v2

    torch.set_num_threads(1)
    tv = v2.Compose([v2.RandomResizedCrop(SIZE, antialias=True), v2.RandomHorizontalFlip(),
                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])

    def run(jpegs, boxes):
        for b in jpegs:
            tv(decode_jpeg(torch.frombuffer(bytearray(b), dtype=torch.uint8)))
    return f"torchvision {torchvision.__version__} (torch {torch.__version__})", run


def dali_row():
    import nvidia.dali as dali
    from nvidia.dali import fn, pipeline_def, types

    def run(jpegs, boxes):
        batch = 32
        chunks = [jpegs[i:i + batch] for i in range(0, len(jpegs), batch)]
        it = iter(chunks)

        @pipeline_def(batch_size=batch, num_threads=1, device_id=None, seed=0, prefetch_queue_depth=1)
        def pipe():
            encoded = fn.external_source(source=lambda: [np.frombuffer(b, np.uint8) for b in next(it)], batch=True,
                                         no_copy=False)
            images = fn.decoders.image_random_crop(encoded, device="cpu", output_type=types.RGB,
                                                   random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                                   num_attempts=10)
            images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True, interp_type=types.INTERP_LINEAR)
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC",
                                            mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                            mirror=fn.random.coin_flip(probability=0.5))
        p = pipe()
        p.build()
        for chunk in chunks:
            if len(chunk) < batch:
                break  # a short last batch: DALI's batch size is fixed; the images count says so
            p.run()
    return f"DALI {dali.__version__}, CPU pipeline", run


def spdl_row():
    import spdl
    import spdl.io

    def run(jpegs, boxes):
        for b, (left, top, w, h, flip) in zip(jpegs, boxes):
            desc = f"crop={w}:{h}:{left}:{top},scale={SIZE}:{SIZE}:flags=bilinear{',hflip' if flip else ''},format=rgb24"
            _scaled(spdl.io.to_numpy(spdl.io.load_image(b, filter_desc=desc)))
    return f"SPDL {getattr(spdl, '__version__', '?')} (FFmpeg)", run


def pillow_row():
    import io

    import PIL
    from PIL import Image

    def run(jpegs, boxes):
        for b, (left, top, w, h, flip) in zip(jpegs, boxes):
            im = Image.open(io.BytesIO(b)).convert("RGB")
            im = im.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
            if flip:
                im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            _scaled(np.asarray(im))
    return f"Pillow {PIL.__version__}", run


def opencv_row():
    import cv2

    cv2.setNumThreads(1)

    def run(jpegs, boxes):
        for b, (left, top, w, h, flip) in zip(jpegs, boxes):
            x = cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            x = cv2.resize(x[top:top + h, left:left + w], (SIZE, SIZE),
                           interpolation=cv2.INTER_AREA if max(w, h) > SIZE else cv2.INTER_LINEAR)
            _scaled(cv2.flip(x, 1) if flip else x)
    return f"OpenCV {cv2.__version__}", run


def enspipe_row(name: str, compiled: bool = True):
    from enspipe.data import decoding, pixels

    if not compiled:
        decoding._jpegregion = pixels._pixels = None
    elif not (decoding.REGION_DECODE and pixels.KERNELS):
        raise RuntimeError("enspipe's compiled parts are not built here (apt-get install gcc libjpeg-dev, reinstall)")

    train = pixels.PREPROCESSING[name]

    def run(jpegs, boxes):
        for i, b in enumerate(jpegs):
            pixels.to_wire(name, train(b, SIZE, pixels.generator(0, i)), "float32")
    return f"enspipe {name}" + (" (region decode, C resize, table)" if compiled else ", no compiled parts"), run


def floor_row(region: bool):
    import cv2

    from enspipe.data import decoding

    cv2.setNumThreads(1)

    def run(jpegs, boxes):
        for b, (left, top, w, h, _) in zip(jpegs, boxes):
            if region:
                decoding.decoded_box(b, decoding.open_image(b), (left, top, left + w, top + h), SIZE)
            else:
                cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR)
    return "floor: the crop's region decoded alone (enspipe)" if region else "floor: whole decode (OpenCV)", run


ROWS = {"torchvision": torchvision_row, "dali": dali_row, "spdl": spdl_row, "pillow-simd": pillow_row,
        "opencv": opencv_row, "enspipe": lambda: enspipe_row("standard"),
        "enspipe-plain": lambda: enspipe_row("standard", False), "enspipe-inception": lambda: enspipe_row("inception"),
        "enspipe-vgg": lambda: enspipe_row("vgg"),
        "floor-whole": lambda: floor_row(False), "floor-region": lambda: floor_row(True)}


def child(spec: dict) -> dict:
    """In a pinned process: the row over its share of the images, once unmeasured, once measured."""
    with open(spec["images"], "rb") as f:
        jpegs, boxes = json.loads(f.read())
    jpegs = [bytes.fromhex(b) for b in jpegs[spec["part"]::spec["parts"]]]
    boxes = boxes[spec["part"]::spec["parts"]]
    label, run = ROWS[spec["row"]]()
    floor = floor_row(False)[1]
    run(jpegs, boxes)
    floor_cpu = time.process_time()
    floor(jpegs, boxes)
    t, cpu = time.perf_counter(), time.process_time()
    run(jpegs, boxes)
    seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
    floor(jpegs, boxes)
    floor_cpu = (time.process_time() - floor_cpu - cpu) / 2  # the whole decode's passes either side of the row's
    images = len(jpegs) // 32 * 32 if spec["row"] == "dali" else len(jpegs)
    return {"label": label, "seconds": seconds, "cpu": cpu, "images": images,
            "floor_cpu_per_image": floor_cpu / len(jpegs)}


def measure(row: str, k: int, images: str, python: str) -> dict:
    """The row on k cores: k pinned processes, started together."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "..", "src"), HERE])}
    procs = [subprocess.Popen(["taskset", "-c", str(c), python, __file__, "--child",
                               json.dumps({"row": row, "part": c, "parts": k, "images": images})],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in range(k)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode:
            return {"error": (err.strip().splitlines() or ["exit %d" % p.returncode])[-1][:160]}
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return {"label": outs[0]["label"], "seconds": max(o["seconds"] for o in outs),
            "cpu": sum(o["cpu"] for o in outs), "images": sum(o["images"] for o in outs),
            "floor_cpu_per_image": float(np.mean([o["floor_cpu_per_image"] for o in outs]))}


CELLS = ("standard", "inception", "vgg")


def cell_row(preprocess: str, k: int, n: int) -> dict:
    """One member of a real cell (``enspipe run --preprocess P --cores k``), its window."""
    from scaling import cell, dataset

    r = cell({"data": dataset(n), "backend": "pillow", "preprocess": preprocess, "size": SIZE,
              "wire_dtype": "float32", "images": max(n, 1280 * k), "cores": list(range(k))})
    return {"label": f"enspipe cell {preprocess} (enspipe run, one member, float32)", **r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--images", type=int, default=256, help="photos (each row does all of them on each core count)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", default="1,2")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--cell", action="store_true", help="add one member of a real enspipe cell for each of "
                    + ", ".join(CELLS))
    ap.add_argument("--python", action="append", default=[], metavar="ROW=PYTHON",
                    help="run ROW's processes in this Python (repeatable)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(json.loads(a.child))))
        return
    from enspipe.data.photos import photo_jpegs

    jpegs = [b for _, b in photo_jpegs(a.images)]  # the cell's dataset holds the same photos
    images = os.path.join(tempfile.mkdtemp(prefix="standard-peers-"), "images.json")
    with open(images, "w") as f:
        json.dump([[b.hex() for b in jpegs], _boxes(jpegs)], f)
    ks, rows = [int(k) for k in a.cores.split(",")], a.rows.split(",")
    pythons = dict(p.split("=", 1) for p in a.python)
    unknown = set(pythons) - set(ROWS)
    if unknown:
        ap.error(f"--python: no row {', '.join(sorted(unknown))}; the rows: {', '.join(ROWS)}")
    if a.cell:
        rows += [f"cell-{p}" for p in CELLS]
    runs = {(r, k): [] for r in rows for k in ks}
    for rep in range(a.repeats):
        order = [(r, k) for r in rows for k in ks]
        shift = rep * 3 % len(order)
        for r, k in order[shift:] + order[:shift]:
            if r.startswith("cell-"):
                runs[r, k].append(cell_row(r[len("cell-"):], k, a.images))
            elif r == "pillow-simd" and r not in pythons:
                runs[r, k].append({"error": "no --python pillow-simd=PYTHON given (a venv with pillow-simd and numpy)"})
            else:
                runs[r, k].append(measure(r, k, images, pythons.get(r, sys.executable)))
            print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    report(runs, rows, ks, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{r}@{k}": v for (r, k), v in runs.items()}, f, indent=1)


def report(runs: dict, rows: list[str], ks: list[int], a) -> None:
    print(f"standard (RandomResizedCrop 224, flip, Normalize to float32; the inception and vgg rows: enspipe's own) "
          f"on {a.images} photos, {a.repeats} repeats interleaved: median (min-max); x floor: CPU per image over the "
          "whole decode's, paired per repeat")
    print(f"{'row':62s} {'cores':>5s} {'images/s':>20s} {'CPU ms/img':>20s} x floor")
    for r in rows:
        for k in ks:
            rs = runs[r, k]
            bad = [x["error"] for x in rs if "error" in x]
            if bad:
                print(f"{r:62s} {k:5d}  cannot run: {bad[0]}")
                continue
            rate = [x["images"] / x["seconds"] for x in rs]
            cpu = [x["cpu"] / x["images"] * 1e3 for x in rs]
            floor = [x.get("floor_cpu_per_image") for x in rs]
            if None in floor:  # the cell: the whole decode's row on one core in the same repeat
                floor = [f["cpu"] / f["images"] for f in runs.get(("floor-whole", 1), [])]
            ratio = [c / (f * 1e3) for c, f in zip(cpu, floor)]
            x = f"{np.median(ratio):5.2f} ({min(ratio):.2f}-{max(ratio):.2f})" if len(floor) == len(cpu) else ""
            print(f"{rs[0]['label'][:62]:62s} {k:5d} {np.median(rate):8.0f} ({min(rate):.0f}-{max(rate):.0f})"
                  f" {np.median(cpu):8.2f} ({min(cpu):.2f}-{max(cpu):.2f}) {x}")
    goals(runs, ks)


def _cpu(runs: dict, row: str, k: int) -> list | None:
    rs = runs.get((row, k), [])
    return [x["cpu"] / x["images"] for x in rs] if rs and not any("error" in x for x in rs) else None


def goals(runs: dict, ks: list[int]) -> None:
    """Issue 68's goals for `standard`, from ratios paired per repeat: the one-member cell's CPU per
    image (the function's, without --cell) at most torchvision's and DALI's, and at most 2x the
    whole decode's."""
    own = "cell-standard" if ("cell-standard", 1) in runs else "enspipe"
    for k in ks:
        mine = _cpu(runs, own, k)
        if mine is None:
            print(f"goal ({own}, {k} cores): not judged: it did not run")
            continue
        for peer, most in (("torchvision", 1.0), ("dali", 1.0), ("floor-whole", 2.0)):
            theirs = _cpu(runs, peer, k if peer != "floor-whole" else 1)
            if theirs is None or len(theirs) != len(mine):
                print(f"goal ({own}, {k} cores) against {peer}: not judged: {peer} did not run")
                continue
            r = sorted(m / t for m, t in zip(mine, theirs))
            verdict = "met" if r[-1] <= most else ("met at the median" if r[len(r) // 2] <= most else "not met")
            print(f"goal ({own}, {k} cores): CPU per image at most {most:g}x {peer}'s: {r[len(r) // 2]:.2f}x "
                  f"({r[0]:.2f}-{r[-1]:.2f}) over {len(r)} repeats: {verdict}")


if __name__ == "__main__":
    main()
