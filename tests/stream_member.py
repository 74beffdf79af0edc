"""One member's script for tests/test_api.py, run under mpiexec: ``python stream_member.py MODE OUT JSON``
(JSON: SharedStream's keyword options). Modes:

* ``keep``: take STEPS batches, keep every one, write each one's checksum taken when it came and
  again at the end (a kept batch must not change), and whether the arrays were read-only;
* ``checksums``: write the checksums of the first STEPS batches (as `enspipe run --batch-checksums` logs them);
* ``raise``: raise inside ``with SharedStream(...)`` at the third batch (the job must abort, fast).
"""
import faulthandler
import json
import os
import sys

import numpy as np

import enspipe
from enspipe.data.keys import batch_checksum
from enspipe.exchange.base import Batch

# a member that hangs prints every thread's stack and exits before the test's own timeout ends it silently
faulthandler.dump_traceback_later(float(os.environ.get("ENSPIPE_TEST_HANG_S", "200")), exit=True)
mode, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
steps = options.pop("steps", 20)
if options.get("preprocess") == "gray40":
    import tensorflow as tf

    def gray40(image, seed):
        image = tf.image.resize(image, [40, 40])
        image = tf.image.stateless_random_flip_left_right(image, seed)
        return tf.cast(tf.reduce_mean(image, axis=-1, keepdims=True), tf.uint8)

    options["preprocess"] = gray40
data = options.pop("data")
batch = options.pop("batch_size")
with enspipe.SharedStream(data, batch, **options) as stream:
    rows = []
    if mode == "raise":
        for i, _ in enumerate(stream):
            if i == 2:
                raise ValueError("a bug in the member's training step")
    kept = []
    for _ in range(steps):
        images, meta = stream._next(keep=True)
        kept.append((images, meta, batch_checksum(Batch(images, meta))))
    for images, meta, first in kept:
        rows.append({"first": first, "last": batch_checksum(Batch(images, meta)),
                     "read_only": not images.flags.writeable and not meta.flags.writeable,
                     "shape": list(images.shape), "dtype": str(images.dtype)})
    replaced = getattr(stream._transport, "ring", None)
    info = {"rows": rows, "epochs": stream.epochs(), "spec": [list(stream.element_spec[0]), str(stream.element_spec[1])],
            "ring_replaced": replaced.replaced if replaced is not None else None,
            "paths": {",".join(map(str, g)): p for g, p in stream._transport.paths.items()},
            "scheme": stream.scheme.name, "planned": stream.planned}
with open(os.path.join(out, f"member{stream.member}.json"), "w") as f:
    json.dump(info, f)
