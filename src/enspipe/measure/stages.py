"""Where a member's time goes: CPU and wall seconds per stage of its pipeline over the window.

A delivered image passes through these stages (:data:`STAGES`, in order); each is measured where
it runs, so the CPU seconds add up to the member's process CPU (``other`` is the remainder:
the queue sampler, the heartbeat, the exchange thread outside its collectives, MPI's progress,
Python's garbage collector):

=============  =============================================================================
read           the read stage's thread and its tf.data pool: TFRecord I/O, shuffling, parsing
preprocess     the preprocess stage's thread and its tf.data pool, or the pillow backend's threads
               and worker processes: JPEG decode and augmentation
copy_in        copying this member's block into the exchange (the node-shared slot, or the
               receive buffer where its own block is part of what it receives)
collective     the rest of the exchange: waiting for peers in barriers and MPI collectives and
               the copies MPI makes inside them (there is no copy out: the consumer reads the
               assembled batch in place)
hand_off       the consumer's thread taking the batch from the queue, its ledger and event log
consume        the consumer's step (nothing for ``peak``, a sleep for ``emulated``)
other          the process's CPU outside every stage above
=============  =============================================================================

Wall seconds are the time each stage spent working, not waiting for room in its output queue
nor (as far as it can be told: tf.data reads the preprocess stage's input ahead) for its input;
stages run concurrently, so the slowest stage's wall time per image sets the pace. For
``hand_off`` the wall time is the consumer's wait for its batch, for ``collective`` the time in
collectives, waiting for peers included. CPU seconds of ``read`` and
``preprocess`` come from their threads' CPU (:mod:`enspipe.measure.threadcpu`), ``copy_in`` and
``collective`` from the transport's counters, the others from :class:`StageClock` around the code
that does them.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager

STAGES = ("read", "preprocess", "copy_in", "collective", "hand_off", "consume", "other")
# stage -> its thread groups: the stage's thread (tf.data's pool threads take its name), the pillow
# backend's threads and its worker processes' (enspipe.engine.workers; their CPU is the member's)
THREAD_GROUPS = {"read": ("enspipe-read",),
                 "preprocess": ("enspipe-preproc", "enspipe-pillow", "enspipe-worker")}


class StageClock:
    """Wall and CPU seconds accumulated per stage, from any thread (CPU is the calling thread's)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._wall: dict[str, float] = {}
        self._cpu: dict[str, float] = {}

    def add(self, stage: str, wall: float, cpu: float = 0.0) -> None:
        if stage not in STAGES:
            raise KeyError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        with self._lock:
            self._wall[stage] = self._wall.get(stage, 0.0) + wall
            self._cpu[stage] = self._cpu.get(stage, 0.0) + cpu

    @contextmanager
    def timed(self, stage: str):
        t, c = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t, time.thread_time() - c)

    def snapshot(self) -> dict[str, tuple[float, float]]:
        """``{stage: (wall seconds, CPU seconds)}`` so far."""
        with self._lock:
            return {s: (self._wall[s], self._cpu.get(s, 0.0)) for s in self._wall}


def breakdown(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
              thread_cpu: dict[str, float], exchange: dict[str, float], process_cpu: float
              ) -> dict[str, dict[str, float]]:
    """Each stage's ``cpu_seconds`` and ``wall_seconds`` in a window: ``before``/``after`` are
    :meth:`StageClock.snapshot` at its ends, ``thread_cpu`` its CPU per thread group
    (:func:`enspipe.measure.threadcpu.by_group`), ``exchange`` its transport's counters' differences
    (:class:`enspipe.exchange.base.TransportStats`) and ``process_cpu`` the process's CPU. ``other`` is
    what is left (never below zero: thread and process CPU are read at slightly different instants)."""
    def clock(stage):
        (w1, c1), (w0, c0) = after.get(stage, (0.0, 0.0)), before.get(stage, (0.0, 0.0))
        return w1 - w0, c1 - c0

    copy = (exchange.get("copy_seconds", 0.0), exchange.get("copy_cpu_seconds", 0.0))
    walls_cpus = {
        "read": (clock("read")[0], sum(thread_cpu.get(g, 0.0) for g in THREAD_GROUPS["read"])),
        "preprocess": (clock("preprocess")[0], sum(thread_cpu.get(g, 0.0) for g in THREAD_GROUPS["preprocess"])),
        "copy_in": copy,
        "collective": (exchange.get("collective_seconds", 0.0) - copy[0],
                       exchange.get("collective_cpu_seconds", 0.0) - copy[1]),
        "hand_off": clock("hand_off"),
        "consume": clock("consume"),
    }
    out = {s: {"cpu_seconds": max(0.0, c), "wall_seconds": max(0.0, w)} for s, (w, c) in walls_cpus.items()}
    rest = process_cpu - sum(v["cpu_seconds"] for v in out.values())
    out["other"] = {"cpu_seconds": max(0.0, rest), "wall_seconds": 0.0}
    return out


def mean_per_image(reports: list[dict]) -> dict[str, dict[str, float]]:
    """Each stage's CPU and wall seconds per delivered image, the mean over members
    (``{stage: {"cpu": s, "wall": s}}``) from their reports' ``stages`` and ``images``."""
    rows = [r for r in reports if r.get("images") and r.get("stages")]
    if not rows:
        return {}
    return {s: {k: sum(r["stages"][s][f"{k}_seconds"] / r["images"] for r in rows) / len(rows)
                for k in ("cpu", "wall")} for s in STAGES}
