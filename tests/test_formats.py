"""Datasets of other formats: TFRecords with a user's parse function, TensorFlow Datasets' records,
PNG images; indexed once by `enspipe index --parse`, read exactly once per epoch by every member."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import enspipe, said
from test_api import members

FOREIGN = '''
import tensorflow as tf

def parse(record):
    f = tf.train.Example.FromString(record).features.feature
    return f["img"].bytes_list.value[0], f["y"].int64_list.value[0]

def broken(record):
    raise KeyError("img")
'''


def _write(path, examples):
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as w:
        for feats in examples:
            w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


def _png(i: int) -> bytes:
    import tensorflow as tf

    rng = np.random.default_rng(i)
    return tf.io.encode_png(rng.integers(0, 255, (24 + i % 5, 30, 3), dtype=np.uint8)).numpy()


def _bytes(b):
    import tensorflow as tf

    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[b]))


def _int(v):
    import tensorflow as tf

    return tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))


@pytest.fixture
def foreign(tmp_path, monkeypatch):
    """20 PNG images in two shards of a format of our own (features img, y), and its parse module."""
    (tmp_path / "foreignfmt.py").write_text(FOREIGN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    data = tmp_path / "foreign"
    data.mkdir()
    for s in range(2):
        _write(data / f"part-{s}.rec", [{"img": _bytes(_png(10 * s + i)), "y": _int((10 * s + i) % 4)}
                                        for i in range(10)])
    yield data
    sys.modules.pop("foreignfmt", None)


@pytest.mark.mpi
def test_a_users_format_is_indexed_and_read_exactly_once_per_epoch(foreign, tmp_path):
    r = enspipe("index", "--data", foreign, "--parse", "foreignfmt:parse")
    assert r.returncode == 0, r.stderr
    m = json.loads((foreign / "manifest.json").read_text())
    assert (m["num_images"], m["num_classes"], m["info"]) == (20, 4, {"parse": "foreignfmt:parse"})
    r, res = members("keep", 2, tmp_path, data=str(foreign), batch_size=10, image_size=32, steps=4)
    assert r.returncode == 0, said(r)
    for x in res:
        assert [(e["count"], e["missing"]) for e in x["epochs"]] == [(20, 0), (20, 0)]
    assert [x["first"] for x in res[0]["rows"]] == [x["first"] for x in res[1]["rows"]]
    import enspipe as lib

    images, labels = lib.validation_set(str(foreign), image_size=32)
    assert images.shape == (20, 32, 32, 3) and sorted(labels.tolist()) == sorted(i % 4 for i in range(20))


def test_a_format_that_cannot_be_read_is_named_before_any_member_starts(foreign):
    r = enspipe("index", "--data", foreign, "--parse", "foreignfmt:gone")
    assert r.returncode == 2 and "--parse" in r.stderr and "foreignfmt has no gone" in r.stderr
    r = enspipe("index", "--data", foreign)  # Slim's format: the records are not Slim's
    assert r.returncode == 2 and "image/encoded" in r.stderr
    manifest = {"kind": "tfrecord", "num_images": 20, "num_classes": 4, "digest": "0", "synthetic": False,
                "info": {"parse": "foreignfmt:broken"}}
    r = enspipe("index", "--data", foreign, "--parse", "foreignfmt:parse")
    assert r.returncode == 0
    m = json.loads((foreign / "manifest.json").read_text())
    (foreign / "manifest.json").write_text(json.dumps({**m, "info": manifest["info"]}))
    import enspipe as lib

    with pytest.raises(lib.ConfigError) as e:
        lib.SharedStream(str(foreign), 10)
    assert e.value.field == "data" and "parse foreignfmt:broken failed: KeyError" in str(e.value)


@pytest.mark.mpi
@pytest.mark.slow
def test_tensorflow_datasets_records_are_read_as_tfds(tmp_path):
    data = tmp_path / "fake_tfds" / "1.0.0"
    data.mkdir(parents=True)
    _write(data / "fake-train.tfrecord-00000-of-00001", [{"image": _bytes(_png(i)), "label": _int(i % 3)}
                                                        for i in range(12)])
    (data / "dataset_info.json").write_text("{}")
    r = enspipe("index", "--data", data, "--parse", "tfds")
    assert r.returncode == 0, r.stderr
    r, res = members("keep", 1, tmp_path, data=str(data), batch_size=6, image_size=32, steps=4)
    assert r.returncode == 0, said(r)
    assert [(e["count"], e["missing"]) for e in res[0]["epochs"]] == [(12, 0), (12, 0)]
