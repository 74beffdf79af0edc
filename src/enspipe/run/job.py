"""Setting up one rank of a cell: its place and cores, the node monitor and the heartbeat, its
event log, the transport and pipeline, the consumer and the member that drives them; and failing
fast, for the whole job, when any of it breaks."""
from __future__ import annotations

import os
import sys
import time

from enspipe.common import keys, phases
from enspipe.engine.backends import BACKENDS
from enspipe.exchange.transports import TRANSPORTS
from enspipe.data.manifest import accounting_note
from enspipe.run.config import RunConfig
from enspipe.plan.schemes import make_scheme, node_groups
from enspipe.run.context import Job, Life
from enspipe.run.monitors import slurm_counter, start_node_monitor
from enspipe.run.steps import Member
from enspipe.run.summary import FAILED_SUMMARY, SUMMARY, say


def setup(cfg: RunConfig, comm, scheme, progress: dict) -> Job:
    """Place and pin this rank, start the node monitor and the heartbeat, clear an earlier run's
    results, and build the transport, the pipeline, the consumer and the member."""
    from enspipe.common.events import EventLog

    rank = comm.Get_rank()
    where, scheme, monitor, affinity, malloc = _placed(cfg, comm)
    heartbeat = _heartbeat(cfg, comm, progress)  # after TensorFlow's import holds the GIL
    _clear_earlier_results(cfg, comm)
    events = EventLog(cfg.out, rank)
    preprocessing = cfg.preprocessing
    manifest = _manifest(cfg)
    _log_start(cfg, comm, scheme, where, events, affinity, malloc, preprocessing, manifest)
    transport, pipeline = _delivery(cfg, comm, scheme, manifest, preprocessing, where, events)
    consumer = _consumer(cfg, comm, transport, manifest, preprocessing, events)
    member = _member(cfg, comm, pipeline, consumer, manifest, preprocessing, events, progress)
    started = time.time()
    phases.mark("pipeline_built")
    if monitor:
        monitor.mark("warmup_start", started)
    return Job(cfg, comm, scheme, progress, where, affinity, monitor, heartbeat, events, manifest, preprocessing,
               transport, pipeline, consumer, member, slurm_counter(cfg) if rank == 0 else None, started, malloc)


def _placed(cfg: RunConfig, comm):
    """This rank's placement and the scheme on its node layout; the node monitor started (each
    host's first rank, before pinning), the process pinned, malloc set and TensorFlow's pools
    sized. Returns ``(where, scheme, monitor, affinity, malloc)``."""
    from mpi4py import MPI

    from enspipe.common.tfimport import import_tensorflow
    from enspipe.engine.affinity import configure_tensorflow_threads, pin_process
    from enspipe.engine.memory import set_malloc
    from enspipe.engine.placement import place

    where = place(comm, MPI, cfg.measure.cores)
    phases.mark("placement")
    # the plan again, now that the node layout is known (validated already, on one node)
    scheme = make_scheme(cfg.stream.scheme, comm.Get_size(), cfg.stream.preprocessors, cfg.global_batch,
                         node_groups(comm.allgather(where.mpi_node)))
    os.makedirs(cfg.out, exist_ok=True)
    monitor = start_node_monitor(cfg, where.host) if where.host_rank == 0 else None  # before pinning
    affinity = pin_process(where.cores)
    malloc = set_malloc(cfg.stream.malloc)  # before TensorFlow allocates
    if cfg.needs_tensorflow:
        import_tensorflow(trains=cfg.training.consumer == "train")  # after the pools' sizes are known
        configure_tensorflow_threads(where.threads, waiting=cfg.gradient_spec.waiting_threads)
    phases.mark("tensorflow")
    return where, scheme, monitor, affinity, malloc


def _heartbeat(cfg: RunConfig, comm, progress: dict):
    from enspipe.common.liveness import Heartbeat

    rank = comm.Get_rank()
    return Heartbeat(comm, on_loss=lambda peer, silent: fail(
        cfg, comm, progress, f"rank {rank}: rank {peer} silent for {silent:.0f} s, lost (its node or process died)"),
        timeout=cfg.faults.peer_timeout, on_stall=lambda seconds: fail(
            cfg, comm, progress, f"rank {rank}: the cell's last barrier and the heartbeat's end took over {seconds:.0f} s "
            "with every rank alive (each thread's stack is in the log above)")).start()


def _clear_earlier_results(cfg: RunConfig, comm) -> None:
    """A rerun must not leave an old summary or an old failure looking like its result."""
    if comm.Get_rank() == 0:
        ranks = [f for f in os.listdir(cfg.out) if f.startswith(("failed.rank", "error.rank"))]
        for old in [SUMMARY, FAILED_SUMMARY, *ranks]:
            if os.path.exists(os.path.join(cfg.out, old)):
                os.remove(os.path.join(cfg.out, old))
    comm.Barrier()


def _manifest(cfg: RunConfig):
    from enspipe.data.manifest import DataError
    from enspipe.data.build import load_manifest
    from enspipe.data.manifest import verify_digest

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


def _delivery(cfg: RunConfig, comm, scheme, manifest, preprocessing: str, where, events):
    """``(transport, pipeline)``: enspipe's scheme, or the peer, TensorFlow's tf.data service."""
    if not scheme.service:
        return enspipe_pipeline(cfg, comm, scheme, manifest, preprocessing, where, events)
    from enspipe.run.service import ServicePipeline, TfDataService

    transport = TfDataService(comm, scheme, cfg, manifest, preprocessing, where.threads, events)
    return transport, ServicePipeline(transport, comm.Get_rank(), cfg.stream.queue_depth,
                                      cfg.measure.sample_interval, events)


def _consumer(cfg: RunConfig, comm, transport, manifest, preprocessing: str, events):
    """This rank's consumer (its members'); a data-parallel member's ranks all-reduce its gradients
    among themselves (collective: every rank splits)."""
    from enspipe.run.consumers import make_consumers
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


def _member(cfg: RunConfig, comm, pipeline, consumer, manifest, preprocessing: str, events, progress: dict) -> Member:
    """The consumer side that steps the cell; with --member-epochs its accelerators idle once it
    has trained them, and its epoch ends validate and checkpoint."""
    from enspipe.data.ledger import DeliveryCounter, EpochLedger

    rank = comm.Get_rank()
    epochs = cfg.epochs_for(cfg.member_of(rank))
    return Member(cfg, rank, pipeline, consumer, EpochLedger(manifest.num_images),
                  DeliveryCounter(manifest.num_images), events, progress,
                  until=None if epochs is None else epochs * manifest.num_images // cfg.global_batch,
                  life=life(cfg, comm, consumer, preprocessing, manifest.num_images) if epochs else None)


def life(cfg: RunConfig, comm, consumer, preprocessing: str, epoch_images: int) -> Life:
    """A member's epoch ends across runs: its state restored from its checkpoint (or new), the
    validation set it is judged on, and whether this rank writes its checkpoints."""
    from enspipe.run import checkpoint

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


def enspipe_pipeline(cfg: RunConfig, comm, scheme, manifest, preprocessing: str, where, events):
    """The transport and the staged pipeline of one of enspipe's schemes."""
    from enspipe.engine.pipeline import build_pipeline

    data_parallel = [tuple(r) for r in cfg.member_ranks(comm.Get_size()) if len(r) > 1]
    return build_pipeline(comm, scheme, manifest, preprocessing, cfg.stream_config(), where.threads, events,
                          steps=cfg.measure.steps, reduce_groups=data_parallel)


def fail(cfg: RunConfig, comm, progress: dict, reason: str, tb: str = "") -> None:
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
