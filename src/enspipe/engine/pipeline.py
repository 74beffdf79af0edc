"""The stages of one member's pipeline, each a thread joined by bounded queues:

    read ──▶ [preprocessing queue] ──▶ preprocess ──▶ [exchange queue] ──▶ exchange ──▶ [compute queue] ──▶ consumer

``read`` takes this member's share of each global batch from the sample stream and reads and
parses only those records (:func:`enspipe.data.order.read_share`; nothing is decoded); ``preprocess``
decodes and augments them on a pool of K threads, tf.data's or, with the ``pillow`` backend,
Pillow's and numpy's (:mod:`enspipe.engine.backends.pillow`);
``exchange`` runs the scheme's collectives (nothing for the baseline); the consumer runs in the
caller's thread. The three producing stages work on a unit of consecutive global batches at a
time (the engine's ``unit``, :meth:`enspipe.plan.schemes.Scheme.unit_batches`): a call into
tf.data and a collective cost about the same whatever they carry, so a member's share of several
batches goes through each at once; the exchange queue and the compute queue still hold batches,
the very batches one at a time would make. Compute-only members run the exchange stage alone.
Queue occupancy is sampled every ``sample_interval`` seconds (the paper's Fig. 3). Any stage's
exception stops the pipeline and is re-raised to the consumer, naming the stage.

The producers run on the (infinite) stream until told where to stop, so a measured window never
sees them idle because they already produced everything the run needs. Stopping is collective,
because the exchange stage's collectives must match on every member: :meth:`Pipeline.freeze`
stops the exchange stage before its next step and returns how many it began; the members agree on
the largest count (an all-reduce), :meth:`Pipeline.finish` lets every exchange stage run up to it,
and :meth:`Pipeline.drain` discards what the consumer no longer takes. What the producers make
after the consumer's last measured step is never consumed or counted.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import TYPE_CHECKING

import numpy as np

from enspipe.data.manifest import Manifest
from enspipe.data.pixels import output_spec
from enspipe.data.records import CORRUPT_LABEL
from enspipe.exchange.base import Batch
from enspipe.exchange.engine import ExchangeEngine
from enspipe.measure.stages import StageClock
from enspipe.measure.threadcpu import set_thread_name
from enspipe.common import keys
from enspipe.engine.backends import BACKENDS
from enspipe.engine.backends.base import PrepSpec, Stopped
from enspipe.exchange.transports import make_transport

if TYPE_CHECKING:
    from enspipe.data.preprocessing import UserPreprocess
    from enspipe.engine.config import StreamConfig

QUEUES = ("preprocessing", "exchange", "compute")


class PipelineFailed(RuntimeError):
    pass


def occupancy_stats(samples: list[tuple], names: tuple[str, ...], depth: int, t0: float, t1: float) -> dict:
    """Per queue, the mean, min and max occupancy (fraction of ``depth``) over the samples
    ``(time, size per queue...)`` taken in ``[t0, t1]`` (all of them if none was)."""
    rows = [s for s in samples if t0 <= s[0] <= t1] or samples
    if not rows:
        return {}
    arr = np.array([r[1:] for r in rows], dtype=float) / depth
    return {q: {"mean": float(arr[:, i].mean()), "min": float(arr[:, i].min()), "max": float(arr[:, i].max())}
            for i, q in enumerate(names)} | {"samples": len(rows), "capacity_batches": depth}


def put_until_stopped(q: queue.Queue, item, stop: threading.Event) -> bool:
    """Put ``item`` on the bounded queue ``q``, waiting while it is full; False if ``stop`` came first."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


class _Taker:
    """A stage's source of work, as a backend's engine takes it: ``take()`` waits for the next
    item, ``poll()`` returns it only if it is there now (else None), for an engine that hands out
    the next slice before it has finished this one."""

    def __init__(self, pipeline: "Pipeline", name: str):
        self.pipeline, self.name = pipeline, name

    def __call__(self):
        return self.pipeline._take(self.name)

    def poll(self):
        return self.pipeline._poll(self.name)


class Pipeline:
    """One member's staged pipeline. ``stream`` (its :class:`~enspipe.engine.config.StreamConfig`,
    whole) says what is read, how it is preprocessed and how deep the stages' queues are; the rest
    is this member's: its exchange ``engine`` and ``rank``, ``preprocessing`` (a built-in's name or
    a :class:`~enspipe.data.preprocessing.UserPreprocess`), its ``threads``, the ``seed`` of its
    order and augmentation, a DecodeCache or None, and the torch ``device`` its exchange takes
    batches on (None: host memory)."""

    def __init__(self, stream: "StreamConfig", *, manifest: Manifest, engine: ExchangeEngine, rank: int,
                 preprocessing: "str | UserPreprocess", threads: int, seed: int, events, cache=None, device=None):
        self.m, self.engine, self.rank, self.batch = manifest, engine, rank, stream.batch_size
        self.threads, self.events, self.cache, self.device = threads, events, cache, device
        self.skip_corrupt, self.sample_interval = stream.skip_corrupt, stream.sample_interval
        row = BACKENDS[stream.backend]
        self.backend_module = row.engine_module()
        if row.needs_tensorflow:  # here, not first in a stage thread: two importing at once deadlock
            import tensorflow  # noqa: F401
        self.image_shape, self.image_dtype = output_spec(preprocessing, stream.image_size, stream.wire_dtype)
        self.share = engine.scheme.share(rank, self.batch)
        self.unit = engine.unit  # global batches per read, preprocessing call and exchange
        self.spec = PrepSpec.of(stream, manifest, preprocessing, seed=seed, share=self.share, unit=self.unit,
                                threads=threads, image_shape=self.image_shape, image_dtype=self.image_dtype,
                                cache=cache, device=device)
        self.is_preprocessor = self.share[1] > self.share[0]
        self.depth = stream.queue_depth
        self.queues = {name: queue.Queue(self.depth) for name in QUEUES}
        self.stop = threading.Event()
        self._running = threading.Event()  # cleared: the read and preprocess stages take no new work (pause)
        self._running.set()
        self.failure: tuple[str, BaseException, str] | None = None
        self._skipped: list[tuple[int, int, str]] = []  # (global batch, epoch, key) of each skipped record
        self.samples: list[tuple[float, int, int, int]] = []
        self._threads: list[threading.Thread] = []
        self._prep_engine = None  # the preprocess stage's engine (enspipe.engine.backends), kept until close()
        self._decodes = None  # its decodes at its end (decodes())
        self.preprocessed = 0  # images this member's preprocess stage has produced
        self.clock = StageClock()  # the stages' working (not waiting) wall time; see enspipe.measure.stages
        # the exchange stage's steps: begun, completed, and the limit it may not pass (None: none)
        self._cond = threading.Condition()
        self._begun = self._done = 0
        self._limit: int | None = None

    # -- plumbing -----------------------------------------------------------------------------
    def _put(self, name: str, item) -> None:
        if not put_until_stopped(self.queues[name], item, self.stop):
            raise Stopped

    def _get(self, name: str):
        while True:
            if self.failure is not None:
                stage, exc, _ = self.failure
                raise PipelineFailed(f"{stage} stage failed: {type(exc).__name__}: {exc}") from exc
            if self.stop.is_set():
                raise Stopped
            try:
                return self.queues[name].get(timeout=0.2)
            except queue.Empty:
                continue

    def _wait_running(self) -> None:
        """Return once the producing stages may take new work (see :meth:`pause`)."""
        while not self._running.wait(0.2):
            if self.stop.is_set():
                raise Stopped

    def _take(self, name: str):
        """A producing stage's next item, once it may take new work."""
        self._wait_running()
        return self._get(name)

    def _poll(self, name: str):
        """A producing stage's next item if one is there now and it may take new work, else None."""
        if self.failure is not None or self.stop.is_set():
            return self._get(name)  # raises
        if not self._running.is_set():
            return None
        try:
            return self.queues[name].get_nowait()
        except queue.Empty:
            return None

    def _stage(self, name: str, fn, cleanup=None) -> threading.Thread:
        """The stage's thread; ``cleanup`` runs in it once the pipeline has stopped."""
        def body():
            set_thread_name(f"enspipe-{name}")  # TensorFlow's pool threads started here inherit it
            try:
                fn()
                self.stop.wait()  # stay alive until close(), so the thread's CPU time stays visible
            except Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - every failure must reach the consumer
                if self.failure is None:
                    self.failure = (name, e, traceback.format_exc())
                self.stop.set()
            finally:
                if cleanup is not None:
                    cleanup()

        t = threading.Thread(target=body, name=f"enspipe-{name}", daemon=True)
        self._threads.append(t)
        return t

    # -- stages -------------------------------------------------------------------------------
    def _read(self) -> None:
        it = self.backend_module.slices(self.spec)
        while True:
            self._wait_running()
            t = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self.clock.add("read", time.perf_counter() - t)
            self._put("preprocessing", item)

    def _preprocess(self) -> None:
        self._prep_engine = self.backend_module.engine(self.spec)  # closed by close(), so its pool threads' CPU stays visible
        try:
            for raw, images, meta, took in self._prep_engine.run(_Taker(self, "preprocessing")):
                if self.skip_corrupt:
                    images, meta = self._drop_skipped(raw, images, meta)
                self.preprocessed += len(meta)
                self.clock.add("preprocess", took)
                images, meta = self._handed(images), np.ascontiguousarray(meta)
                # the unit's slices, as views (a slice that lost skipped images is alone in its unit)
                ends = [len(meta)] if self.unit == 1 else [self.spec.slice_len * (i + 1) for i in range(self.unit)]
                for lo, hi in zip([0, *ends[:-1]], ends):
                    self._put("exchange", Batch(images[lo:hi], meta[lo:hi]))
        except Exception:
            if self.stop.is_set():  # closed, or another stage failed, while this one waited
                raise Stopped from None
            raise

    def _handed(self, images):
        """A slice's images as the exchange takes them: contiguous, and in host memory unless the
        exchange is on a device (a backend on the GPU makes tensors there)."""
        if isinstance(images, np.ndarray):
            return np.ascontiguousarray(images)
        return images.contiguous() if self.device is not None else images.cpu().numpy()

    def _end_preprocessing(self) -> None:
        engine, self._prep_engine = self._prep_engine, None
        if engine is not None:
            if hasattr(engine, "decodes"):
                self._decodes = engine.decodes
                self.events.log(keys.DECODES, **self._decodes)
            engine.close()

    def decodes(self) -> dict | None:
        """The preprocess stage's decodes (its engine's ``decodes``: the images the pillow backend
        decoded whole, by reason; the gpu backend's on the device and on the CPU): now, or at its
        end; None for an engine that does not count them."""
        engine = self._prep_engine
        return engine.decodes if engine is not None and hasattr(engine, "decodes") else self._decodes

    def _drop_skipped(self, raw: dict, images, meta):
        """Record and log each image the slice ``raw`` lost (its preprocessing skipped it)."""
        lost = set(raw["id"].tolist()) - set(meta[:, 0].tolist())
        if lost:
            batch = int(raw["position"][0]) // self.batch
            for key, i, epoch, label in zip(raw["key"], raw["id"], raw["epoch"], raw["label"]):
                if i in lost:
                    self._skipped.append((batch, int(epoch), key.decode()))
                    self.events.log(keys.SKIPPED, key=key.decode(), batch=batch, epoch=int(epoch),
                                    reason="corrupt record" if label == CORRUPT_LABEL else "undecodable image")
        return images, meta

    def _exchange(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self.stop.is_set() or self._limit is None or self._begun < self._limit)
                if self.stop.is_set():
                    raise Stopped
                self._begun += self.unit
            mine = [self._get("exchange") if self.is_preprocessor else None for _ in range(self.unit)]
            for batch in self.engine.run(mine):
                self._put("compute", batch)
            with self._cond:
                self._done += self.unit

    def _sample(self) -> None:
        set_thread_name("enspipe-sampler")
        while not self.stop.wait(self.sample_interval):
            sizes = [self.queues[q].qsize() for q in QUEUES]
            self.samples.append((time.time(), *sizes))
            self.events.log(keys.OCCUPANCY, **dict(zip(QUEUES, sizes)), capacity=self.depth)

    # -- public -------------------------------------------------------------------------------
    def start(self) -> None:
        if self.is_preprocessor:
            self._stage("read", self._read).start()
            self._stage("preprocess", self._preprocess, cleanup=self._end_preprocessing).start()
        self._stage("exchange", self._exchange).start()
        threading.Thread(target=self._sample, name="enspipe-sampler", daemon=True).start()

    def next_batch(self) -> Batch:
        return self._get("compute")

    def occupancy(self) -> dict:
        return {q: self.queues[q].qsize() for q in QUEUES}

    def skipped(self, batches: int) -> dict[int, list[str]]:
        """Keys of the records this member skipped in the first ``batches`` global batches (those
        consumed; the producers may have gone further), per epoch."""
        out: dict[int, list[str]] = {}
        for b, epoch, key in self._skipped:
            if b < batches:
                out.setdefault(epoch, []).append(key)
        return out

    def saturated(self) -> bool:
        """Whether every queue this member's stages fill is full: back-pressure has reached the
        first stage, so the producers run at the consumer's pace (an accelerator-bound steady state)."""
        names = QUEUES if self.is_preprocessor else ("compute",)
        return all(self.queues[q].qsize() >= self.depth for q in names)

    def pause(self) -> None:
        """Let the read and preprocess stages finish what they hold but take no new work: a member
        waiting for the others (its window's start, or their ends) stocks no more than that."""
        self._running.clear()

    def resume(self) -> None:
        """Let the read and preprocess stages take new work again (after :meth:`pause`)."""
        self._running.set()

    def freeze(self) -> int:
        """Let the exchange stage finish the step it is in but begin no other; returns how many
        steps it has begun (the members then agree on the largest, see :meth:`finish`)."""
        with self._cond:
            self._limit = self._begun
            return self._begun

    def finish(self, steps: int) -> None:
        """Let the exchange stage run exactly ``steps`` steps in all (the same on every member)."""
        with self._cond:
            self._limit = steps
            self._cond.notify_all()

    def drain(self) -> int:
        """Discard batches until the exchange stage has delivered its last step; returns how many."""
        drained = 0
        while True:
            with self._cond:
                last = self._limit is not None and self._done >= self._limit
            if last and self.queues["compute"].empty():
                return drained
            drained += self.discard()

    def discard(self, timeout: float = 0.05) -> int:
        """Take the next batch, if one comes within ``timeout`` seconds, and drop it; returns 1 or 0
        (raises :class:`PipelineFailed` where a stage failed)."""
        try:
            self.queues["compute"].get(timeout=timeout)
            return 1
        except queue.Empty:
            if self.failure is not None:
                self._get("compute")  # raises PipelineFailed, naming the stage
            return 0

    def close(self, timeout: float = 10.0) -> None:
        """Stop the stages; with a decode cache, free it once they have ended (collective over the
        node's members, as every member closes its pipeline)."""
        self.stop.set()
        self._running.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)
        if self.cache is not None and not any(t.is_alive() for t in self._threads):
            self.cache.free()

    def occupancy_stats(self, t0: float, t1: float) -> dict:
        return occupancy_stats(self.samples, QUEUES, self.depth, t0, t1)


def build_pipeline(comm, scheme, manifest: Manifest, preprocessing, stream, threads: int, events,
                   steps: int | None = None, reduce_groups: tuple = (), device=None):
    """One member's transport and staged pipeline for one of enspipe's schemes (not the tf.data
    service's): ``stream`` is its :class:`~enspipe.engine.config.StreamConfig`, ``preprocessing`` a
    built-in's name or a :class:`~enspipe.data.preprocessing.UserPreprocess`, ``threads`` the size
    of its preprocessing pool; ``steps`` (a measured window's length) cuts the unit to divide it;
    ``reduce_groups``: data-parallel members' ranks, whose gradients the Horovod transport also sums;
    ``device``: the torch device the torch transport exchanges on (None: host memory). Collective
    over ``comm``. Returns ``(transport, pipeline)``."""
    rank = comm.Get_rank()
    shape, dtype = output_spec(preprocessing, stream.image_size, stream.wire_dtype)
    common = (comm, scheme.groups(), shape, dtype)
    unit = 1 if stream.skip_corrupt else scheme.unit_batches(stream.batch_size, stream.block_images, steps)
    transport = make_transport(stream, *common, events=events, uses=scheme.uses(), unit=unit, device=device,
                               reduce_groups=reduce_groups)
    engine = ExchangeEngine(scheme, rank, transport, stream.batch_size, fixed_blocks=not stream.skip_corrupt,
                            unit=unit)
    seed = stream.seed + (0 if scheme.shared else rank)  # baseline members each have their own stream
    cache = None
    if stream.decode_cache:
        from mpi4py import MPI

        from enspipe.engine.decode_cache import DecodeCache

        cache = DecodeCache(MPI, comm, stream.decode_cache, manifest.num_images)
    pipeline = Pipeline(stream, manifest=manifest, engine=engine, rank=rank, preprocessing=preprocessing,
                        threads=threads, seed=seed, events=events, cache=cache, device=device)
    return transport, pipeline
