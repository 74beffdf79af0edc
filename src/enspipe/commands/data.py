"""The data commands: ``make-dataset``, ``convert``, ``stage`` and ``index``.

Each checks its arguments before reading a file, then either includes every file of a folder or
names it with its reason (``skipped.csv`` beside the manifest); its last line says how many files
were included and skipped, and where the list is. A bad dataset exits 2 with one line naming the
file and the fix; an interrupted conversion exits 130, leaving complete shards for a rerun.
"""
from __future__ import annotations

import argparse
import os

from enspipe.commands.base import Command, Fail, say
from enspipe.plan.options import positive_int

STRICT_HELP = ("make any skipped image an error, naming the first few (default: skip it, say so and list it in "
               "skipped.csv beside the manifest)")


def _workers():
    from enspipe.data.convert import default_workers

    return default_workers()


def _data_step(fail: Fail, fn, *args, **kwargs):
    """A data-stage function's result; its DataError (a bad dataset) exits 2 with the message, an
    interrupt exits 130 saying what is left for a rerun."""
    from enspipe.data.convert import Interrupted
    from enspipe.data.manifest import DataError

    try:
        return fn(*args, **kwargs)
    except Interrupted as e:
        say(str(e))
        raise SystemExit(130) from None
    except DataError as e:
        fail(str(e))


def _source(a: argparse.Namespace, root: str, fail: Fail):
    """The folder source the options name, every path checked before any file is read."""
    from enspipe.data.build import FolderSource

    for name in ("labels", "synsets"):
        path = getattr(a, name)
        if path is not None and not os.path.isfile(path):
            fail(f"--{name}: {path!r} is not a file; pass " + ("the folder's labels file (LOC_val_solution.csv)"
                                                               if name == "labels" else "LOC_synset_mapping.txt"))
    return FolderSource(root, a.labels, a.synsets, a.numbering)


def _accounted(m, out: str) -> str:
    """The last line's accounting (from the manifest), with where the list is."""
    from enspipe.data.manifest import counts_text

    acc = m.accounting or {}
    text = counts_text(acc)
    if acc.get("skipped") or acc.get("ignored"):
        text += f"; the list: {os.path.join(out, acc.get('list') or 'skipped.csv')}"
    if acc.get("skipped"):
        text += " (skipped images are left out by default; --strict makes them an error)"
    return text


# -- make-dataset ---------------------------------------------------------------------------------
def _make_dataset_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--num-images", type=positive_int, required=True, help="number of images M (>= 1)")
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--num-classes", type=positive_int, default=100, help="number of classes (default 100)")
    p.add_argument("--images-per-shard", type=positive_int, default=256, help="records per shard (default 256)")


def _make_dataset(a: argparse.Namespace, fail: Fail) -> int:
    if a.num_images < 1:
        fail("--num-images: must be >= 1; pass the number of images to generate")
    from enspipe.data.synthetic import make_dataset

    m = make_dataset(a.out, a.num_images, a.seed, max(1, a.num_classes), max(1, a.images_per_shard))
    say(f"wrote {m.num_images} images in {len(m.files)} shards to {a.out} (digest {m.digest})")
    return 0


# -- convert, stage, index --------------------------------------------------------------------------
def _folder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--labels", default=None, metavar="FILE", help="a flat folder's labels: Kaggle's "
                   "LOC_val_solution.csv, lines of `file class`, or one class a line in the files' sorted order "
                   "(TF-Slim's imagenet_2012_validation_synset_labels.txt)")
    p.add_argument("--synsets", default=None, metavar="FILE", help="the classes in label order, one a line, its "
                   "first word the class (LOC_synset_mapping.txt); default: the class names sorted")
    p.add_argument("--numbering", choices=("folders", "slim"), default="folders", help="labels 0..K-1 (folders), or "
                   "TF-Slim's 1..K with 0 for background (slim: num_classes K+1)")
    p.add_argument("--workers", type=positive_int, default=None, help="processes reading and checking the images "
                   "(default: this machine's cores)")
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)


def _convert_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jpeg-dir", "--images", dest="jpeg_dir", required=True,
                   help="a folder of class folders (or a flat folder with --labels) of JPEG, PNG, GIF, BMP or WebP "
                        "images")
    p.add_argument("--out", required=True, help="output directory (a rerun of the same command resumes there)")
    p.add_argument("--split", default="train", help="the shards' name prefix (Slim's: train, validation)")
    p.add_argument("--shards", type=positive_int, default=None, help="number of shards (default: one per "
                   "--images-per-shard images)")
    p.add_argument("--images-per-shard", type=positive_int, default=None,
                   help="images per shard (default 1252: ImageNet's training set in Slim's 1024 shards)")
    _folder_args(p)


def _convert(a: argparse.Namespace, fail: Fail) -> int:
    if not os.path.isdir(a.jpeg_dir):
        fail(f"--jpeg-dir: {a.jpeg_dir!r} is not a directory; pass your folder of class folders")
    source = _source(a, a.jpeg_dir, fail)
    listing = _data_step(fail, source.listing)  # a folder that is none, or bad labels: before any work
    from enspipe.common.progress import Progress
    from enspipe.data.build import convert_folder

    m, _, reused = _data_step(fail, convert_folder, source, a.out, a.split, a.shards, a.images_per_shard,
                              a.workers or _workers(), a.strict, Progress("enspipe convert"), listing)
    again = f" ({reused} complete shards reused)" if reused else ""
    say(f"converted {m.num_images} images into {len(m.files)} shards in {a.out}{again}; {_accounted(m, a.out)}")
    return 0


def _stage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="your TF-Slim TFRecord shards or image class folders")
    p.add_argument("--out", required=True, help="the staged dataset directory")
    p.add_argument("--workers", type=positive_int, default=None, help="processes converting image folders "
                   "(default: this machine's cores)")
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)


def _stage(a: argparse.Namespace, fail: Fail) -> int:
    if not os.path.isdir(a.data):
        fail(f"--data: {a.data!r} is not a directory; pass your dataset's folder")
    from enspipe.common.progress import Progress
    from enspipe.data.build import stage_dataset
    from enspipe.data.manifest import image_folders

    progress = Progress("enspipe stage") if image_folders(a.data) else None  # its total: the folder's files
    m = _data_step(fail, stage_dataset, a.data, a.out, a.workers or _workers(), a.strict, progress)
    said = f"; {_accounted(m, a.out)}" if m.accounting is not None else ""
    say(f"staged {m.num_images} images ({m.kind}) from {a.data} in {a.out} (digest {m.digest}){said}")
    return 0


def _index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", required=True, help="a folder of TFRecord shards, image class folders, or a flat "
                   "image folder with --labels")
    p.add_argument("--parse", default=None, metavar="FORMAT", help="the records' format: slim (default: TF-Slim's "
                   "ImageNet records), tfds (TensorFlow Datasets' image and label) or your function as "
                   "package.module:function, fn(record_bytes) -> (image_bytes, label); the manifest records it")
    _folder_args(p)


def _index(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.common.atomic import write_json_atomic
    from enspipe.data.manifest import MANIFEST, image_folders, manifest_dict
    from enspipe.data.parse import resolve

    if not os.path.isdir(a.data):
        fail(f"--data: {a.data!r} is not a directory; pass your dataset's folder")
    folder = a.labels is not None or image_folders(a.data)
    if not folder and (a.labels or a.synsets or a.numbering != "folders"):
        fail("--labels, --synsets and --numbering are for image folders; TFRecords carry their labels")
    try:
        resolve(a.parse)
    except ValueError as e:
        fail(f"--parse: {e}")
    if folder:
        from enspipe.data.build import index_folder

        m = _data_step(fail, index_folder, _source(a, a.data, fail), a.workers or _workers(), a.strict)
        say(f"{m.num_images} images, {m.num_classes} classes, digest {m.digest}; {_accounted(m, a.data)}")
        return 0
    from enspipe.data.build import scan_records

    m = _data_step(fail, scan_records, a.data, a.parse)
    write_json_atomic(os.path.join(a.data, MANIFEST), manifest_dict(m))
    say(f"{m.num_images} images, {m.num_classes} classes, digest {m.digest}")
    return 0


DATA_COMMANDS: dict[str, Command] = {
    "make-dataset": Command("write the embedded synthetic JPEG TFRecord dataset", _make_dataset_args, _make_dataset),
    "convert": Command("convert image class folders (or a flat folder and its labels) into Slim TFRecord shards, "
                       "every file accounted for", _convert_args, _convert),
    "index": Command("scan a TFRecord dataset or image folder and write its manifest.json (and skipped.csv)",
                     _index_args, _index),
    "stage": Command("the workflow's data stage for your dataset: pack image folders into shards, or link "
                     "TFRecord shards, into --out with a manifest", _stage_args, _stage),
}
