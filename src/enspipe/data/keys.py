"""Sample keys' ids and order-free digests: TensorFlow's FarmHash fingerprint of a key, reduced to
63 bits, and the sum of a set's ids modulo 2**64 (``manifest.json``'s ``digest``)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

_ID_BUCKETS = 2**63 - 1
_MASK64 = (1 << 64) - 1


def sample_ids(keys) -> np.ndarray:
    """The 63-bit ids of sample keys (a list of str/bytes or a string tensor)."""
    return tf.strings.to_hash_bucket_fast(tf.convert_to_tensor(keys, tf.string), _ID_BUCKETS).numpy()


def digest_of(ids) -> str:
    """Order-independent digest of a collection of ids: their sum modulo 2**64, in hex."""
    total = int(np.asarray(ids, dtype=np.uint64).sum(dtype=np.uint64)) if len(ids) else 0
    return f"{total & _MASK64:016x}"


def add_digests(a: str, b: str) -> str:
    return f"{(int(a, 16) + int(b, 16)) & _MASK64:016x}"
