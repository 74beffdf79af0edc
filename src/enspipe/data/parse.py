"""How a TFRecord's payload becomes ``(encoded image, label)``: Slim's ImageNet records (the
default), TensorFlow Datasets' image-classification records (``tfds``: features ``image`` and
``label``), or a user's ``package.module:function`` (or a callable) taking the record's bytes and
returning ``(image bytes, int label)``. The image may be JPEG, PNG, GIF or BMP.

A dataset of a user's format is indexed once with ``enspipe index --data DIR --parse NAME``, which
counts its records and labels with the function and records its name in the manifest, so every
member reads it the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from enspipe.common.plugins import NotLoadable, load_function
from enspipe.data.manifest import DataError, Manifest
from enspipe.data.records import example_features, first_samples, parse_slim, record_format

SLIM = "slim"
TFDS = "tfds"


@dataclass(frozen=True)
class Parser:
    """A record format: its name (as the manifest records it) and ``fn(payload, key) -> (image, label)``."""

    name: str
    fn: Callable[[bytes, bytes], tuple[bytes, int]]

    @property
    def slim(self) -> bool:
        return self.name == SLIM


def _tfds(payload: bytes, key: bytes = b"?") -> tuple[bytes, int]:
    """A TensorFlow Datasets image-classification record: ``image`` (encoded) and ``label``."""
    features = example_features(payload, key)
    image = features["image"].bytes_list.value if "image" in features else ()
    label = features["label"].int64_list.value if "label" in features else ()
    if len(image) != 1 or len(label) != 1:
        raise DataError(f"{key.decode()}: not a TFDS image-classification record (image: {len(image)} values, "
                        f"label: {len(label)}); pass your own --parse")
    return image[0], int(label[0])


def _user(fn: Callable, name: str) -> Callable[[bytes, bytes], tuple[bytes, int]]:
    def parse(payload: bytes, key: bytes = b"?") -> tuple[bytes, int]:
        try:
            image, label = fn(payload)
        except Exception as e:  # noqa: BLE001 - the user's code, named with the record
            raise DataError(f"{key.decode()}: parse {name} failed: {type(e).__name__}: {e}") from None
        if not isinstance(image, (bytes, bytearray)):
            raise DataError(f"{key.decode()}: parse {name} returned {type(image).__name__} for the image, not bytes")
        return bytes(image), int(label)

    return parse


def resolve(spec) -> Parser:
    """The parser ``spec`` names: None or ``slim``, ``tfds``, ``package.module:function``, or a
    callable. Raises :class:`ValueError` naming what is wrong."""
    if spec is None or spec == SLIM:
        return Parser(SLIM, parse_slim)
    if spec == TFDS:
        return Parser(TFDS, _tfds)
    if callable(spec):
        name = getattr(spec, "__qualname__", repr(spec))
        return Parser(name, _user(spec, name))
    try:
        return Parser(spec, _user(load_function(spec, "parse"), spec))
    except NotLoadable as e:
        raise ValueError(f"{e.problem} (a record format is slim, tfds or your function); {e.fix}") from None


def first_images(m: Manifest, k: int = 2) -> list[bytes]:
    """The encoded images of the dataset's first ``k`` samples in canonical order, parsed in the
    format its manifest names; raises :class:`ValueError` or :class:`DataError` naming the problem."""
    return [encoded for _, encoded in first_keyed(m, k)]


def first_keyed(m: Manifest, k: int = 2) -> list[tuple[str, bytes]]:
    """:func:`first_images` with each sample's key: its file, or its shard and record."""
    parser = resolve(record_format(m))
    if m.kind == "jpeg_folders":
        return [(key.decode(), payload) for key, payload in first_samples(m, k)]
    return [(key.decode(), parser.fn(payload, key)[0]) for key, payload in first_samples(m, k)]


def format_problem(m: Manifest) -> str | None:
    """Why the dataset's records cannot be read in the format its manifest names (the function
    cannot be had, or fails on the first records), or None. Needs no TensorFlow."""
    try:
        first_images(m)
    except (ValueError, DataError) as e:
        return str(e)
    return None
