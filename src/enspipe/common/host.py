"""This process's machine and launch: its kernel's boot id, one per booted machine and shared by
every host (container, network-namespaced node) on it, since they share its CPUs and
``/proc/stat``; the rank and size of the MPI job its launcher started, before MPI starts; and a
process's identity (host, boot, pid, start time), by which a peer on its host may end it."""
from __future__ import annotations

import os
import signal
import socket

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """The kernel's boot id ("" where it cannot be read)."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


# what launchers tell a process of its place before MPI_Init: MPICH's Hydra and Slurm's PMI (PMI_*),
# Open MPI (OMPI_COMM_WORLD_*), an srun step (SLURM_STEP_NUM_TASKS, SLURM_PROCID)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
_RANK_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def launched() -> tuple[int, int] | None:
    """``(rank, size)`` of the job the launcher started this process in, from its environment, or
    None where no launcher said (a process started alone is a job of one, MPI decides)."""
    for size_var, rank_var in zip(_SIZE_VARS, _RANK_VARS):
        size, rank = os.environ.get(size_var), os.environ.get(rank_var)
        if size and rank and size.isdigit() and rank.isdigit():
            return int(rank), int(size)
    return None


def host_id() -> str:
    """This host, as MPI's shared-memory split sees it: its name and its kernel's boot."""
    return f"{socket.gethostname()}/{boot_id()}"


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or None
    where it is gone or cannot be read; with the pid and boot id, it names one process for good."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may hold spaces
    return int(fields[19])  # field 22 of the whole line: state is field 3, fields[0] here


def process_identity() -> dict:
    """This process, named so that another on its host can end it, and only it:
    ``{host, pid, started}`` (:func:`host_id`, :func:`start_ticks`)."""
    pid = os.getpid()
    return {"host": host_id(), "pid": pid, "started": start_ticks(pid)}


def end_process(identity: dict) -> bool:
    """SIGKILL the process ``identity`` names (:func:`process_identity`) where it is on this host,
    is still the same process (its pid not reused: the same start time) and is not this one; True
    where the signal was sent. A stopped process takes no SIGTERM until it is continued; SIGKILL
    ends it at once."""
    pid = identity.get("pid")
    if identity.get("host") != host_id() or not isinstance(pid, int) or pid == os.getpid() or identity.get("started") is None:
        return False
    if start_ticks(pid) != identity["started"]:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True
