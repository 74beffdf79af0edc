import dataclasses
import itertools
import os

import numpy as np
import pytest
import tensorflow as tf

from enspipe.data.manifest import DataError
from enspipe.data.build import load_manifest
from enspipe.data.records import first_samples, indexed, make_example, parse_slim
from enspipe.data.build import FolderSource, convert_folder, scan
from enspipe.data.keys import digest_of, sample_ids
from enspipe.data.shards import SLIM_FEATURES, load_samples, read_slices, sample_stream, slice_of_batch
from enspipe.data.synthetic import make_dataset, synthetic_image


def _take(m, seed, batch, lo, hi, steps, shuffle=64):
    return list(itertools.islice(read_slices(m, seed, shuffle, False, batch, lo, hi), steps))


def _take_every_record(m, seed, batch, lo, hi, steps, shuffle=64):
    """The same share, every record read and parsed before slicing (the unindexed path)."""
    ds = slice_of_batch(sample_stream(m, seed, shuffle), batch, lo, hi).take(steps)
    return [{k: v.numpy() for k, v in load_samples(m.kind, b).items()} for b in ds]


@pytest.mark.parametrize("shuffle", [0, 64])
def test_a_member_reads_only_its_share_and_gets_what_reading_everything_gives(dataset, shuffle):
    """The indexed stream (order drawn over record numbers, only the share's records read) is the
    same samples in the same order, with the same bytes, as reading every record and slicing."""
    m = load_manifest(dataset)
    assert indexed(m)
    with_payloads = dataclasses.replace(m, counts=())  # no counts: the unindexed path
    for batch, lo, hi, steps in ((8, 0, 8, 8), (8, 3, 5, 8), (24, 5, 24, 9)):  # 64 > 50: crosses an epoch;
        a = _take(m, 3, batch, lo, hi, steps, shuffle)                     # 216: four epochs, batches across them
        b = _take_every_record(with_payloads, 3, batch, lo, hi, steps, shuffle)
        for x, y in zip(a, b, strict=True):
            assert set(x) == set(y)
            for k in x:
                assert (x[k] == y[k]).all(), k


def test_manifest_matches_a_scan(dataset):
    written, scanned = load_manifest(dataset), scan(dataset)
    assert written.num_images == scanned.num_images == 50
    assert written.digest == scanned.digest
    assert len(written.files) == 3 and written.synthetic


def test_generation_is_deterministic_and_seed_dependent(tmp_path):
    a = make_dataset(str(tmp_path / "a"), 5, seed=7, images_per_shard=2)
    b = make_dataset(str(tmp_path / "b"), 5, seed=7, images_per_shard=2)
    c = make_dataset(str(tmp_path / "c"), 5, seed=8, images_per_shard=2)
    assert b.files == a.files and b.digest == a.digest
    for f in a.files:
        assert open(tmp_path / "a" / f, "rb").read() == open(tmp_path / "b" / f, "rb").read()
    assert open(tmp_path / "a" / a.files[0], "rb").read() != open(tmp_path / "c" / c.files[0], "rb").read()


def test_synthetic_images_look_like_imagenet():
    sizes = [len(tf.io.encode_jpeg(synthetic_image(0, i, 10)[0], quality=90).numpy()) for i in range(12)]
    shapes = [synthetic_image(0, i, 10)[0].shape for i in range(12)]
    assert 60_000 < np.mean(sizes) < 160_000
    assert 250 < np.mean([s[0] for s in shapes]) < 450 and 300 < np.mean([s[1] for s in shapes]) < 500


def test_digest_is_order_independent():
    ids = sample_ids(["a:0", "a:1", "b:0"])
    assert digest_of(ids) == digest_of(ids[::-1]) != digest_of(ids[:2])


@pytest.mark.parametrize("shuffle", [0, 64])
def test_one_epoch_of_the_stream_is_the_dataset_exactly_once(dataset, shuffle):
    m = load_manifest(dataset)
    batches = _take(m, seed=1, batch=8, lo=0, hi=8, steps=7, shuffle=shuffle)  # 56 > 50: crosses an epoch
    ids = np.concatenate([b["id"] for b in batches])
    epochs = np.concatenate([b["epoch"] for b in batches])
    assert (np.diff(epochs) >= 0).all()
    assert len(set(ids[epochs == 0])) == 50 and digest_of(ids[epochs == 0]) == m.digest
    assert (np.concatenate([b["label"] for b in batches]) >= 0).all()


def test_shares_partition_each_global_batch(dataset):
    m = load_manifest(dataset)
    whole = _take(m, 2, 10, 0, 10, 4)
    parts = [_take(m, 2, 10, lo, hi, 4) for lo, hi in ((0, 4), (4, 7), (7, 10))]
    for k in range(4):
        joined = np.concatenate([p[k]["id"] for p in parts])
        assert (joined == whole[k]["id"]).all()
        assert (np.concatenate([p[k]["position"] for p in parts]) == np.arange(10 * k, 10 * k + 10)).all()


def test_different_order_seeds_give_different_orders(dataset):
    m = load_manifest(dataset)
    a, b = _take(m, 1, 50, 0, 50, 1), _take(m, 2, 50, 0, 50, 1)
    assert set(a[0]["id"]) == set(b[0]["id"]) and (a[0]["id"] != b[0]["id"]).any()


def test_jpeg_folders_read_and_convert(tmp_path):
    for c in ("cat", "dog"):
        os.makedirs(tmp_path / "jpegs" / c)
        for i in range(3):
            img, _ = synthetic_image(1, i, 2)
            tf.io.write_file(str(tmp_path / "jpegs" / c / f"{i}.jpg"), tf.io.encode_jpeg(img))
    m = load_manifest(str(tmp_path / "jpegs"))
    assert (m.kind, m.num_images, m.num_classes) == ("jpeg_folders", 6, 2)
    b = _take(m, 0, 6, 0, 6, 1)[0]
    assert digest_of(b["id"]) == m.digest and sorted(b["label"].tolist()) == [0, 0, 0, 1, 1, 1]
    shards, _, _ = convert_folder(FolderSource(str(tmp_path / "jpegs")), str(tmp_path / "shards"), images_per_shard=4)
    assert shards.num_images == 6 and len(shards.files) == 2
    assert scan(str(tmp_path / "shards")).digest == shards.digest


def test_corrupt_shard_is_named(tmp_path):
    m = make_dataset(str(tmp_path / "d"), 4, seed=1, images_per_shard=2)
    path = tmp_path / "d" / m.files[1]
    raw = bytearray(path.read_bytes())
    raw[200] ^= 0xFF
    path.write_bytes(bytes(raw))
    os.remove(tmp_path / "d" / "manifest.json")
    with pytest.raises(DataError, match=m.files[1]):
        scan(str(tmp_path / "d"))


def test_a_slim_record_parses_as_tensorflow_parses_it():
    def example(**features):
        return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()

    image = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"\xff\xd8jpeg"]))
    label = tf.train.Feature(int64_list=tf.train.Int64List(value=[7]))
    for payload in (example(**{"image/encoded": image, "image/class/label": label}),
                    example(**{"image/encoded": image})):  # no label: -1, as the parser's default
        want = tf.io.parse_single_example(payload, SLIM_FEATURES)
        assert parse_slim(payload) == (want["image/encoded"].numpy(), int(want["image/class/label"]))
    with pytest.raises(DataError, match="k:1: the record has 0 image/encoded values"):
        parse_slim(example(**{"image/class/label": label}), b"k:1")
    with pytest.raises(DataError, match="k:2: not a tf.train.Example"):
        parse_slim(b"\x0a\xff\xff\xff", b"k:2")


def test_examples_written_without_tensorflow_read_as_tensorflow_reads_them():
    payload = make_example({"image/encoded": b"\xff\xd8jpeg", "image/class/label": 7, "image/height": 3})
    want = tf.io.parse_single_example(payload, SLIM_FEATURES | {"image/height": tf.io.FixedLenFeature([], tf.int64)})
    assert (want["image/encoded"].numpy(), int(want["image/class/label"]), int(want["image/height"])) == (
        b"\xff\xd8jpeg", 7, 3)
    assert tf.train.Example.FromString(payload).features.feature["image/height"].int64_list.value == [3]


@pytest.mark.parametrize("k", [1, 5, 12])
def test_the_first_samples_are_the_streams_first_in_canonical_order(tmp_path, k):
    """Read without TensorFlow, in the order the unshuffled stream interleaves 5 shards (4 at a
    time, a finished one replaced by the next): the same keys and records as tf.data's."""
    m = make_dataset(str(tmp_path / "d"), 13, seed=5, num_classes=3, images_per_shard=3)
    assert len(m.files) == 5
    stream = slice_of_batch(sample_stream(m, 0, 0, in_graph=True), 13, 0, 13).take(1)  # every record read
    want = next(iter(stream))
    got = first_samples(m, k)
    assert [key for key, _ in got] == list(want["key"].numpy()[:k])
    assert [payload for _, payload in got] == list(want["payload"].numpy()[:k])
