"""TFRecord records without TensorFlow: writing shards, reading them (by offset, or a shard from its start), Slim's
``tf.train.Example`` parsed by protobuf, and a dataset's first samples in the stream's canonical
order. Checking ``--data`` before MPI starts needs only this module, so a bad option is refused
in a fraction of a second, not after TensorFlow's few seconds of import.

A TFRecord is ``length (uint64) | masked CRC32C of length | payload | masked CRC32C of payload``,
little-endian. ``tf.train.Example``'s message classes are built here from their ``.proto``
definition (``tensorflow/core/example/{example,feature}.proto``) in a pool of their own; the bytes
they read and write are TensorFlow's own.
"""
from __future__ import annotations

import functools
import math
import os
import shutil
import struct
from collections.abc import Iterator

from enspipe.common.atomic import write_json_atomic
from enspipe.data.keys import add_digests, digest_of, sample_ids
from enspipe.data.manifest import MANIFEST, DataError, Manifest, manifest_dict, masked_crc32c

CORRUPT_LABEL = -2  # the label of a placeholder for a record that could not be read (skip mode)
CYCLE = 4  # shards the stream interleaves at a time (block length 1): the canonical order's cycle


@functools.cache
def example_class():
    """``Example``'s message class, built from its proto definition (proto3, package tensorflow)
    on first use: protobuf is imported only where a record is parsed or made this way."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="enspipe/example.proto", package="tensorflow", syntax="proto3")

    def message(name, *fields, nested=(), map_entry=False, oneof=None):
        m = f.message_type.add(name=name) if not nested else nested[0].nested_type.add(name=name)
        if map_entry:
            m.options.map_entry = True
        if oneof:
            m.oneof_decl.add(name=oneof)
        for number, (fname, ftype, label, type_name) in enumerate(fields, 1):
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name
            if oneof:
                fd.oneof_index = 0
        return m

    repeated, optional = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", ("value", F.TYPE_BYTES, repeated, None))
    message("FloatList", ("value", F.TYPE_FLOAT, repeated, None))
    message("Int64List", ("value", F.TYPE_INT64, repeated, None))
    message("Feature", ("bytes_list", F.TYPE_MESSAGE, optional, ".tensorflow.BytesList"),
            ("float_list", F.TYPE_MESSAGE, optional, ".tensorflow.FloatList"),
            ("int64_list", F.TYPE_MESSAGE, optional, ".tensorflow.Int64List"), oneof="kind")
    features = message("Features", ("feature", F.TYPE_MESSAGE, repeated, ".tensorflow.Features.FeatureEntry"))
    message("FeatureEntry", ("key", F.TYPE_STRING, optional, None),
            ("value", F.TYPE_MESSAGE, optional, ".tensorflow.Feature"), nested=(features,), map_entry=True)
    message("Example", ("features", F.TYPE_MESSAGE, optional, ".tensorflow.Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.Example"))


def example_features(payload: bytes, key: bytes = b"?"):
    """A serialized ``tf.train.Example``'s feature map; raises :class:`DataError` naming ``key``."""
    try:
        return example_class().FromString(payload).features.feature
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, whichever implementation
        raise DataError(f"{key.decode()}: not a tf.train.Example ({e})") from None


def make_example(features: dict[str, bytes | int]) -> bytes:
    """A serialized ``tf.train.Example`` of one bytes or int64 value per feature."""
    ex = example_class()()
    for name, value in features.items():
        f = ex.features.feature[name]
        (f.int64_list if isinstance(value, int) else f.bytes_list).value.append(value)
    return ex.SerializeToString()


def slim_example(encoded: bytes, label: int, height: int, width: int, filename: str, synset: str,
                 image_format: str = "JPEG") -> bytes:
    """A ``tf.train.Example`` with TF-Slim's ImageNet feature keys (``image/format`` the image's
    own: Slim's reader decodes PNG as well as JPEG)."""
    return make_example({
        "image/encoded": encoded, "image/format": image_format.encode(), "image/class/label": label,
        "image/class/synset": synset.encode(), "image/class/text": synset.encode(), "image/height": height,
        "image/width": width, "image/colorspace": b"RGB", "image/channels": 3, "image/filename": filename.encode()})


def framed(payload: bytes) -> bytes:
    """One TFRecord: ``payload`` with its length and their masked CRCs, as TFRecordWriter writes it."""
    length = struct.pack("<Q", len(payload))
    return (length + struct.pack("<I", masked_crc32c(length)) + payload
            + struct.pack("<I", masked_crc32c(payload)))


def parse_slim(payload: bytes, key: bytes = b"?") -> tuple[bytes, int]:
    """A serialized Slim ``tf.train.Example``'s encoded image and label, as ``tf.io.parse_example``
    with Slim's features reads them (the label is -1 where it is absent), parsed by protobuf in
    this thread: TensorFlow's op costs ~50 us per record plus ~1 ms per call, in the read stage of
    every member."""
    features = example_features(payload, key)
    encoded = features["image/encoded"].bytes_list.value if "image/encoded" in features else ()
    if len(encoded) != 1:
        raise DataError(f"{key.decode()}: the record has {len(encoded)} image/encoded values, not 1")
    labels = features["image/class/label"].int64_list.value if "image/class/label" in features else ()
    return encoded[0], int(labels[0]) if len(labels) else -1


def placeholder() -> bytes:
    """A Slim example with no image, standing in for an unreadable record in skip mode: it keeps
    the record's place and key in the stream, and its decode fails, so the preprocess stage skips
    and counts it like an undecodable image."""
    return make_example({"image/encoded": b"", "image/class/label": CORRUPT_LABEL})


def record_format(m: Manifest) -> str | None:
    """The format ``enspipe index --parse`` recorded for the dataset's records (None: Slim's)."""
    return (m.info or {}).get("parse")


def indexed(m: Manifest) -> bool:
    """Whether the stream draws its order over ``(shard, record)`` numbers and members read only
    their own records (TFRecords whose manifest counts every shard's records)."""
    return m.kind == "tfrecord" and bool(m.counts) and all(c is not None for c in m.counts)


def header_length(head: bytes) -> int | None:
    """A record's payload length from its 12-byte header, or None where the header is cut short
    or its CRC does not check out (the shard cannot be followed past it)."""
    if len(head) < 12 or struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
        return None
    return struct.unpack("<Q", head[:8])[0]


def checked_payload(raw: bytes, length: int) -> bytes | None:
    """The payload of ``raw`` (a record's ``length`` payload bytes and its 4-byte CRC), or None
    where it is cut short or does not match its CRC."""
    if len(raw) < length + 4 or struct.unpack("<I", raw[length:length + 4])[0] != masked_crc32c(raw[:length]):
        return None
    return raw[:length]


def shard_records(path: str) -> Iterator[bytes]:
    """A shard's payloads from its start; raises :class:`DataError` naming the first record that
    cannot be read."""
    with open(path, "rb") as f:
        for i in range(2**62):
            head = f.read(12)
            if not head:
                return
            length = header_length(head)
            payload = None if length is None else checked_payload(f.read(length + 4), length)
            if payload is None:
                raise DataError(f"{path}: corrupt TFRecord at record {i}")
            yield payload


def _interleaved(sources: list[Iterator], cycle: int) -> Iterator:
    """tf.data's ``interleave(cycle_length=cycle, block_length=1)`` of ``sources``: one element from
    each of ``cycle`` open sources in turn, an exhausted one replaced in its slot by the next source."""
    pending, slots = iter(sources), []
    for _ in range(cycle):
        slots.append(next(pending, None))
    while any(s is not None for s in slots):
        for i, s in enumerate(slots):
            while s is not None:
                x = next(s, StopIteration)
                if x is not StopIteration:
                    yield x
                    break
                s = slots[i] = next(pending, None)


def first_samples(m: Manifest, k: int = 2) -> list[tuple[bytes, bytes]]:
    """The dataset's first ``k`` samples in the stream's canonical order (unshuffled: the shards
    interleaved :data:`CYCLE` at a time, as :func:`enspipe.data.shards.sample_stream` draws them),
    each ``(key, payload)``: a serialized record, or a JPEG folder's file."""
    k = max(1, min(k, m.num_images))
    if m.kind == "jpeg_folders":
        out = []
        for rel, path in zip(m.files[:k], m.paths()[:k]):
            with open(path, "rb") as f:
                out.append((rel.encode(), f.read()))
        return out

    def keyed(path):
        name = os.path.basename(path)
        return ((f"{name}:{i}".encode(), payload) for i, payload in enumerate(shard_records(path)))

    stream = _interleaved([keyed(p) for p in m.paths()], min(CYCLE, len(m.files)))
    return [x for _, x in zip(range(k), stream)]


def write_shards(out: str, samples, num_images: int, num_classes: int, images_per_shard: int,
                 info: dict, synthetic: bool) -> Manifest:
    """Write ``(jpeg, label, height, width, filename, synset)`` samples as Slim TFRecord shards
    ``train-XXXXX-of-YYYYY`` and, last and atomically, ``manifest.json``."""

    num_shards = max(1, math.ceil(num_images / images_per_shard))
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, MANIFEST)):
        os.remove(os.path.join(out, MANIFEST))  # an incomplete rewrite must not look complete
    tmp = os.path.join(out, ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    names, counts, digest, total_bytes, it = [], [], digest_of([]), 0, iter(samples)
    for s in range(num_shards):
        name = f"train-{s:05d}-of-{num_shards:05d}"
        n = min(images_per_shard, num_images - s * images_per_shard)
        with open(os.path.join(tmp, name), "wb") as f:
            for _ in range(n):
                encoded, label, h, w, filename, synset = next(it)
                f.write(framed(slim_example(encoded, label, h, w, filename, synset)))
                total_bytes += len(encoded)
        names.append(name)
        counts.append(n)
        digest = add_digests(digest, digest_of(sample_ids([f"{name}:{i}" for i in range(n)])))
    for name in names:
        os.replace(os.path.join(tmp, name), os.path.join(out, name))
    os.rmdir(tmp)
    info = dict(info, mean_jpeg_bytes=round(total_bytes / max(1, num_images)))
    m = Manifest(out, "tfrecord", num_images, num_classes, digest, tuple(names), synthetic=synthetic, info=info,
                 counts=tuple(counts), sizes=tuple(os.path.getsize(os.path.join(out, n)) for n in names))
    write_json_atomic(os.path.join(out, MANIFEST), manifest_dict(m))
    return m
