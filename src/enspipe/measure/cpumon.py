"""Node CPU utilisation, as the paper measured it: ``mpstat`` per node, integrated over time.

One monitor per node (the lowest rank on the host) runs ``mpstat -P ALL -o JSON <interval>`` for
the cell's lifetime and keeps the raw log (``mpstat.<host>.json``) with a marks file
(``cpu-marks.<host>.json``: launch time, interval, warm-up start, measured-window start and end).
Where ``mpstat`` is missing, :mod:`enspipe.measure.cpusampler` (psutil) writes ``psutil-cpu.<host>.jsonl``
with the same fields. Both parse to one tidy table: a row per (host, cpu, t) with the mpstat
percentages, ``busy = 100 - idle`` and the ``source``.

The CPU integral of a window is the paper's: busy % integrated over time by the trapezoid rule,
summed over cores (and nodes), in CPU-seconds. Each sample is the average over the interval
ending at its timestamp, so it is placed at the interval's midpoint.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import numpy as np

from enspipe.common.atomic import write_csv_atomic, write_json_atomic

FIELDS = ("usr", "nice", "sys", "iowait", "irq", "soft", "steal", "guest", "gnice", "idle")
COLUMNS = ("host", "cpu", "t", *FIELDS, "busy", "source")
SOURCES = ("mpstat", "psutil")


SAMPLE_MARGIN = 0.3  # s: a sample's tick to its line in the log (the monitor's start-up, mpstat's alarm drift)


class CpuMonitorError(RuntimeError):
    pass


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Stop the monitor (SIGINT: mpstat closes its JSON) if the rank that started it dies."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG


def resolve_source(wanted: str) -> str | None:
    """``auto`` is mpstat where installed, else psutil; ``none`` turns the monitor off."""
    if wanted == "none":
        return None
    if wanted in ("auto", "mpstat") and shutil.which("mpstat"):
        return "mpstat"
    if wanted == "mpstat":
        raise CpuMonitorError("mpstat is not installed (Debian/Ubuntu: apt-get install sysstat); "
                              "use --cpu-monitor psutil or auto")
    return "psutil"


class CpuMonitor:
    """The per-node monitor process; ``mark(name)`` records a timestamp, ``stop()`` ends it."""

    def __init__(self, out_dir: str, host: str, source: str, interval: int = 1):
        if source not in SOURCES:
            raise ValueError(f"unknown CPU source {source!r}")
        self.source, self.host, self.interval = source, host, interval
        self.log_path = os.path.join(out_dir, log_name(source, host))
        self.marks_path = os.path.join(out_dir, f"cpu-marks.{host}.json")
        self.marks: dict = {"host": host, "source": source, "interval": interval, "log": os.path.basename(self.log_path)}
        self.marks["launch"] = time.time()
        if source == "mpstat":
            cmd = ["mpstat", "-P", "ALL", "-o", "JSON", str(interval)]
        else:
            cmd = [sys.executable, "-m", "enspipe.measure.cpusampler", str(interval), repr(self.marks["launch"]),
                   str(os.getpid())]
        env = dict(os.environ, S_TIME_FORMAT="ISO", TZ="UTC", LC_ALL="C")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.DEVNULL, env=env,
                                     preexec_fn=_die_with_parent, start_new_session=True)
        self._write_marks()

    def mark(self, name: str, t: float | None = None) -> None:
        self.marks[name] = time.time() if t is None else t
        self._write_marks()

    def _write_marks(self) -> None:
        write_json_atomic(self.marks_path, self.marks)

    def stop(self, linger: float | None = None, covering: float | None = None) -> None:
        """Keep sampling ``linger`` seconds, or until the first sample after the time ``covering``
        has been written (the monitor samples at its launch plus whole intervals; the psutil
        sampler's log is read to see it), or by default one interval and a bit; then stop the
        monitor cleanly."""
        if linger is None and covering is not None:
            ticks = max(1, math.ceil((covering - self.marks["launch"]) / self.interval))
            deadline = self.marks["launch"] + ticks * self.interval + SAMPLE_MARGIN
            while self.source == "psutil" and time.time() < deadline and not self._sampled(covering):
                time.sleep(0.01)  # its line appears within milliseconds of the tick, unless the node is loaded
            linger = max(0.0, deadline - time.time()) if self.source == "mpstat" else 0.0
        time.sleep(self.interval + 0.2 if linger is None else linger)
        if self.proc.poll() is not None:  # it ended before it was asked to: killed, or crashed
            self.marks["ended_early"] = {"returncode": self.proc.returncode, "seen": time.time()}
        else:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.mark("stopped")


    def _sampled(self, t: float) -> bool:
        """Whether the psutil sampler has logged a sample at or after ``t`` (its lines' ``t``)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 512))
                lines = f.read().splitlines()
        except OSError:
            return False
        for line in reversed(lines):
            try:
                return json.loads(line)["t"] >= t
            except (ValueError, KeyError):
                continue  # a line cut short at the tail's start, or being written
        return False


def log_name(source: str, host: str) -> str:
    return f"mpstat.{host}.json" if source == "mpstat" else f"psutil-cpu.{host}.jsonl"


# -- parsing --------------------------------------------------------------------------------------
_TS = re.compile(r'"timestamp":\s*"([^"]+)"')
_DATE = re.compile(r'"date":\s*"([^"]+)"')
_HOST = re.compile(r'"nodename":\s*"([^"]+)"')


def parse_mpstat_json(text: str, launch: float | None = None, interval: float | None = None) -> list[dict]:
    """Rows from ``mpstat -o JSON`` output, complete or cut short by a crash (line-oriented).

    Timestamps are UTC when mpstat ran with ``TZ=UTC S_TIME_FORMAT=ISO`` (the monitor does). They
    have whole-second resolution; with the monitor's ``launch`` time and ``interval``, sample k is
    placed at ``launch + k * interval`` where that agrees with the printed second."""
    date = _DATE.search(text)
    host = _HOST.search(text)
    if not date:
        raise CpuMonitorError("not an mpstat JSON log: no \"date\" field")
    day = _parse_date(date.group(1))
    rows, ts, k, prev = [], None, 0, None
    for line in text.splitlines():
        m = _TS.search(line)
        if m:
            clock = _parse_clock(m.group(1))
            t = day + clock
            if prev is not None and t < prev:  # past midnight
                day += 86400
                t += 86400
            prev, k = t, k + 1
            ts = t
            if launch is not None and interval:
                precise = launch + k * interval
                if abs(precise - (t + 0.5)) <= 1.5:
                    ts = precise
            continue
        line = line.strip().rstrip(",")
        if ts is not None and line.startswith('{"cpu"'):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break  # the last line of a log cut short
            rows.append(_row(host.group(1) if host else "", rec, ts, "mpstat"))
    return rows


def parse_psutil_jsonl(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        rows.append(_row(rec["host"], rec, float(rec["t"]), "psutil"))
    return rows


def _row(host: str, rec: dict, t: float, source: str) -> dict:
    row = {"host": host, "cpu": str(rec["cpu"]), "t": t, **{f: float(rec.get(f, 0.0)) for f in FIELDS}}
    row["busy"] = max(0.0, 100.0 - row["idle"])
    row["source"] = source
    return row


def _parse_date(s: str) -> float:
    for fmt in ("%Y-%m-%d", "%m/%d/%Y", "%m/%d/%y"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise CpuMonitorError(f"mpstat date {s!r} is not in a known format (run mpstat with S_TIME_FORMAT=ISO)")


def _parse_clock(s: str) -> float:
    for fmt in ("%H:%M:%S", "%I:%M:%S %p"):
        try:
            c = datetime.strptime(s, fmt)
            return timedelta(hours=c.hour, minutes=c.minute, seconds=c.second).total_seconds()
        except ValueError:
            continue
    raise CpuMonitorError(f"mpstat timestamp {s!r} is not in a known format")


def read_node_log(out_dir: str, host: str) -> tuple[list[dict], dict]:
    """The tidy rows of one node's monitor log and its marks."""
    with open(os.path.join(out_dir, f"cpu-marks.{host}.json")) as f:
        marks = json.load(f)
    with open(os.path.join(out_dir, marks["log"])) as f:
        text = f.read()
    if marks["source"] == "mpstat":
        rows = parse_mpstat_json(text, marks.get("launch"), marks.get("interval"))
    else:
        rows = parse_psutil_jsonl(text)
    for r in rows:
        r["host"] = host  # the MPI processor name, as everywhere else in the summary
    return rows, marks


# -- integrals ------------------------------------------------------------------------------------
def core_series(rows: list[dict], interval: float) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """``{(host, cpu): (midpoint times, busy %)}`` for every core (the ``all`` rows left out)."""
    out: dict[tuple[str, str], list] = {}
    for r in rows:
        if r["cpu"] != "all":
            out.setdefault((r["host"], r["cpu"]), []).append((r["t"] - interval / 2, r["busy"]))
    return {k: tuple(np.array(c) for c in zip(*sorted(v))) for k, v in out.items()}


def integrate(t: np.ndarray, y: np.ndarray, t0: float, t1: float) -> float:
    """Trapezoid integral of the samples (t, y) over [t0, t1]; values are interpolated at the
    window's edges and held constant beyond the first and last sample."""
    if len(t) == 0 or t1 <= t0:
        return 0.0
    inside = (t > t0) & (t < t1)
    ts = np.concatenate([[t0], t[inside], [t1]])
    ys = np.interp(ts, t, y)
    return float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(ts)))


COMPLETE_COVERAGE = 0.98  # a host's samples must cover this share of the window for its node CPU to count


def coverage(rows: list[dict], interval: float, t0: float, t1: float) -> dict[str, float]:
    """Per host, the share of the window [t0, t1] its monitor's samples cover: a sample covers the
    interval that ends at its timestamp. A monitor that died inside the window covers less than 1."""
    times: dict[str, set[float]] = {}
    for r in rows:
        times.setdefault(r["host"], set()).add(r["t"])
    out = {}
    for host, ts in times.items():
        covered = 0.0
        for t in sorted(ts):
            covered += max(0.0, min(t, t1) - max(t - interval, t0))
        out[host] = min(1.0, covered / (t1 - t0)) if t1 > t0 else 0.0
    return out


def window_cpu(rows: list[dict], interval: float, t0: float, t1: float) -> dict:
    """CPU-seconds per node and per-core average busy % over the window [t0, t1], and each host's
    ``coverage``. A host whose samples cover less than :data:`COMPLETE_COVERAGE` of the window
    (its monitor died, or was killed) has no node CPU (None), never one extrapolated over time the
    monitor did not see."""
    nodes: dict[str, float | None] = {}
    per_core: dict[str, dict[str, float] | None] = {}
    covered = coverage(rows, interval, t0, t1)
    for (host, cpu), (t, busy) in sorted(core_series(rows, interval).items(), key=lambda kv: (kv[0][0], _cpu_key(kv[0][1]))):
        cpu_s = integrate(t, busy, t0, t1) / 100.0
        nodes[host] = nodes.get(host, 0.0) + cpu_s
        per_core.setdefault(host, {})[cpu] = 100.0 * cpu_s / (t1 - t0) if t1 > t0 else 0.0
    for host, share in covered.items():
        if share < COMPLETE_COVERAGE:
            nodes[host], per_core[host] = None, None
    complete = all(v is not None for v in nodes.values())
    return {"node_cpu_seconds": nodes, "node_cpu_seconds_total": float(sum(nodes.values())) if complete else None,
            "per_core_busy_percent": per_core, "window_seconds": t1 - t0, "coverage": covered}


def _cpu_key(cpu: str):
    return (0, int(cpu)) if cpu.isdigit() else (1, cpu)


def write_table(path: str, rows: list[dict]) -> None:
    """The tidy CPU table as CSV, written atomically."""
    write_csv_atomic(path, rows, COLUMNS)
