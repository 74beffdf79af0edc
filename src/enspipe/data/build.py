"""A user's dataset made into one the stream reads, with every file accounted for: a folder's
manifest (``enspipe index``, or a folder given directly to a run; :func:`load_manifest` reads or
makes any dataset's), a folder converted into TF-Slim shards (``enspipe convert``), and the
workflow's data stage (``enspipe stage``).

Each writes ``skipped.csv`` beside its ``manifest.json`` (every file left out, with its reason:
:mod:`enspipe.data.images`) and records the counts in the manifest's ``accounting``; under
``strict`` any skipped image is an error instead, and no manifest is written.
"""
from __future__ import annotations

import dataclasses
import functools
import os

from enspipe.common.atomic import write_json_atomic
from enspipe.data.convert import accounting_of, plan_shards, write_shards_of
from enspipe.data.folders import SKIPPED_CSV, Accounting, Listing, accounted, empty_problem, list_folder
from enspipe.data.keys import add_digests, digest_of, sample_ids
from enspipe.data.manifest import (
    MANIFEST,
    DataError,
    Manifest,
    candidate_shards,
    check,
    image_folders,
    manifest_dict,
    read_manifest,
)
from enspipe.data.parse import resolve
from enspipe.data.records import shard_records


@dataclasses.dataclass(frozen=True)
class FolderSource:
    """Where a folder's images and labels come from (see :mod:`enspipe.data.folders`)."""

    root: str
    labels: str | None = None     # a flat folder's labels file
    synsets: str | None = None    # the classes' order
    numbering: str = "folders"    # folders (0..K-1) or slim (1..K, 0 background)

    def listing(self) -> Listing:
        return list_folder(self.root, self.labels, self.synsets, self.numbering)


def load_manifest(root: str) -> Manifest:
    """Read ``root/manifest.json``, or scan the directory when there is none (which reads every
    record, or each image folder file's header, and hashes the keys with TensorFlow:
    :func:`enspipe.data.build.scan`)."""
    if not os.path.exists(os.path.join(root, MANIFEST)):
        return scan(root)
    return read_manifest(root)


def scan(root: str, parse=None) -> Manifest:
    """The manifest of the dataset at ``root``, by reading it: image class folders (each file's
    header checked: :func:`scan_folder`) or TFRecord shards (:func:`scan_records`)."""
    if os.path.isdir(root) and image_folders(root):
        return dataclasses.replace(_scanned(os.path.abspath(root), _folder_stamp(root)), root=root)
    problem = check(root) if os.path.isdir(root) else None  # a flat folder of images, a file that is no shard
    if problem:
        raise DataError(problem)
    return scan_records(root, parse)


def scan_records(root: str, parse=None) -> Manifest:
    """Build a TFRecord dataset's manifest by reading the directory (every record is read once to
    count and key it, its label read with ``parse``: see :mod:`enspipe.data.parse`; the manifest
    names it). Image folders are scanned by :func:`scan`."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory; create a dataset with `enspipe make-dataset`")
    shards = candidate_shards(root)
    if not shards:
        raise DataError(f"{root}: no TFRecord shards and no image class folders found")
    parser = resolve(parse)
    total, digest, max_label, counts = 0, digest_of([]), -1, []
    for shard in shards:
        name, keys = os.path.basename(shard), []
        for i, payload in enumerate(shard_records(shard)):  # a corrupt record: DataError naming it
            keys.append(f"{name}:{i}")
            max_label = max(max_label, parser.fn(payload, keys[-1].encode())[1])
        total += len(keys)
        counts.append(len(keys))
        digest = add_digests(digest, digest_of(sample_ids(keys)))
    return Manifest(root, "tfrecord", total, max_label + 1, digest,
                    tuple(os.path.relpath(s, root) for s in shards), counts=tuple(counts),
                    sizes=tuple(os.path.getsize(s) for s in shards),
                    info=None if parser.slim else {"parse": parser.name})


def _folder_stamp(root: str) -> tuple:
    """What changes when a file is added to or removed from the folder or its class folders."""
    return tuple((d, os.stat(os.path.join(root, d)).st_mtime_ns) for d in ["", *sorted(os.listdir(root))]
                 if os.path.isdir(os.path.join(root, d)))


@functools.lru_cache(maxsize=4)
def _scanned(root: str, stamp: tuple) -> Manifest:
    """A folder's manifest, once per process while its listing is unchanged (a run's checks and
    its rank each load the dataset: a large folder is read once, not four times)."""
    return scan_folder(FolderSource(root))


def scan_folder(source: FolderSource, level: str = "header", workers: int = 1) -> Manifest:
    """A folder's manifest (kind ``jpeg_folders``): its included images, their labels, and the
    accounting of every file. ``level``: ``header`` reads each file's header, ``decode`` decodes
    every image (see :mod:`enspipe.data.images`)."""
    return _folder_manifest(source, level, workers)[0]


def _folder_manifest(source: FolderSource, level: str, workers: int) -> tuple[Manifest, Accounting]:
    listing = source.listing()
    files, labels, acc = accounted(listing, level, workers)
    m = Manifest(source.root, "jpeg_folders", len(files), listing.num_classes, digest_of(sample_ids(files)),
                 tuple(files), tuple(labels), classes=listing.classes, numbering=listing.numbering,
                 accounting=acc.as_dict(None), info={"checked": level})
    return m, acc


def _finish(m: Manifest, acc: Accounting, out: str, strict: bool) -> Manifest:
    """``skipped.csv``, then (unless ``strict`` finds a skipped image) the manifest, last and atomically."""
    listed = os.path.join(out, SKIPPED_CSV)
    acc.write_csv(listed)
    problem = acc.strict_problem(listed) if strict else None
    if problem:
        raise DataError(problem)
    m = dataclasses.replace(m, accounting=acc.as_dict(SKIPPED_CSV))
    write_json_atomic(os.path.join(out, MANIFEST), manifest_dict(m))
    return m


def index_folder(source: FolderSource, workers: int = 1, strict: bool = False) -> Manifest:
    """``enspipe index`` of a folder: every image decoded once, the manifest and ``skipped.csv``
    written into the folder."""
    m, acc = _folder_manifest(source, "decode", workers)
    return _finish(m, acc, source.root, strict)


def convert_folder(source: FolderSource, out: str, split: str = "train", num_shards: int | None = None,
                   images_per_shard: int | None = None, workers: int = 1, strict: bool = False,
                   progress=None, listing: Listing | None = None) -> tuple[Manifest, Accounting, int]:
    """``enspipe convert``: the folder as Slim TFRecord shards under ``out``
    (:mod:`enspipe.data.convert`); returns the manifest, the accounting and how many shards a
    rerun reused. ``listing``: the source's, where the caller listed it already."""
    listing = listing if listing is not None else source.listing()
    if os.path.abspath(out) == os.path.abspath(source.root):
        raise DataError(f"{out}: the output folder is the source folder; pass a new folder (the source is never "
                        "changed)")
    os.makedirs(out, exist_ok=True)
    plan = plan_shards(listing, split, num_shards, images_per_shard)
    notes, reused = write_shards_of(listing, out, plan, workers, "decode", progress)
    acc = accounting_of(listing, notes)
    counts = [notes[n]["records"] for n in plan.names]
    left = {rel for rel, _ in acc.rows}
    empty_problem(listing, [label for rel, label in zip(listing.files, listing.labels) if rel not in left], acc)
    digest = digest_of([])
    for name, n in zip(plan.names, counts):
        digest = add_digests(digest, digest_of(sample_ids([f"{name}:{i}" for i in range(n)])))
    image_bytes = sum(notes[n]["image_bytes"] for n in plan.names)
    m = Manifest(out, "tfrecord", sum(counts), listing.num_classes, digest, plan.names, synthetic=False,
                 info={"source": os.path.abspath(source.root),
                       "mean_jpeg_bytes": round(image_bytes / max(1, sum(counts))),
                       "checked": "decode"},
                 counts=tuple(counts), sizes=tuple(notes[n]["bytes"] for n in plan.names), classes=listing.classes,
                 numbering=listing.numbering)
    return _finish(m, acc, out, strict), acc, reused


def stage_dataset(src: str, out: str, workers: int = 1, strict: bool = False, progress=None) -> Manifest:
    """The workflow's shared data stage for a user's dataset, leaving the source untouched: image
    class folders are converted into TF-Slim shards under ``out``; TFRecord shards are linked
    there. Either way ``out`` gets a ``manifest.json`` (sample keys, hence the digest, unchanged)."""
    if os.path.isdir(src) and image_folders(src):
        return convert_folder(FolderSource(src), out, workers=workers, strict=strict, progress=progress)[0]
    m = scan(src)
    os.makedirs(out, exist_ok=True)
    for f in m.files:
        dst = os.path.join(out, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.lexists(dst):
            os.remove(dst)
        os.symlink(os.path.abspath(os.path.join(src, f)), dst)
    staged = dataclasses.replace(m, root=out, sizes=tuple(os.path.getsize(p) for p in m.paths()))
    write_json_atomic(os.path.join(out, MANIFEST), manifest_dict(staged))
    return staged
