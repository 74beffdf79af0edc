"""Atomic file writes: a path either does not exist or holds a complete file (no TensorFlow import)."""
from __future__ import annotations

import contextlib
import csv
import json
import os


@contextlib.contextmanager
def atomic_open(path: str, newline: str | None = None, mode: int | None = None, gid: int | None = None):
    """Write to a temporary sibling, flushed to disk, then rename it over ``path``; on failure the
    temporary file is removed and ``path`` is left as it was. ``mode``: the file's exact mode,
    whatever the umask, from its creation on (``gid``: its group)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode & 0o600)
        if mode is not None:
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
        with open(fd, "w", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_json_atomic(path: str, obj, mode: int | None = None, gid: int | None = None) -> None:
    with atomic_open(path, mode=mode, gid=gid) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_csv_atomic(path: str, rows: list[dict], columns) -> None:
    """Rows of dicts with exactly ``columns`` as a CSV with a header."""
    with atomic_open(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)
