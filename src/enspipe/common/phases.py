"""Where one rank's wall time goes: time stamps at the boundaries of a cell's phases (process and
imports, MPI_Init, placement, TensorFlow, the pipeline, warm-up, the window, the stop, the report),
written beside the summary as ``phases.json`` by rank 0 (``benchmarks/overhead.py`` reads them).

    >>> from enspipe.common import phases
    >>> phases.mark("mpi_init")
    >>> list(phases.stamps())[:2]
    ['process', 'mpi_init']
"""
from __future__ import annotations

import os
import time

from enspipe.common.host import start_ticks

_MARKS: list[tuple[str, float]] = []


def mark(name: str) -> None:
    """Stamp the end of phase ``name`` now (wall-clock seconds)."""
    _MARKS.append((name, time.time()))


def reset() -> None:
    """Forget earlier stamps: a cell that starts inside a longer job (``enspipe ensemble --in-job``)
    stamps ``cell_start`` and its own phases after it."""
    _MARKS.clear()
    mark("cell_start")


def process_start() -> float:
    """When this process started (wall clock, to the kernel's clock tick, 10 ms), or now if unknown."""
    try:
        ticks = start_ticks(os.getpid())
        if ticks is None:
            return time.time()
        with open("/proc/uptime") as f:
            uptime, now = float(f.read().split()[0]), time.time()
        return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def stamps() -> dict[str, float]:
    """``{"process": its start, phase: end, ...}`` in the order marked."""
    return {"process": process_start(), **dict(_MARKS)}
