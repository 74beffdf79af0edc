"""This process's machine: its kernel's boot id, one per booted machine and shared by every host
(container, network-namespaced node) on it, since they share its CPUs and ``/proc/stat``."""
from __future__ import annotations

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """The kernel's boot id ("" where it cannot be read)."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""
