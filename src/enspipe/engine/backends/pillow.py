"""The ``pillow`` backend: Pillow and numpy (:mod:`enspipe.data.pixels`), no TensorFlow.

A member given one core preprocesses in its stage thread. Given k > 1, it runs k worker processes
that decode and augment into shared memory (:mod:`enspipe.engine.workers`): a thread pool in one
interpreter stopped at about 2 busy cores whatever it was given (the GIL: Pillow's and numpy's
many short calls each take it), where processes scale with the cores. With the decode cache,
whose images live in this process, the k are threads instead.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from enspipe.common import spelling
from enspipe.data import transforms
from enspipe.data.manifest import DataError
from enspipe.data.order import NumpyOrder, read_share
from enspipe.data.parse import resolve
from enspipe.data.records import record_format
from enspipe.engine.backends.base import PrepSpec, kept, meta_rows
from enspipe.engine.workers import FunctionFailed, WorkerDied
from enspipe.measure.threadcpu import set_thread_name


def slices(spec: PrepSpec):
    order = NumpyOrder(spec.manifest, spec.order_seed, spec.shuffle_buffer)
    return read_share(spec.manifest, order, resolve(record_format(spec.manifest)), spec.skip_corrupt, spec.batch,
                      *spec.share, spec.unit)


def engine(spec: PrepSpec) -> "PillowEngine":
    return PillowEngine(spec.preprocessing, spec.size, spec.fast_mode, spec.wire_dtype, spec.prep_seed,
                        spec.threads, spec.skip_corrupt, spec.cache, spec.impl == "fused-colour")


def work(preprocessing: str, size: int, fast_mode: bool, wire_dtype: str, prep_seed: int, fused: bool):
    """The per-image function ``f(source, position, sample, epoch) -> image as it travels`` and
    the exception that means an undecodable image (a worker's factory, and the threads')."""
    from enspipe.data import pixels as px

    fn, options = px.PREPROCESSING[preprocessing], ({"fused": True} if fused and preprocessing == "inception" else {})

    def one(source, position: int, sample: int, epoch: int) -> np.ndarray:
        image = fn(source, size, px.generator(prep_seed, position), fast_mode, **options)
        return px.to_wire(preprocessing, image, wire_dtype)

    return one, px.Undecodable


def user_work(prep_seed: int, **transform):
    """:func:`work` for a user's augmentation (:mod:`enspipe.data.transforms`): each image decoded
    whole, then given to the user's function with the generators seeded for its sample."""
    from enspipe.data.decoding import Undecodable, decode

    fn = transforms.load(transform)
    kind, shape, dtype = transform["given"], tuple(transform["shape"]), np.dtype(transform["dtype"])

    def one(source, position: int, sample: int, epoch: int) -> np.ndarray:
        out = transforms.apply(fn, decode(source), transforms.sample_seed(prep_seed, position), kind)
        if out.shape != shape or out.dtype != dtype:
            raise ValueError(f"preprocess {transforms.name_of(fn)} returned {out.dtype} {out.shape} for the sample at "
                             f"stream position {position}, {dtype} {shape} for the first: return one shape and dtype")
        return out

    return one, Undecodable


class PillowEngine:
    """Each slice's images decoded and augmented: in the stage's thread (one core), on ``threads``
    worker processes, or with a decode cache on ``threads`` threads."""

    def __init__(self, preprocessing: str, size: int, fast_mode: bool, wire_dtype: str, prep_seed: int,
                 threads: int, skip_corrupt: bool, cache=None, fused: bool = False):
        from enspipe.data.decoding import whole_decodes  # brings OpenCV, as the decode itself does
        from enspipe.data.pixels import output_spec

        self.size, self.wire_dtype, self.skip_corrupt, self.cache = size, wire_dtype, skip_corrupt, cache
        self.shape, self.dtype = output_spec(preprocessing, size, wire_dtype)
        dtype = self.dtype
        self.workers = self.pool = None
        self.user = not isinstance(preprocessing, str)
        self._whole_before = Counter(whole_decodes())  # this process's, before this engine's images
        self.name = f"preprocess {preprocessing.name}" if self.user else f"the {preprocessing} preprocessing"
        if self.user:  # a user's augmentation: on worker processes alone, seeded there
            from enspipe.engine.workers import WorkerPool

            self.workers = WorkerPool(max(threads, 1), f"{__name__}:user_work",
                                      dict(prep_seed=prep_seed, **preprocessing.worker_kwargs()), self.shape, dtype,
                                      skip_corrupt)
            return
        kwargs = dict(preprocessing=preprocessing, size=size, fast_mode=fast_mode, wire_dtype=wire_dtype,
                      prep_seed=prep_seed, fused=fused)
        self.one, self.errors = work(**kwargs)
        if cache is not None and threads > 1:
            self.pool = ThreadPoolExecutor(threads, thread_name_prefix="enspipe-pillow",
                                           initializer=set_thread_name, initargs=("enspipe-pillow",))
        elif threads > 1:
            from enspipe.engine.workers import WorkerPool

            self.workers = WorkerPool(threads, f"{__name__}:work", kwargs, self.shape, dtype, skip_corrupt)

    def _guarded(self, encoded: bytes, position: int, sample: int, epoch: int):
        """One image in this process, or the reason it is undecodable."""
        try:
            source = encoded if self.cache is None else self.cache.decoded(sample, epoch, lambda: _decode(encoded))
            return self.one(source, position, sample, epoch)
        except self.errors as e:
            return f"{type(e).__name__}: {e}"

    def _submit(self, item: dict):
        """The slice handed to the worker processes (:meth:`WorkerPool.submit`)."""
        with self._named(item):
            return self.workers.submit(item["encoded"], item["position"].tolist(), item["id"].tolist(),
                                       item["epoch"].tolist(), tag=item)

    def _collect(self, item: dict, job) -> tuple[list, dict[int, str]]:
        """The slice's images from the workers."""
        with self._named(item):
            return self.workers.result(job)

    @contextmanager
    def _named(self, item: dict):
        """A worker's failure, while handing out or collecting ``item``, as a DataError naming the
        record it held (a slice handed out earlier is named by its tag)."""
        try:
            yield
        except FunctionFailed as e:
            i, why = e.args
            raise DataError(f"{self.name} failed on {item['key'][i].decode()} (stream position "
                            f"{int(item['position'][i])}): {why}; fix the function") from None
        except WorkerDied as e:
            if not e.args[1]:
                raise DataError(f"{e.args[0]} while it held no image (out of memory, or a signal from outside "
                                "the job?)") from None
            held_by = e.args[2] if e.args[2] is not None else item
            held = ", ".join(held_by["key"][i].decode() for i in e.args[1])
            hint = ("" if self.user else f"; {spelling.option('skip_corrupt', True)} skips and counts an image "
                    "that crashes the decoder")
            raise DataError(f"{e.args[0]} while decoding and running {self.name} on {held}{hint}") from None

    def _images(self, item: dict) -> tuple[list, dict[int, str]]:
        if self.workers is not None:
            return self._collect(item, self._submit(item))
        args = (item["encoded"], item["position"].tolist(), item["id"].tolist(), item["epoch"].tolist())
        out = list(self.pool.map(self._guarded, *args)) if self.pool else [self._guarded(*a) for a in zip(*args)]
        return out, {i: x for i, x in enumerate(out) if isinstance(x, str)}

    def _slice(self, item: dict, made: tuple, since: float) -> tuple:
        """``(item, images, meta, seconds)``: the images kept (see :func:`kept`) and the seconds
        since ``since`` that it took."""
        out, failed = made
        ok = kept(item, failed, self.skip_corrupt)
        if isinstance(out, np.ndarray):
            images = out if ok.all() else out[ok]
        elif ok.any():
            images = np.stack([x for x, good in zip(out, ok) if good])
        else:  # every image of the slice skipped
            images = np.zeros((0, *self.shape), self.dtype)
        return item, images, meta_rows(item)[ok], time.perf_counter() - since

    def run(self, take):
        """Each slice ``take()`` gives, preprocessed: ``(item, images, meta, seconds)``. On worker
        processes, where ``take`` has ``poll()`` (the next slice if one is ready now, else None),
        the next slice goes to the workers before this one's images are copied out, so they do
        not wait on the member between slices; ``seconds`` then counts each slice's wait alone."""
        poll = getattr(take, "poll", None)
        if self.workers is None or poll is None:
            while True:
                item = take()
                t = time.perf_counter()
                yield self._slice(item, self._images(item), t)
        pending = None  # (item, job, when it was handed out)
        resumed = time.perf_counter()
        while True:
            item = take() if pending is None else poll()
            ahead = (item, self._submit(item), time.perf_counter()) if item is not None else None
            if pending is not None:
                item0, job, submitted = pending
                since = max(submitted, resumed)
                made = self._collect(item0, job)
                yield self._slice(item0, made, since)
                resumed = time.perf_counter()
            pending = ahead

    @property
    def decodes(self) -> dict:
        """The images this engine decoded whole for a crop (the region decode could not take them),
        by reason (:func:`enspipe.data.decoding.whole_decodes`): in this process since it started,
        and in its worker processes."""
        from enspipe.data.decoding import whole_decodes

        whole = Counter(whole_decodes()) - self._whole_before
        if self.workers is not None:
            whole += self.workers.whole_decodes
        return {"decoded_whole": dict(whole)}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.workers is not None:
            self.workers.close()


def maker(spec: PrepSpec) -> "PillowMaker":
    return PillowMaker(spec)


class PillowMaker:
    """The attach server's: a chunk of samples made with the draws of their stream positions
    (:func:`work`, or :func:`user_work` for a user's augmentation). Each calling thread has a worker
    process of its own that decodes and augments while the thread waits, so ``k`` threads make
    samples on ``k`` cores, past the GIL; a sample whose decoder crashes its worker fails alone, as
    an undecodable one does."""

    def __init__(self, spec: PrepSpec):
        self.spec = spec
        if isinstance(spec.preprocessing, str):
            self.function = f"{__name__}:work"
            self.kwargs = dict(preprocessing=spec.preprocessing, size=spec.size, fast_mode=spec.fast_mode,
                               wire_dtype=spec.wire_dtype, prep_seed=spec.prep_seed, fused=spec.impl == "fused-colour")
        else:
            self.function = f"{__name__}:user_work"
            self.kwargs = dict(prep_seed=spec.prep_seed, **spec.preprocessing.worker_kwargs())
        self._local = threading.local()
        self._pools: list = []
        self._lock = threading.Lock()

    def _pool(self):
        pool = getattr(self._local, "pool", None)
        if pool is None:
            from enspipe.engine.workers import WorkerPool

            pool = self._local.pool = WorkerPool(1, self.function, self.kwargs, self.spec.image_shape,
                                                 self.spec.image_dtype, skip=True)
            with self._lock:
                self._pools.append(pool)
        return pool

    def make(self, encoded: list, positions: list, samples: list) -> tuple[np.ndarray, dict]:
        """The images (undefined where one failed) and ``{index: why}`` for those that failed."""
        return self._pool().map(encoded, positions, samples, [0] * len(encoded))

    @property
    def decodes(self) -> dict:
        """The images its worker processes decoded whole for a crop, by reason (as
        :attr:`PillowEngine.decodes`)."""
        with self._lock:
            return {"decoded_whole": dict(sum((p.whole_decodes for p in self._pools), Counter()))}

    def close(self) -> None:
        with self._lock:
            pools, self._pools = self._pools, []
        for pool in pools:
            pool.close()


def _decode(encoded: bytes) -> np.ndarray:
    from enspipe.data.pixels import decode

    return decode(encoded)
