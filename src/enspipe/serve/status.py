"""What the attach server reports: the consumers attached (their epochs, positions and rates), and
per window and in total the images preprocessed, the deliveries, the sharing factor (deliveries
per preprocessed image; its ideal is the number of consumers attached), the images preprocessed
again (and why), the memory held and the server's CPU (``process_time``, its own nanoseconds and its worker processes'; the total's CPU per delivered image counts from the first consumer's attach,
leaving out the server's start).

A window is the time between two snapshots; its counts are what happened in it.
"""
from __future__ import annotations

import collections
import os
import socket
import time

from enspipe.engine.memory import in_force
from enspipe.measure import threadcpu


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


class Status:
    """The server's counters and the consumers' places; read and written under the server's lock."""

    def __init__(self, sched, opts, pool_bytes: int):
        self.sched, self.opts, self.pool_bytes = sched, opts, pool_bytes
        self.started = time.time()
        self.consumers: dict[int, dict] = {}
        self.departed: collections.deque[dict] = collections.deque(maxlen=50)  # the last ones, not a search's all
        self.left = 0  # consumers that have left, all told
        self.accepted = self.closed = 0  # connections accepted and ended, admitted or not
        self.connections: dict[int, socket.socket] = {}
        self.failures: list[str] = []
        self._last = self._counters()
        self._cpu_first_attach = None  # the server's CPU when its first consumer attached
        self.extra = None  # a rank's part in an MPI server (enspipe.serve.mesh), as a callable
        self.decodes = None  # the backend's decodes (SampleMaker.decodes), as a callable
        self.pool_device = "host"  # where the pool's images are: /dev/shm, or a GPU

    def attached(self, cid: int, conn: socket.socket, hello: dict) -> None:
        if self._cpu_first_attach is None:
            self._cpu_first_attach = threadcpu.process_cpu()
        self.connections[cid] = conn
        self.consumers[cid] = {"consumer": cid, "pid": hello.get("pid"), "name": hello.get("name") or f"consumer{cid}",
                               "attached_at": round(time.time() - self.started, 3), "delivered": 0, "_window": 0}

    def detached(self, cid: int, why: str) -> None:
        self.connections.pop(cid, None)
        c = self.consumers.pop(cid, None)
        if c is not None:
            self.left += 1
            c = {k: v for k, v in c.items() if not k.startswith("_")}
            self.departed.append({**c, "left_at": round(time.time() - self.started, 3), "how": why})

    def gave(self, cid: int, n: int) -> None:
        c = self.consumers[cid]
        c["delivered"] += n
        c["_window"] += n

    def failed(self, problem: str) -> None:
        self.failures.append(problem)

    def close_connections(self) -> None:
        for conn in list(self.connections.values()):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _counters(self) -> dict:
        return {"time": time.monotonic(), "made": self.sched.made, "given": self.sched.given,
                "again": dict(self.sched.again), "cpu": threadcpu.process_cpu()}

    def snapshot(self, state: str) -> dict:
        """The status now: the totals, the window since the last snapshot, and the consumers."""
        now, last = self._counters(), self._last
        seconds = now["time"] - last["time"]
        window = {"seconds": round(seconds, 3), "preprocessed": now["made"] - last["made"],
                  "delivered": now["given"] - last["given"],
                  "preprocessed_again": {r: now["again"][r] - last["again"].get(r, 0) for r in now["again"]},
                  "cpu_seconds": round(now["cpu"] - last["cpu"], 4)}
        window["sharing_factor"] = _ratio(window["delivered"], window["preprocessed"])
        window["cpu_ms_per_delivered_image"] = _ratio(1000 * window["cpu_seconds"], window["delivered"])
        self._last = now
        consumers = []
        for cid, c in self.consumers.items():
            place = self.sched.consumers.get(cid)
            consumers.append({**{k: v for k, v in c.items() if not k.startswith("_")},
                              "epoch": place.epoch if place else None,
                              "position": (self.sched.n - place.left) if place and not place.rollover else 0,
                              "images_per_second": _ratio(c["_window"], seconds)})
            c["_window"] = 0
        total = {"seconds": round(time.time() - self.started, 3), "preprocessed": self.sched.made,
                 "delivered": self.sched.given, "preprocessed_again": dict(self.sched.again),
                 "evictions": self.sched.evictions, "cpu_seconds": round(now["cpu"], 4),
                 "cpu_seconds_serving": round(now["cpu"] - (self._cpu_first_attach or now["cpu"]), 4),
                 "sharing_factor": _ratio(self.sched.given, self.sched.made),
                 "cpu_ms_per_delivered_image": _ratio(1000 * (now["cpu"] - (self._cpu_first_attach or now["cpu"])),
                                                      self.sched.given),
                 "left_out": list(self.failures)}
        return {"state": state, "pid": os.getpid(), "socket": self.opts.socket, "data": str(self.opts.data),
                "num_images": self.sched.n, "batch_size": self.opts.batch_size,
                "backend": self.opts.backend, "malloc": in_force(), **({"decodes": self.decodes()} if self.decodes else {}),
                "memory": {"budget_bytes": self.opts.memory or self.opts.pool_bytes, "pool_bytes": self.pool_bytes, "pool_on": self.pool_device,
                           "held_bytes": self.sched.occupied() * self.opts.sample_bytes,
                           "cached_bytes": (self.sched.occupied() - self.sched.in_use()) * self.opts.sample_bytes,
                           "slots": self.sched.slots, "slots_in_use": self.sched.in_use(),
                           "slots_cached": self.sched.occupied() - self.sched.in_use()},
                "consumers": consumers, "departed": list(self.departed), "consumers_left": self.left,
                "connections": {"accepted": self.accepted, "closed": self.closed}, "window": window, "total": total,
                **({"mpi": self.extra()} if self.extra else {})}

    def totals_line(self) -> str:
        s = self.sched
        if self.extra:  # a rank of an MPI server: its pool's copies came from every rank
            mpi = self.extra()
            return (f"rank {mpi['rank']} of {mpi['ranks']}: {mpi['preprocessed_here']} images preprocessed here, "
                    f"{s.made} copies in this pool, {s.given} delivered here; the job: {mpi['job']['preprocessed']} "
                    f"preprocessed, {mpi['job']['delivered']} delivered (sharing factor "
                    f"{mpi['job']['sharing_factor']}), {s.again['evicted']} preprocessed again after eviction here")
        return (f"{s.made} images preprocessed, {s.given} delivered (sharing factor "
                f"{_ratio(s.given, s.made)}), {s.again['evicted']} preprocessed again after eviction")
