"""The per-cell program: one ensemble member per MPI rank, run under ``mpiexec``/``srun``.

Each rank finds its place (host, cores) and pins itself, builds its pipeline and consumer, and
then, read top to bottom in :func:`_run_member`:

1. warm-up: unmeasured steps until every member's pipeline is in its steady state (at least
   ``--warmup`` steps; decided together, so every member opens its window at the same step,
   then as many as draw down what waiting there stocked);
2. the measured window: ``--steps`` steps, opened by every member at once (its producers paused
   while it waits) and ended with them paused until every member's has;
3. the producers stop together and what they made beyond the window is discarded;
4. rank 0 gathers the per-rank reports and the node monitors' integrals and writes
   ``summary.json``, last and atomically.

Any failure on any rank aborts the whole job (``MPI_Abort``) after logging it, so a job never
hangs and never leaves a summary that looks complete.
"""
from __future__ import annotations

import sys
import traceback

from enspipe.common import phases, tempdirs
from enspipe.common.host import launched
from enspipe.common.liveness import die_with_launcher
from enspipe.data.manifest import read_manifest
from enspipe.engine.placement import place
from enspipe.exchange.shm import reap_orphans
from enspipe.plan.errors import ConfigError
from enspipe.plan.options import plain_name
from enspipe.plan.planner import choose_together
from enspipe.plan.schemes import AUTO, SCHEME_KINDS, make_scheme
from enspipe.run.config import RunConfig
from enspipe.run.job import fail, setup
from enspipe.run.summary import job_report, rank_report, say
from enspipe.run.window import measure, stop, warm_up


def run(cfg: RunConfig) -> int:
    die_with_launcher()  # a lost node's members must not run on as orphans
    place = launched()
    if place is not None and _refused(cfg, *place):  # before MPI: a job whose ranks all exit 2 exits 2
        return 2
    before_mpi()
    from mpi4py import MPI

    phases.mark("mpi_init")

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    try:
        if cfg.stream.scheme == AUTO:
            cfg = _planned(cfg, comm)
        scheme = make_scheme(cfg.stream.scheme, n, cfg.stream.preprocessors, cfg.global_batch)
        check_members(cfg, n)
    except ConfigError as e:  # every rank reaches the same verdict: no collective needed
        _say_refused(rank, e)
        return 2

    return _run_guarded(cfg, comm, scheme)


def _refused(cfg: RunConfig, rank: int, n: int) -> bool:
    """Whether the options cannot run on the ``n`` ranks launched, said by rank 0. Checked before
    MPI starts wherever the launcher says ``n``: once MPI is up, a rank that exits 2 while another
    is still in MPI_Finalize gets that one killed, and the job's status would say 9."""
    try:
        check_fit(cfg, n)
    except ConfigError as e:
        _say_refused(rank, e)
        return True
    return False


def check_fit(cfg: RunConfig, n: int) -> None:
    """The options against ``n`` ranks, before MPI starts: the scheme's plan (``auto``'s is chosen
    once MPI places the ranks) and the options that name members; raises :class:`ConfigError`."""
    if cfg.stream.scheme != AUTO:
        make_scheme(cfg.stream.scheme, n, cfg.stream.preprocessors, cfg.global_batch)
    check_members(cfg, n)


def _say_refused(rank: int, e: ConfigError) -> None:
    if rank == 0:
        print(f"enspipe run: error: {e}", file=sys.stderr, flush=True)


def leave(rc: int) -> int:
    """End the cell's process now that its outputs are written: MPI finalized, its own temporary
    folder removed (:mod:`enspipe.common.tempdirs`), then out without Python's slow teardown of
    TensorFlow's modules and threads (a second per cell). Returns only where MPI never started (an
    error before it)."""
    tempdirs.remove_own()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized():
        return rc
    if not mpi.Is_finalized():
        mpi.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    _exit_after_mpi(rc)


def _exit_after_mpi(rc: int) -> None:
    """Exit with the C library's ``exit``: its atexit handlers run (MPICH's among them) but not
    Python's teardown. MPICH's launcher takes a rank that skipped them (``os._exit``) for one
    that died, and SIGKILLs its peers still finalizing: a job whose every rank succeeded ended
    with status 9, most often where one rank finalized a second after the others."""
    import ctypes
    import os

    try:
        ctypes.CDLL(None).exit(rc)
    except (OSError, AttributeError):  # no C library to call: as before
        os._exit(rc)


def before_mpi() -> None:
    """Every cell rank's start, before MPI (``enspipe run``, ``run-cells``, an in-job arm): a rank
    that dies in native code (a signal) leaves its Python stacks on stderr (:mod:`faulthandler`),
    and /dev/shm is freed of the segments killed jobs left (see
    :func:`enspipe.exchange.shm.reap_orphans`), saying so."""
    import faulthandler

    faulthandler.enable()
    count, size = reap_orphans()
    if count:
        print(f"enspipe: removed {count} orphaned MPICH shared-memory segments ({size / 2**20:.0f} MiB) from "
              "/dev/shm, left by jobs that were killed", file=sys.stderr, flush=True)


def run_on(cfg: RunConfig, comm) -> int:
    """One rank of a cell on ``comm``, a communicator inside a longer MPI job whose ranks run one
    cell after another (``enspipe ensemble --in-job``: TensorFlow and MPI start once, not per
    cell). Raises :class:`ConfigError` as :func:`run` would exit 2; a failed rank aborts the job."""
    phases.reset()
    scheme = make_scheme(cfg.stream.scheme, comm.Get_size(), cfg.stream.preprocessors, cfg.global_batch)
    check_members(cfg, comm.Get_size())
    return _run_guarded(cfg, comm, scheme)


def _run_guarded(cfg: RunConfig, comm, scheme) -> int:
    rank = comm.Get_rank()
    progress = {"rank": rank, "stage": "setup", "step": None}
    try:
        return _run_member(cfg, comm, scheme, progress)
    except BaseException as e:  # noqa: BLE001 - a failed rank takes the job down, fast
        fail(cfg, comm, progress, f"rank {rank} failed: {type(e).__name__}: {e}", traceback.format_exc())
        return 1


def check_members(cfg: RunConfig, n: int) -> None:
    """The options that name members, against the ``n`` ranks launched (data-parallel members
    are several ranks each); raises :class:`ConfigError`."""
    members = cfg.members(n)
    for name, values in (("member_rates", cfg.training.member_rates), ("member_epochs", cfg.lives.member_epochs),
                         ("member_networks", cfg.training.member_networks), ("member_names", cfg.lives.member_names),
                         ("member_patience", cfg.lives.member_patience),
                         ("member_batch_multipliers", cfg.training.member_batch_multipliers)):
        if values is not None and len(values) not in ({1, members} if name in (
                "member_epochs", "member_patience", "member_batch_multipliers") else {members}):
            raise ConfigError(name, f"{len(values)} values for {members} members",
                              f"pass one per member ({members}: the ranks over --data-parallel, times "
                              "--members-per-rank)")
    if cfg.lives.member_names is not None:
        bad = [x for x in cfg.lives.member_names if not plain_name(x)]
        if bad or len(set(cfg.lives.member_names)) != len(cfg.lives.member_names):
            raise ConfigError("member_names", f"names must be distinct and of letters, digits, '-', '_' and '.', got "
                              f"{list(cfg.lives.member_names)}", "name each member once, e.g. a,b,c")
    if cfg.training.slow_member is not None and cfg.training.slow_member[0] >= members:
        raise ConfigError("slow_member", f"there is no member {cfg.training.slow_member[0]} among {members}",
                          f"pass a member below {members}")
    if cfg.lives.checkpoint_dir is not None:  # a member resumes from its checkpoint, never silently from scratch
        from enspipe.run import checkpoint

        for m in range(members):
            problem = checkpoint.problem(cfg.lives.checkpoint_dir, cfg.name_of(m),
                                         cfg.network_for(m) if cfg.training.consumer == "train" else None)
            if problem:
                raise ConfigError("checkpoint_dir", problem, "restore it, or remove it to start the member over")
    if cfg.lives.member_epochs is not None:  # members leave at an epoch's end: it must end on a batch's
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
    from mpi4py import MPI

    where = place(comm, MPI, cfg.measure.cores)
    nodes = len(set(comm.allgather(where.mpi_node)))
    s, t = cfg.stream, cfg.training
    choice = choose_together(comm, nodes, where.host_cpus, cfg.calibration, t.network, batch=cfg.global_batch,
                             image_size=s.image_size, rc=t.rate if t.consumer == "emulated" else None,
                             core_limit=cfg.measure.cores, wire_dtype=s.wire_dtype, node_shm=s.node_shm,
                             comm_json=s.plan_comm, block_images=s.block_images)
    takes_p = SCHEME_KINDS[choice["scheme"]].takes_p
    say(comm.Get_rank(), f"scheme auto: the plan runs {choice['scheme']}" + (f" P={choice['p']}" if takes_p else "")
         + f" (predicted {choice['predicted']['images_per_second']:.0f} images/s per member, "
         f"{choice['predicted']['bound']}-bound)")
    return cfg.replaced(scheme=choice["scheme"], preprocessors=choice["p"] if takes_p else None, planned=choice)


def _run_member(cfg: RunConfig, comm, scheme, progress: dict) -> int:
    """One rank of a cell, top to bottom: set up, warm up, measure, stop, report."""
    job = setup(cfg, comm, scheme, progress)  # placed, pinned, logging, the pipeline built
    job.pipeline.start()
    phases.mark("pipeline_started")
    progress["stage"] = "warm-up"
    warm = warm_up(cfg, comm, job.member)  # until every pipeline is in its steady state
    phases.mark("warm_up")
    window = measure(job, warm)  # cfg.measure.steps steps, opened together
    phases.mark("window")
    progress["stage"] = "stopping the producers"
    discarded = stop(job)  # together (their collectives must match), discarding what is left
    phases.mark("stop")
    progress["stage"] = "report"
    report = rank_report(job, window, warm.steps, discarded)
    phases.mark("reported")
    return job_report(job, report, window, warm)  # rank 0 writes the summary, last
