"""One structured JSON-lines event log per rank (in the spirit of MLPerf logging).

The first record is the run's configuration; events are named and described in
:data:`enspipe.common.keys.EVENTS`, and no other name is logged; every record has ``event``, ``t`` (Unix time,
seconds) and ``rank``. Lines are flushed as written, so a crashed run leaves a readable log.
"""
from __future__ import annotations

import json
import os
import threading
import time

from enspipe.common.keys import EVENTS


class EventLog:
    def __init__(self, out_dir: str, rank: int):
        self.rank = rank
        self.path = os.path.join(out_dir, f"events.rank{rank:04d}.jsonl")
        self._f = open(self.path, "w", buffering=1)
        self._lock = threading.Lock()

    def log(self, event: str, **fields) -> dict:
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}: declare it in enspipe.common.keys.EVENTS")
        rec = {"event": event, "t": time.time(), "rank": self.rank, **fields}
        line = json.dumps(rec, default=_jsonable)
        with self._lock:
            if not self._f.closed:
                self._f.write(line + "\n")
        return rec

    def close(self) -> None:
        with self._lock:
            self._f.close()


class NullEvents:
    """An :class:`EventLog` that keeps nothing: the library's streams log only when asked to."""

    rank = None
    path = None

    def log(self, event: str, **fields) -> dict:
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}: declare it in enspipe.common.keys.EVENTS")
        return {"event": event, **fields}

    def close(self) -> None:
        pass


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_events(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
