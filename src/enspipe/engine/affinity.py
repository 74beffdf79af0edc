"""Enforced core limits: pin a member to K cores and size every thread pool to K.

Ranks on one host get distinct cores while the host has enough (K * local ranks), and share
them round-robin when it does not. The candidate cores are those this process may already use,
so a Slurm allocation's cpuset is respected.
"""
from __future__ import annotations

import os


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def assign_cores(available: list[int], cores: int | None, local_rank: int, local_size: int) -> tuple[list[int], bool]:
    """The cores of one member, and whether members on this host share cores."""
    if cores is None:
        return list(available), local_size > 1
    if cores * local_size <= len(available):
        return available[local_rank * cores:(local_rank + 1) * cores], False
    picked = [available[(local_rank * cores + j) % len(available)] for j in range(cores)]
    return sorted(set(picked)), True


def pin_process(cpus: list[int]) -> list[int]:
    """Set the affinity of every thread of this process; returns the affinity now in force."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):
            pass  # a thread that ended meanwhile
    os.sched_setaffinity(0, cpus)
    return sorted(os.sched_getaffinity(0))


def configure_tensorflow_threads(threads: int, waiting: int = 0) -> int:
    """Size TensorFlow's op pools; takes effect only before TensorFlow executes anything. A process
    that runs several cells (``enspipe ensemble --in-job``) keeps its first cell's pools: returns
    the size in force. ``waiting``: inter-op threads beyond ``threads`` for ops that sleep until
    an exchange delivers (a deferred gradient exchange), so the computation goes on beside them."""
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads + waiting)
    except RuntimeError:  # TensorFlow is initialised: its pools are fixed for the process
        pass
    return tf.config.threading.get_intra_op_parallelism_threads()
