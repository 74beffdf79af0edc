"""The psutil fallback of the CPU monitor, for nodes without ``mpstat``.

    python -m enspipe.measure.cpusampler INTERVAL [START [PARENT]] > psutil-cpu.<host>.jsonl

Prints, every INTERVAL seconds until SIGINT/SIGTERM, one JSON line per core with mpstat's fields
(percentages over the interval that just ended) and the Unix time ``t`` of the sample. Samples
fall on START plus whole intervals (START: a Unix time, default now), as mpstat's fall on its launch.
PARENT: the pid of the process that started it; once that is gone it stops too (its death signal
is lost where the parent dies before the child asked for it).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

FIELD_MAP = {"usr": "user", "nice": "nice", "sys": "system", "iowait": "iowait", "irq": "irq",
             "soft": "softirq", "steal": "steal", "guest": "guest", "gnice": "guest_nice", "idle": "idle"}


def rows(per_cpu, t: float, host: str) -> list[dict]:
    out = []
    for cpu, times in enumerate(per_cpu):
        out.append({"host": host, "cpu": str(cpu), "t": t,
                    **{k: round(getattr(times, v, 0.0), 2) for k, v in FIELD_MAP.items()}})
    return out


def main(argv: list[str]) -> int:
    import psutil

    interval = float(argv[0]) if argv else 1.0
    start = float(argv[1]) if len(argv) > 1 else time.time()
    parent = int(argv[2]) if len(argv) > 2 else os.getppid()
    host = socket.gethostname()
    stop = threading.Event()  # set by the signal: ends the wait at once (a plain sleep would run to its tick)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    psutil.cpu_times_percent(percpu=True)  # the first call only sets the reference point
    next_t = start + interval
    while next_t < time.time():  # started late: the next tick still on START's grid
        next_t += interval
    while not stop.is_set():
        if stop.wait(max(0.0, next_t - time.time())) or os.getppid() != parent:
            break
        for r in rows(psutil.cpu_times_percent(percpu=True), time.time(), host):
            print(json.dumps(r), flush=True)
        next_t += interval
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
