"""Datasets: TF-Slim ImageNet TFRecord shards or JPEG class folders, their manifest, and the
deterministic sample stream every pipeline reads.

Every sample has a stable key (``<shard>:<index>`` for TFRecords, ``<class>/<file>`` for JPEG
folders) and a 63-bit id (TensorFlow's FarmHash fingerprint of the key). A set of samples has an
order-independent digest, the sum of its ids modulo 2**64, so exactly-once delivery can be checked
against ``manifest.json`` from outside.

The stream is infinite: epoch ``e`` is the dataset in an order drawn from ``(order_seed, e)``;
its elements are ``position`` (index in the whole stream), ``epoch``, ``id``, ``key`` and where
the sample is. Global batch ``k`` is positions ``[k*B, (k+1)*B)``; a preprocessor keeps only its
share of each batch before anything is read, parsed or decoded (:func:`read_slices`): where the
manifest counts every shard's records, the order is drawn over ``(shard, record)`` numbers and a
member reads only its own records, by their offsets (:class:`~enspipe.data.order.RecordReader`), so sharing the
preprocessing shares the reading too; otherwise every member reads every record and keeps its
share.
"""
from __future__ import annotations

import itertools
import os

import numpy as np
import tensorflow as tf

from enspipe.common import spelling
from enspipe.data.keys import _ID_BUCKETS
from enspipe.data.manifest import DataError, Manifest
from enspipe.data.order import effective_shuffle_buffer, read_share
from enspipe.data.parse import resolve
from enspipe.data.records import CYCLE, header_length, indexed, placeholder, record_format

SLIM_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/format": tf.io.FixedLenFeature([], tf.string, default_value="jpeg"),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
}


def resilient_records(path, count):
    """The records of one TFRecord shard, a placeholder in place of each one that cannot be read:
    a corrupt record is stepped over by its header's length (when the header itself checks out),
    and where the shard cannot be followed any further the records the manifest still promises
    (``count``; -1: unknown) are placeholders too. Nothing after a corrupt record is lost."""
    from tensorflow.python.lib.io import _pywrap_record_io

    path = path.decode() if isinstance(path, bytes) else path
    size, stand_in = os.path.getsize(path), placeholder()
    reader = _pywrap_record_io.RandomRecordReader(path)
    offset, index = 0, 0
    with open(path, "rb") as f:
        while offset < size:
            try:
                record, offset = reader.read(offset)
            except tf.errors.OpError:
                f.seek(offset)
                length = header_length(f.read(12))
                if length is None:
                    break  # the length itself is damaged: the rest of the shard cannot be followed
                offset += 16 + length
                record = stand_in
            yield record
            index += 1
    for _ in range(index, count):
        yield stand_in


def _epoch_records(m: Manifest, epoch_seed: tf.Tensor, shuffle_buffer: int, skip_corrupt: bool,
                   in_graph: bool = False) -> tf.data.Dataset:
    """One epoch of ``(key, payload, label, shard, record)`` in the order drawn from
    ``epoch_seed``: ``payload`` is the serialized record (``shard``/``record`` -1), the file's path
    (JPEG folders), or empty where the manifest counts every shard's records (:func:`indexed`):
    the record is then read after the stream is sliced. Either way the order is the same: the
    draw depends only on how many records each shard holds. ``in_graph`` reads every record in the
    graph (``TFRecordDataset``), for a graph that must run elsewhere (the tf.data service's workers)."""
    if m.kind == "jpeg_folders":
        n = len(m.files)
        ds = tf.data.Dataset.from_tensor_slices((list(m.files), m.paths(), np.asarray(m.labels, np.int64),
                                                 np.full(n, -1, np.int64), np.full(n, -1, np.int64)))
        return ds.shuffle(m.num_images, seed=epoch_seed) if shuffle_buffer else ds

    def shard_numbers(path, count, shard):  # the shard's records by number: nothing is read here
        prefix = tf.strings.split(path, "/")[-1]
        return tf.data.Dataset.range(count).map(
            lambda i: (tf.strings.join([prefix, ":", tf.strings.as_string(i)]), tf.constant(b""),
                       tf.constant(-1, tf.int64), shard, i))

    def shard_records(path, count):
        if skip_corrupt:
            records = tf.data.Dataset.from_generator(resilient_records, args=(path, count),
                                                     output_signature=tf.TensorSpec([], tf.string))
        else:
            records = tf.data.TFRecordDataset(path)
        prefix = tf.strings.split(path, "/")[-1]
        return records.enumerate().map(
            lambda i, rec: (tf.strings.join([prefix, ":", tf.strings.as_string(i)]), rec, tf.constant(-1, tf.int64),
                            tf.constant(-1, tf.int64), tf.constant(-1, tf.int64)))

    counts = [-1 if c is None else c for c in (m.counts or (None,) * len(m.files))]
    files = tf.data.Dataset.from_tensor_slices((m.paths(), np.asarray(counts, np.int64),
                                                np.arange(len(m.files), dtype=np.int64)))
    if shuffle_buffer:
        files = files.shuffle(len(m.files), seed=epoch_seed)
    per_shard = shard_numbers if indexed(m) and not in_graph else (lambda path, count, shard: shard_records(path, count))
    ds = files.interleave(per_shard, cycle_length=min(CYCLE, len(m.files)), block_length=1)
    return ds.shuffle(effective_shuffle_buffer(m, shuffle_buffer), seed=epoch_seed + 1) if shuffle_buffer else ds


def _without_global_seed() -> None:
    """Inside a function tf.data is tracing: draw its shuffles from their own seeds alone. The
    traced graph inherits the process's global seed (``tf.random.set_seed``, ``keras.utils.
    set_random_seed``), which would mix into the order and differ between members that seed their
    models differently; and with one set, TensorFlow cannot take the epoch's seed as a tensor."""
    tf.compat.v1.get_default_graph().seed = None


def sample_stream(m: Manifest, order_seed: int | tf.Tensor, shuffle_buffer: int = 1024,
                  skip_corrupt: bool = False, in_graph: bool = False) -> tf.data.Dataset:
    """The infinite stream of ``dict(position, epoch, key, payload, label)``.

    ``payload`` is a serialized Slim ``tf.train.Example`` (TFRecords) or a file path (JPEG
    folders); ``label`` is -1 until :func:`load_samples` parses the payload. ``in_graph``: every
    record is read by the graph itself (see :func:`_epoch_records`).
    """
    def epoch(e):
        _without_global_seed()
        seed = tf.cast(order_seed, tf.int64) * 1_000_003 + e * 7_919
        return _epoch_records(m, seed, shuffle_buffer, skip_corrupt, in_graph).map(
            lambda key, payload, label, shard, record: {"epoch": e, "key": key, "payload": payload, "label": label,
                                                        "shard": shard, "record": record})

    ds = tf.data.Dataset.range(2**62).flat_map(epoch).enumerate()
    return ds.map(lambda pos, el: dict(el, position=pos))


def slice_of_batch(stream: tf.data.Dataset, batch: int, lo: int, hi: int) -> tf.data.Dataset:
    """Keep stream positions whose offset in their global batch is in ``[lo, hi)``, batched per
    global batch: one element per global batch, each with ``hi - lo`` samples."""
    if (lo, hi) != (0, batch):
        stream = stream.filter(lambda el: tf.logical_and(el["position"] % batch >= lo, el["position"] % batch < hi))
    return stream.batch(hi - lo)


def without_autotune(ds: tf.data.Dataset) -> tf.data.Dataset:
    """``ds`` with tf.data's autotuner off: its model thread sleeps up to 10 s between passes and an
    iterator's destructor waits for it holding the GIL, so a process that drops iterators and goes
    on (a member's next round in ``enspipe ensemble --in-job``) stalled up to 10 s per iterator."""
    opts = tf.data.Options()
    opts.autotune.enabled = False
    return ds.with_options(opts)


class IndexedOrder:
    """The stream's order over ``(shard, record)`` numbers, an epoch at a time, as numpy arrays.

    Each epoch is drawn by the same tf.data shuffles and interleave as :func:`_epoch_records`
    (the draw depends only on how many records each shard holds, so drawing bare numbers gives
    the same order), in one pass per epoch; a member then picks its share of each global batch by
    position. Every member draws the whole epoch, but that costs microseconds per record; walking
    the sample stream element by element through tf.data instead cost every member ~150 us per
    sample of the whole stream, so a member's read stage shrank not at all with its share.
    """

    def __init__(self, m: Manifest, order_seed: int, shuffle_buffer: int):
        self.m, self.order_seed, self.shuffle_buffer = m, int(order_seed), shuffle_buffer
        self.counts = np.asarray(m.counts, np.int64)
        self.size = int(self.counts.sum())  # records per epoch (skipped ones stay as placeholders)
        self.first = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)  # each shard's first
        self.names = np.array([os.path.basename(p) + ":" for p in m.paths()], dtype=object)
        self._epochs: dict[int, np.ndarray] = {}
        self._next = 0
        self._draws = iter(without_autotune(tf.data.Dataset.range(2**62).flat_map(self._epoch_dataset)
                                            .batch(self.size)))

    def _epoch_dataset(self, e):
        """Epoch ``e``'s numbers: the shuffles and interleave of :func:`_epoch_records` (and its seed)."""
        _without_global_seed()
        seed = tf.cast(self.order_seed, tf.int64) * 1_000_003 + e * 7_919
        files = tf.data.Dataset.from_tensor_slices((self.counts, self.first))
        if self.shuffle_buffer:
            files = files.shuffle(len(self.counts), seed=seed)
        # records numbered across shards (no per-record function: tf.data runs one at ~10 us a call)
        ds = files.interleave(lambda count, first: tf.data.Dataset.range(first, first + count),
                              cycle_length=min(CYCLE, len(self.counts)), block_length=1)
        if self.shuffle_buffer:
            ds = ds.shuffle(effective_shuffle_buffer(self.m, self.shuffle_buffer), seed=seed + 1)
        return ds

    def epoch(self, e: int) -> np.ndarray:
        """Epoch ``e``'s ``(shard, record)`` rows in stream order (epochs are drawn in order; the
        last two are kept)."""
        while self._next <= e:
            numbers = next(self._draws).numpy()
            shard = np.searchsorted(self.first, numbers, side="right") - 1
            self._epochs[self._next] = np.stack([shard, numbers - self.first[shard]], axis=1)
            self._epochs.pop(self._next - 2, None)
            self._next += 1
        return self._epochs[e]

    def at(self, positions: np.ndarray) -> dict:
        """The stream elements at ``positions`` (ascending): ``epoch``, ``position``, ``key``,
        ``shard``, ``record``."""
        epochs, index = positions // self.size, positions % self.size
        rows = np.zeros((len(positions), 2), np.int64)
        for e in np.unique(epochs):
            at_e = epochs == e
            rows[at_e] = self.epoch(int(e))[index[at_e]]
        keys = self.names[rows[:, 0]] + rows[:, 1].astype(str).astype(object)
        return {"epoch": epochs.astype(np.int64), "position": positions.astype(np.int64),
                "key": np.array([k.encode() for k in keys], dtype=object), "shard": rows[:, 0], "record": rows[:, 1]}


def read_slices(m: Manifest, order_seed: int, shuffle_buffer: int, skip_corrupt: bool, batch: int,
                lo: int, hi: int, options: tf.data.Options | None = None, unit: int = 1, parse=None):
    """This member's share ``[lo, hi)`` of every global batch of the stream, read and parsed: an
    iterator of numpy dicts (``encoded``, ``label``, ``id``, ``epoch``, ``position``, ``key``), one
    per ``unit`` consecutive global batches (their shares one after the other). Only the share's
    records are read where the stream is :func:`indexed`, and only the share's positions are looked
    at (:class:`IndexedOrder`). ``parse``: the records' format (:func:`record_format`)."""
    parser = resolve(parse if parse is not None else record_format(m))
    if not indexed(m):
        if not parser.slim:
            raise DataError(f"{m.root}: records of format {parser.name} are read by their index: run "
                            f"`enspipe index --data {m.root} --parse {parser.name}` first")
        ds = slice_of_batch(sample_stream(m, order_seed, shuffle_buffer, skip_corrupt), batch, lo, hi)
        if options is not None:
            ds = ds.with_options(options)
        slices = ({k: v.numpy() for k, v in b.items()} for b in ds.map(lambda b: load_samples(m.kind, b)))
        while True:
            try:
                group = list(itertools.islice(slices, unit))
            except tf.errors.DataLossError:
                raise DataError(locate_corrupt_record(m)) from None
            if not group:
                return
            yield group[0] if unit == 1 else {k: np.concatenate([g[k] for g in group]) for k in group[0]}
    yield from read_share(m, IndexedOrder(m, order_seed, shuffle_buffer), parser, skip_corrupt, batch, lo, hi, unit)


def load_samples(kind: str, batch: dict) -> dict:
    """Turn a batch of stream elements into ``encoded`` JPEG bytes and labels (parse or read files)."""
    if kind == "jpeg_folders":
        encoded = tf.map_fn(tf.io.read_file, batch["payload"], fn_output_signature=tf.string)
        label = batch["label"]
    else:
        ex = tf.io.parse_example(batch["payload"], SLIM_FEATURES)
        encoded, label = ex["image/encoded"], ex["image/class/label"]
    out = {k: v for k, v in batch.items() if k not in ("payload", "shard", "record")}
    out.update(encoded=encoded, label=label, id=tf.strings.to_hash_bucket_fast(batch["key"], _ID_BUCKETS))
    return out


def locate_corrupt_record(m: Manifest) -> str:
    """Find the first unreadable TFRecord and say where it is (used after a DataLossError)."""
    for path in m.paths():
        n = 0
        try:
            for _ in tf.data.TFRecordDataset(path):
                n += 1
        except tf.errors.DataLossError as e:
            return f"{path}: corrupt TFRecord at record {n} ({e.message.splitlines()[0]}); {spelling.skip_hint()}"
    return "a TFRecord shard became unreadable during the run"
