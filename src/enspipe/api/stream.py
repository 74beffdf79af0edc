"""The shared stream: what a member's own training script iterates, under ``mpiexec``/``srun`` or ``torchrun``.

Every rank of the job is one member of the ensemble. Each builds its own model, loss and optimizer;
all of them read one shuffled stream of the same global batches, whose preprocessing the scheme
splits among them (All-Shared: each member preprocesses 1/n of every batch, and an all-gather
gives every member the whole batch). A member sees every sample exactly once per epoch.

Example (every rank runs it)::

    import enspipe
    stream = enspipe.SharedStream("data/train", batch_size=64, scheme="all_shared", image_size=224)
    model.fit(stream.dataset(), epochs=5, steps_per_epoch=stream.steps_per_epoch)
    stream.close()   # waits for the other members, serving their batches meanwhile

or without Keras::

    with enspipe.SharedStream("data/train", batch_size=64) as stream:
        for epoch in range(5):
            for images, labels in stream:   # one epoch: len(stream) batches of numpy arrays
                ...

Ending: :meth:`SharedStream.close` ends this member's use of the stream; its producers go on
making its share of the batches for the members still training, until every member has closed
(so one member's early stop never starves the others), and then all stop together. An exception
inside ``with SharedStream(...)`` aborts the whole job at once (``MPI_Abort``) with the error, so
nobody waits for a member that died; a member that is lost (killed, its node gone) is noticed by
the heartbeat within ``peer_timeout`` seconds and the job aborted.
"""
from __future__ import annotations

import atexit
import math
import os
import sys
import traceback

import numpy as np

from enspipe.api.adapters import StreamAdapters
from enspipe.engine.config import MALLOC_POLICIES, StreamConfig
from enspipe.exchange.transports import TRANSPORTS, WITHOUT_MPI
from enspipe.plan.errors import ConfigError, require, unknown_keywords
from enspipe.plan.schemes import AUTO, SCHEME_KINDS, make_scheme, node_groups


class StreamClosed(RuntimeError):
    """The stream was closed: no more batches."""


class SharedStream(StreamAdapters):
    """One member's view of the ensemble's shared stream of preprocessed batches.

    ``SharedStream(data, batch_size, **options)``: ``options`` are :class:`StreamConfig`'s
    fields (``scheme``, ``preprocessors``, ``preprocess``, ``image_size``, ``seed``, ...); or
    ``SharedStream(config)`` with a :class:`StreamConfig` made beforehand. Either takes the member's
    own options:

    * ``comm``: the MPI communicator whose ranks are the members (default ``MPI.COMM_WORLD``; under
      ``torchrun``, every process torchrun started, over torch.distributed, with ``transport="torch"``);
    * ``peer_timeout``: seconds a member may go unheard before the job is aborted (default 30);
    * ``malloc``: ``"keep"`` (default) lets this process's malloc reuse freed images' pages
      instead of faulting them in afresh (see :mod:`enspipe.engine.memory`); ``"system"`` leaves it;
    * ``threads``: the preprocessing pool's size (default: this member's fair share of its host's
      cores, or ``cores``);
    * ``cores``: pin this member to K cores of its host, as ``enspipe run --cores K`` pins a
      cell's ranks: the members of a host get distinct cores while it has enough, and share them
      round-robin (oversubscribed, said on stderr) when not. Default: every core this process may
      use, shared with the host's other members, and nothing pinned;
    * ``members_per_rank``: K ensemble members in this process (Crossbow's several models per
      accelerator), each trained on every batch: the ensemble has ranks x K members, and this
      rank's are :attr:`local_members`;
    * ``log_dir``: write this member's event log there (off by default);
    * ``drop_last``: every batch whole, as a ``DataLoader``'s ``drop_last=True``: an epoch's short
      tail is left out (and counted as ``dropped`` by :meth:`epochs`).

    One pass over the stream (``for images, labels in stream``, :meth:`torch`, :meth:`jax`) is one
    epoch, every sample exactly once, in ``len(stream)`` batches, the last one short where the batch
    does not divide the dataset, as a ``DataLoader``'s are (see :mod:`enspipe.api.epochs`).

    Construction validates everything and tries a user's preprocessing on the first samples
    before any collective, raising :class:`enspipe.ConfigError` naming the culprit; then it is
    collective over ``comm`` (every member must construct its stream).

    Batches are ``(images, labels)`` numpy arrays, read-only. They stay valid for as long as you
    hold them: the exchange's buffers are pinned while referenced, and node-shared memory is
    copied out, so a kept batch never changes. With ``transport="torch", device="cuda"`` the
    batches are exchanged on the member's GPU: :meth:`torch` yields them there as tensors of the
    member's own (nothing else refers to them, so writing is safe), and numpy iteration copies them
    to host memory.
    """

    def __init__(self, data, batch_size: int | None = None, *, comm=None, peer_timeout: float = 30.0,
                 malloc: str = "keep", threads: int | None = None, cores: int | None = None,
                 log_dir: str | None = None, members_per_rank: int = 1, drop_last: bool = False, **options):
        from enspipe.exchange.torchcomm import torch_launched

        by_torch = comm is None and torch_launched()
        if isinstance(data, StreamConfig):  # the stream's options made and validated beforehand
            from enspipe.plan.errors import require

            require(batch_size is None and not options, "batch_size" if batch_size is not None else
                    sorted(options)[0] if options else "data", "a StreamConfig holds every option of the stream",
                    "pass SharedStream(config) with the member's own options (comm, threads, peer_timeout, ...), or "
                    "the dataset and keywords without a StreamConfig")
            self.config = data
        else:
            _check_keywords(options)
            if by_torch:
                options.setdefault("transport", WITHOUT_MPI)
            self.config = StreamConfig(data=data, batch_size=batch_size, **options)
        _check_member_options(peer_timeout, malloc, threads, members_per_rank, drop_last, cores)
        self.drop_last = drop_last
        if by_torch:
            _check_torch_launch(self.config)
        self.members_per_rank = members_per_rank
        self.manifest, self._preprocessing = self.config.check()  # files and user code: before any collective

        comm = (_torch_world() if by_torch else _world()) if comm is None else comm
        self._MPI = _module_of(comm)
        if self.config.scheme != AUTO:  # no collective: every rank reaches the same verdict
            make_scheme(self.config.scheme, comm.Get_size(), self.config.preprocessors, self.config.batch_size)
        self._comm, self._closed, self._log_dir = comm, False, log_dir
        _say_left_out(self.manifest, comm)
        self._start(peer_timeout, malloc, threads, cores, log_dir)
        atexit.register(self._at_exit)

    # -- what a training script reads ---------------------------------------------------------
    @property
    def num_images(self) -> int:
        """Samples in one epoch of the dataset."""
        return self.manifest.num_images

    @property
    def num_classes(self) -> int:
        """Classes of the dataset's labels (``0 .. num_classes - 1``): a classifier's outputs."""
        return self.manifest.num_classes

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch: ``ceil(num_images / batch_size)``, the last one short where the batch
        does not divide the dataset (``drop_last``: ``num_images // batch_size``, all whole)."""
        return self._epochs.steps()

    def __len__(self) -> int:
        return self.steps_per_epoch

    @property
    def member(self) -> int:
        """This member's index: its rank in ``comm`` (with ``members_per_rank`` K, the first of its K)."""
        return self._comm.Get_rank() * self.members_per_rank

    @property
    def local_members(self) -> list[int]:
        """The members this process hosts: ``[member]``, or K of them with ``members_per_rank``."""
        return list(range(self.member, self.member + self.members_per_rank))

    @property
    def members(self) -> int:
        """The ensemble's members: the ranks, times ``members_per_rank``."""
        return self._comm.Get_size() * self.members_per_rank

    @property
    def element_spec(self) -> tuple:
        """``(image shape, image dtype)`` of one preprocessed sample."""
        return self._pipeline.image_shape, self._pipeline.image_dtype

    @property
    def sample_layout(self) -> str | None:
        """One sample's layout: ``HWC`` (the built-ins', a numpy function's), ``CHW`` (a torchvision
        pipeline's), or None (not an image), read from what the preprocessing returns."""
        from enspipe.data.transforms import layout_of

        return layout_of(self._preprocessing)

    def next_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The next batch of the stream, ``(images, labels)`` (an epoch's last may be short)."""
        while True:
            images, meta, _ = self._next(keep=True)
            if len(meta):
                return images, meta[:, 3]

    def _batches(self, writable: bool, tensors: bool = False):
        """The rest of this epoch as kept ``(images, labels)``; ``writable``: as writable arrays
        (views of a buffer private to the batch, or a copy where the buffer is read-only);
        ``tensors``: images exchanged on a torch device (``device``) as those tensors, else copied
        to host numpy."""
        while True:
            images, meta, last = self._next(keep=True)
            if len(meta):
                if not (tensors and _is_tensor(images)):
                    images = _host(images)
                    if writable:
                        images = _writable(images)
                yield images, meta[:, 3]
            if last:
                return

    def _endless(self):
        while True:
            try:
                images, meta, _ = self._next(keep=False)  # tf.data copies each batch as it is yielded
            except StreamClosed:
                return
            if len(meta):
                yield _host(images), meta[:, 3]

    @property
    def _dataset_batch(self) -> int | None:
        whole = self.drop_last or (self.num_images % self.config.batch_size == 0 and not self.config.skip_corrupt)
        return self.config.batch_size if whole else None

    # -- ending -------------------------------------------------------------------------------
    def close(self) -> None:
        """End this member's use of the stream. Until every member has closed, this member's
        producers keep making its share of the batches for the others (what reaches it is
        discarded); then all stop together. Raises :class:`enspipe.DataError` if an epoch this
        member completed lacked samples (unless ``skip_corrupt`` skipped them)."""
        if self._closed:
            return
        self._closed = True
        from enspipe.exchange.base import allreduce_quietly, wait_quietly

        if self.scheme.steps:  # the others need this member's share of their batches until they are done
            everyone = self._control.Ibarrier()
            while not everyone.Test():
                self._pipeline.discard()  # what reaches this member
            self._pipeline.finish(allreduce_quietly(self._control, self._pipeline.freeze(), self._MPI.MAX))
            self._pipeline.drain()
            self._pipeline.close()
        else:  # nobody depends on this member's pipeline: stop it now, then wait for the others asleep
            self._pipeline.close()
            wait_quietly([self._control.Ibarrier()])
        self._transport.close()
        self._heartbeat.finish(self._control.Barrier)
        self._control.Free()
        self._events.close()
        short = [e for e in self.epochs() if e["missing"]]
        if short and not self.config.skip_corrupt:  # (skipped records are missing by design: epochs() counts them)
            from enspipe.data.manifest import DataError

            raise DataError(f"member {self.member}: epochs {[e['epoch'] for e in short]} lacked samples "
                            f"({[e['missing'] for e in short]} missing): the data changed under its manifest")

    def __enter__(self) -> "SharedStream":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
        elif not self._closed:
            self._abort(f"member {self.member} failed: {kind.__name__}: {value}",
                        "".join(traceback.format_exception(kind, value, tb)))

    # -- internals ----------------------------------------------------------------------------
    def _start(self, peer_timeout: float, malloc: str, threads: int | None, cores: int | None,
               log_dir: str | None) -> None:
        """The member set up as a cell's rank is (:class:`enspipe.engine.member.MemberBuilder`)."""
        from enspipe.api.epochs import EpochBatches
        from enspipe.engine.member import MemberBuilder
        from enspipe.exchange.engine import BufferRing

        comm, cfg = self._comm, self.config
        build = MemberBuilder(comm, self._MPI, cores=cores, malloc=malloc)  # collective: hosts, nodes, cores
        self.malloc, self.placement = build.malloc, build.where
        self.affinity = build.pin() if cores is not None else sorted(os.sched_getaffinity(0))
        threads = build.threads(threads, "threads=")
        _agree(comm, cfg)
        self.device = _exchange_device(cfg, build.where)
        nodes = node_groups(comm.allgather(build.where.mpi_node))
        self.planned = _plan(cfg, comm, build.where, len(nodes)) if cfg.scheme == AUTO else None
        scheme, p = (self.planned["scheme"], self.planned["p"]) if self.planned else (cfg.scheme, cfg.preprocessors)
        self.scheme = make_scheme(scheme, comm.Get_size(), p if SCHEME_KINDS[scheme].takes_p else None,
                                  cfg.batch_size, nodes)
        self._control = comm.Dup()  # ending together, apart from the exchange's communicators
        self._heartbeat = build.heartbeat(peer_timeout, on_loss=lambda peer, silent: self._abort(
            f"member {self.member}: member {peer} silent for {silent:.0f} s, lost (its process or node died)"),
            on_stall=lambda seconds: self._abort(
                f"member {self.member}: closing took over {seconds:.0f} s with every member alive (each thread's "
                "stack is in its log)"))
        self._events = _events(log_dir, comm.Get_rank())
        self._transport, self._pipeline, self._ledger = build.pipeline(
            self.scheme, self.manifest, self._preprocessing, cfg, threads, self._events, drop_last=self.drop_last,
            device=self.device)
        shape, dtype = self.element_spec
        ring = BufferRing(2, cfg.batch_size, shape, dtype)  # node-shared batches copied out, batches assembled
        self._epochs = EpochBatches(self._fetch, cfg.batch_size, self.manifest.num_images, ring, self._ledger,
                                    self.drop_last, counted=not cfg.skip_corrupt)
        self._pipeline.start()

    def _fetch(self) -> tuple:
        """The pipeline's next global batch: ``(images, meta, volatile)``."""
        from enspipe.engine.pipeline import Stopped

        try:
            batch = self._pipeline.next_batch()
        except Stopped:
            raise StreamClosed("the stream is closed") from None
        return batch.images, batch.meta, batch.volatile

    def _next(self, keep: bool) -> tuple:
        """The epoch's next batch as read-only arrays (:class:`~enspipe.api.epochs.EpochBatches`)
        and whether it ends the epoch; ``keep``: valid for as long as it is held (a batch in
        node-shared memory is copied out), else only until the next. A tensor on the exchange's
        device is this member's own."""
        if self._closed:
            raise StreamClosed("the stream is closed")
        images, meta, last = self._epochs.next(keep)
        meta = meta.view()
        meta.flags.writeable = False
        if not _is_tensor(images):
            images = images.view()
            images.flags.writeable = False
        return images, meta, last

    def _abort(self, reason: str, tb: str = "") -> None:
        """Say why (on stderr, and in ``log_dir`` when there is one), then end the whole job."""
        from enspipe.engine.member import fail_job

        fail_job(self._comm, f"enspipe: error: {reason}; aborting the job so that no member waits for this one",
                 directory=self._log_dir, rank=self._comm.Get_rank(), tb=tb, echo_tb=True,
                 heartbeat=getattr(self, "_heartbeat", None))

    def _at_exit(self) -> None:
        if not self._closed:
            try:
                self.close()
            except Exception as e:  # noqa: BLE001 - at exit: say it, take the job down
                self._abort(f"member {self.member}: closing the stream at exit failed: {type(e).__name__}: {e}")


def _is_tensor(a) -> bool:
    return not isinstance(a, np.ndarray)


def _host(a) -> np.ndarray:
    """``a`` as a read-only numpy array: itself, or a torch tensor's copy in host memory (a view
    of a CPU tensor's)."""
    if not _is_tensor(a):
        return a
    out = a.cpu().numpy()
    out.flags.writeable = False
    return out


def _exchange_device(cfg: StreamConfig, where):
    """The torch device this member exchanges on (None: host memory): ``cfg.device``, with
    ``cuda`` resolved to the member's own GPU by its rank on its host."""
    if cfg.device is None:
        return None
    from enspipe.exchange.torchdist import member_device

    return member_device(cfg.device, where.host_rank)


def _writable(a: np.ndarray) -> np.ndarray:
    """A writable view of a kept batch's array (its buffer is the batch's own: a copy out of
    node-shared memory, or an exchange buffer pinned while referenced), or a copy."""
    view = a.view()
    try:
        view.flags.writeable = True
    except ValueError:  # a base that is itself read-only
        return a.copy()
    return view


AGREED = {  # what every member must share, and how to make them agree
    "backend": "pass the same backend= to every member, or install TensorFlow on every node or on none",
    "transport": "pass the same transport= to every member (torchrun's members take torch by default)",
    "preprocess": "pass every member the same preprocess= (a built-in's name, or the same function)"}


def _agree(comm, cfg: StreamConfig) -> None:
    """Every member preprocesses with one backend and preprocessing, and exchanges over one transport
    (collective, at the first exchange; the same verdict on every rank)."""
    from enspipe.data.transforms import name_of

    pre = cfg.preprocess if isinstance(cfg.preprocess, str) else name_of(cfg.preprocess)
    mine = {"backend": cfg.backend, "transport": cfg.transport, "preprocess": pre}
    everyone = comm.allgather(mine)
    for field, fix in AGREED.items():
        values = [m[field] for m in everyone]
        if len(set(values)) > 1:
            ranks = {v: [r for r, x in enumerate(values) if x == v] for v in sorted(set(values))}
            raise ConfigError(field, f"the members resolved different values ({ranks}, by member): a shuffled "
                              "stream's batches would differ between them", fix)


def _check_torch_launch(cfg: StreamConfig) -> None:
    """A member that torchrun launched has no MPI world: the torch transport, no MPI-only option."""
    require(not TRANSPORTS[cfg.transport].mpi_world, "transport", f"torchrun launched this member, so there is no "
            f"MPI world for the {cfg.transport} transport", f"leave transport out ({WITHOUT_MPI}), or launch with "
            "mpiexec or srun")
    require(not cfg.decode_cache, "decode_cache", "the decode cache is MPI's node-shared windows, and torchrun "
            "launched this member", "leave decode_cache out, or launch with mpiexec or srun")


def _plan(cfg: StreamConfig, comm, where, nodes: int) -> dict:
    """``scheme="auto"``: the cost model's choice for these members on their placement (collective)."""
    from enspipe.plan.planner import choose_together

    return choose_together(comm, nodes, where.host_cpus, cfg.calibration, cfg.network, batch=cfg.batch_size,
                           image_size=cfg.image_size, rc=cfg.accelerator_rate, core_limit=None,
                           wire_dtype=cfg.wire_dtype, node_shm=cfg.node_shm, comm_json=cfg.plan_comm,
                           block_images=cfg.block_images)


def _say_left_out(manifest, comm) -> None:
    """On the first rank: the files of the dataset's folder that were left out, and where they are listed."""
    from enspipe.data.manifest import accounting_note

    note = accounting_note(manifest)
    if note and comm.Get_rank() == 0:
        print(f"enspipe: {note}", file=sys.stderr, flush=True)


def _check_keywords(options: dict) -> None:
    """``SharedStream``'s keywords beyond its own are :class:`StreamConfig`'s: any other name is a
    ConfigError listing them, with the nearest (a ``DataLoader``'s names mapped to ours)."""
    import dataclasses

    own = ("comm", "peer_timeout", "malloc", "threads", "cores", "log_dir", "members_per_rank", "drop_last")
    known = {f.name for f in dataclasses.fields(StreamConfig)} - {"data", "batch_size"} | set(own)
    unknown_keywords(options, known, "SharedStream", DATALOADER_NAMES)


# a DataLoader's (and DistributedSampler's) keywords, and the nearest of SharedStream's
DATALOADER_NAMES = {"num_workers": "threads", "shuffle": "shuffle_buffer", "transform": "preprocess",
                    "transforms": "preprocess", "prefetch_factor": "queue_depth", "num_replicas": "comm"}


def _check_member_options(peer_timeout, malloc, threads, members_per_rank, drop_last=False, cores=None) -> None:
    require(isinstance(peer_timeout, (int, float)) and math.isfinite(peer_timeout) and peer_timeout > 0,
            "peer_timeout", f"must be a positive number of seconds, got {peer_timeout!r}", "pass e.g. 30")
    require(malloc in MALLOC_POLICIES, "malloc", f"unknown policy {malloc!r}", f"choose {' or '.join(MALLOC_POLICIES)}")
    for name, value in (("threads", threads), ("cores", cores)):
        require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1), name,
                f"must be a positive integer, got {value!r}", f"pass {name}=K, or leave it out")
    require(isinstance(members_per_rank, int) and members_per_rank >= 1, "members_per_rank",
            f"must be a positive integer, got {members_per_rank!r}", "pass K >= 1 members per process")
    require(isinstance(drop_last, bool), "drop_last", f"must be True or False, got {drop_last!r}",
            "pass drop_last=True for whole batches only")


def _mpi():
    from mpi4py import MPI

    return MPI


def _world():
    return _mpi().COMM_WORLD


def _torch_world():
    from enspipe.exchange.torchcomm import TorchComm

    return TorchComm.world()


def _module_of(comm):
    """mpi4py's ``MPI`` module, or its stand-in for a communicator over torch.distributed."""
    from enspipe.exchange import torchcomm

    return torchcomm.MPI if isinstance(comm, torchcomm.TorchComm) else _mpi()


def _events(log_dir: str | None, rank: int):
    from enspipe.common.events import EventLog, NullEvents

    if log_dir is None:
        return NullEvents()
    os.makedirs(log_dir, exist_ok=True)
    return EventLog(log_dir, rank)

