"""A rank's own temporary folder, and the folders of killed ranks reaped.

TensorFlow's autograph writes a module for each function it converts into ``tempfile``'s folder
and removes them at exit, in ``atexit`` handlers that a cell's fast exit (``os._exit``) skips: 17
files per rank and cell were left in /tmp. So each cell process gets a folder of its own
(:func:`own`), removed as it leaves (:func:`remove_own`).

A rank that is killed (SIGKILL, the OOM killer, a scheduler's time limit) never removes its folder.
Its owner lock says so: a rank holds an exclusive ``flock`` on the folder's ``.owner`` file for as
long as it lives, and the kernel releases it however the process ends, whatever its PID namespace.
The next rank to start on the machine reaps every folder whose lock it can take, at once, whatever
its age (:func:`reap_killed`)::

    from enspipe.common import tempdirs

    tempdirs.own()          # reaps the killed ranks' folders, then makes and locks this one's
    ...
    tempdirs.remove_own()   # before os._exit
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

from enspipe.common.ownerlock import create_locked, reap_unlocked

PREFIX = "enspipe-rank-"
OWNER = ".owner"       # locked (flock, exclusive) by the folder's rank while it lives

_OWN: list[tuple[str, int]] = []  # (folder, the open owner file holding its lock)


def own() -> str:
    """Give this process a temporary folder of its own (``tempfile``'s default from now on), locked
    as its owner, after reaping the folders of killed ranks beside it (saying how many). Returns it."""
    parent = tempfile.gettempdir()
    count = reap_killed(parent)
    if count:
        print(f"enspipe: removed {count} temporary folders ({PREFIX}*) from {parent}, left by ranks that were "
              "killed", file=sys.stderr, flush=True)
    while True:
        folder = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
        try:  # a folder without its owner file yet is no reaper's to judge; the file is locked as it is made
            fd = create_locked(os.path.join(folder, OWNER))
            break
        except FileNotFoundError:  # reaped in the instant between the owner file's creation and its lock
            continue
    _OWN.append((folder, fd))
    tempfile.tempdir = folder
    return folder


def remove_own() -> None:
    """Remove this process's folders (:func:`own`) and release their locks."""
    while _OWN:
        folder, fd = _OWN.pop()
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)


def reap_killed(parent: str) -> int:
    """Remove the folders in ``parent`` that ranks left when they were killed: those whose owner lock
    anyone can take (:func:`enspipe.common.ownerlock.reap_unlocked`). A folder with no owner file is
    not enspipe's to judge and is left. Returns how many were removed."""
    return len(reap_unlocked(parent, PREFIX, lock_of=lambda folder: os.path.join(folder, OWNER),
                             remove=lambda folder: shutil.rmtree(folder, ignore_errors=True)))
