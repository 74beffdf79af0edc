"""How a member's process gets and returns memory (``--malloc``).

Preprocessing makes and frees images by the thousand a second: a 224 px float32 image is 588 KiB,
a batch of 64 of them 37 MiB. glibc's malloc serves every block above its mmap threshold (128 KiB
at first, raised as such blocks are freed, to 32 MiB at most) with a fresh ``mmap`` and returns
it to the kernel on ``free``, and trims freed memory off its heaps' tops; so each image's pages are
faulted in, zeroed by the kernel, and given back, again and again. On a virtual machine a page
fault is expensive: measured on a 2-vCPU nested VM (alexnet_v2's preprocessing, 224 px, peak
consumer, 5 + 30 steps), one member at batch 64 took 3.7 million minor faults and 9.3 s of kernel
time, 5.85 ms of CPU per image at 322 images/s; with ``keep``, 0.23 million faults and 1.4 s,
3.05 ms per image at 636 images/s (batch 32: 4.85 against 3.06 ms), for 160 MB more resident
memory (1028 against 866 MB).

``keep`` (the default) tells glibc to serve large blocks from its heaps too and never to trim them,
so freed images' pages are reused in place: the process's footprint is its high-water mark rather
than its current use. Blocks larger than a thread heap (64 MiB) still get their own mapping.
``system`` leaves malloc as the process found it (the ``GLIBC_TUNABLES`` or ``MALLOC_*_``
environment, or glibc's defaults). Without glibc (macOS, musl) ``keep`` cannot be applied and the
summary says so.
"""
from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # bytes (mallopt takes an int): more free memory than a heap's top ever holds
_in_force = ["system"]  # this process's policy, which its worker processes take too


def set_malloc(policy: str) -> str:
    """Apply ``policy`` (``keep`` or ``system``: ``--malloc``'s choices) to this process's malloc, for the blocks
    it allocates from now on; returns what is in force, as the summary records it."""
    if policy == "system":
        return "system"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "system (keep needs glibc's mallopt, which this C library lacks)"
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not (mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM)):
        return "system (glibc's mallopt refused keep's settings)"
    _in_force[0] = "keep"
    return "keep"


def in_force() -> str:
    """The policy :func:`set_malloc` last applied in this process (``system`` if none)."""
    return _in_force[0]
