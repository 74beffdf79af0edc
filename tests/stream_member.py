"""One member's script for tests/test_api.py, run under mpiexec: ``python stream_member.py MODE OUT JSON``
(JSON: SharedStream's keyword options), or ``python stream_member.py cases OUT JSON`` with JSON a list
of ``[name, mode, options]``: one stream after another in one job (MPI and TensorFlow start once),
each writing into OUT/name. Modes:

* ``keep``: take STEPS batches, keep every one, write each one's checksum taken when it came and
  again at the end (a kept batch must not change), and whether the arrays were read-only;
* ``checksums``: write the checksums of the first STEPS batches (as `enspipe run --batch-checksums` logs them);
* ``raise``: raise inside ``with SharedStream(...)`` at the third batch (the job must abort, fast);
* ``kill`` / ``stop``: the last member sends itself SIGKILL (dies) / SIGSTOP (hangs) at the third
  batch; the others read on (the job must end, fast, naming what happened);
* ``layouts``: one pass of ``stream.torch(layout=L)`` per layout, its images saved as NCHW;
* ``epochs``: EPOCHS passes (``via`` numpy or torch): each batch's length, each sample's digest and label;
* ``torch`` / ``jax``: EPOCHS epochs of ``stream.torch(layout=LAYOUT)`` / ``stream.jax()``, every batch
  kept; each one's NHWC pixel and label checksums when it came and at the end, its type, layout
  and dtypes, and every warning raised.
"""
import faulthandler
import json
import os
import signal
import sys
import time

import numpy as np

import enspipe
from enspipe.data.keys import batch_checksum
from enspipe.exchange.base import Batch

# a member that hangs prints every thread's stack and exits before the test's own timeout ends it silently
faulthandler.dump_traceback_later(float(os.environ.get("ENSPIPE_TEST_HANG_S", "200")), exit=True)
def gray40(image, seed):
    import tensorflow as tf

    image = tf.image.resize(image, [40, 40])
    image = tf.image.stateless_random_flip_left_right(image, seed)
    return tf.cast(tf.reduce_mean(image, axis=-1, keepdims=True), tf.uint8)


def _framework_rows(stream, mode: str, layout: str, epochs: int) -> dict:
    """``torch`` / ``jax`` mode: every batch of EPOCHS epochs kept and checked at the end."""
    import hashlib
    import warnings

    def nhwc(x):
        if mode == "torch":
            return (x.permute(0, 2, 3, 1) if x.dim() == 4 and layout != "NHWC" else x).contiguous().numpy()
        return np.asarray(x)

    def digest(images, labels):
        return hashlib.blake2b(nhwc(images).tobytes() + nhwc(labels).astype(np.int64).tobytes(),
                               digest_size=8).hexdigest()

    kept = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(epochs):
            batches = stream.torch(layout=layout) if mode == "torch" else stream.jax()
            assert len(batches) == stream.steps_per_epoch
            kept += [(x, y, digest(x, y)) for x, y in batches]
    rows = [{"first": d, "last": digest(x, y), "type": type(x).__module__.split(".")[0], "shape": list(x.shape),
             "dtype": str(x.dtype), "label_dtype": str(y.dtype),
             "contiguous": bool(x.is_contiguous()) if mode == "torch" else None,
             "channels_last": bool(x.is_contiguous(memory_format=__import__("torch").channels_last))
             if mode == "torch" and x.dim() == 4 else None} for x, y, d in kept]
    return {"rows": rows, "epochs": stream.epochs(), "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}


def _epoch_rows(stream, epochs: int, via: str) -> dict:
    """``epochs`` mode: EPOCHS passes over the stream (numpy, or ``stream.torch()``), each batch's
    length and each sample's image digest and label, in order, and the ledger."""
    import hashlib

    passes = []
    for _ in range(epochs):
        rows = []
        for images, labels in (stream if via == "numpy" else stream.torch()):
            images, labels = np.asarray(images), np.asarray(labels)
            rows.append({"len": len(labels), "samples": [
                [hashlib.blake2b(np.ascontiguousarray(x).tobytes(), digest_size=8).hexdigest(), int(y)]
                for x, y in zip(images, labels)]})
        passes.append(rows)
    return {"passes": passes, "len": len(stream), "epochs": stream.epochs(), "dataset_batch": stream._dataset_batch}


def _layout_rows(stream, out: str) -> dict:
    """``layouts`` mode: one pass of ``stream.torch(layout=L)`` per layout; per pass its shapes and
    memory format, and its images as NCHW saved to OUT/L.memberK.npy (to compare values)."""
    import torch

    def nchw(x, layout):
        if layout == "NHWC" or (layout is None and stream.sample_layout == "HWC"):
            return x.permute(0, 3, 1, 2)
        return x

    rows = {}
    os.makedirs(out, exist_ok=True)
    for layout in (None, "NCHW", "channels_last", "NHWC"):
        xs = [x for x, _ in stream.torch(layout=layout)]
        rows[str(layout)] = {"shapes": sorted({tuple(x.shape[1:]) for x in xs}),
                             "contiguous": all(x.is_contiguous() for x in xs),
                             "channels_last": all(x.is_contiguous(memory_format=torch.channels_last) for x in xs)}
        np.save(os.path.join(out, f"{layout}.member{stream.member}.npy"),
                torch.cat([nchw(x, layout) for x in xs]).contiguous().numpy())
    return {"layouts": rows, "sample_layout": stream.sample_layout}


def _kept_rows(stream, steps: int, pause: float = 0) -> dict:
    """``keep`` / ``checksums`` mode: STEPS batches kept, each checked when it came and at the end."""
    def checksum(images, meta):  # (a batch exchanged on a torch device: its pixels in host memory)
        return batch_checksum(Batch(images if isinstance(images, np.ndarray) else images.cpu().numpy(), meta))

    kept, rows = [], []
    for _ in range(steps):
        images, meta = stream._next(keep=True)[:2]
        kept.append((images, meta, checksum(images, meta)))
        time.sleep(pause)
    for images, meta, first in kept:
        host = isinstance(images, np.ndarray)
        rows.append({"first": first, "last": checksum(images, meta), "type": type(images).__module__.split(".")[0],
                     "read_only": not (host and images.flags.writeable) and not meta.flags.writeable,
                     "shape": list(images.shape), "dtype": str(images.dtype)})
    replaced = getattr(stream._transport, "ring", None)
    return {"rows": rows, "epochs": stream.epochs(), "spec": [list(stream.element_spec[0]), str(stream.element_spec[1])],
            "ring_replaced": replaced.replaced if replaced is not None else None,
            "paths": {",".join(map(str, g)): p for g, p in stream._transport.paths.items()},
            "scheme": stream.scheme.name, "planned": stream.planned}


MEMBER_OPTIONS = ("comm", "peer_timeout", "malloc", "threads", "cores", "log_dir", "members_per_rank", "drop_last")


def case(case_mode: str, out: str, options: dict) -> None:
    """One stream of ``options`` read as ``case_mode`` asks; this member's json in ``out``."""
    options = dict(options)
    steps, layout, epochs = options.pop("steps", 20), options.pop("layout", "NHWC"), options.pop("epochs", 2)
    pause = options.pop("pause_s", 0)  # slept after each batch: a run that outlasts peer_timeout
    via = options.pop("via", "numpy")
    if options.get("preprocess") == "gray40":
        options["preprocess"] = gray40
    elif ":" in options.get("preprocess", ""):  # module:function, or module:factory() (tests/user_transforms.py)
        module, name = options["preprocess"].split(":")
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        fn = getattr(__import__(module), name.removesuffix("()"))
        options["preprocess"] = fn() if name.endswith("()") else fn
    data, batch = options.pop("data"), options.pop("batch_size")
    # options for one member alone (by its launcher's rank): members that disagree
    rank = os.environ.get("RANK", os.environ.get("PMI_RANK", "0"))
    options.update(options.pop("rank_options", {}).get(rank, {}))
    if options.pop("as_config", False):  # SharedStream(StreamConfig(...)), the member's own options beside it
        member = {k: options.pop(k) for k in MEMBER_OPTIONS if k in options}
        opened = enspipe.SharedStream(enspipe.StreamConfig(data=data, batch_size=batch, **options), **member)
    else:
        opened = enspipe.SharedStream(data, batch, **options)
    with opened as stream:
        if case_mode == "raise":
            for i, _ in enumerate(stream):
                if i == 2:
                    raise ValueError("a bug in the member's training step")
        if case_mode in ("kill", "stop"):
            last = stream.member == stream.members - 1
            for i in range(10 ** 6):  # the others read on until the job ends
                stream.next_batch()
                if i == 2 and last:
                    os.makedirs(out, exist_ok=True)
                    with open(os.path.join(out, "signalled_at"), "w") as f:  # when, for the test's clock
                        f.write(repr(time.time()))
                    os.kill(os.getpid(), signal.SIGKILL if case_mode == "kill" else signal.SIGSTOP)
        if case_mode == "layouts":
            info = _layout_rows(stream, out)
        elif case_mode == "epochs":
            info = _epoch_rows(stream, epochs, via)
        elif case_mode in ("torch", "jax"):
            info = _framework_rows(stream, case_mode, layout, epochs)
        else:
            info = _kept_rows(stream, steps, pause)
    info["affinity"] = stream.affinity
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"member{stream.member}.json"), "w") as f:
        json.dump(info, f)


if sys.argv[1] == "cases":
    for name, case_mode, case_options in json.loads(sys.argv[3]):
        case(case_mode, os.path.join(sys.argv[2], name), case_options)
else:
    case(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
