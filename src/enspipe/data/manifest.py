"""A dataset's manifest, readable and checkable without TensorFlow, so a bad ``--data`` (or
``dataset.path``) is refused before any MPI or TensorFlow work.

``manifest.json`` records what a dataset directory holds: its kind (TF-Slim ``tfrecord`` shards or
``jpeg_folders``), the number of images and classes, the order-independent ``digest`` of all
sample keys, and per shard its path, number of records and size in bytes. :func:`check` compares
it with the directory: every shard present, of the recorded size (an emptied or rewritten shard
is caught here), the shards' records adding up to ``num_images``. Without a manifest the directory
must hold JPEG class folders or files that begin like a TFRecord (a record header whose CRC checks
out). The digest itself is checked against the shards' keys at load
(:func:`enspipe.data.shards.verify_digest`, which needs TensorFlow's hash).
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

MANIFEST = "manifest.json"
DIGEST_ALGORITHM = "sum mod 2^64 of FarmHash64(key) mod (2^63-1)"
JPEG_EXTENSIONS = (".jpg", ".jpeg", ".JPG", ".JPEG")


class DataError(RuntimeError):
    """A dataset problem (missing, corrupt record, undecodable image); the message names the place."""


@dataclass(frozen=True)
class Manifest:
    """What a dataset directory holds. ``kind`` is ``tfrecord`` or ``jpeg_folders``."""

    root: str
    kind: str
    num_images: int
    num_classes: int
    digest: str
    files: tuple[str, ...]          # shard paths (tfrecord) or image paths (jpeg_folders), relative
    labels: tuple[int, ...] = ()    # per image, jpeg_folders only
    synthetic: bool = False
    info: dict | None = None
    counts: tuple[int | None, ...] = ()  # records per shard, where known
    sizes: tuple[int | None, ...] = ()   # bytes per shard, where known
    classes: tuple[str, ...] = ()        # class names in label order, where known
    numbering: str = ""                  # how labels are numbered (enspipe.data.folders.NUMBERINGS), where known
    accounting: dict | None = None       # the source folder's files: included, skipped and ignored by reason

    def paths(self) -> list[str]:
        return [os.path.join(self.root, f) for f in self.files]


def manifest_dict(m: Manifest) -> dict:
    d = {"kind": m.kind, "num_images": m.num_images, "num_classes": m.num_classes, "digest": m.digest,
         "synthetic": m.synthetic, "digest_algorithm": DIGEST_ALGORITHM}
    if m.kind == "tfrecord":
        counts = m.counts or (None,) * len(m.files)
        sizes = m.sizes or (None,) * len(m.files)
        d["shards"] = [{"path": f, "num_records": c, "bytes": b} for f, c, b in zip(m.files, counts, sizes)]
    else:
        d["files"], d["labels"] = list(m.files), list(m.labels)
    if m.info:
        d["info"] = m.info
    if m.classes:
        d["classes"] = list(m.classes)
    if m.numbering:
        d["numbering"] = m.numbering
    if m.accounting is not None:
        d["accounting"] = m.accounting
    return d


def accounting_note(m: Manifest) -> str | None:
    """One line on the files of the dataset's source folder that were left out (None where none
    was): the counts by reason, and where they are listed or how to list them."""
    acc = m.accounting or {}
    skipped, ignored = acc.get("skipped") or {}, acc.get("ignored") or {}
    if not skipped and not ignored:
        return None
    said = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in {**skipped, **ignored}.items())
    where = (f"listed in {os.path.join(m.root, acc['list'])}" if acc.get("list")
             else f"`enspipe index --data {m.root}` lists them in skipped.csv")
    return (f"{m.root}: {acc.get('included', m.num_images)} images included, {sum(skipped.values())} files skipped "
            f"and {sum(ignored.values())} ignored ({said}); {where}")


def read_manifest(root: str) -> Manifest:
    """``root/manifest.json`` as a :class:`Manifest` (raises :class:`DataError` when malformed)."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path) as f:
            m = json.load(f)
        shards = m["shards"] if m["kind"] == "tfrecord" else []
        return Manifest(root=root, kind=m["kind"], num_images=int(m["num_images"]),
                        num_classes=int(m["num_classes"]), digest=m["digest"],
                        files=tuple(s["path"] for s in shards) if m["kind"] == "tfrecord" else tuple(m["files"]),
                        labels=tuple(m.get("labels", ())), synthetic=bool(m.get("synthetic", False)),
                        info=m.get("info"), counts=tuple(s.get("num_records") for s in shards),
                        sizes=tuple(s.get("bytes") for s in shards), classes=tuple(m.get("classes", ())),
                        numbering=m.get("numbering", ""), accounting=m.get("accounting"))
    except (KeyError, ValueError, TypeError) as e:
        raise DataError(f"{path}: malformed manifest ({e!r}); delete it to rescan, or regenerate the dataset") from None


def check(root: str) -> str | None:
    """What is wrong with the dataset directory ``root`` (None: nothing this check can see)."""
    if not os.path.isdir(root):
        return f"{root!r} is not a directory"
    if os.path.exists(os.path.join(root, MANIFEST)):
        try:
            m = read_manifest(root)
        except DataError as e:
            return str(e)
        return _check_against(m)
    if image_folders(root):
        return None
    files = candidate_shards(root)
    if not files:
        return f"{root!r} holds no TFRecord shards and no JPEG class folders"
    bad = [f for f in files if not looks_like_tfrecord(f)]
    if bad:
        return f"{bad[0]!r} is not a TFRecord file (its first record header does not check out)"
    return None


def _check_against(m: Manifest) -> str | None:
    fix = "re-create the dataset, or re-index it with `enspipe index --data DIR` if the change is intended"
    if m.num_images < 1:
        return f"{m.root}/{MANIFEST} promises {m.num_images} images"
    if m.kind == "jpeg_folders":
        return None
    for path, count, size in zip(m.paths(), m.counts or (None,) * len(m.files), m.sizes or (None,) * len(m.files)):
        if not os.path.isfile(path):
            return f"shard {path} of the manifest is missing; {fix}"
        actual = os.path.getsize(path)
        if size is not None and actual != size:
            return f"shard {path} has {actual} bytes, the manifest says {size}; {fix}"
        if count is not None and count > 0 and actual == 0:
            return f"shard {path} is empty, the manifest says {count} records; {fix}"
    if m.counts and all(c is not None for c in m.counts) and sum(m.counts) != m.num_images:
        return (f"{m.root}/{MANIFEST} promises {m.num_images} images but its shards hold {sum(m.counts)} records; "
                f"{fix}")
    return None


def image_folders(root: str, looked_at: int = 8) -> bool:
    """Whether ``root`` holds a folder of images (its first few files' content tells)."""
    from enspipe.data.images import HEAD, hidden, sniff

    for d in sorted(os.listdir(root)):
        here = os.path.join(root, d)
        if hidden(d) or not os.path.isdir(here):
            continue
        for name in sorted(os.listdir(here))[:looked_at]:
            path = os.path.join(here, name)
            if os.path.isdir(path):
                return True  # class folders with subfolders of their own
            try:
                with open(path, "rb") as f:
                    if sniff(f.read(HEAD)):
                        return True
            except OSError:
                continue
    return False


def candidate_shards(root: str) -> list[str]:
    """Files of ``root`` that may be TFRecord shards (not the manifest, temporaries or JPEGs)."""
    return sorted(p for p in (os.path.join(root, f) for f in os.listdir(root))
                  if os.path.isfile(p) and not p.endswith((".json", ".tmp", ".csv", ".partial")) and ".tmp." not in p
                  and not os.path.basename(p).startswith(".")
                  and not p.endswith(JPEG_EXTENSIONS))


def looks_like_tfrecord(path: str) -> bool:
    """Whether the file is empty or begins with a TFRecord header: a little-endian uint64 length
    and the masked CRC-32C of those 8 bytes."""
    with open(path, "rb") as f:
        head = f.read(12)
    if not head:
        return True
    if len(head) < 12:
        return False
    return struct.unpack("<I", head[8:12])[0] == masked_crc32c(head[:8])


def crc32c(data) -> int:
    """CRC-32C (Castagnoli) of ``data``, in C (google-crc32c): a record's payload is ~100 KB."""
    import google_crc32c

    return google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data)


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
