"""The ``tf`` backend: a tf.data pipeline over the read slices, mapping Slim's preprocessing
(:mod:`enspipe.data.preprocessing`) on a private pool of the member's threads."""
from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING

import numpy as np

from enspipe.data.manifest import DataError
from enspipe.data.pixels import OUTPUT_RANGE
from enspipe.engine.backends.base import PrepSpec, Stopped
from enspipe.common import spelling

if TYPE_CHECKING:
    from enspipe.data.preprocessing import UserPreprocess

def slices(spec: PrepSpec):
    from enspipe.data.shards import read_slices

    lo, hi = spec.share
    return read_slices(spec.manifest, spec.order_seed, spec.shuffle_buffer, spec.skip_corrupt, spec.batch, lo, hi,
                       tf_data_options(spec.threads), unit=spec.unit)


def engine(spec: PrepSpec) -> "TfEngine":
    one = element_fn(spec.preprocessing, spec.size, spec.fast_mode, spec.wire_dtype, spec.prep_seed, spec.impl,
                     spec.cache)
    return TfEngine(one, spec.image_shape, spec.image_dtype, tf_data_options(spec.threads), spec.threads,
                    spec.skip_corrupt, spec.slice_len, spec.unit, spec.depth, spec.cache)


def quantizer(preprocessing: str):
    """(quantize, dequantize) for the uint8 wire: lossy by (range)/255 per value."""
    lo, hi = OUTPUT_RANGE[preprocessing]

    def quantize(x):
        import tensorflow as tf

        return tf.cast(tf.math.round(tf.clip_by_value((x - lo) / (hi - lo), 0.0, 1.0) * 255.0), tf.uint8)

    def dequantize(q):
        return q.astype(np.float32) * np.float32((hi - lo) / 255.0) + np.float32(lo)

    return quantize, dequantize


def element_fn(preprocessing: "str | UserPreprocess", size: int, fast_mode: bool, wire_dtype: str, prep_seed,
               impl: str = "crop-first", cache=None):
    """One sample's preprocessing, the same in every arm (enspipe's pipelines and the tf.data
    service's graph): decode and augment with the stateless seed ``(prep_seed, position)``,
    quantise for a uint8 wire; returns ``(image, [id, epoch, position, label])``. A user's
    preprocessing (:class:`~enspipe.data.preprocessing.UserPreprocess`) goes on the wire as it
    returns it. With a :class:`~enspipe.engine.decode_cache.DecodeCache`, the decoded image comes
    from it where it holds the sample, else from a whole decode that it then keeps."""
    import tensorflow as tf

    from enspipe.data.preprocessing import UserPreprocess, make_decoded_fn, make_preprocess_fn

    if isinstance(preprocessing, UserPreprocess):
        prep, quantize = preprocessing.encoded_fn(), (lambda x: x)
        from_pixels = preprocessing.decoded_fn()
    else:
        prep = make_preprocess_fn(preprocessing, size, fast_mode, impl)
        from_pixels = make_decoded_fn(preprocessing, size, fast_mode, impl)
        quantize = quantizer(preprocessing)[0] if wire_dtype == "uint8" else (lambda x: x)

    def one(e):
        seed = tf.stack([tf.cast(prep_seed, tf.int64), e["position"]])
        if cache is None:
            image = prep(e["encoded"], seed)
        else:
            image = from_pixels(cached_decode(cache, e), seed)
        return quantize(image), tf.stack([e["id"], e["epoch"], e["position"], e["label"]])

    return one


def cached_decode(cache, e):
    """The sample's decoded uint8 pixels from ``cache``, else decoded (as the tf backend decodes)
    and offered to it."""
    import tensorflow as tf

    from enspipe.data.preprocessing import decode

    def get(sample, epoch):
        pixels = cache.get(int(sample), int(epoch))
        return np.zeros((0, 0, 3), np.uint8) if pixels is None else pixels

    def put(sample, pixels):
        return np.bool_(cache.put(int(sample), pixels))

    held = tf.numpy_function(get, [e["id"], e["epoch"]], tf.uint8, stateful=True)
    held.set_shape([None, None, 3])

    def decoded():
        image = decode(e["encoded"])
        with tf.control_dependencies([tf.numpy_function(put, [e["id"], image], tf.bool, stateful=True)]):
            return tf.identity(image)

    return tf.cond(tf.size(held) > 0, lambda: held, decoded)


def tf_data_options(threads: int):
    """A member's tf.data options: a private pool of ``threads``, one thread per op, deterministic."""
    import tensorflow as tf

    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    opts.threading.max_intra_op_parallelism = 1
    opts.deterministic = True
    # Parallelism is set explicitly (``threads``), so tf.data's autotuner has nothing to tune;
    # its model thread sleeps up to 10 s between passes and an iterator's destructor waits for
    # it, holding the GIL: stopping a member took 10 s in half the runs and silenced its heartbeat.
    opts.autotune.enabled = False
    return opts



class TfEngine:
    """A tf.data pipeline over the slices, mapping :func:`enspipe.engine.pipeline.element_fn` on a
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
                        f"fix or remove the record, or {spelling.skip_hint()}")
    return f"preprocessing failed: {error.message.splitlines()[0]}"
