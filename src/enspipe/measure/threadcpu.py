"""Where a member's CPU goes: CPU time per group of threads of this process (Linux ``/proc``).

Stage threads name themselves (``set_thread_name``); TensorFlow names its pools (``tf_data_*``,
``tf_Compute``...). A snapshot maps each thread id to (name, CPU seconds), from ``schedstat``
(nanoseconds) where the kernel has it, else from ``stat`` ticks. Groups are thread names with
trailing digits and separators removed, so a pool's threads add up to one entry.

A member's worker processes (:mod:`enspipe.engine.workers`) are its own: :func:`adopt` adds each
one's threads to the snapshots (under the worker's name) and its CPU to :func:`process_cpu` and
:func:`process_ticks`, and :func:`release` keeps what a worker used once it has ended.
"""
from __future__ import annotations

import ctypes
import os
import re

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PR_SET_NAME = 15


def set_thread_name(name: str) -> None:
    """Name the calling OS thread (at most 15 bytes are kept), so ``/proc`` and ``top -H`` show it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def name_threads(tids, name: str) -> None:
    """Name other threads of this process (say, a library's background threads) by their ids."""
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm", "w") as f:
                f.write(name[:15])
        except OSError:
            pass


def _cpu_seconds(task: str) -> float | None:
    try:
        with open(f"{task}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


_children: dict[int, str] = {}   # adopted worker processes: pid -> thread name
_retired = [0.0, 0.0]            # CPU seconds of released workers: (scheduler's, ticks')


def adopt(pid: int, name: str) -> None:
    """Count process ``pid`` (a worker of this member's) as this process's own from now on."""
    _children[pid] = name


def release(pid: int) -> None:
    """Stop reading worker ``pid``, keeping the CPU it used: call it once the worker has ended
    and before it is reaped (``os.waitid`` with ``WNOWAIT``), while the kernel still has its
    times (ticks only, so the scheduler's clock takes them on the ticks' grain)."""
    if _children.pop(pid, None) is None:
        return
    ticks = _ticks(f"/proc/{pid}/stat") or 0.0
    _retired[0] += ticks
    _retired[1] += ticks


def _ticks(path: str) -> float | None:
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def _children_cpu() -> tuple[float, float]:
    """The adopted workers' CPU seconds so far, ended ones included: (scheduler's, ticks')."""
    sched, ticks = _retired
    for pid in list(_children):
        for _, cpu in _tasks(f"/proc/{pid}/task", None).values():
            sched += cpu
        ticks += _ticks(f"/proc/{pid}/stat") or 0.0
    return sched, ticks


def process_cpu() -> float:
    """This member's CPU seconds on the scheduler's clock: ``time.process_time`` (every thread of
    this process) plus its adopted worker processes'."""
    import time

    return time.process_time() + _children_cpu()[0]


def process_ticks() -> float | None:
    """This process's CPU seconds (every thread, live and ended) as the kernel's tick accounting
    reports them (``/proc/self/stat`` utime + stime over ``SC_CLK_TCK``): the clock ``mpstat``'s
    node CPU is read on, for this process alone; None without ``/proc``. ``time.process_time``
    reads the same CPU on the scheduler's nanosecond clock."""
    own = _ticks("/proc/self/stat")
    return None if own is None else own + _children_cpu()[1]


def snapshot() -> dict[int, tuple[str, float]]:
    """``{tid: (thread name, CPU seconds so far)}`` for every live thread of this process and of
    its adopted workers (named as adopted)."""
    out = _tasks("/proc/self/task", None)
    for pid, name in list(_children.items()):
        out.update(_tasks(f"/proc/{pid}/task", name))
    return out


def _tasks(base: str, name: str | None) -> dict[int, tuple[str, float]]:
    """``{tid: (name, CPU seconds)}`` of the tasks under ``base``, each named ``name`` or its own."""
    out: dict[int, tuple[str, float]] = {}
    if not os.path.isdir(base):
        return out
    for tid in os.listdir(base):
        task = f"{base}/{tid}"
        try:
            with open(f"{task}/comm") as f:
                own = f.read().strip()
        except OSError:
            continue
        cpu = _cpu_seconds(task)
        if cpu is not None:
            out[int(tid)] = (name or own, cpu)
    return out


def group_of(name: str) -> str:
    return re.sub(r"[\W_]*\d*$", "", name) or name


def by_group(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per thread group between two snapshots; threads born in between count from 0.
    Threads that ended in between are lost to this view (their time still counts in the process total)."""
    groups: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        start = before.get(tid, (name, 0.0))[1]
        g = group_of(name)
        groups[g] = groups.get(g, 0.0) + max(0.0, cpu - start)
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))
