"""The peer arm: TensorFlow's tf.data service with ephemeral data sharing, run as an enspipe cell.

This is the answer TensorFlow ships for "several trainers, one preprocessed stream": a dispatcher,
workers that run the input pipeline's graph, and trainers that read one shared job through the
workers' cross-trainer cache (``distribute(..., job_name=..., cross_trainer_cache=
CrossTrainerCache(trainer_id))``). Here it runs inside the same MPI job as enspipe's schemes, so the
workflow, the monitors and the tables treat it as one more scheme (``tfdata_service``):

* member 0 hosts the dispatcher; members 0..P-1 each host a worker (in-process gRPC servers, on
  the member's pinned cores); member 0 registers the dataset once and every member learns its id;
* every member is a trainer: a client thread reads the job with its own trainer id into the same
  bounded hand-off queue an enspipe pipeline fills, and the member's consumer takes batches from it.

The graph the workers run reads, parses and preprocesses with enspipe's own functions
(:func:`enspipe.data.shards.sample_stream` read in the graph, :func:`enspipe.data.shards.load_samples`,
:func:`enspipe.engine.backends.tf.element_fn`), at the same batch, image size and wire type. The
cross-trainer cache needs ``ShardingPolicy.OFF``: every worker processes the whole stream. With one
worker it is enspipe's stream, the same order and augmentation seeds, so its batches equal
All-Shared's bit for bit while no member lags. With P > 1 workers, each draws its own order and
augmentation seed when it starts (with one seed they would all make the same batches), and a member
reads from them in turn, so within an epoch's length it sees some samples twice and misses others.
A member that falls further behind than a worker's cache holds skips elements: the service delivers
each element at most once per trainer, not exactly once. :class:`enspipe.data.ledger.DeliveryCounter`
counts both, the same way for every arm.
"""
from __future__ import annotations

import queue
import socket
import threading
import time

import tensorflow as tf

from enspipe.common import keys
from enspipe.data.shards import load_samples, sample_stream
from enspipe.exchange.base import Batch, TransportStats, wait_quietly
from enspipe.measure.stages import StageClock
from enspipe.measure.threadcpu import set_thread_name
from enspipe.engine.backends.tf import element_fn
from enspipe.engine.pipeline import PipelineFailed, occupancy_stats, put_until_stopped

JOB = "enspipe"
QUEUES = ("compute",)  # the only queue on this side: the service's elements, waiting for the consumer
REGISTER_TIMEOUT = 60.0  # seconds for every worker to register with the dispatcher


def service_dataset(manifest, cfg, preprocessing: str, threads: int, workers: int) -> tf.data.Dataset:
    """The graph each worker runs: the sample stream read in the graph, parsed, preprocessed one
    image at a time on ``threads`` threads and batched, each element ``(images, meta, stream)``
    (``stream`` tells one worker's elements from another's; 0 with one worker)."""
    batch, size = cfg.global_batch, cfg.stream.image_size

    def stream(salt, seed):
        one = element_fn(preprocessing, size, cfg.preprocess.fast_mode, cfg.stream.wire_dtype, seed,
                         cfg.preprocess.preprocess_impl)
        samples = sample_stream(manifest, seed, cfg.stream.shuffle_buffer, in_graph=True).batch(batch)
        samples = samples.map(lambda b: load_samples(manifest.kind, b)).flat_map(tf.data.Dataset.from_tensor_slices)
        images = samples.map(one, num_parallel_calls=threads, deterministic=True).batch(batch, drop_remainder=True)
        return images.map(lambda x, meta: (x, meta, salt))

    if workers == 1:  # enspipe's stream itself
        ds = stream(tf.constant(0, tf.int64), tf.constant(cfg.stream.seed, tf.int64))
    else:  # each worker its own order and augmentation: seed=None draws a new one per worker
        ds = tf.data.Dataset.random(seed=None).take(1).flat_map(
            lambda r: stream(r % (2**31 - 1) + 1, r % (2**31 - 1)))
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    opts.threading.max_intra_op_parallelism = 1
    opts.deterministic = True
    opts.autotune.enabled = False  # parallelism is explicit, as in enspipe's pipelines
    return ds.with_options(opts)


def element_spec(cfg) -> tuple:
    wire = tf.uint8 if cfg.stream.wire_dtype == "uint8" else tf.float32
    b, s = cfg.global_batch, cfg.stream.image_size
    return (tf.TensorSpec([b, s, s, 3], wire), tf.TensorSpec([b, 4], tf.int64), tf.TensorSpec([], tf.int64))


class TfDataService:
    """The service's servers on this member (dispatcher on member 0, a worker on members below P)
    and the job's coordinates; in the member's ``transport`` slot: ``stats`` counts what its
    client received from the service and the time it waited for it."""

    name = "tf.data service (gRPC)"

    def __init__(self, comm, scheme, cfg, manifest, preprocessing: str, threads: int, events):
        from tensorflow.core.protobuf import service_config_pb2

        svc = tf.data.experimental.service
        self.comm, self.cfg, self.events = comm, cfg, events
        rank = comm.Get_rank()
        self.stats = TransportStats()
        self.workers = scheme.p
        hosts = comm.allgather(socket.gethostname())
        host = "localhost" if len(set(hosts)) == 1 else hosts[rank]  # one host: no name lookup needed
        self.dispatcher = self.worker = None
        address = None
        if rank == 0:
            self.dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0, protocol="grpc"))
            address = f"{host}:{self.dispatcher.target.rsplit(':', 1)[1]}"
        self.address = comm.bcast(address, root=0)
        if rank in scheme.preprocessors:
            self.worker = svc.WorkerServer(service_config_pb2.WorkerConfig(
                dispatcher_address=self.address, worker_address=f"{host}:%port%", port=0, protocol="grpc",
                heartbeat_interval_ms=1000, dispatcher_timeout_ms=60_000,
                cross_trainer_cache_size_bytes=cfg.service.tfdata_cache_mb << 20))
        dataset_id = None
        if rank == 0:
            deadline = time.monotonic() + REGISTER_TIMEOUT
            while self.dispatcher._num_workers() < scheme.p:  # noqa: SLF001 - no public count
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {self.dispatcher._num_workers()} of {scheme.p} tf.data service "  # noqa: SLF001
                                       f"workers registered with the dispatcher at {self.address} in "
                                       f"{REGISTER_TIMEOUT:.0f} s")
                time.sleep(0.05)
            ds = service_dataset(manifest, cfg, preprocessing, threads, scheme.p)
            compression = None if cfg.service.tfdata_compression == "none" else cfg.service.tfdata_compression
            dataset_id = svc.register_dataset(f"grpc://{self.address}", ds, compression=compression).numpy()
        self.dataset_id = comm.bcast(dataset_id, root=0)
        events.log(keys.SERVICE, dispatcher=self.address, dataset_id=self.dataset_id.decode(), workers=scheme.p,
                   worker=self.worker is not None, cache_mb=cfg.service.tfdata_cache_mb,
                   compression=cfg.service.tfdata_compression,
                   sharding="OFF", job=JOB)

    @property
    def paths(self) -> dict:
        return {tuple(range(self.comm.Get_size())): "tf.data service (gRPC)"}

    def describe(self) -> dict:
        return {"dispatcher": self.address, "dataset_id": self.dataset_id.decode(), "workers": self.workers,
                "cache_mb": self.cfg.service.tfdata_cache_mb, "compression": self.cfg.service.tfdata_compression,
                "sharding": "OFF",
                "orders": "enspipe's stream (one worker)" if self.workers == 1 else
                          "one per worker, drawn at its start (ShardingPolicy.OFF: each worker streams the whole dataset)"}

    def dataset(self, trainer_id: str) -> tf.data.Dataset:
        svc = tf.data.experimental.service
        return svc.from_dataset_id(processing_mode=svc.ShardingPolicy.OFF, service=f"grpc://{self.address}",
                                   dataset_id=self.dataset_id, element_spec=element_spec(self.cfg), job_name=JOB,
                                   cross_trainer_cache=svc.CrossTrainerCache(trainer_id=trainer_id),
                                   target_workers="ANY")  # every worker, not only one in this process

    def close(self) -> None:
        """Stop the servers once every member has stopped reading (a worker must outlive its readers)."""
        wait_quietly([self.comm.Ibarrier()])
        if self.worker is not None:
            self.worker.stop()
        wait_quietly([self.comm.Ibarrier()])
        if self.dispatcher is not None:
            self.dispatcher.stop()


class ServicePipeline:
    """A member's side of the service, in the place of :class:`enspipe.engine.pipeline.Pipeline`: a
    client thread reads the shared job as trainer ``member<rank>`` into a bounded hand-off queue.
    Nothing here preprocesses (the workers do, in their own threads), so ``preprocessed`` is None;
    stopping needs no agreement between members (there are no collectives to match)."""

    unit = 1  # batches per element the client takes

    def __init__(self, service: TfDataService, rank: int, queue_depth: int, sample_interval: float, events):
        self.service, self.rank, self.depth = service, rank, queue_depth
        self.sample_interval, self.events = sample_interval, events
        self.queues = {"compute": queue.Queue(queue_depth)}
        self.stop = threading.Event()
        self.failure: tuple[str, BaseException] | None = None
        self.samples: list[tuple] = []
        self.clock = StageClock()
        self.preprocessed = None
        self._threads: list[threading.Thread] = []

    def _fetch(self) -> None:
        set_thread_name("enspipe-service")
        stats = self.service.stats
        try:
            it = iter(self.service.dataset(f"member{self.rank}"))
            while not self.stop.is_set():
                t, c = time.perf_counter(), time.thread_time()
                images, meta, stream = next(it)
                batch = Batch(images.numpy(), meta.numpy(), int(stream))
                stats.collective_seconds += time.perf_counter() - t
                stats.collective_cpu_seconds += time.thread_time() - c
                stats.collectives += 1
                stats.bytes_received += batch.nbytes
                put_until_stopped(self.queues["compute"], batch, self.stop)
        except BaseException as e:  # noqa: BLE001 - every failure must reach the consumer
            if not self.stop.is_set():
                self.failure = ("service client", e)
            self.stop.set()

    def _sample(self) -> None:
        set_thread_name("enspipe-sampler")
        while not self.stop.wait(self.sample_interval):
            size = self.queues["compute"].qsize()
            self.samples.append((time.time(), size))
            self.events.log(keys.OCCUPANCY, compute=size, capacity=self.depth)

    def start(self) -> None:
        for name, fn in (("enspipe-service", self._fetch), ("enspipe-sampler", self._sample)):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def next_batch(self) -> Batch:
        while True:
            if self.failure is not None:
                stage, exc = self.failure
                raise PipelineFailed(f"{stage} failed: {type(exc).__name__}: {exc}") from exc
            try:
                return self.queues["compute"].get(timeout=0.2)
            except queue.Empty:
                continue

    def occupancy(self) -> dict:
        return {"compute": self.queues["compute"].qsize()}

    def saturated(self) -> bool:
        return self.queues["compute"].qsize() >= self.depth

    def skipped(self, batches: int) -> dict:
        return {}  # corrupt records cannot be skipped and counted in the service's graph (refused up front)

    def decodes(self) -> None:
        return None  # the tf.data service's workers decode, in their own processes

    def pause(self) -> None:
        pass  # the service's workers run on; a member only reads what they made

    def resume(self) -> None:
        pass

    def freeze(self) -> int:
        return 0

    def finish(self, steps: int) -> None:
        pass

    def drain(self) -> int:
        drained = 0
        while True:
            try:
                self.queues["compute"].get_nowait()
                drained += 1
            except queue.Empty:
                return drained

    def close(self, timeout: float = 10.0) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout)

    def occupancy_stats(self, t0: float, t1: float) -> dict:
        return occupancy_stats(self.samples, QUEUES, self.depth, t0, t1)

