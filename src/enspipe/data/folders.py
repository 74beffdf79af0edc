"""Image folders as users have them, every file accounted for. Needs no TensorFlow.

Two layouts:

- **class folders** (ImageNet's training set, torchvision's ``ImageFolder``): one folder per class
  under the root, images anywhere below it. The class is the top folder's name.
- **a flat folder and a labels file** (ImageNet's validation set as distributed): the images in one
  folder; ``labels`` names each one's class: Kaggle's ``LOC_val_solution.csv`` (``ImageId,
  PredictionString``, the class the string's first word), lines of ``file class``, or one class a
  line for the files in sorted order (TF-Slim's ``imagenet_2012_validation_synset_labels.txt``).

Labels are numbered by the classes in order: the sorted class names, or a ``synsets`` list
(``LOC_synset_mapping.txt``: a class a line, its first word; so a training and a validation set
get the same numbers). ``numbering``: ``folders`` numbers them 0..K-1 (``num_classes`` K);
``slim`` numbers them 1..K with 0 for TF-Slim's background class (``num_classes`` K+1). A model
built with ``num_classes`` outputs fits either.

Every file under the root is included or left out with a reason (:mod:`enspipe.data.images`):
:class:`Accounting` counts them, ``skipped.csv`` lists each one left out.
"""
from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass, field

from enspipe.common.atomic import write_csv_atomic
from enspipe.data.images import NON_IMAGE_SUFFIXES, Verdict, hidden, judge_file
from enspipe.data.manifest import DataError, counts_text

NUMBERINGS = {"folders": "0..K-1 in class order; num_classes K",
              "slim": "1..K in class order, 0 for TF-Slim's background class; num_classes K+1"}
SKIPPED_CSV = "skipped.csv"
SHOWN = 3  # left-out files named in a one-line message


@dataclass(frozen=True)
class Listing:
    """A folder's candidate images (``rel`` paths, sorted, with their labels) and what was left
    out before any file was read (hidden files, non-images at the top)."""

    root: str
    files: tuple[str, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]
    numbering: str
    left_out: tuple[tuple[str, Verdict], ...] = ()

    @property
    def num_classes(self) -> int:
        return len(self.classes) + (self.numbering == "slim")


@dataclass
class Accounting:
    """What became of every file of a folder: included, skipped (a reason each) or ignored."""

    included: int = 0
    rows: list[tuple[str, Verdict]] = field(default_factory=list)  # the files left out, each with its verdict

    def add(self, rel: str, v: Verdict) -> None:
        if v.included:
            self.included += 1
        else:
            self.rows.append((rel, v))

    def counts(self, ignored: bool) -> dict[str, int]:
        return dict(sorted(Counter(v.reason for _, v in self.rows if v.ignored == ignored).items()))

    def as_dict(self, listed: str | None) -> dict:
        """The manifest's ``accounting``: the counts, and where the list of files is."""
        return {"included": self.included, "skipped": self.counts(False), "ignored": self.counts(True),
                "list": listed}

    def skipped_names(self) -> list[str]:
        return [f"{rel} ({v.reason}{': ' + v.detail if v.detail else ''})" for rel, v in self.rows if not v.ignored]

    def line(self) -> str:
        """One line: how many were included, skipped and ignored (by reason), and the first skipped."""
        first = self.skipped_names()[:SHOWN]
        return counts_text(self.as_dict(None)) + (f"; first skipped: {', '.join(first)}" if first else "")

    def strict_problem(self, listed: str | None) -> str | None:
        """Under ``--strict``: the skipped files as one message (None where none was skipped)."""
        names = self.skipped_names()
        if not names:
            return None
        more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
        where = f"; every one is listed in {listed}" if listed else ""
        return (f"{len(names)} files skipped under --strict: {', '.join(names[:SHOWN])}{more}{where}; fix or remove "
                "them, or leave --strict out to skip them")

    def write_csv(self, path: str) -> None:
        rows = [{"path": rel, "verdict": "ignored" if v.ignored else "skipped", "reason": v.reason,
                 "detail": v.detail} for rel, v in sorted(self.rows)]
        write_csv_atomic(path, rows, ("path", "verdict", "reason", "detail"))


def _walk(root: str, top: str) -> tuple[list[str], list[tuple[str, Verdict]]]:
    """The files under ``root/top`` (relative to ``root``, sorted) and the hidden ones left out."""
    found, hid = [], []
    for here, dirs, files in os.walk(os.path.join(root, top), followlinks=True):
        rel = os.path.relpath(here, root)
        for d in sorted(dirs):
            if hidden(d):
                hid.append((f"{rel}/{d}/", Verdict("hidden", "a folder")))
        dirs[:] = sorted(d for d in dirs if not hidden(d))
        for name in sorted(files):
            if hidden(name):
                hid.append((f"{rel}/{name}", Verdict("hidden")))
            else:
                found.append(f"{rel}/{name}")
    return sorted(found), hid


def _read_synsets(path: str) -> list[str]:
    """A synset list's classes in order: each line's first word (``LOC_synset_mapping.txt``)."""
    try:
        with open(path, encoding="utf-8") as f:
            classes = [line.split()[0] for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the synset list ({e})") from None
    dup = [c for c, n in Counter(classes).items() if n > 1]
    if not classes or dup:
        raise DataError(f"{path}: " + (f"names {dup[0]} twice" if dup else "is empty")
                        + "; a synset list is one class a line, its first word the class")
    return classes


def _numbered(classes: list[str], synsets: str | None, numbering: str, where: str) -> list[str]:
    """The classes in numbering order: the synset list's (every class in it), or sorted."""
    if numbering not in NUMBERINGS:
        raise DataError(f"numbering {numbering!r}: choose one of {', '.join(NUMBERINGS)}")
    if synsets is None:
        return sorted(set(classes))
    order = _read_synsets(synsets)
    unknown = sorted(set(classes) - set(order))
    if unknown:
        raise DataError(f"{where} has classes the synset list {synsets} does not name: {', '.join(unknown[:SHOWN])}"
                        f"{' and more' if len(unknown) > SHOWN else ''}; pass the list these classes come from")
    return order


def list_class_folders(root: str, synsets: str | None = None, numbering: str = "folders") -> Listing:
    """A class-folder tree's candidate images; raises :class:`DataError` for a tree that is none."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory")
    entries = sorted(os.listdir(root))
    class_dirs = [d for d in entries if os.path.isdir(os.path.join(root, d)) and not hidden(d)]
    top_files = [e for e in entries if e not in class_dirs]
    if not class_dirs:
        raise DataError(f"{root}: not a folder of class folders ({len(top_files)} files and no subfolder); put each "
                        "class's images in a folder of its own, or for one flat folder (ImageNet's validation set) "
                        "pass its labels file (--labels)")
    left_out = [(f"{e}/" if os.path.isdir(os.path.join(root, e)) else e,
                 Verdict("hidden") if hidden(e) else _top_file(root, e)) for e in top_files]
    files, labels = [], []
    classes = _numbered(class_dirs, synsets, numbering, root)
    first = 1 if numbering == "slim" else 0
    for cls in class_dirs:
        found, hid = _walk(root, cls)
        left_out += hid
        if not found:
            raise DataError(f"{os.path.join(root, cls)}: a class folder with no files; remove it, or put its images "
                            "in it")
        files += found
        labels += [classes.index(cls) + first] * len(found)
    return Listing(root, tuple(files), tuple(labels), tuple(classes), numbering, tuple(left_out))


def _top_file(root: str, name: str) -> Verdict:
    """A file at the top of a class-folder tree: an image there is in no class (skipped)."""
    v = judge_file(os.path.join(root, name), "header")
    return Verdict("outside_class_folder", "move it into its class's folder") if v.included else v


def _read_labels(path: str) -> list[list[str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read the labels file ({e})") from None
    lines = text.splitlines()
    rows = csv.reader(lines) if lines and "," in lines[0] else (line.split() for line in lines)  # or any whitespace
    return [[c.strip() for c in r if c.strip()] for r in rows if any(c.strip() for c in r)]


def _labels_by_file(path: str, files: list[str]) -> dict[str, str]:
    """Each file's class from the labels file ``path`` (see the module's docstring)."""
    rows = _read_labels(path)
    if rows and rows[0][:2] == ["ImageId", "PredictionString"]:
        rows = [[r[0], r[1].split()[0]] for r in rows[1:] if len(r) > 1]
    if rows and all(len(r) == 1 for r in rows):
        if len(rows) != len(files):
            raise DataError(f"{path}: {len(rows)} classes for the {len(files)} files of the folder; a list of one "
                            "class a line names every file's, in sorted order")
        rows = [[f, r[0]] for f, r in zip(files, rows)]
    if not rows or any(len(r) < 2 for r in rows):
        raise DataError(f"{path}: not a labels file (LOC_val_solution.csv, lines of `file class`, or one class a line)")
    if all(r[1].isdigit() for r in rows):
        raise DataError(f"{path}: numeric labels (the devkit's ILSVRC2012_ID numbers follow its meta.mat, not the "
                        "synsets' order); pass LOC_val_solution.csv or TF-Slim's "
                        "imagenet_2012_validation_synset_labels.txt, which name each file's synset")
    by_name = {f: f for f in files} | {os.path.splitext(f)[0]: f for f in files}
    unknown = [r[0] for r in rows if r[0] not in by_name]
    if unknown:
        raise DataError(f"{path} names files that are not in the folder: {', '.join(unknown[:SHOWN])}"
                        f"{f' and {len(unknown) - SHOWN} more' if len(unknown) > SHOWN else ''}; pass the folder "
                        "this labels file describes")
    out = {by_name[r[0]]: r[1] for r in rows}
    missing = [f for f in files if f not in out]
    if missing:
        raise DataError(f"{len(missing)} files of the folder have no line in {path}: {', '.join(missing[:SHOWN])}; "
                        "pass the whole labels file, or move those files out")
    return out


def list_labelled_folder(root: str, labels: str, synsets: str | None = None, numbering: str = "folders") -> Listing:
    """A flat folder of images and its labels file (ImageNet's validation set as distributed)."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a directory")
    entries = sorted(os.listdir(root))
    left_out = [(e, Verdict("hidden")) for e in entries if hidden(e)]
    subdirs = [e for e in entries if not hidden(e) and os.path.isdir(os.path.join(root, e))]
    left_out += [(f"{d}/", Verdict("non_image", "a folder in a flat labelled folder")) for d in subdirs]
    candidates = [e for e in entries if not hidden(e) and e not in subdirs]
    known = [e for e in candidates if e.lower().endswith(NON_IMAGE_SUFFIXES)]
    left_out += [(e, Verdict("non_image", os.path.splitext(e)[1])) for e in known]
    files = [e for e in candidates if e not in known]
    if not files:
        raise DataError(f"{root}: no files to label")
    by_file = _labels_by_file(labels, files)
    classes = _numbered(list(by_file.values()), synsets, numbering, labels)
    index = {c: i + (1 if numbering == "slim" else 0) for i, c in enumerate(classes)}
    return Listing(root, tuple(files), tuple(index[by_file[f]] for f in files), tuple(classes), numbering,
                   tuple(left_out))


def list_folder(root: str, labels: str | None = None, synsets: str | None = None,
                numbering: str = "folders") -> Listing:
    """The candidate images of a class-folder tree, or of a flat folder with its ``labels``."""
    if labels is not None:
        return list_labelled_folder(root, labels, synsets, numbering)
    return list_class_folders(root, synsets, numbering)


def _judge(job: tuple[str, str, str]) -> Verdict:
    root, rel, level = job
    return judge_file(os.path.join(root, rel), level)


def judge_listing(listing: Listing, level: str, workers: int = 1, chunksize: int = 32):
    """``(rel, label, verdict)`` for every candidate, in order (``workers`` processes read them)."""
    jobs = [(listing.root, rel, level) for rel in listing.files]
    if workers <= 1 or len(jobs) < 4 * chunksize:
        verdicts = map(_judge, jobs)
        yield from zip(listing.files, listing.labels, verdicts)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from zip(listing.files, listing.labels, pool.map(_judge, jobs, chunksize=chunksize))


def accounted(listing: Listing, level: str = "header", workers: int = 1):
    """The included ``files`` and ``labels`` of a listing and its :class:`Accounting`; raises
    :class:`DataError` for a class (or the folder) left with no image."""
    acc, files, labels = Accounting(), [], []
    for rel, v in listing.left_out:
        acc.add(rel, v)
    for rel, label, v in judge_listing(listing, level, workers):
        acc.add(rel, v)
        if v.included:
            files.append(rel)
            labels.append(label)
    empty_problem(listing, labels, acc)
    return files, labels, acc


def empty_problem(listing: Listing, labels: list[int], acc: Accounting) -> None:
    """Raise :class:`DataError` where no image, or no image of a class folder, was included."""
    if not labels:
        raise DataError(f"{listing.root}: no image could be included; {acc.line()}")
    if len(set(listing.labels)) > len(set(labels)):  # a class all of whose files were left out
        first = 1 if listing.numbering == "slim" else 0
        lost = sorted(set(listing.labels) - set(labels))
        names = [listing.classes[i - first] for i in lost]
        raise DataError(f"{listing.root}: class {names[0]} has no image that could be included"
                        f"{f' (and {len(names) - 1} more classes)' if len(names) > 1 else ''}; {acc.line()}")


__all__ = ["SKIPPED_CSV", "NUMBERINGS", "Accounting", "Listing", "list_folder", "accounted"]
