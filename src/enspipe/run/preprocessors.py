"""The preprocess stage's engines, one per backend: what turns a member's read slices (encoded
images and their keys) into preprocessed images, on a pool of the member's ``threads``.

* ``tf``: a tf.data pipeline fed by the stage's input (Slim's preprocessing, :mod:`enspipe.data.preprocessing`);
* ``pillow``: a thread pool over Pillow and numpy (:mod:`enspipe.data.pixels`), no TensorFlow.

Each engine's :meth:`run` takes ``take()`` (the next slice; raises :class:`Stopped` once the
pipeline stops) and yields ``(slice, images, meta, seconds)``: the slice as read, its images and
``[id, epoch, position, label]`` rows (skipped images left out in skip mode), and the seconds the
engine worked on it (not counting its waits for input).
"""
from __future__ import annotations

import collections
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from enspipe.data.manifest import DataError
from enspipe.measure.threadcpu import set_thread_name


class Stopped(Exception):
    """The pipeline was closed while a stage (or its consumer) waited."""


def _meta(item: dict) -> np.ndarray:
    return np.stack([item["id"], item["epoch"], item["position"], item["label"]], axis=1).astype(np.int64)


class PillowEngine:
    """Each slice's images decoded and augmented one per task on a pool of ``threads`` threads."""

    def __init__(self, preprocessing: str, size: int, fast_mode: bool, wire_dtype: str, prep_seed: int,
                 threads: int, skip_corrupt: bool, cache=None, fused: bool = False):
        from enspipe.data import pixels

        self.pixels, self.name, self.size, self.fast_mode = pixels, preprocessing, size, fast_mode
        self.wire_dtype, self.prep_seed, self.skip_corrupt, self.cache = wire_dtype, prep_seed, skip_corrupt, cache
        self.options = {"fused": True} if fused and preprocessing == "inception" else {}
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="enspipe-pillow",
                                       initializer=set_thread_name, initargs=("enspipe-pillow",))

    def _one(self, encoded: bytes, position: int, sample: int, epoch: int):
        px = self.pixels
        try:
            source = encoded if self.cache is None else self.cache.decoded(sample, epoch, lambda: px.decode(encoded))
            rng = px.generator(self.prep_seed, position)
            image = px.PREPROCESSING[self.name](source, self.size, rng, self.fast_mode, **self.options)
        except px.Undecodable as e:
            return e
        return px.to_wire(self.name, image, self.wire_dtype)

    def run(self, take):
        while True:
            item = take()
            t = time.perf_counter()
            out = list(self.pool.map(self._one, item["encoded"], item["position"].tolist(), item["id"].tolist(),
                                     item["epoch"].tolist()))
            ok = np.array([not isinstance(x, Exception) for x in out], bool)
            if not ok.all() and not self.skip_corrupt:
                bad = int(np.argmin(ok))
                raise DataError(f"{item['key'][bad].decode()}: undecodable image ({out[bad]}); fix or remove the "
                                "record, or pass --on-corrupt skip to skip and count it")
            if ok.any():
                images = np.stack([x for x, good in zip(out, ok) if good])
            else:  # every image of the slice skipped
                images = np.zeros((0, self.size, self.size, 3), np.uint8 if self.wire_dtype == "uint8" else np.float32)
            yield item, images, _meta(item)[ok], time.perf_counter() - t

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class TfEngine:
    """A tf.data pipeline over the slices, mapping :func:`enspipe.run.pipeline.element_fn` on a
    private pool: across slice boundaries and regrouped per unit, or, in skip mode, per slice with
    an end marker (a slice may lose images; each keeps its own bounds)."""

    def __init__(self, one, image_shape, image_dtype, options, threads: int, skip_corrupt: bool,
                 slice_len: int, unit: int, depth: int, cache=None):
        self.one, self.image_shape, self.image_dtype, self.options = one, image_shape, image_dtype, options
        self.cache = cache
        self.threads, self.skip_corrupt, self.slice_len, self.unit, self.depth = threads, skip_corrupt, slice_len, \
            unit, depth
        self._iterator = None  # kept until close(), so its pool threads' CPU stays visible

    def run(self, take):
        import tensorflow as tf

        pending: collections.deque = collections.deque()
        waited = [0.0]  # seconds the input generator waited for the read stage
        stopped = [False]

        def gen():
            while True:
                t = time.perf_counter()
                try:
                    item = take()
                except Stopped:
                    stopped[0] = True
                    return
                waited[0] += time.perf_counter() - t
                pending.append(item)
                yield {k: item[k] for k in ("encoded", "id", "epoch", "position", "label")}

        it = self._iterator = iter(self._dataset(gen))
        calibrate = self.cache is not None and not self.cache.decodes
        while True:
            t, w = time.perf_counter(), waited[0]
            try:
                images, meta = next(it)
            except (StopIteration, tf.errors.OpError) as e:
                if stopped[0]:  # closed while the stage waited for its input
                    raise Stopped from None
                if isinstance(e, tf.errors.InvalidArgumentError):
                    raise DataError(_diagnose(pending, e)) from None
                raise
            raw = pending.popleft()
            if calibrate:  # the cache's CPU saved is its hits times this decode cost, measured here
                calibrate = self._time_decodes(raw["encoded"][:9])
            images, meta = images.numpy(), meta.numpy()
            if self.skip_corrupt:  # the end marker goes
                keep = meta[:, 0] != -1
                images, meta = images[keep], meta[keep]
            took = time.perf_counter() - t  # less the input's waits, which tf.data may overlap with it
            yield raw, images, meta, took - min(took, waited[0] - w)

    def _time_decodes(self, encoded) -> bool:
        """The decode cache's decode cost: TensorFlow's decode of a few of the member's JPEGs on
        this thread's CPU clock, the first call (its setup) not counted (the graph's decodes cannot
        be timed one by one). False: done."""
        import tensorflow as tf

        from enspipe.data.preprocessing import decode

        for i, jpeg in enumerate(encoded):
            t = time.thread_time()
            try:
                decode(tf.constant(jpeg))
            except tf.errors.OpError:  # an undecodable one: the pipeline says so itself
                continue
            if i:
                self.cache.decode_seconds += time.thread_time() - t
                self.cache.decodes += 1
        return False

    def _dataset(self, gen):
        import tensorflow as tf

        sig = {"encoded": tf.TensorSpec([None], tf.string),
               **{k: tf.TensorSpec([None], tf.int64) for k in ("id", "epoch", "position", "label")}}

        def per_slice(b):  # one slice's images, the skipped ones left out, and a marker at its end
            items = tf.data.Dataset.from_tensor_slices(b).map(self.one, num_parallel_calls=self.threads,
                                                              deterministic=True)
            items = items.ignore_errors().concatenate(tf.data.Dataset.from_tensors(
                (tf.zeros(self.image_shape, tf.as_dtype(self.image_dtype)),
                 tf.constant([-1, -1, -1, -1], tf.int64))))
            return items.batch(self.slice_len + 1)

        ds = tf.data.Dataset.from_generator(gen, output_signature=sig)
        if self.skip_corrupt:
            ds = ds.interleave(per_slice, cycle_length=2, num_parallel_calls=2, deterministic=True)
        else:
            ds = ds.flat_map(tf.data.Dataset.from_tensor_slices).map(
                self.one, num_parallel_calls=self.threads, deterministic=True).batch(self.slice_len * self.unit)
        return ds.with_options(self.options)

    def close(self) -> None:
        """Once stopped, run the iterator to its end in the stage's own thread and drop it. Its
        input is a Python generator: an iterator dropped while a call into it is in flight waits
        for that call, which needs the GIL the dropping thread holds; dropped by the interpreter
        at exit, a member's process hung there for good (seen in CI)."""
        import tensorflow as tf

        it, self._iterator = self._iterator, None
        for _ in range(4 * self.depth + 16):  # the generator ends at once now; what tf.data holds drains
            if it is None:
                return
            try:
                next(it)
            except StopIteration:
                break
            except tf.errors.OpError:
                continue
        del it


def _diagnose(pending, error) -> str:
    import tensorflow as tf

    from enspipe.data.preprocessing import decode

    for raw in pending:
        for key, encoded in zip(raw["key"], raw["encoded"]):
            try:
                decode(tf.constant(encoded))
            except tf.errors.InvalidArgumentError as e:
                return (f"{key.decode()}: undecodable JPEG ({e.message.splitlines()[0]}); "
                        "fix or remove the record, or pass --on-corrupt skip to skip and count it")
    return f"preprocessing failed: {error.message.splitlines()[0]}"
