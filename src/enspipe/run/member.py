"""The per-cell program: one ensemble member per MPI rank, run under ``mpiexec``/``srun``.

Each rank finds its place (host, cores) and pins itself, builds its pipeline and consumer, and
then, read top to bottom in :func:`_run_member`:

1. warm-up: unmeasured steps until every member's pipeline is in its steady state (at least
   ``--warmup`` steps; decided together, so every member opens its window at the same step,
   then as many as draw down what waiting there stocked);
2. the measured window: ``--steps`` steps, the producers running throughout;
3. the producers stop together and what they made beyond the window is discarded;
4. rank 0 gathers the per-rank reports and the node monitors' integrals and writes
   ``summary.json``, last and atomically.

Any failure on any rank aborts the whole job (``MPI_Abort``) after logging it, so a job never
hangs and never leaves a summary that looks complete.
"""
from __future__ import annotations

import collections
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from enspipe.plan.errors import ConfigError
from enspipe.plan.config import RunConfig, plain_name
from enspipe.plan.grid import Cell
from enspipe.plan.schemes import AUTO, SCHEME_KINDS, make_scheme, node_groups
from enspipe.common import keys

SUMMARY = "summary.json"
FAILED_SUMMARY = "summary.failed.json"  # a finished cell that broke its exactly-once promise


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"enspipe: {msg}", flush=True)


def _percentile(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def run(cfg: RunConfig) -> int:
    from enspipe.common.liveness import die_with_launcher

    die_with_launcher()  # a lost node's members must not run on as orphans
    reap_killed_jobs_segments()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    try:
        if cfg.scheme == AUTO:
            cfg = _planned(cfg, comm)
        scheme = make_scheme(cfg.scheme, n, cfg.preprocessors, cfg.global_batch)
        _check_members(cfg, n)
    except ConfigError as e:  # every rank reaches the same verdict: no collective needed
        if rank == 0:
            print(f"enspipe run: error: {e}", file=sys.stderr, flush=True)
        return 2

    return _run_guarded(cfg, comm, scheme)


def reap_killed_jobs_segments() -> None:
    """Before MPI starts: free /dev/shm of the segments killed jobs left (see
    :func:`enspipe.exchange.shm.reap_orphans`), saying so."""
    from enspipe.exchange.shm import reap_orphans

    count, size = reap_orphans()
    if count:
        print(f"enspipe: removed {count} orphaned MPICH shared-memory segments ({size / 2**20:.0f} MiB) from "
              "/dev/shm, left by jobs that were killed", file=sys.stderr, flush=True)


def run_on(cfg: RunConfig, comm) -> int:
    """One rank of a cell on ``comm``, a communicator inside a longer MPI job whose ranks run one
    cell after another (``enspipe ensemble --in-job``: TensorFlow and MPI start once, not per
    cell). Raises :class:`ConfigError` as :func:`run` would exit 2; a failed rank aborts the job."""
    scheme = make_scheme(cfg.scheme, comm.Get_size(), cfg.preprocessors, cfg.global_batch)
    _check_members(cfg, comm.Get_size())
    return _run_guarded(cfg, comm, scheme)


def _run_guarded(cfg: RunConfig, comm, scheme) -> int:
    rank = comm.Get_rank()
    progress = {"rank": rank, "stage": "setup", "step": None}
    try:
        return _run_member(cfg, comm, scheme, progress)
    except BaseException as e:  # noqa: BLE001 - a failed rank takes the job down, fast
        _fail(cfg, comm, progress, f"rank {rank} failed: {type(e).__name__}: {e}", traceback.format_exc())
        return 1


def _check_members(cfg: RunConfig, n: int) -> None:
    """The options that name members, against the ``n`` ranks launched (data-parallel members
    are several ranks each); raises :class:`ConfigError`."""
    from enspipe.data.manifest import read_manifest

    members = cfg.members(n)
    for name, values in (("member_rates", cfg.member_rates), ("member_epochs", cfg.member_epochs),
                         ("member_networks", cfg.member_networks), ("member_names", cfg.member_names),
                         ("member_patience", cfg.member_patience),
                         ("member_batch_multipliers", cfg.member_batch_multipliers)):
        if values is not None and len(values) not in ({1, members} if name in (
                "member_epochs", "member_patience", "member_batch_multipliers") else {members}):
            raise ConfigError(name, f"{len(values)} values for {members} members",
                              f"pass one per member ({members}: the ranks over --data-parallel, times --members-per-rank)")
    if cfg.member_names is not None:
        bad = [x for x in cfg.member_names if not plain_name(x)]
        if bad or len(set(cfg.member_names)) != len(cfg.member_names):
            raise ConfigError("member_names", f"names must be distinct and of letters, digits, '-', '_' and '.', got "
                              f"{list(cfg.member_names)}", "name each member once, e.g. a,b,c")
    if cfg.slow_member is not None and cfg.slow_member[0] >= members:
        raise ConfigError("slow_member", f"there is no member {cfg.slow_member[0]} among {members}",
                          f"pass a member below {members}")
    if cfg.checkpoint_dir is not None:  # a member resumes from its checkpoint, never silently from scratch
        from enspipe.run import checkpoint

        for m in range(members):
            problem = checkpoint.problem(cfg.checkpoint_dir, cfg.name_of(m),
                                         cfg.network_for(m) if cfg.consumer == "train" else None)
            if problem:
                raise ConfigError("checkpoint_dir", problem, "restore it, or remove it to start the member over")
    if cfg.member_epochs is not None:  # members leave at an epoch's end: it must end on a batch's
        images = read_manifest(cfg.data).num_images
        if images % cfg.global_batch:
            raise ConfigError("member_epochs", f"the dataset's {images} images are not a whole number of "
                              f"batches of {cfg.global_batch}, so an epoch ends inside a batch",
                              "pick a --batch-size that divides it (or a dataset of a multiple of the batch)")
        spe = images // cfg.global_batch
        uneven = [cfg.batch_multiplier_for(m) for m in range(members) if spe % cfg.batch_multiplier_for(m)]
        if uneven:  # a checkpoint at an epoch's end must not hold half an update
            raise ConfigError("member_batch_multipliers", f"{uneven} do not divide an epoch's {spe} batches",
                              f"pick multipliers that divide {spe}")


def _planned(cfg: RunConfig, comm) -> RunConfig:
    """``--scheme auto``: the cost model's choice of scheme and P for these members on this
    placement (their hosts' cores, their nodes), from the calibration; rank 0 decides, every rank
    runs it. Raises :class:`ConfigError` (exit 2) where the calibration cannot give a plan."""
    import dataclasses

    from mpi4py import MPI

    from enspipe.plan.planner import choose
    from enspipe.run.placement import place

    where = place(comm, MPI, cfg.cores)
    nodes = len(set(comm.allgather(where.mpi_node)))
    choice = None
    if comm.Get_rank() == 0:
        try:
            choice = choose(cfg.calibration, cfg.network, comm.Get_size(), nodes, where.host_cpus,
                            batch=cfg.global_batch, image_size=cfg.image_size,
                            rc=cfg.rate if cfg.consumer == "emulated" else None, core_limit=cfg.cores,
                            wire_dtype=cfg.wire_dtype, node_shm=cfg.node_shm, comm_json=cfg.plan_comm,
                            block_images=cfg.block_images)
        except ConfigError as e:
            choice = {"error": [e.field, e.problem, e.fix]}
    choice = comm.bcast(choice, root=0)
    if "error" in choice:
        raise ConfigError(*choice["error"])
    takes_p = SCHEME_KINDS[choice["scheme"]].takes_p
    _say(comm.Get_rank(), f"scheme auto: the plan runs {choice['scheme']}" + (f" P={choice['p']}" if takes_p else "")
         + f" (predicted {choice['predicted']['images_per_second']:.0f} images/s per member, "
         f"{choice['predicted']['bound']}-bound)")
    return dataclasses.replace(cfg, scheme=choice["scheme"], preprocessors=choice["p"] if takes_p else None,
                               planned=choice)


def _fail(cfg: RunConfig, comm, progress: dict, reason: str, tb: str = "") -> None:
    """Leave why next to the event logs and end the whole job: ``error.rankNNNN.txt`` (with the
    traceback) and ``failed.rankNNNN.json`` (where the rank got to), then ``MPI_Abort``."""
    from enspipe.common.atomic import write_json_atomic

    rank = progress["rank"]
    print(f"enspipe: error: {reason}", file=sys.stderr, flush=True)
    try:
        os.makedirs(cfg.out, exist_ok=True)
        with open(os.path.join(cfg.out, f"error.rank{rank:04d}.txt"), "w") as f:
            f.write(reason + "\n\n" + tb)
        write_json_atomic(os.path.join(cfg.out, f"failed.rank{rank:04d}.json"),
                          {**progress, "reason": reason, "time": time.time(), "config": cfg.to_dict()})
    except OSError:
        pass
    comm.Abort(1)


def _run_member(cfg: RunConfig, comm, scheme, progress: dict) -> int:
    """One rank of a cell, top to bottom: set up, warm up, measure, stop, report."""
    job = _setup(cfg, comm, scheme, progress)  # placed, pinned, logging, the pipeline built
    job.pipeline.start()
    progress["stage"] = "warm-up"
    warm = _warm_up(cfg, comm, job.member)  # until every pipeline is in its steady state
    window = _measure(job, warm)  # cfg.steps steps, the producers running throughout
    progress["stage"] = "stopping the producers"
    discarded = _stop(job)  # together (their collectives must match), discarding what is left
    progress["stage"] = "report"
    report = _rank_report(job, window, warm.steps, discarded)
    return _job_report(job, report, window, warm)  # rank 0 writes the summary, last


@dataclass
class _Job:
    """What one rank's run holds between its phases."""

    cfg: RunConfig
    comm: object
    scheme: object
    progress: dict
    where: object           # enspipe.run.placement.Placement
    affinity: list[int]
    monitor: object         # the node's CPU monitor, on each host's first rank
    heartbeat: object
    events: object
    manifest: object
    preprocessing: str
    transport: object
    pipeline: object
    consumer: object
    member: "_Member"
    slurm: object           # the job step's energy counter, on rank 0 inside Slurm
    started: float
    malloc: str             # the malloc policy in force (enspipe.run.memory)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def n(self) -> int:
        return self.comm.Get_size()


@dataclass
class _Window:
    """The measured window's readings, from its start to its end."""

    seconds: float
    cpu_seconds: float
    wall: tuple[float, float]
    thread_cpu: dict
    preprocessed: int | None
    clocks: tuple[dict, dict]
    exchange: dict
    slurm_joules: tuple[float | None, float | None]
    steps: int          # measured steps (fewer than --steps when --stop-below ended the run early)
    stopped_early: bool


def _setup(cfg: RunConfig, comm, scheme, progress: dict) -> _Job:
    """Place and pin this rank, start the node monitor and the heartbeat, clear an earlier run's
    results, and build the transport, the pipeline and the consumer."""
    from mpi4py import MPI

    from enspipe.common.liveness import Heartbeat
    from enspipe.run.affinity import configure_tensorflow_threads, pin_process
    from enspipe.run.memory import set_malloc
    from enspipe.run.placement import place

    rank, n = comm.Get_rank(), comm.Get_size()
    where = place(comm, MPI, cfg.cores)
    # the plan again, now that the node layout is known (validated already, on one node)
    scheme = make_scheme(cfg.scheme, n, cfg.preprocessors, cfg.global_batch,
                         node_groups(comm.allgather(where.mpi_node)))
    os.makedirs(cfg.out, exist_ok=True)
    monitor = _start_node_monitor(cfg, where.host) if where.host_rank == 0 else None  # before pinning
    affinity = pin_process(where.cores)
    malloc = set_malloc(cfg.malloc)  # before TensorFlow allocates
    configure_tensorflow_threads(where.threads)  # imports TensorFlow, after the pools' sizes are known

    heartbeat = Heartbeat(comm, on_loss=lambda peer, silent: _fail(  # after TensorFlow's import holds the GIL
        cfg, comm, progress, f"rank {rank}: rank {peer} silent for {silent:.0f} s, lost (its node or process died)"),
        timeout=cfg.peer_timeout).start()
    from enspipe.common.events import EventLog
    from enspipe.data.ledger import DeliveryCounter, EpochLedger
    from enspipe.data.manifest import DataError
    from enspipe.data.shards import load_manifest, verify_digest
    from enspipe.models.networks import network_spec
    from enspipe.run.consumers import make_consumers
    from enspipe.run.pipeline import quantizer

    if rank == 0:  # a rerun must not leave an old summary or an old failure looking like its result
        for old in [SUMMARY, FAILED_SUMMARY, *(f for f in os.listdir(cfg.out) if f.startswith(("failed.rank", "error.rank")))]:
            if os.path.exists(os.path.join(cfg.out, old)):
                os.remove(os.path.join(cfg.out, old))
    comm.Barrier()
    events = EventLog(cfg.out, rank)
    preprocessing = network_spec(cfg.network).preprocessing
    manifest = load_manifest(cfg.data)
    problem = verify_digest(manifest)  # the count and the shards were checked before MPI started
    if problem:
        raise DataError(problem)
    events.log(keys.CONFIG, config=cfg.to_dict(), scheme=scheme.name, n=n, p=scheme.p, role=scheme.role(rank),
               host=where.host, host_rank=where.host_rank, mpi_node=where.mpi_node, cores=affinity,
               sharing_cores=where.sharing_cores, threads=where.threads, placement=where.as_dict(), malloc=malloc,
               preprocessing=preprocessing, share=scheme.share(rank, cfg.global_batch),
               dataset={"path": os.path.abspath(cfg.data), "num_images": manifest.num_images,
                        "digest": manifest.digest, "synthetic": manifest.synthetic})
    _say(rank, f"{scheme.name} n={n} p={scheme.p} {cfg.network} batch={cfg.global_batch} "
               f"{cfg.consumer}{' (emulated accelerator)' if cfg.consumer == 'emulated' else ''} "
               f"steps={cfg.warmup}+{cfg.steps} cores={cfg.cores or 'all'} {cfg.image_size}px"
               f"{' OVERSUBSCRIBED' if where.oversubscribed else ''} -> {cfg.out}")

    if scheme.service:  # the peer: TensorFlow's tf.data service delivers the batches
        from enspipe.run.service import ServicePipeline, TfDataService

        transport = TfDataService(comm, scheme, cfg, manifest, preprocessing, where.threads, events)
        pipeline = ServicePipeline(transport, rank, cfg.queue_depth, cfg.sample_interval, events)
    else:
        transport, pipeline = _enspipe_pipeline(cfg, comm, scheme, manifest, preprocessing, where, events)
    dequantize = quantizer(preprocessing)[1] if cfg.wire_dtype == "uint8" else None
    # a data-parallel member's ranks all-reduce its gradients among themselves (collective: every rank splits)
    group = comm.Split(cfg.member_of(rank), rank) if max(cfg.data_parallel) > 1 else None
    gradient_sum = None  # the gradients' all-reduce: the member's group communicator, or its Horovod process set
    if group is not None and cfg.transport == "horovod" and group.Get_size() > 1:
        mine = tuple(cfg.member_ranks(n)[cfg.member_of(rank)])
        gradient_sum = lambda values: transport.allreduce_sum(mine, values)  # noqa: E731
        events.log(keys.EXCHANGE_PATH, group=list(mine), path="horovod", purpose="gradients")
    consumer = make_consumers(cfg, manifest.num_classes, cfg.rank_members(rank), dequantize=dequantize, group=group,
                              gradient_sum=gradient_sum)
    epochs = cfg.epochs_for(cfg.member_of(rank))  # --member-epochs: then its accelerators idle
    member = _Member(cfg, rank, pipeline, consumer, EpochLedger(manifest.num_images),
                     DeliveryCounter(manifest.num_images), events, progress,
                     until=None if epochs is None else epochs * manifest.num_images // cfg.global_batch,
                     life=_life(cfg, comm, consumer, preprocessing, manifest.num_images) if epochs else None)
    started = time.time()
    if monitor:
        monitor.mark("warmup_start", started)
    return _Job(cfg, comm, scheme, progress, where, affinity, monitor, heartbeat, events, manifest, preprocessing,
                transport, pipeline, consumer, member, _slurm_counter(cfg) if rank == 0 else None, started, malloc)


def _life(cfg: RunConfig, comm, consumer, preprocessing: str, epoch_images: int) -> "_Life":
    """A member's epoch ends across runs: its state restored from its checkpoint (or new), the
    validation set it is judged on, and whether this rank writes its checkpoints."""
    from enspipe.run import checkpoint

    rank = comm.Get_rank()
    m = cfg.member_of(rank)
    name, network = cfg.name_of(m), cfg.network_for(m) if cfg.consumer == "train" else None
    state = checkpoint.load(cfg.checkpoint_dir, name, network) if cfg.checkpoint_dir else None
    if state is None:
        state = checkpoint.MemberState(name, network)
    elif state.weights is not None:
        checkpoint.restore(cfg.checkpoint_dir, state, consumer.trackable())
    state.runs.append({"out": os.path.abspath(cfg.out), "started": time.time(), "epochs": 0})
    validation = None
    if cfg.validation_data and cfg.consumer == "train":
        from enspipe.data.validation import load_validation

        validation = load_validation(cfg.validation_data, preprocessing, cfg.image_size)
    writer = cfg.checkpoint_dir is not None and rank == cfg.member_ranks(comm.Get_size())[m][0]
    return _Life(cfg.checkpoint_dir if writer else None, state, validation, cfg.patience_for(m), cfg.min_delta,
                 epoch_images)


@dataclass
class _Life:
    """What a member carries from epoch end to epoch end (see :meth:`_Member.epoch_end`)."""

    checkpoint_dir: str | None   # where this rank writes the member's checkpoints (its first rank only)
    state: object                # enspipe.run.checkpoint.MemberState: over every run so far
    validation: tuple | None     # (images, labels) of --validation-data
    patience: int
    min_delta: float
    epoch_images: int


def unit_batches(cfg: RunConfig, scheme) -> int:
    """Global batches a member's pipeline reads, preprocesses and exchanges at a time (one where
    corrupt records may be skipped: a slice keeps its own bounds)."""
    return 1 if cfg.skip_corrupt else scheme.unit_batches(cfg.global_batch, cfg.block_images, cfg.steps)


def _enspipe_pipeline(cfg: RunConfig, comm, scheme, manifest, preprocessing: str, where, events):
    """The transport and the staged pipeline of one of enspipe's schemes."""
    from enspipe.run.pipeline import build_pipeline

    data_parallel = [tuple(r) for r in cfg.member_ranks(comm.Get_size()) if len(r) > 1]
    return build_pipeline(comm, scheme, manifest, preprocessing, cfg.stream(), where.threads, events,
                          steps=cfg.steps, reduce_groups=data_parallel)


def _measure(job: _Job, warm: "_Warmup") -> _Window:
    """The measured window: ``cfg.steps`` steps, and the CPU, stage, exchange and energy readings
    taken at its edges (so they count only work done inside it)."""
    from enspipe.measure import threadcpu

    slurm_j0 = _read_slurm(job.slurm)  # an sstat subprocess: before the window opens
    t0, cpu0, wall0, threads0 = time.perf_counter(), time.process_time(), time.time(), threadcpu.snapshot()
    comm0, prep0, clock0 = job.transport.stats.as_dict(), job.pipeline.preprocessed, job.pipeline.clock.snapshot()
    if job.monitor:
        job.monitor.mark("measure_start", wall0)
    warmup_steps = warm.steps
    job.events.log(keys.MEASURE_START, step=warmup_steps, steady=warm.steady, drain_steps=warm.drain_steps)
    job.progress["stage"] = "measured window"
    steps, stopped_early = 0, False
    for step in range(warmup_steps, warmup_steps + job.cfg.steps):
        job.member.step(step, measured=True)
        steps += 1
        if job.cfg.stop_below is not None and job.member.epoch_ends(step) and \
                _count(job.comm, job.member.training_after(step)) < job.cfg.stop_below:
            stopped_early = True  # too few accelerators would stay busy: the plan goes on without this run
            break
    seconds, cpu_seconds, wall1 = time.perf_counter() - t0, time.process_time() - cpu0, time.time()
    thread_cpu = threadcpu.by_group(threads0, threadcpu.snapshot())
    preprocessed = None if prep0 is None else job.pipeline.preprocessed - prep0  # None: the service's workers
    clock1 = job.pipeline.clock.snapshot()
    comm1 = job.transport.stats.as_dict()
    exchange = {k: v - comm0[k] for k, v in comm1.items()}  # collectives in the measured window
    slurm_j1 = _read_slurm(job.slurm)
    job.events.log(keys.MEASURE_END, step=warmup_steps + steps, stopped_early=stopped_early)
    if job.monitor:
        job.monitor.mark("measure_end", wall1)
    return _Window(seconds, cpu_seconds, (wall0, wall1), thread_cpu, preprocessed, (clock0, clock1), exchange,
                   (slurm_j0, slurm_j1), steps, stopped_early)


def _stop(job: _Job) -> int:
    """Stop the producers together and close the pipeline and the transport; returns how many
    batches the exchange made that no step consumed."""
    t_stop = time.perf_counter()
    discarded = _stop_producers(job.comm, job.pipeline)
    job.pipeline.close()
    job.transport.close()
    job.events.log(keys.STOPPED, seconds=time.perf_counter() - t_stop, discarded_batches=discarded)
    return discarded


def _rank_report(job: _Job, w: _Window, warmup_steps: int, discarded: int) -> dict:
    """This rank's part of the summary: its rate and CPU, stages, queues, epochs and exchange."""
    from enspipe.data.shards import expected_keys, sample_ids
    from enspipe.measure import stages

    cfg, member, rank, where = job.cfg, job.member, job.rank, job.where
    epochs = member.ledger.completed()
    for e in epochs:
        job.events.log(keys.EPOCH, **e)
    skipped = job.pipeline.skipped(warmup_steps + w.steps)
    short: dict[int, list[str] | None] = dict.fromkeys(member.ledger.short() if job.scheme.exactly_once else ())
    wanted = expected_keys(job.manifest) if short else None
    if wanted:  # an epoch short of the manifest: the keys it lacks tell skipped from lost
        expected = dict(zip(sample_ids(wanted).tolist(), wanted))
        short = {e: member.ledger.lacking(e, expected) for e in short}
    images, seconds, cpu_seconds = member.images, w.seconds, w.cpu_seconds
    return {
        "rank": rank, "host": where.host, "role": job.scheme.role(rank), "host_rank": where.host_rank,
        "mpi_node": where.mpi_node, "cores": job.affinity, "sharing_cores": where.sharing_cores,
        "threads": where.threads, "share": list(job.scheme.share(rank, cfg.global_batch)),
        "member": cfg.member_of(rank), "members": cfg.rank_members(rank),
        "max_rss_bytes": _max_rss_bytes(), "learning_rate": cfg.lr_for(cfg.member_of(rank)) if cfg.consumer == "train" else None,
        "images": images, "images_preprocessed": w.preprocessed, "seconds": seconds,
        "images_per_second": images / seconds if seconds > 0 else None,
        "cpu_seconds": cpu_seconds, "cpu_seconds_per_image": cpu_seconds / images if images else None,
        "thread_cpu_seconds": w.thread_cpu,
        "stages": stages.breakdown(*w.clocks, w.thread_cpu, w.exchange, cpu_seconds),
        "step_time_p50": _percentile(member.step_times, 50), "step_time_p95": _percentile(member.step_times, 95),
        "wait_time_mean": float(np.mean(member.waits)) if member.waits else None,
        "starved_fraction": member.starved / w.steps,
        "queue_occupancy": job.pipeline.occupancy_stats(*w.wall),
        "epochs": epochs, "partial_epoch": member.ledger.partial(),
        "skipped": [k for ks in skipped.values() for k in ks], "skipped_by_epoch": skipped,
        "short_epochs": short,
        "trained_images": member.trained, "accelerator_busy_seconds": member.busy_seconds,
        "member_name": cfg.name_of(cfg.member_of(rank)),
        "network": cfg.network_for(cfg.member_of(rank)) if cfg.consumer == "train" else None,
        "epochs_trained": member.epochs_trained,
        "member_state": member.life.state.as_dict() if member.life else None,
        "steps_measured": w.steps, "stopped_early": w.stopped_early,
        "loss_first": member.losses[0] if member.losses else None,
        "loss_last": member.losses[-1] if member.losses else None,
        "device": getattr(job.consumer, "device", None),
        "measured_window": {"start": w.wall[0], "end": w.wall[1]}, "started": job.started,
        "warmup_steps": warmup_steps, "discarded_batches": discarded,
        "exchange_paths": {",".join(map(str, g)): p for g, p in job.transport.paths.items()},
        # collectives in the measured window (the exchange stage runs up to a queue ahead of it)
        **w.exchange,
        "delivery": member.delivery.summary(),
    }


def _job_report(job: _Job, report: dict, w: _Window, warm: "_Warmup") -> int:
    """Gather the ranks' reports and the nodes' CPU and power on rank 0, agree on whether every
    epoch was whole, and only then, with every member alive and done, write the summary."""
    from mpi4py import MPI

    from enspipe.common.atomic import write_json_atomic

    cfg, comm, rank = job.cfg, job.comm, job.rank
    # the job's window: from the first member's measurement start to the last one's end
    job_t0, job_t1 = comm.allreduce(w.wall[0], op=MPI.MIN), comm.allreduce(w.wall[1], op=MPI.MAX)
    node = job.monitor.finish(job_t0, job_t1) if job.monitor else None
    gathered = comm.gather((report, node), root=0)
    summary = failure = None
    if rank == 0:
        reports, nodes = [g[0] for g in gathered], [g[1] for g in gathered if g[1] is not None]
        summary = _summary(job, reports, nodes, (job_t0, job_t1), w, warm)
        failure = _short_epochs(reports, job.manifest.num_images)
    failure = comm.bcast(failure, root=0)
    job.events.log(keys.END, **({"failure": failure} if failure else {}))
    job.events.close()
    comm.Barrier()  # every member is alive and done: only now does the cell's summary appear
    job.heartbeat.stop()
    if rank == 0:
        summary_path = os.path.join(cfg.out, SUMMARY)
        write_json_atomic(summary_path if not failure else os.path.join(cfg.out, FAILED_SUMMARY),
                          summary | ({"failure": failure} if failure else {}))
        if failure:
            print(f"enspipe: error: {failure}; the cell's numbers are in {FAILED_SUMMARY}", file=sys.stderr, flush=True)
        else:
            _say(rank, f"{summary['images_per_second_per_member']:.1f} images/s per member, "
                       f"{summary['cpu_seconds_total']:.2f} CPU-s in the measured window; {summary_path}")
    return 1 if failure else 0


def _summary(job: _Job, reports: list[dict], nodes: list[dict], window: tuple[float, float], w: _Window,
             warm: "_Warmup") -> dict:
    """The cell's summary (rank 0): its identity and settings, the ranks' reports, the nodes'
    CPU and energy over the job's window; also writes the cell's cpu.csv and power.csv."""
    import tensorflow as tf
    from mpi4py import MPI

    from enspipe.data.shards import effective_shuffle_buffer
    from enspipe.measure import cpumon, stages
    from enspipe.measure.node import job_fields, write_power_table

    cfg, scheme, n, manifest = job.cfg, job.scheme, job.n, job.manifest
    slurm_j0, slurm_j1 = w.slurm_joules
    measured, power_rows = job_fields(
        nodes, *window, cfg.power, idle_watts=cfg.idle_watts, watts_per_core=cfg.watts_per_core,
        idle_file=cfg.idle_power, power_csv=cfg.power_csv,
        slurm_joules=slurm_j1 - slurm_j0 if slurm_j0 is not None and slurm_j1 is not None else None,
        slurm_why=None if job.slurm else "not inside a Slurm job step with energy accounting")
    cpumon.write_table(os.path.join(cfg.out, "cpu.csv"), [r for nd in nodes for r in nd["cpu_rows"]])
    write_power_table(os.path.join(cfg.out, "power.csv"), power_rows)
    return {
        "cell": Cell.of({"network": cfg.network, "scheme": AUTO if cfg.planned else scheme.name, "n": n,
                         "p": n if cfg.planned else scheme.p, "cores": cfg.cores,  # an auto cell: P = N, as the grid
                         "consumer": cfg.consumer, "rep": cfg.rep}).as_dict(),
        "planned": cfg.planned,  # --scheme auto: the plan's choice and prediction; the scheme that ran is below
        "network": cfg.network, "consumer": cfg.consumer, "emulated": cfg.consumer == "emulated",
        "accelerator": "emulated" if cfg.consumer == "emulated" else ("none" if cfg.consumer == "peak" else "measured"),
        "rate": cfg.rate, "rate_source": cfg.rate_source, "batch_size": cfg.global_batch, "steps": cfg.steps,
        "warmup": cfg.warmup, "cores": cfg.cores, "image_size": cfg.image_size, "scheme": scheme.name, "n": n,
        "p": scheme.p, "wire_dtype": cfg.wire_dtype, "transport": job.transport.name,
        "unit_batches": None if scheme.service else job.pipeline.unit,  # batches per read/preprocess/exchange
        "malloc": job.malloc,  # how the members' malloc returned freed images (--malloc)
        "members_per_rank": cfg.members_per_rank,
        "preprocessing": job.preprocessing, "fast_mode": cfg.fast_mode, "seed": cfg.seed,
        "dataset": {"path": os.path.abspath(cfg.data), "num_images": manifest.num_images,
                    "digest": manifest.digest, "synthetic": manifest.synthetic,
                    "shuffle_buffer": effective_shuffle_buffer(manifest, cfg.shuffle_buffer)},
        "images_per_second_per_member": float(np.mean([r["images_per_second"] for r in reports])),
        "cpu_seconds_total": float(sum(r["cpu_seconds"] for r in reports)),
        "stages_per_image": stages.mean_per_image(reports),
        "window": _window_summary(scheme, reports, warm),
        "delivery": _delivery_summary(scheme, reports, cfg),
        "service": job.transport.describe() if scheme.service else None,
        "placement": job.where.as_dict(),
        **measured,
        "ranks": reports,
        "machine": _machine(tf),
        "slurm": {k.lower()[6:]: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS",
                                                          "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION")
                  if k in os.environ} or None,
        "versions": {"enspipe": _version(), "tensorflow": tf.__version__, "python": platform.python_version(),
                     "mpi": MPI.Get_library_version().splitlines()[0].strip()},
        "finished": time.time(),
    }


def _short_epochs(reports: list[dict], num_images: int) -> str | None:
    """Why the cell failed its exactly-once promise, or None: a member's completed epoch lacks
    samples that no member skipped (and counted), i.e. data vanished under the manifest."""
    skipped: dict[int, set[str]] = {}
    for r in reports:
        for epoch, ks in r["skipped_by_epoch"].items():
            skipped.setdefault(epoch, set()).update(ks)
    for r in reports:
        counts = {e["epoch"]: e["count"] for e in r["epochs"]}
        for epoch, lacking in r["short_epochs"].items():
            gone = skipped.get(epoch, set())
            where = f"rank {r['rank']}, epoch {epoch}: "
            if lacking is None:  # the manifest does not count its shards' records
                lost = num_images - counts[epoch] - len(gone)
                if lost > 0:
                    return (where + f"{counts[epoch]} of the manifest's {num_images} samples delivered and {lost} not "
                            "skipped (the manifest does not count its shards' records, so they cannot be named; "
                            "re-index with `enspipe index`)")
            elif lost := [k for k in lacking if k not in gone]:
                shards = collections.Counter(k.rsplit(":", 1)[0] for k in lost)
                return (where + f"{len(lost)} of the manifest's {num_images} samples never arrived and were not "
                        f"skipped, from {', '.join(f'{s} ({k})' for s, k in sorted(shards.items()))}; the data "
                        "changed under its manifest: re-create or re-index it")
    return None


# -- the consumer side of one member ----------------------------------------------------------------
class _Member:
    """One member's consumer side: takes its pipeline's batches, feeds its consumer, keeps the
    exactly-once ledger and logs one event per step; the measured steps' numbers accumulate."""

    def __init__(self, cfg: RunConfig, rank: int, pipeline, consumer, ledger, delivery, events, progress: dict,
                 until: int | None = None, life: "_Life | None" = None):
        self.cfg, self.pipeline, self.consumer, self.ledger, self.events = cfg, pipeline, consumer, ledger, events
        self.until = until  # the step from which its member has trained its epochs: its accelerators idle
        self.life = life    # --member-epochs: its epoch ends (validation, checkpoint, early stopping)
        self.epochs_trained = 0  # in this run
        self.trained, self.busy_seconds = 0, 0.0  # images trained on and seconds training, every step
        self.delivery = delivery  # what it saw, judged alike for every arm (DeliveryCounter)
        self.progress = progress
        self.fault = _injected_fault(rank)
        self.step_times: list[float] = []
        self.waits: list[float] = []
        self.losses: list[float] = []
        self.images = self.starved = 0

    def step(self, step: int, measured: bool) -> bool:
        """Consume one batch; returns what the pipeline looked like when it was asked for it (see
        :class:`_Look`): whether the batch was missing, whether every queue was full and how many
        batches the queues held."""
        from enspipe.data.shards import batch_checksum, digest_of

        self.progress["step"] = step
        if self.fault and self.fault[0] == step:
            _inject(self.fault[1], step)
        cpu_req = time.thread_time()
        queues = self.pipeline.occupancy()
        starved, saturated = queues["compute"] == 0, self.pipeline.saturated()
        t_req = time.perf_counter()
        batch = self.pipeline.next_batch()
        t_got, cpu_got = time.perf_counter(), time.thread_time()
        idle = self.until is not None and step >= self.until
        out = {"idle": True} if idle else self.consumer.step(batch.images, batch.meta[:, 3])
        t_done, cpu_done = time.perf_counter(), time.thread_time()
        if not idle:
            self.trained += len(batch)
            self.busy_seconds += t_done - t_got
            if self.life is not None and self.trained % self.life.epoch_images == 0:
                out = {**out, **self.epoch_end(step)}
        self.ledger.add(batch.meta[:, 0], batch.meta[:, 1])
        self.delivery.add(batch.meta[:, 0], batch.meta[:, 2], batch.stream)
        if measured:
            self.images += len(batch)
            self.starved += starved
            self.step_times.append(t_done - t_req)
            self.waits.append(t_got - t_req)
        if "loss" in out:
            self.losses.append(out["loss"])
        self.events.log(keys.STEP, step=step, images=len(batch), wait_s=t_got - t_req, compute_s=t_done - t_got,
                        cpu_s=time.process_time(),
                        measured=measured, queues=queues, starved=starved, saturated=saturated,
                        batch_digest=digest_of(batch.meta[:, 0]),
                        **({"batch_checksum": batch_checksum(batch)} if self.cfg.batch_checksums else {}), **out)
        clock = self.pipeline.clock
        clock.add("consume", t_done - t_got, cpu_done - cpu_got)
        clock.add("hand_off", t_got - t_req, time.thread_time() - cpu_done + cpu_got - cpu_req)
        return _Look(starved, saturated, sum(queues.values()))

    def epoch_end(self, step: int) -> dict:
        """The member has trained another whole epoch at ``step``: validate it, decide whether it
        has converged (early stopping), checkpoint it (its first rank), and, converged or at its
        epochs' bound, leave its accelerators idle from the next step."""
        from enspipe.plan.ensemble import converged
        from enspipe.run import checkpoint

        life, state = self.life, self.life.state
        self.epochs_trained += 1
        state.epochs += 1
        state.images += life.epoch_images
        state.runs[-1]["epochs"] = self.epochs_trained
        val = self.consumer.evaluate(*life.validation) if life.validation is not None else None
        if val is not None:
            state.val_losses.append(val)
        state.converged = converged(state.val_losses, life.patience, life.min_delta)
        saved = checkpoint.save(life.checkpoint_dir, state, self.consumer.trackable()) if life.checkpoint_dir else None
        if state.converged:
            self.until = step + 1
        self.events.log(keys.MEMBER_EPOCH, step=step, member=state.name, epochs=state.epochs, val_loss=val,
                        converged=state.converged, checkpoint=saved,
                        idle_from=self.until)
        return {"member_epoch": state.epochs, **({"val_loss": val} if val is not None else {})}

    def capacity(self) -> int:
        """The most batches its producers can have made ahead of its consumer: its queues full, and
        a unit more in each of the stages that fill them (one waiting to put, one inside tf.data)."""
        return len(self.pipeline.occupancy()) * self.pipeline.depth + 2 * self.pipeline.unit

    def epoch_ends(self, step: int) -> bool:
        """Whether every member's epoch ends with ``step`` (every member has trained or idled
        through the same steps of the one stream)."""
        return (step + 1) * self.cfg.global_batch % self.ledger.num_images == 0

    def training_after(self, step: int) -> int:
        """1 while this rank's member still trains after ``step``, else 0."""
        return int(self.until is None or self.until > step + 1)


class _Look(NamedTuple):
    starved: bool     # the consumer's batch was not there yet
    saturated: bool   # every queue this member fills was full
    held: int         # batches in this member's queues


STEADY_STEPS = 3  # how many steps back the queues' trend is judged


def max_warmup(cfg: RunConfig) -> int:
    """The most unmeasured steps before the window opens anyway: ``warmup`` plus three times what
    the stage queues hold (time enough to fill them whenever the producers outpace the consumer)."""
    from enspipe.run.pipeline import QUEUES

    return cfg.warmup + 3 * len(QUEUES) * cfg.queue_depth


class _Warmup(NamedTuple):
    steps: int              # unmeasured steps run; the window opens at this step
    steady: bool | None     # every pipeline steady (False: max_warmup reached; None: --warmup 0)
    drain_steps: int        # of them, run after the agreement to draw down what its waits stocked


def _warm_up(cfg: RunConfig, comm, member: _Member) -> _Warmup:
    """Unmeasured steps before the window: at least ``cfg.warmup``, then until every member's
    pipeline is steady, i.e. its queues are no longer filling: either every queue is full (the
    producers wait for the consumer), or its queues hold no more than they did
    :data:`STEADY_STEPS` steps ago (empty when the consumer waits for the producers, level near
    balance). A wait alone is not enough: a consumer also waits at start-up, while the queues are
    still filling towards full, and a window opened then counts their filling (preprocessing done
    for batches delivered after it) as its own work. Decided together (an all-reduce per step),
    so every member opens its window at the same step; after :func:`max_warmup` steps the window
    opens anyway and ``steady`` is False. ``--warmup 0`` measures from the first step (``steady``
    is None).

    Deciding together holds the faster members at the slowest one's pace, and while a member's
    consumer waits at the agreement (or a straggler's stalls) its producers stock its queues: a
    4-member baseline on 2 cores opened its window with up to 8 batches in stock and counted 10-17%
    fewer images preprocessed than delivered, and stock from a stall looks like full queues, i.e.
    like a consumer that sets the pace. So once agreed, every member runs
    :meth:`_Member.capacity` more steps, free of any collective (the same number on every member,
    so their windows still cover the same steps): a member whose producers set the pace draws all
    its stock down; one whose consumer sets it stays full, as it was."""
    if cfg.warmup == 0:
        return _Warmup(0, None, 0)
    looks: list[_Look] = []
    step, limit = 0, max_warmup(cfg)
    while True:
        looks = (looks + [member.step(step, measured=False)])[-(STEADY_STEPS + 1):]
        step += 1
        if step >= cfg.warmup:
            steady = _all(comm, _steady(looks))
            if steady or step >= limit:
                drain = member.capacity()
                for _ in range(drain):
                    member.step(step, measured=False)
                    step += 1
                return _Warmup(step, steady, drain)


def _steady(looks: list["_Look"]) -> bool:
    """Whether a member's pipeline is steady after these looks (oldest first): see :func:`_warm_up`."""
    last = looks[-1]
    if last.saturated:
        return True
    if len(looks) <= STEADY_STEPS:
        return False
    return last.held <= looks[0].held


def _all(comm, flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (an all-reduce that sleeps while it waits)."""
    from mpi4py import MPI

    from enspipe.exchange.base import allreduce_quietly

    return bool(allreduce_quietly(comm, int(flag), MPI.MIN))


def _count(comm, value: int) -> int:
    """The sum of ``value`` over every rank (an all-reduce that sleeps while it waits)."""
    from mpi4py import MPI

    from enspipe.exchange.base import allreduce_quietly

    return allreduce_quietly(comm, value, MPI.SUM)


def _stop_producers(comm, pipeline) -> int:
    """Stop every member's exchange stage at the same step (the largest any has begun), so its
    collectives all complete, and discard the batches no one will consume; returns how many."""
    from mpi4py import MPI

    from enspipe.exchange.base import allreduce_quietly

    pipeline.finish(allreduce_quietly(comm, pipeline.freeze(), MPI.MAX))
    return pipeline.drain()


def _delivery_summary(scheme, reports: list[dict], cfg: RunConfig) -> dict:
    """What the members saw, side by side for every arm (see :class:`enspipe.data.ledger.DeliveryCounter`)."""
    d = [r["delivery"] for r in reports]
    distinct = [x["distinct_min"] for x in d if x["distinct_min"] is not None]
    return {"exactly_once": scheme.exactly_once, "window_samples": d[0]["window_samples"],
            "distinct_min": min(distinct) if distinct else None,
            "skipped_samples": sum(x["skipped_samples"] for x in d),
            "skipped_by_member": [x["skipped_samples"] for x in d],
            "slow_member": list(cfg.slow_member) if cfg.slow_member else None}


def _window_summary(scheme, reports: list[dict], warm: "_Warmup") -> dict:
    """Whether the window's CPU and its images describe the same work: the images the members
    preprocessed inside it against those they had to (every member's own batches for the
    baseline; one copy of each shared batch otherwise)."""
    delivered = [r["images"] for r in reports]
    needed = sum(delivered) if not scheme.shared else max(delivered)
    made = [r["images_preprocessed"] for r in reports]
    made = None if None in made else sum(made)  # None: the tf.data service's workers do not say
    return {"warmup_steps": warm.steps, "steady": warm.steady, "drain_steps": warm.drain_steps,
            "images_preprocessed": made, "images_needed": needed,
            "balance": made / needed if needed and made is not None else None,
            "starved_fraction": float(np.mean([r["starved_fraction"] for r in reports]))}


def _start_node_monitor(cfg: RunConfig, host: str):
    from enspipe.measure.cpumon import resolve_source
    from enspipe.measure.node import NodeMonitor

    return NodeMonitor(cfg.out, host, resolve_source(cfg.cpu_monitor), cfg.power, cfg.monitor_interval)


def _slurm_counter(cfg: RunConfig):
    from enspipe.measure.power import PowerUnavailable, SlurmStepCounter

    if cfg.power != ("auto",) and "slurm" not in cfg.power:
        return None
    try:
        return SlurmStepCounter()
    except (PowerUnavailable, OSError) as e:
        if "slurm" in cfg.power:
            raise PowerUnavailable(f"--power slurm: {e}") from None
        return None


def _read_slurm(counter) -> float | None:
    return counter.read()["step"] if counter else None


def _injected_fault(rank: int) -> tuple[int, str] | None:
    """Fault injection for the fault-tolerance tests: ``ENSPIPE_INJECT_FAULT=rank:step:raise|kill|stall``
    (stall: a straggler, its consumer stopped for 2 s while its producers run on)."""
    spec = os.environ.get("ENSPIPE_INJECT_FAULT")
    if not spec:
        return None
    r, step, kind = spec.split(":")
    return (int(step), kind) if int(r) == rank else None


def _inject(kind: str, step: int) -> None:
    if kind == "stall":
        time.sleep(2.0)
        return
    if kind == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault at step {step}")


def _machine(tf) -> dict:
    """What the numbers were measured on (rank 0's node)."""
    from enspipe.measure.node import cpu_model

    gpus = [tf.config.experimental.get_device_details(d).get("device_name", "GPU")
            for d in tf.config.list_physical_devices("GPU")]
    return {"node": platform.node(), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
            "gpus": f"{len(gpus)}x {gpus[0]}" if gpus else None}


def _max_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _version() -> str:
    from enspipe import __version__

    return __version__
