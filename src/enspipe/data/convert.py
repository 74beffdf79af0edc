"""An image folder converted into TF-Slim TFRecord shards, at ImageNet scale. Needs no TensorFlow.

- **Slim's layout.** The files are shuffled once (Slim's seed, 12345) so every shard mixes the
  classes, then cut into ``{split}-NNNNN-of-MMMMM`` shards: by default one per
  :data:`IMAGES_PER_SHARD` images, ImageNet's training set's 1,281,167 in 1024 shards as Slim's
  ``build_imagenet_data.py`` writes them.
- **In parallel, streaming.** ``workers`` processes each write whole shards, one image in memory
  at a time; every image is checked by decoding it (:mod:`enspipe.data.images`), and an image is
  stored as it is, in its own format (Slim's ``image/format``), never re-encoded.
- **Resumable.** A shard is written under a temporary name and renamed when complete; a note of
  what it holds (its sources' names, sizes and times, and the verdicts) follows it into
  ``.enspipe-convert/``. A rerun reuses every shard whose note matches its sources and its size.
- **Never complete-looking when it is not.** ``manifest.json`` is removed when a conversion starts
  and written last (by the caller, :func:`enspipe.data.shards.convert_folder`); an interrupted
  conversion leaves complete shards for the rerun and no manifest.
"""
from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import random
import re
import signal
import time
from dataclasses import dataclass

from enspipe.common.atomic import write_json_atomic
from enspipe.common.liveness import die_with_launcher
from enspipe.data.folders import Accounting, Listing
from enspipe.data.images import Verdict, read_image
from enspipe.data.manifest import MANIFEST, DataError
from enspipe.data.records import framed, slim_example

IMAGES_PER_SHARD = 1252  # ImageNet's training set in Slim's 1024 shards
SLIM_SHUFFLE_SEED = 12345
STATE = ".enspipe-convert"
_VERSION = 1  # of the shard notes: a change to what a shard holds makes old notes stale


class Interrupted(DataError):
    """The conversion was interrupted; complete shards stay for a rerun."""


@dataclass(frozen=True)
class ShardPlan:
    """Which candidate images go into which shard."""

    split: str
    names: tuple[str, ...]
    members: tuple[tuple[int, ...], ...]  # per shard, indices into the listing's files


def plan_shards(listing: Listing, split: str = "train", num_shards: int | None = None,
                images_per_shard: int | None = None) -> ShardPlan:
    """Slim's shards: the files shuffled with Slim's seed, cut into ``num_shards`` near-equal ranges
    (default: one shard per ``images_per_shard``, :data:`IMAGES_PER_SHARD` unless given)."""
    n = len(listing.files)
    if num_shards is None:
        num_shards = max(1, math.ceil(n / (images_per_shard or IMAGES_PER_SHARD)))
    num_shards = max(1, min(num_shards, n))
    order = list(range(n))
    random.Random(SLIM_SHUFFLE_SEED).shuffle(order)
    bounds = [round(i * n / num_shards) for i in range(num_shards + 1)]
    names = tuple(f"{split}-{s:05d}-of-{num_shards:05d}" for s in range(num_shards))
    return ShardPlan(split, names, tuple(tuple(order[bounds[s]:bounds[s + 1]]) for s in range(num_shards)))


def _fingerprint(listing: Listing, members, level: str) -> str:
    """What a shard's content depends on: its sources (name, size, time, label) and the check."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{_VERSION}|{level}|{listing.numbering}|".encode())
    for i in members:
        path = os.path.join(listing.root, listing.files[i])
        try:
            st = os.stat(path)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "-"
        h.update(f"{listing.files[i]}|{stamp}|{listing.labels[i]}\n".encode())
    return h.hexdigest()


def _note_path(out: str, name: str) -> str:
    return os.path.join(out, STATE, name + ".json")


def _reusable(out: str, name: str, fingerprint: str) -> dict | None:
    """The note of a complete shard that a rerun can keep as it is, or None."""
    try:
        with open(_note_path(out, name)) as f:
            note = json.load(f)
        if note["fingerprint"] == fingerprint and os.path.getsize(os.path.join(out, name)) == note["bytes"]:
            return note
    except (OSError, ValueError, KeyError):
        pass
    return None


_done = None  # per worker: the shared counters of files done and bytes read


def _init_worker(done, nbytes) -> None:
    global _done
    _done = (done, nbytes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles an interrupt
    die_with_launcher()  # a killed conversion leaves no worker writing behind it


def _count(nbytes: int) -> None:
    if _done is not None:
        with _done[0].get_lock():
            _done[0].value += 1
            _done[1].value += nbytes


def write_shard(job: tuple) -> dict:
    """Write one shard (``job``: out, name, fingerprint, level and its ``(path, rel, label,
    synset)`` sources); returns its note: records, bytes, image bytes and the verdicts."""
    out, name, fingerprint, level, sources = job
    partial = os.path.join(out, f".{name}.partial")
    verdicts, records, image_bytes = [], 0, 0
    with open(partial, "wb") as f:
        for path, rel, label, synset in sources:
            v, data = read_image(path, level)
            _count(len(data))
            verdicts.append([rel, v.reason, v.detail])
            if not v.included:
                continue
            f.write(framed(slim_example(data, label, v.height, v.width, rel, synset, v.format)))
            records, image_bytes = records + 1, image_bytes + len(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, os.path.join(out, name))
    note = {"fingerprint": fingerprint, "records": records, "bytes": os.path.getsize(os.path.join(out, name)),
            "image_bytes": image_bytes, "verdicts": [x for x in verdicts if x[1] is not None]}
    write_json_atomic(_note_path(out, name), note)
    return note


def _clear_stale(out: str, plan: ShardPlan) -> None:
    """Remove the manifest and this split's shards that the plan does not name (an older plan's)."""
    if os.path.exists(os.path.join(out, MANIFEST)):
        os.remove(os.path.join(out, MANIFEST))  # an incomplete rewrite must not look complete
    pattern, keep = re.compile(rf"^\.?{re.escape(plan.split)}-\d{{5}}-of-\d{{5}}(\.partial)?$"), set(plan.names)
    for f in os.listdir(out):
        if pattern.match(f) and f not in keep:
            os.remove(os.path.join(out, f))


def _jobs(listing: Listing, plan: ShardPlan, out: str, level: str):
    """Per shard: its reusable note, or the job that writes it."""
    first = 1 if listing.numbering == "slim" else 0
    for name, members in zip(plan.names, plan.members):
        fingerprint = _fingerprint(listing, members, level)
        note = _reusable(out, name, fingerprint)
        if note is not None:
            yield name, note, None
            continue
        sources = [(os.path.join(listing.root, listing.files[i]), listing.files[i], listing.labels[i],
                    listing.classes[listing.labels[i] - first]) for i in members]
        yield name, None, (out, name, fingerprint, level, sources)


def write_shards_of(listing: Listing, out: str, plan: ShardPlan, workers: int = 1, level: str = "decode",
                    progress=None) -> tuple[dict[str, dict], int]:
    """Every shard of ``plan`` written (or reused) under ``out``; returns each shard's note by name
    and how many were reused. ``progress``: a :class:`enspipe.common.progress.Progress`, or None."""
    os.makedirs(os.path.join(out, STATE), exist_ok=True)
    if progress is not None:
        progress.total = max(1, len(listing.files))
    _clear_stale(out, plan)
    notes, todo = {}, []
    for name, note, job in _jobs(listing, plan, out, level):
        if note is not None:
            notes[name] = note
        else:
            todo.append(job)
    reused = len(notes)
    already = sum(len(m) for name, m in zip(plan.names, plan.members) if name in notes)
    try:
        if todo:
            _run_jobs(todo, notes, workers, already, progress)
    except KeyboardInterrupt:
        complete = sum(os.path.exists(_note_path(out, n)) for n in plan.names)
        raise Interrupted(f"interrupted: {complete} of {len(plan.names)} shards complete in {out}, and no manifest; "
                          "rerun the same command to resume") from None
    finally:
        if progress is not None:
            progress.close()
    return notes, reused


def _run_jobs(todo: list, notes: dict, workers: int, already: int, progress) -> None:
    """Write the shards of ``todo`` on ``workers`` processes, at most two shards each in flight
    (memory stays bounded however many shards there are), their notes into ``notes``."""
    ctx = multiprocessing.get_context("spawn")
    done, nbytes = ctx.Value("q", 0), ctx.Value("q", 0)
    workers = max(1, min(workers, len(todo)))
    queue, flight = list(reversed(todo)), []
    with ctx.Pool(workers, initializer=_init_worker, initargs=(done, nbytes)) as pool:
        while queue or flight:
            while queue and len(flight) < 2 * workers:
                job = queue.pop()
                flight.append((job[1], pool.apply_async(write_shard, (job,))))
            time.sleep(0.1)
            for name, result in [x for x in flight if x[1].ready()]:
                try:
                    notes[name] = result.get()
                except OSError as e:  # the output's disk full or unwritable: no traceback, the shard named
                    raise DataError(f"{name}: could not be written ({e}); complete shards stay for a rerun") from None
                flight.remove((name, result))
            if progress is not None:
                progress.update(already + done.value, nbytes.value)


def accounting_of(listing: Listing, notes: dict[str, dict]) -> Accounting:
    """The folder's accounting from what the listing left out and the shards' verdicts."""
    acc = Accounting()
    for rel, v in listing.left_out:
        acc.add(rel, v)
    for note in notes.values():
        acc.included += note["records"]
        for rel, reason, detail in note["verdicts"]:
            acc.add(rel, Verdict(reason, detail))
    return acc


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
