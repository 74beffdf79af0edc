"""Files whose owner process's liveness is a lock: an exclusive ``flock`` that the owner takes as it
creates the file and holds for as long as it lives. The kernel releases it however the process
ends (exit, SIGKILL, the OOM killer), whatever its PID namespace; so a file whose lock anyone can
take has no owner, at once, whatever its age.

Used for a rank's temporary folder (:mod:`enspipe.common.tempdirs`, its ``.owner`` file) and for
the attach server's pool in ``/dev/shm`` (:mod:`enspipe.serve.samples`)::

    fd = create_locked(path, 0o600)         # O_EXCL, locked, and still the file at path
    ...
    reap_unlocked(parent, "prefix-")         # another process: remove the files nobody holds
"""
from __future__ import annotations

import fcntl
import os
from typing import Callable


def create_locked(path: str, mode: int = 0o600) -> int:
    """Create ``path`` (it must not exist), lock it as its owner and return the open descriptor
    that holds the lock; the mode is set exactly (whatever the umask). Between the create and the
    lock a reaper may take the free lock and remove the file: then the path no longer names this
    descriptor's file, and the file is made again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.fchmod(fd, mode)
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:  # reaped between the create and the lock: make it again
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def reap_unlocked(parent: str, prefix: str, lock_of: Callable[[str], str] = lambda p: p,
                  remove: Callable[[str], None] = os.remove) -> list[str]:
    """Remove the entries of ``parent`` named ``prefix*`` whose owner lock (the file
    ``lock_of(entry's path)``) anyone can take: their owners are gone. An entry without a lock file,
    or one this user may not open, is left. Each is removed while its lock is held, so an owner
    can't be starting on it meanwhile. Returns the paths removed."""
    try:
        names = sorted(n for n in os.listdir(parent) if n.startswith(prefix))
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(parent, name)
        try:
            fd = os.open(lock_of(path), os.O_RDONLY)
        except OSError:  # no lock file, not ours to open, or another reaper was first
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner is alive
            os.close(fd)
            continue
        try:
            remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
        except OSError:  # not ours to remove
            pass
        finally:
            os.close(fd)
    return removed
