"""Power and energy, every number labelled with where it came from.

Energy *counters* (cumulative joules per domain, sampled by :class:`PowerMonitor` on each node):

* ``rapl``: ``/sys/class/powercap/intel-rapl:*`` package and dram zones; counter wrap-around
  handled with ``max_energy_range_uj``. (``psys``, where present, would double-count; left out.)
* ``nvml``: each GPU's total-energy counter (nvidia-ml-py), or its power integrated over time
  where the GPU has no counter. NVML's power reading (and nvidia-smi's ``power.draw``) is an
  average over about a second: integrated, it agrees with the counter over a whole run (1% on the
  recorded H200 load) but lags it at load edges (up to 49% of a 3 s idle phase after a load).
* ``slurm``: ``sstat``'s ConsumedEnergyRaw of the running job step (job-wide; rank 0 only), where
  the cluster gathers energy (``AcctGatherEnergyType``). ``sacct`` gives the same after the job.

Power *series* (watts over time, integrated by the trapezoid rule):

* ``external``: a meter's CSV of (timestamp, watts), like the paper's metered cabinet.
* ``modelled``: ``idle_watts + watts_per_core * busy cores`` from the CPU monitor, per node.
  Labelled ``modelled`` wherever it appears.
"""
from __future__ import annotations

import csv
import glob
import os
import subprocess
import threading
import time
from datetime import datetime

import numpy as np

from enspipe.measure.cpumon import integrate
from enspipe.measure.threadcpu import set_thread_name

COUNTER_SOURCES = ("rapl", "nvml")
# Seconds between counter samples. A window's energy interpolates the cumulative counter at its
# edges; on a recorded H200 load (tests/fixtures/nvml_h200) sampling every 0.5 s misplaced up to
# 13% of a 3-8 s phase's energy across its edges, 0.2 s up to 3%. A read is a sysfs file or an NVML call.
COUNTER_INTERVAL = 0.1
SOURCES = ("rapl", "nvml", "slurm", "external", "modelled")


class PowerUnavailable(RuntimeError):
    """A power source cannot be read here; the message says why and what to do."""


# -- counters -------------------------------------------------------------------------------------
class RaplCounter:
    source = "rapl"

    def __init__(self, root: str = "/sys/class/powercap"):
        self.zones: dict[str, tuple[str, float]] = {}  # domain -> (energy_uj path, range in J)
        for zone in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
            name = _read(os.path.join(zone, "name"))
            parts = os.path.basename(zone).split(":")
            if len(parts) == 2 and name.startswith("package"):
                domain = name
            elif len(parts) == 3 and name == "dram":
                domain = f"{_read(os.path.join(zone[:zone.rindex(':')], 'name'))}/dram"
            else:
                continue  # core/uncore are inside the package; psys would double-count
            rng = float(_read(os.path.join(zone, "max_energy_range_uj"))) / 1e6
            self.zones[domain] = (os.path.join(zone, "energy_uj"), rng)
        if not self.zones:
            raise PowerUnavailable(f"no RAPL zones under {root} (not an Intel/AMD host, or powercap not exposed)")
        self._last: dict[str, float] = {}
        self._offset = dict.fromkeys(self.zones, 0.0)
        try:
            self.read()
        except PermissionError:
            raise PowerUnavailable(f"RAPL counters under {root} are readable by root only "
                                   "(chmod o+r .../energy_uj, or use another power source)") from None

    def read(self) -> dict[str, float]:
        out = {}
        for domain, (path, rng) in self.zones.items():
            raw = float(_read(path)) / 1e6
            last = self._last.get(domain)
            if last is not None and raw < last:  # the counter wrapped
                self._offset[domain] += rng
            self._last[domain] = raw
            out[domain] = raw + self._offset[domain]
        return out


class NvmlCounter:
    source = "nvml"

    def __init__(self, nvml=None):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                raise PowerUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as e:  # noqa: BLE001 - NVMLError has many subclasses
            raise PowerUnavailable(f"NVML is not usable here: {e}") from None
        if not self.handles:
            raise PowerUnavailable("NVML sees no GPU")
        self._integrated: dict[str, list[float]] = {}  # domain -> [joules, last t, last watts]
        self.read()

    def read(self) -> dict[str, float]:
        out, now = {}, time.time()
        for i, h in enumerate(self.handles):
            domain = f"gpu{i}"
            try:
                out[domain] = self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
                continue
            except Exception:  # noqa: BLE001 - no energy counter on this GPU: integrate its power
                pass
            watts = self.nvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            acc = self._integrated.setdefault(domain, [0.0, now, watts])
            acc[0] += (watts + acc[2]) / 2 * (now - acc[1])
            acc[1], acc[2] = now, watts
            out[domain] = acc[0]
        return out


class SlurmStepCounter:
    """ConsumedEnergyRaw (joules) of the running job step, from ``sstat``."""

    source = "slurm"

    def __init__(self, job: str | None = None, step: str | None = None, sstat: str = "sstat"):
        job = job or os.environ.get("SLURM_JOB_ID")
        step = step or os.environ.get("SLURM_STEP_ID")
        if not job or step is None:
            raise PowerUnavailable("not inside a Slurm job step (launch with srun)")
        self.step_id, self.sstat = f"{job}.{step}", sstat
        if self.read()["step"] is None:
            raise PowerUnavailable(f"Slurm records no energy for step {self.step_id} (AcctGatherEnergyType is none)")

    def read(self) -> dict[str, float | None]:
        r = subprocess.run([self.sstat, "--noheader", "--parsable2", "-a", "-j", self.step_id,
                            "--format=ConsumedEnergyRaw"], capture_output=True, text=True, timeout=30)
        return {"step": parse_slurm_energy(r.stdout) if r.returncode == 0 else None}


def parse_slurm_energy(text: str) -> float | None:
    """Sum of the ConsumedEnergyRaw values (joules) in ``sstat``/``sacct --parsable2`` output;
    None where the cluster records none (empty, 0 or unknown on every line)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        value = line.strip().split("|")[-1] if line.strip() else ""
        try:
            v = float(value)
        except ValueError:
            continue
        if v > 0:
            total, seen = total + v, True
    return total if seen else None


def sacct_energy(job_step: str, sacct: str = "sacct") -> float | None:
    """ConsumedEnergyRaw of a finished job step (``JOB.STEP``), from Slurm accounting."""
    r = subprocess.run([sacct, "--noheader", "--parsable2", "-j", job_step, "--format=JobID,ConsumedEnergyRaw"],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise PowerUnavailable(f"sacct failed: {r.stderr.strip()}")
    lines = [ln for ln in r.stdout.splitlines() if ln.split("|")[0] == job_step]
    return parse_slurm_energy("\n".join(lines))


def open_counters(names: list[str], rapl_root: str = "/sys/class/powercap") -> tuple[list, dict[str, str]]:
    """The node counters among ``names`` that work here, and why the others do not."""
    counters, why = [], {}
    makers = {"rapl": lambda: RaplCounter(rapl_root), "nvml": NvmlCounter}
    for name in names:
        if name in makers:
            try:
                counters.append(makers[name]())
            except PowerUnavailable as e:
                why[name] = str(e)
    return counters, why


class PowerMonitor:
    """Samples energy counters every ``interval`` seconds in a thread: ``(t, source, domain, J)``."""

    def __init__(self, counters: list, interval: float = 0.5):
        self.counters, self.interval = counters, interval
        self.samples: list[tuple[float, str, str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="enspipe-power", daemon=True)

    def start(self) -> "PowerMonitor":
        self._sample()
        self._thread.start()
        return self

    def _sample(self) -> None:
        t = time.time()
        for c in self.counters:
            for domain, joules in c.read().items():
                if joules is not None:
                    self.samples.append((t, c.source, domain, joules))

    def _run(self) -> None:
        set_thread_name("enspipe-power")
        while not self._stop.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()


def _by_domain(samples) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """``{(source, domain): [(t, joules), ...] in time order}`` from PowerMonitor samples."""
    series: dict[tuple[str, str], list] = {}
    for t, source, domain, joules in samples:
        series.setdefault((source, domain), []).append((t, joules))
    return {k: sorted(v) for k, v in series.items()}


def counter_energy(samples: list[tuple[float, str, str, float]], t0: float, t1: float) -> dict[str, dict[str, float]]:
    """Joules per (source, domain) in [t0, t1], the cumulative counters interpolated at the edges."""
    out: dict[str, dict[str, float]] = {}
    for (source, domain), pts in _by_domain(samples).items():
        t, j = (np.array(c) for c in zip(*pts))
        if len(t) < 2 or t[0] > t0 + 1e-6 and t[-1] < t1:
            continue
        a, b = np.interp([t0, t1], t, j)
        out.setdefault(source, {})[domain] = float(b - a)
    return out


def counter_power_rows(samples, host: str) -> list[dict]:
    """Watts between consecutive counter samples, per domain (for the power-over-time figure)."""
    rows = []
    for (source, domain), pts in _by_domain(samples).items():
        for (ta, ja), (tb, jb) in zip(pts, pts[1:]):
            if tb > ta:
                rows.append({"t": (ta + tb) / 2, "host": host, "source": source, "domain": domain,
                             "watts": (jb - ja) / (tb - ta)})
    return rows


# -- series ---------------------------------------------------------------------------------------
def read_meter_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
    """(t, watts) from an external meter's CSV: a header naming ``timestamp`` (Unix seconds or
    ISO 8601) and ``watts`` columns, or two unnamed columns in that order; or one GPU's
    ``nvidia-smi -i N --query-gpu=timestamp,power.draw --format=csv -lms 100`` log (local time, as
    nvidia-smi writes it; ``75.20 W`` values)."""
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    except OSError as e:
        raise PowerUnavailable(f"cannot read the meter CSV {path}: {e.strerror}") from None
    if not rows:
        raise PowerUnavailable(f"the meter CSV {path} is empty")
    ti, wi = 0, 1
    header = [c.strip().lower() for c in rows[0]]
    if "watts" in header:
        wi = header.index("watts")
        ti = next((header.index(k) for k in ("timestamp", "time", "t") if k in header), 0)
        rows = rows[1:]
    elif any(h.startswith("power.draw") for h in header):  # nvidia-smi's --format=csv
        wi = next(i for i, h in enumerate(header) if h.startswith("power.draw"))
        ti = header.index("timestamp") if "timestamp" in header else 0
        rows = rows[1:]
    try:
        pts = sorted((_timestamp(r[ti]), float(r[wi].split()[0])) for r in rows)
    except (ValueError, IndexError) as e:
        raise PowerUnavailable(f"the meter CSV {path} has a row that is not (timestamp, watts): {e}") from None
    if len(pts) < 2:
        raise PowerUnavailable(f"the meter CSV {path} needs at least two samples")
    t, w = (np.array(c) for c in zip(*pts))
    return t, w


def _timestamp(s: str) -> float:
    s = s.strip()
    try:
        return float(s)
    except ValueError:
        return datetime.fromisoformat(s.replace("Z", "+00:00").replace("/", "-")).timestamp()  # nvidia-smi: 2026/11/27


def series_energy(t: np.ndarray, watts: np.ndarray, t0: float, t1: float) -> float:
    if t0 < t[0] - 2.0 or t1 > t[-1] + 2.0:
        raise PowerUnavailable(f"the meter's samples ({t[0]:.1f}..{t[-1]:.1f}) do not cover the window "
                               f"({t0:.1f}..{t1:.1f}); start the meter log before the cell")
    return integrate(t, watts, t0, t1)


def modelled_node_power(cpu_rows: list[dict], interval: float, idle_watts: float, watts_per_core: float) -> list[dict]:
    """Per-node modelled watts at each CPU sample: ``idle + watts_per_core * sum(busy)/100``."""
    busy: dict[tuple[str, float], float] = {}
    for r in cpu_rows:
        if r["cpu"] != "all":
            key = (r["host"], r["t"] - interval / 2)
            busy[key] = busy.get(key, 0.0) + r["busy"] / 100.0
    return [{"t": t, "host": host, "source": "modelled", "domain": "node",
             "watts": idle_watts + watts_per_core * cores} for (host, t), cores in sorted(busy.items())]


def modelled_energy(node_cpu_seconds: dict[str, float], seconds: float, idle_watts: float,
                    watts_per_core: float) -> float:
    """The model's energy over a window: idle power of every node plus the busy cores' share
    (the trapezoid integral of the modelled series, computed from the CPU integral directly)."""
    return sum(idle_watts * seconds + watts_per_core * cpu_s for cpu_s in node_cpu_seconds.values())


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()
