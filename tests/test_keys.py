"""Sample ids without TensorFlow: FarmHash's Fingerprint64 in numpy, as TensorFlow computes it."""
import random

import numpy as np
import pytest

from enspipe.data.keys import add_digests, digest_of, sample_ids

# tf.strings.to_hash_bucket_fast(keys, 2**63 - 1) on TensorFlow 2.21: every branch of the hash
# (0, 1-3, 4-7, 8-16, 17-32, 33-64 bytes, and the 64-byte loop), and a UTF-8 key
KNOWN = {b"": 1936946117179621456, b"a": 3694432073954588132, b"abc": 2640714258260161385,
         b"train-00000-of-00001:0": 2612745884880098029, b"n01440764/n01440764_10026.JPEG": 4795952168804650501,
         b"x" * 64: 6916188127298655160, b"y" * 65: 4023130470993650269, b"z" * 200: 8728890208429024092,
         "é/ü.jpg".encode(): 4504533211231933028}


def test_ids_are_tensorflows_without_tensorflow():
    assert sample_ids(list(KNOWN)).tolist() == list(KNOWN.values())
    assert sample_ids(["abc"]).tolist() == [KNOWN[b"abc"]]  # str keys are their UTF-8 bytes
    assert sample_ids(np.array([b"abc", b"a"], dtype=object)).dtype == np.int64


def test_ids_match_tensorflow_at_every_length():
    tf = pytest.importorskip("tensorflow")
    rng = random.Random(1)
    keys = [bytes(rng.randrange(256) for _ in range(n)) for n in range(301) for _ in range(3)]
    keys += [f"train-{i % 1024:05d}-of-01024:{i}".encode() for i in range(500)]
    expected = tf.strings.to_hash_bucket_fast(tf.constant(keys), 2**63 - 1).numpy()
    assert (sample_ids(keys) == expected).all()


def test_digests_are_order_free_sums():
    ids = sample_ids([f"k{i}" for i in range(10)])
    assert digest_of(ids) == digest_of(ids[::-1])
    assert add_digests(digest_of(ids[:4]), digest_of(ids[4:])) == digest_of(ids)
    assert digest_of([]) == "0" * 16
