"""Atomic file writes: a path either does not exist or holds a complete file (no TensorFlow import)."""
from __future__ import annotations

import contextlib
import csv
import json
import os


@contextlib.contextmanager
def atomic_open(path: str, newline: str | None = None):
    """Write to a temporary sibling, flushed to disk, then rename it over ``path``; on failure the
    temporary file is removed and ``path`` is left as it was."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_json_atomic(path: str, obj) -> None:
    with atomic_open(path) as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def write_csv_atomic(path: str, rows: list[dict], columns) -> None:
    """Rows of dicts with exactly ``columns`` as a CSV with a header."""
    with atomic_open(path, newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)
