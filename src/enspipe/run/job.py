"""Setting up one rank of a cell: its place and cores, the node monitor and the heartbeat, its
event log, the transport and pipeline, the consumer and the member that drives them; and failing
fast, for the whole job, when any of it breaks."""
from __future__ import annotations

import os
import time

from enspipe.common import keys, phases
from enspipe.common.events import EventLog
from enspipe.common.tfimport import import_tensorflow
from enspipe.data.build import load_manifest
from enspipe.data.ledger import DeliveryCounter, EpochLedger
from enspipe.data.manifest import DataError, accounting_note, verify_digest
from enspipe.engine.affinity import configure_tensorflow_threads
from enspipe.engine.backends import BACKENDS
from enspipe.engine.member import MemberBuilder, fail_job
from enspipe.exchange.transports import TRANSPORTS
from enspipe.plan.schemes import make_scheme, node_groups
from enspipe.run import checkpoint
from enspipe.run.config import RunConfig
from enspipe.run.consumers import make_consumers
from enspipe.run.context import Job, Life
from enspipe.run.monitors import slurm_counter, start_node_monitor
from enspipe.run.steps import Member
from enspipe.run.summary import FAILED_SUMMARY, SUMMARY, say


def setup(cfg: RunConfig, comm, scheme, progress: dict) -> Job:
    """Place and pin this rank, start the node monitor and the heartbeat, clear an earlier run's
    results, and build the transport, the pipeline, the consumer and the member (the steps of
    :class:`enspipe.engine.member.MemberBuilder`, as a library member takes them)."""
    rank = comm.Get_rank()
    build, scheme, monitor = _placed(cfg, comm)
    heartbeat = _heartbeat(cfg, comm, build, progress)  # after TensorFlow's import holds the GIL
    _clear_earlier_results(cfg, comm)
    events = EventLog(cfg.out, rank)
    preprocessing = cfg.preprocessing
    manifest = _manifest(cfg)
    where, affinity, malloc = build.where, build.affinity, build.malloc
    _log_start(cfg, comm, scheme, where, events, affinity, malloc, preprocessing, manifest)
    transport, pipeline, ledger = _delivery(cfg, comm, build, scheme, manifest, preprocessing, events)
    consumer = _consumer(cfg, comm, transport, manifest, preprocessing, events)
    member = _member(cfg, comm, pipeline, consumer, ledger, manifest, preprocessing, events, progress)
    started = time.time()
    phases.mark("pipeline_built")
    if monitor:
        monitor.mark("warmup_start", started)
    return Job(cfg, comm, scheme, progress, where, affinity, monitor, heartbeat, events, manifest, preprocessing,
               transport, pipeline, consumer, member, slurm_counter(cfg) if rank == 0 else None, started, malloc)


def _placed(cfg: RunConfig, comm):
    """This rank set up up to its pipeline: malloc set, placed, the scheme on its node layout,
    the node monitor started (each host's first rank, before pinning), the process pinned and
    TensorFlow's pools sized. Returns ``(builder, scheme, monitor)``."""
    from mpi4py import MPI

    build = MemberBuilder(comm, MPI, cores=cfg.measure.cores, malloc=cfg.stream.malloc)  # before TensorFlow allocates
    where = build.where
    phases.mark("placement")
    # the plan again, now that the node layout is known (validated already, on one node)
    scheme = make_scheme(cfg.stream.scheme, comm.Get_size(), cfg.stream.preprocessors, cfg.global_batch,
                         node_groups(comm.allgather(where.mpi_node)))
    os.makedirs(cfg.out, exist_ok=True)
    monitor = start_node_monitor(cfg, where.host) if where.host_rank == 0 else None  # before pinning
    build.pin()
    if cfg.needs_tensorflow:
        import_tensorflow(trains=cfg.training.consumer == "train")  # after the pools' sizes are known
        configure_tensorflow_threads(where.threads, waiting=cfg.gradient_spec.waiting_threads)
    phases.mark("tensorflow")
    return build, scheme, monitor


def _heartbeat(cfg: RunConfig, comm, build, progress: dict):
    rank = comm.Get_rank()
    heartbeat = build.heartbeat(cfg.faults.peer_timeout, on_loss=lambda peer, silent: fail(
        cfg, comm, progress, f"rank {rank}: rank {peer} silent for {silent:.0f} s, lost (its node or process died)",
        heartbeat=heartbeat),
        on_stall=lambda seconds: fail(
            cfg, comm, progress, f"rank {rank}: the cell's last barrier and the heartbeat's end took over {seconds:.0f} s "
            "with every rank alive (each thread's stack is in the log above)"))
    return heartbeat


def _clear_earlier_results(cfg: RunConfig, comm) -> None:
    """A rerun must not leave an old summary or an old failure looking like its result."""
    if comm.Get_rank() == 0:
        ranks = [f for f in os.listdir(cfg.out) if f.startswith(("failed.rank", "error.rank"))]
        for old in [SUMMARY, FAILED_SUMMARY, *ranks]:
            if os.path.exists(os.path.join(cfg.out, old)):
                os.remove(os.path.join(cfg.out, old))
    comm.Barrier()


def _manifest(cfg: RunConfig):
    manifest = load_manifest(cfg.data)
    problem = verify_digest(manifest)  # the count and the shards were checked before MPI started
    if problem:
        raise DataError(problem)
    return manifest


def _log_start(cfg: RunConfig, comm, scheme, where, events, affinity, malloc, preprocessing, manifest) -> None:
    """The config event (the log's first record) and the cell's one line on the terminal."""
    rank, n = comm.Get_rank(), comm.Get_size()
    events.log(keys.CONFIG, config=cfg.to_dict(), scheme=scheme.name, n=n, p=scheme.p, role=scheme.role(rank),
               host=where.host, host_rank=where.host_rank, mpi_node=where.mpi_node, cores=affinity,
               sharing_cores=where.sharing_cores, threads=where.threads, placement=where.as_dict(), malloc=malloc,
               preprocessing=preprocessing, share=scheme.share(rank, cfg.global_batch),
               dataset={"path": os.path.abspath(cfg.data), "num_images": manifest.num_images,
                        "digest": manifest.digest, "synthetic": manifest.synthetic,
                        "accounting": manifest.accounting})
    say(rank, f"{scheme.name} n={n} p={scheme.p} {cfg.training.network} batch={cfg.global_batch} "
              f"{cfg.training.consumer}{' (emulated accelerator)' if cfg.training.consumer == 'emulated' else ''} "
              f"steps={cfg.measure.warmup}+{cfg.measure.steps} cores={cfg.measure.cores or 'all'} "
              f"{cfg.stream.image_size}px"
              f"{' OVERSUBSCRIBED' if where.oversubscribed else ''}{_exchange_note(cfg)} -> {cfg.out}")
    note = accounting_note(manifest)
    if note:
        say(rank, note)


def _exchange_note(cfg: RunConfig) -> str:
    """The start line's word on a data-parallel member's gradient exchange, where it is not whole."""
    spec = cfg.gradient_spec
    if spec.kind == "whole" or max(cfg.training.data_parallel) == 1:
        return ""
    return f" gradients: {spec.label()}"


def _delivery(cfg: RunConfig, comm, build, scheme, manifest, preprocessing: str, events):
    """``(transport, pipeline, ledger)``: enspipe's scheme, or the peer, TensorFlow's tf.data service."""
    if not scheme.service:
        data_parallel = [tuple(r) for r in cfg.member_ranks(comm.Get_size()) if len(r) > 1]
        return build.pipeline(scheme, manifest, preprocessing, cfg.stream_config(), build.where.threads, events,
                              steps=cfg.measure.steps, reduce_groups=data_parallel)
    from enspipe.run.service import ServicePipeline, TfDataService

    transport = TfDataService(comm, scheme, cfg, manifest, preprocessing, build.where.threads, events)
    return transport, ServicePipeline(transport, comm.Get_rank(), cfg.stream.queue_depth,
                                      cfg.measure.sample_interval, events), EpochLedger(manifest.num_images)


def _consumer(cfg: RunConfig, comm, transport, manifest, preprocessing: str, events):
    """This rank's consumer (its members'); a data-parallel member's ranks all-reduce its gradients
    among themselves (collective: every rank splits)."""
    from enspipe.engine.backends.tf import quantizer

    rank, n = comm.Get_rank(), comm.Get_size()
    dequantize = quantizer(preprocessing)[1] if cfg.stream.wire_dtype == "uint8" else None
    group = comm.Split(cfg.member_of(rank), rank) if max(cfg.training.data_parallel) > 1 else None
    gradient_sum = None  # the gradients' all-reduce: the member's group communicator, or its Horovod process set
    if group is not None and TRANSPORTS[cfg.stream.transport].process_sets and group.Get_size() > 1:
        mine = tuple(cfg.member_ranks(n)[cfg.member_of(rank)])
        gradient_sum = lambda values: transport.allreduce_sum(mine, values)  # noqa: E731
        events.log(keys.EXCHANGE_PATH, group=list(mine), path=cfg.stream.transport, purpose="gradients")
    return make_consumers(cfg, manifest.num_classes, cfg.rank_members(rank), dequantize=dequantize, group=group,
                          gradient_sum=gradient_sum)


def _member(cfg: RunConfig, comm, pipeline, consumer, ledger, manifest, preprocessing: str, events,
            progress: dict) -> Member:
    """The consumer side that steps the cell; with --member-epochs its accelerators idle once it
    has trained them, and its epoch ends validate and checkpoint."""
    rank = comm.Get_rank()
    epochs = cfg.epochs_for(cfg.member_of(rank))
    return Member(cfg, rank, pipeline, consumer, ledger,
                  DeliveryCounter(manifest.num_images), events, progress,
                  until=None if epochs is None else epochs * manifest.num_images // cfg.global_batch,
                  life=life(cfg, comm, consumer, preprocessing, manifest.num_images) if epochs else None)


def life(cfg: RunConfig, comm, consumer, preprocessing: str, epoch_images: int) -> Life:
    """A member's epoch ends across runs: its state restored from its checkpoint (or new), the
    validation set it is judged on, and whether this rank writes its checkpoints."""
    rank = comm.Get_rank()
    m = cfg.member_of(rank)
    name, network = cfg.name_of(m), cfg.network_for(m) if cfg.training.consumer == "train" else None
    state = checkpoint.load(cfg.lives.checkpoint_dir, name, network) if cfg.lives.checkpoint_dir else None
    if state is None:
        state = checkpoint.MemberState(name, network)
    elif state.weights is not None:
        checkpoint.restore(cfg.lives.checkpoint_dir, state, consumer.trackable())
    state.runs.append({"out": os.path.abspath(cfg.out), "started": time.time(), "epochs": 0})
    validation = None
    if cfg.lives.validation_data and cfg.training.consumer == "train":
        from enspipe.data.validation import load_validation

        validation = load_validation(cfg.lives.validation_data, preprocessing, cfg.stream.image_size,
                                     BACKENDS[cfg.backend].needs_tensorflow)
    writer = cfg.lives.checkpoint_dir is not None and rank == cfg.member_ranks(comm.Get_size())[m][0]
    return Life(cfg.lives.checkpoint_dir if writer else None, state, validation, cfg.patience_for(m),
                cfg.lives.min_delta, epoch_images)


def fail(cfg: RunConfig, comm, progress: dict, reason: str, tb: str = "", heartbeat=None) -> None:
    """Leave why next to the event logs and end the whole job
    (:func:`enspipe.engine.member.fail_job`): ``error.rankNNNN.txt`` (with the traceback) and
    ``failed.rankNNNN.json`` (where the rank got to), then ``MPI_Abort``."""
    record = {**progress, "reason": reason, "time": time.time(), "config": cfg.to_dict()}
    fail_job(comm, f"enspipe: error: {reason}", directory=cfg.out, rank=progress["rank"], tb=tb, record=record,
             heartbeat=heartbeat)
