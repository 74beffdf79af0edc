"""This process's machine and launch: its kernel's boot id, one per booted machine and shared by
every host (container, network-namespaced node) on it, since they share its CPUs and
``/proc/stat``; and the rank and size of the MPI job its launcher started, before MPI starts."""
from __future__ import annotations

import os

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
