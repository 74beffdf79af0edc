"""A cell's warm-up and measured window: unmeasured steps until every member's pipeline is
steady (decided together), a drain, then ``--steps`` measured steps with CPU, stage, exchange and
energy readings at the window's edges, and the producers stopped together.

Every member's window opens at once (a quiet barrier, its producers paused while it waits), and a
member's producers pause as its window ends, until every window has. So the members' windows are
one window on the node's clock too: the node's CPU over the job's window counts no member's work
outside its own (a baseline's independent members otherwise open up to seconds apart, and run on
after their last step, filling their queues)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from enspipe.common import keys
from enspipe.exchange.base import allreduce_quietly
from enspipe.measure import threadcpu
from enspipe.run.config import RunConfig
from enspipe.run.monitors import read_slurm
from enspipe.run.steps import Look, Member

if TYPE_CHECKING:
    from enspipe.run.context import Job


@dataclass
class Window:
    """The measured window's readings, from its start to its end."""

    seconds: float
    cpu_seconds: float          # process_time (its worker processes too): the scheduler's nanoseconds
    tick_cpu_seconds: float | None  # /proc/self/stat: the same CPU in the kernel's ticks (None without /proc)
    wall: tuple[float, float]
    thread_cpu: dict
    preprocessed: int | None
    clocks: tuple[dict, dict]
    exchange: dict
    slurm_joules: tuple[float | None, float | None]
    steps: int          # measured steps (fewer than --steps when --stop-below ended the run early)
    stopped_early: bool


STEADY_STEPS = 3  # how many steps back the queues' trend is judged


def max_warmup(cfg: RunConfig) -> int:
    """The most unmeasured steps before the window opens anyway: ``warmup`` plus three times what
    the stage queues hold (time enough to fill them whenever the producers outpace the consumer)."""
    from enspipe.engine.pipeline import QUEUES

    return cfg.measure.warmup + 3 * len(QUEUES) * cfg.stream.queue_depth


class Warmup(NamedTuple):
    steps: int              # unmeasured steps run; the window opens at this step
    steady: bool | None     # every pipeline steady (False: max_warmup reached; None: --warmup 0)
    drain_steps: int        # of them, run after the agreement to draw down what its waits stocked


def warm_up(cfg: RunConfig, comm, member: Member) -> Warmup:
    """Unmeasured steps before the window: at least ``cfg.measure.warmup``, then until every member's
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
    :meth:`Member.capacity` more steps, free of any collective (the same number on every member,
    so their windows still cover the same steps): a member whose producers set the pace draws all
    its stock down; one whose consumer sets it stays full, as it was."""
    if cfg.measure.warmup == 0:
        return Warmup(0, None, 0)
    looks: list[Look] = []
    step, limit = 0, max_warmup(cfg)
    while True:
        looks = (looks + [member.step(step, measured=False)])[-(STEADY_STEPS + 1):]
        step += 1
        if step >= cfg.measure.warmup:
            steady = all_ranks(comm, is_steady(looks))
            if steady or step >= limit:
                drain = member.capacity()
                for _ in range(drain):
                    member.step(step, measured=False)
                    step += 1
                return Warmup(step, steady, drain)


def is_steady(looks: list["Look"]) -> bool:
    """Whether a member's pipeline is steady after these looks (oldest first): see :func:`warm_up`."""
    last = looks[-1]
    if last.saturated:
        return True
    if len(looks) <= STEADY_STEPS:
        return False
    return last.held <= looks[0].held


def all_ranks(comm, flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (an all-reduce that sleeps while it waits)."""
    from mpi4py import MPI

    return bool(allreduce_quietly(comm, int(flag), MPI.MIN))


def count_ranks(comm, value: int) -> int:
    """The sum of ``value`` over every rank (an all-reduce that sleeps while it waits)."""
    from mpi4py import MPI

    return allreduce_quietly(comm, value, MPI.SUM)


def open_together(comm, pipeline) -> None:
    """Wait for every member to reach its window (a barrier that sleeps), taking no new work
    meanwhile: the producers pause until all are there (finishing only the unit they hold)."""
    pipeline.pause()
    all_ranks(comm, True)
    pipeline.resume()


def stop_producers(comm, pipeline) -> int:
    """Stop every member's exchange stage at the same step (the largest any has begun), so its
    collectives all complete, and discard the batches no one will consume; returns how many. The
    producers, paused at the window's end, run again once every member has agreed (every window
    has ended): the steps still to complete may need what they make."""
    from mpi4py import MPI

    steps = allreduce_quietly(comm, pipeline.freeze(), MPI.MAX)
    pipeline.resume()
    pipeline.finish(steps)
    return pipeline.drain()


def measure(job: Job, warm: "Warmup") -> Window:
    """The measured window: ``cfg.measure.steps`` steps, and the CPU, stage, exchange and energy readings
    taken at its edges (so they count only work done inside it)."""
    slurm_j0 = read_slurm(job.slurm)  # an sstat subprocess: before the window opens
    open_together(job.comm, job.pipeline)
    t0, cpu0, wall0, threads0 = time.perf_counter(), threadcpu.process_cpu(), time.time(), threadcpu.snapshot()
    ticks0 = threadcpu.process_ticks()
    comm0, prep0, clock0 = job.transport.stats.as_dict(), job.pipeline.preprocessed, job.pipeline.clock.snapshot()
    if job.monitor:
        job.monitor.mark("measure_start", wall0)
    warmup_steps = warm.steps
    job.events.log(keys.MEASURE_START, step=warmup_steps, steady=warm.steady, drain_steps=warm.drain_steps)
    job.progress["stage"] = "measured window"
    steps, stopped_early = 0, False
    for step in range(warmup_steps, warmup_steps + job.cfg.measure.steps):
        job.member.step(step, measured=True)
        steps += 1
        if job.cfg.lives.stop_below is not None and job.member.epoch_ends(step) and \
                count_ranks(job.comm, job.member.training_after(step)) < job.cfg.lives.stop_below:
            stopped_early = True  # too few accelerators would stay busy: the plan goes on without this run
            break
    job.pipeline.pause()  # until every window has ended (stop_producers)
    seconds, cpu_seconds, wall1 = time.perf_counter() - t0, threadcpu.process_cpu() - cpu0, time.time()
    ticks1 = threadcpu.process_ticks()
    tick_cpu_seconds = ticks1 - ticks0 if ticks0 is not None and ticks1 is not None else None
    thread_cpu = threadcpu.by_group(threads0, threadcpu.snapshot())
    preprocessed = None if prep0 is None else job.pipeline.preprocessed - prep0  # None: the service's workers
    clock1 = job.pipeline.clock.snapshot()
    comm1 = job.transport.stats.as_dict()
    exchange = {k: v - comm0[k] for k, v in comm1.items()}  # collectives in the measured window
    slurm_j1 = read_slurm(job.slurm)
    job.events.log(keys.MEASURE_END, step=warmup_steps + steps, stopped_early=stopped_early)
    if job.monitor:
        job.monitor.mark("measure_end", wall1)
    return Window(seconds, cpu_seconds, tick_cpu_seconds, (wall0, wall1), thread_cpu, preprocessed, (clock0, clock1),
                  exchange, (slurm_j0, slurm_j1), steps, stopped_early)


def stop(job: Job) -> int:
    """Stop the producers together and close the pipeline and the transport; returns how many
    batches the exchange made that no step consumed."""
    t_stop = time.perf_counter()
    discarded = stop_producers(job.comm, job.pipeline)
    job.pipeline.close()
    job.transport.close()
    close = getattr(job.consumer, "close", None)
    if close:  # a deferred gradient exchange applies its last sums; its thread ends
        close()
    job.events.log(keys.STOPPED, seconds=time.perf_counter() - t_stop, discarded_batches=discarded)
    return discarded
