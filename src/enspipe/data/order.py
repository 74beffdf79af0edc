"""The sample stream's order and its reading without TensorFlow (the ``pillow`` backend).

Epoch ``e`` of the stream is the dataset in an order drawn from ``(order_seed, e)``; global batch
``k`` is stream positions ``[k*B, (k+1)*B)``; a member looks up only the positions of its share of
each batch and reads only those records (by offset, :class:`RecordReader`) or files.

The order is numpy's: with a shuffle buffer, a full permutation of the epoch drawn by a Philox
generator keyed by ``(order_seed, epoch)`` (every record is read by its offset, so a full shuffle
costs no more than a buffered one); without, the canonical order (the shards interleaved
:data:`~enspipe.data.records.CYCLE` at a time, the files in their manifest's order), the order in
which TensorFlow's backend reads an unshuffled stream too. A shuffled stream's order differs
between the two backends (TensorFlow's is tf.data's buffered shuffle), so every member of a job
uses one backend: the members agree on it before anything is exchanged.
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import numpy as np

from enspipe.data.keys import sample_ids
from enspipe.data.manifest import DataError, Manifest
from enspipe.data.records import CYCLE, checked_payload, header_length, indexed, placeholder
from enspipe.common import spelling


class RecordReader:
    """Random access to a manifest's TFRecord records by ``(shard, record number)``.

    A shard's record offsets and lengths are found on first use by following its records' length
    fields (12 bytes each, their CRC checked; no payload is read); a record is then one ``pread``
    of its payload and its CRC, checked. (TensorFlow's own random-access reader re-reads its
    buffer on every backward seek: 1.3 ms of CPU per record in a shuffled order, against 15 us
    here.) A record that cannot be read (a damaged payload, a damaged length field before it, a
    shard that ends before it) fails the run naming it, or with ``skip_corrupt`` reads as a
    placeholder (:func:`enspipe.data.records.placeholder`) that the preprocess stage skips and counts.
    """

    OPEN_SHARDS = 64  # shards kept open at once (the interleave reads 4 at a time)

    def __init__(self, m: Manifest, skip_corrupt: bool):
        self.paths, self.counts, self.skip_corrupt = m.paths(), list(m.counts), skip_corrupt
        self._index_of: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._fds: dict[int, int] = {}

    def _index(self, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Each record's offset and payload length (-1 from the first that cannot be found)."""
        path, count = self.paths[shard], self.counts[shard]
        offsets, lengths = np.full(count, -1, np.int64), np.full(count, -1, np.int64)
        size, offset = os.path.getsize(path), 0
        with open(path, "rb") as f:
            for i in range(count):
                f.seek(offset)
                length = header_length(f.read(12))
                if length is None:
                    break  # the shard ends, or a length field is damaged: the rest cannot be found
                if offset + 16 + length > size:
                    break
                offsets[i], lengths[i] = offset, length
                offset += 16 + length
        return offsets, lengths

    def _fd(self, shard: int) -> int:
        if shard not in self._fds:
            if len(self._fds) >= self.OPEN_SHARDS:  # the oldest goes: ImageNet has 1024 shards
                os.close(self._fds.pop(next(iter(self._fds))))
            self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return self._fds[shard]

    def read(self, shard: int, record: int) -> bytes:
        if shard not in self._index_of:
            self._index_of[shard] = self._index(shard)
        offsets, lengths = self._index_of[shard]
        if offsets[record] < 0:  # named by the first record the shard lacks, whichever was asked for
            first = int(np.argmax(offsets < 0))
            return self._unreadable(shard, first, f"the shard ends, or its length field is damaged, there: it "
                                                  f"holds {first} of the manifest's {self.counts[shard]} records")
        length = int(lengths[record])
        raw = os.pread(self._fd(shard), length + 4, int(offsets[record]) + 12)
        if len(raw) < length + 4:
            return self._unreadable(shard, record, "the shard was cut short while being read")
        payload = checked_payload(raw, length)
        if payload is None:
            return self._unreadable(shard, record, "its data does not match its CRC")
        return payload

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def _unreadable(self, shard: int, record: int, why: str) -> bytes:
        if self.skip_corrupt:
            return placeholder()
        raise DataError(f"{self.paths[shard]}: corrupt TFRecord at record {record} ({why}); {spelling.skip_hint()}")


def effective_shuffle_buffer(m: Manifest, shuffle_buffer: int, permutation: bool = False) -> int:
    """The record shuffle buffer really used. A reader that shuffles by a full ``permutation``
    (:class:`NumpyOrder`: the pillow and gpu backends') has the dataset's. TensorFlow's: at most a
    quarter of the dataset. A shuffle buffer
    fills before it emits, so one as large as the dataset reads every record of an epoch at the
    epoch's start; a measured window shorter than a few epochs then counts reading done for
    images outside it (or misses it). A quarter keeps reading at the stream's pace. JPEG folders
    shuffle file names, not records, and read only what is kept: their buffer is the dataset."""
    if permutation and shuffle_buffer:
        return m.num_images
    if m.kind == "jpeg_folders" or not shuffle_buffer:
        return shuffle_buffer
    return max(1, min(shuffle_buffer, m.num_images // 4))


def canonical_numbers(counts: list[int]) -> np.ndarray:
    """Record numbers (counted across shards) in the canonical order: tf.data's
    ``interleave(cycle_length=CYCLE, block_length=1)`` of the shards in order."""
    counts = [int(c) for c in counts]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if counts else np.zeros(0, np.int64)
    out, pending, slots = [], iter(range(len(counts))), []
    for _ in range(min(CYCLE, len(counts))):
        slots.append([next(pending), 0])
    while slots:
        for slot in list(slots):
            while slot is not None and slot[1] >= counts[slot[0]]:  # exhausted: the next shard takes its place
                nxt = next(pending, None)
                if nxt is None:
                    slots.remove(slot)
                    slot = None
                else:
                    slot[0], slot[1] = nxt, 0
            if slot is not None:
                out.append(first[slot[0]] + slot[1])
                slot[1] += 1
    return np.asarray(out, np.int64)


class NumpyOrder:
    """The stream's order over a manifest's samples, an epoch at a time: ``(shard, record)`` rows
    for TFRecords (counted by the manifest), ``(file, -1)`` for image folders."""

    def __init__(self, m: Manifest, order_seed: int, shuffle_buffer: int):
        if m.kind == "tfrecord" and not indexed(m):
            raise DataError(f"{m.root}: the manifest does not count every shard's records; index it once with "
                            f"`enspipe index --data {m.root}` (the pillow backend reads records by their offsets)")
        self.m, self.order_seed, self.shuffle = m, int(order_seed), bool(shuffle_buffer)
        self.folders = m.kind == "jpeg_folders"
        counts = [1] * len(m.files) if self.folders else list(m.counts)
        self.first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self.size = int(sum(counts))
        if self.folders:
            self.names = np.array(list(m.files), dtype=object)
        else:
            self.names = np.array([os.path.basename(p) + ":" for p in m.paths()], dtype=object)
        self._canonical = np.arange(self.size, dtype=np.int64) if self.folders else canonical_numbers(counts)
        self._epochs: dict[int, np.ndarray] = {}

    def epoch(self, e: int) -> np.ndarray:
        """Epoch ``e``'s sample numbers in stream order (the last two epochs drawn are kept)."""
        if not self.shuffle:
            return self._canonical
        if e not in self._epochs:
            rng = np.random.Generator(np.random.Philox(key=[self.order_seed % 2**64, e]))
            self._epochs[e] = self._canonical[rng.permutation(self.size)]
            for old in [k for k in self._epochs if k < e - 1]:
                del self._epochs[old]
        return self._epochs[e]

    def at(self, positions: np.ndarray) -> dict:
        """The stream elements at ``positions``: ``epoch``, ``position``, ``key``, ``shard`` (the
        file, for folders) and ``record`` (-1 for folders)."""
        epochs, index = positions // self.size, positions % self.size
        numbers = np.zeros(len(positions), np.int64)
        for e in np.unique(epochs):
            at_e = epochs == e
            numbers[at_e] = self.epoch(int(e))[index[at_e]]
        return {"epoch": epochs.astype(np.int64), "position": positions.astype(np.int64), **self.samples(numbers)}

    def samples(self, numbers: np.ndarray) -> dict:
        """The samples numbered ``numbers`` (counted across shards): ``key``, ``shard`` (the file,
        for folders) and ``record`` (-1 for folders)."""
        shard = np.searchsorted(self.first, numbers, side="right") - 1
        record = numbers - self.first[shard]
        if self.folders:
            keys, record = self.names[shard], np.full(len(numbers), -1, np.int64)
        else:
            keys = self.names[shard] + record.astype(str).astype(object)
        return {"key": np.array([k.encode() for k in keys], dtype=object), "shard": shard, "record": record}


def read_file(path: str, key: bytes, skip_corrupt: bool) -> bytes:
    """An image folder's file, or where it cannot be read an empty payload (skip mode: its decode
    fails and it is skipped and counted) or a :class:`DataError` naming it."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        if skip_corrupt:
            return b""
        raise DataError(f"{key.decode()}: cannot be read ({e.strerror}); {spelling.skip_hint()}") from None


def read_share(m: Manifest, order, parser, skip_corrupt: bool, batch: int, lo: int, hi: int,
               unit: int = 1) -> Iterator[dict]:
    """This member's share ``[lo, hi)`` of every global batch in ``order`` (:class:`NumpyOrder` or
    TensorFlow's ``IndexedOrder``), read and parsed: numpy dicts of ``encoded``, ``label``, ``id``,
    ``epoch``, ``position`` and ``key``, one per ``unit`` consecutive global batches."""
    folders = m.kind == "jpeg_folders"
    reader = None if folders else RecordReader(m, skip_corrupt)
    paths, labels = (m.paths(), np.asarray(m.labels, np.int64)) if folders else (None, None)
    share = np.arange(lo, hi, dtype=np.int64)
    try:
        for first in itertools.count(0, unit):
            b = order.at(np.concatenate([(first + i) * batch + share for i in range(unit)]))
            shard, record = b.pop("shard"), b.pop("record")
            b["encoded"] = np.empty(len(shard), object)
            if folders:
                b["encoded"][:] = [read_file(paths[s], k, skip_corrupt) for s, k in zip(shard, b["key"])]
                b["label"] = labels[shard]
            else:
                parsed = [parser.fn(reader.read(int(s), int(r)), k) for s, r, k in zip(shard, record, b["key"])]
                b["encoded"][:] = [e for e, _ in parsed]
                b["label"] = np.array([label for _, label in parsed], np.int64)
            b["id"] = sample_ids(b["key"]) if len(shard) else np.zeros(0, np.int64)
            yield b
    finally:
        if reader is not None:
            reader.close()
