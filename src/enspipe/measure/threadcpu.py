"""Where a member's CPU goes: CPU time per group of threads of this process (Linux ``/proc``).

Stage threads name themselves (``set_thread_name``); TensorFlow names its pools (``tf_data_*``,
``tf_Compute``...). A snapshot maps each thread id to (name, CPU seconds), from ``schedstat``
(nanoseconds) where the kernel has it, else from ``stat`` ticks. Groups are thread names with
trailing digits and separators removed, so a pool's threads add up to one entry.
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


def process_ticks() -> float | None:
    """This process's CPU seconds (every thread, live and ended) as the kernel's tick accounting
    reports them (``/proc/self/stat`` utime + stime over ``SC_CLK_TCK``): the clock ``mpstat``'s
    node CPU is read on, for this process alone; None without ``/proc``. ``time.process_time``
    reads the same CPU on the scheduler's nanosecond clock."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, ValueError, IndexError):
        return None


def snapshot() -> dict[int, tuple[str, float]]:
    """``{tid: (thread name, CPU seconds so far)}`` for every live thread of this process."""
    out: dict[int, tuple[str, float]] = {}
    base = "/proc/self/task"
    if not os.path.isdir(base):
        return out
    for tid in os.listdir(base):
        task = f"{base}/{tid}"
        try:
            with open(f"{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        cpu = _cpu_seconds(task)
        if cpu is not None:
            out[int(tid)] = (name, cpu)
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
