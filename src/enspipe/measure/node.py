"""A cell's node-level measurements over its measured window: CPU (mpstat) and energy.

The lowest rank on each host runs a :class:`NodeMonitor` for the cell's lifetime: the CPU monitor
(:mod:`enspipe.measure.cpumon`) and the node's energy counters (:mod:`enspipe.measure.power`). At the end every
monitor integrates its node over the job's window (the earliest member's measurement start to
the latest one's end) and rank 0 combines the nodes with the job-wide sources (Slurm, an external
meter) into the summary's fields (:func:`job_fields`) and the tidy ``cpu.csv`` and ``power.csv``.
"""
from __future__ import annotations

import json
import platform
import socket
import time

import numpy as np

from enspipe.common.atomic import write_csv_atomic, write_json_atomic
from enspipe.common.host import boot_id
from enspipe.measure import cpumon, power

POWER_COLUMNS = ("t", "host", "source", "domain", "watts")
AUTO_ORDER = (("external",), ("slurm",), ("rapl", "nvml"), ("modelled",))


def cpu_model() -> str:
    """This host's CPU model (``/proc/cpuinfo``'s model name; the architecture where unreadable)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        return model


def preference(requested: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """Groups of sources in order of preference; rapl and nvml add up (CPU + GPU)."""
    if requested == ("auto",):
        return AUTO_ORDER
    groups: list[tuple[str, ...]] = []
    for s in requested:
        if s in power.COUNTER_SOURCES and any(set(g) <= set(power.COUNTER_SOURCES) for g in groups):
            i = next(i for i, g in enumerate(groups) if set(g) <= set(power.COUNTER_SOURCES))
            groups[i] = groups[i] + (s,)
        elif (s,) not in groups:
            groups.append((s,))
    return tuple(groups)


class NodeMonitor:
    """CPU monitor and energy counters of one node, for one cell."""

    def __init__(self, out_dir: str, host: str, cpu_source: str | None, requested: tuple[str, ...],
                 interval: int, rapl_root: str = "/sys/class/powercap"):
        self.out_dir, self.host, self.interval = out_dir, host, interval
        self.requested = requested
        names = [s for s in power.COUNTER_SOURCES if requested == ("auto",) or s in requested]
        counters, self.unavailable = power.open_counters(names, rapl_root)
        explicit = [s for s in names if s in self.unavailable and requested != ("auto",)]
        if explicit:
            raise power.PowerUnavailable(f"--power {explicit[0]} on {host}: {self.unavailable[explicit[0]]}")
        self.power = power.PowerMonitor(counters, interval=power.COUNTER_INTERVAL).start() if counters else None
        self.cpu = cpumon.CpuMonitor(out_dir, host, cpu_source, interval) if cpu_source else None

    def mark(self, name: str, t: float | None = None) -> None:
        if self.cpu:
            self.cpu.mark(name, t)

    def finish(self, t0: float, t1: float) -> dict:
        """Stop, parse and integrate this node over [t0, t1]."""
        if self.cpu:
            self.cpu.mark("window_start", t0)
            self.cpu.mark("window_end", t1)
            self.cpu.stop(covering=t1)
        if self.power:
            self.power.stop()
        out = {"host": self.host, "kernel": boot_id(), "interval": self.interval,
               "cpu_source": self.cpu.source if self.cpu else None, "cpu_rows": [],
               "cpu": None, "counter_energy": {}, "power_rows": [], "unavailable": self.unavailable}
        if self.cpu:
            rows, _ = cpumon.read_node_log(self.out_dir, self.host)
            out["cpu_rows"], out["cpu"] = rows, cpumon.window_cpu(rows, self.interval, t0, t1)
        if self.power:
            out["counter_energy"] = power.counter_energy(self.power.samples, t0, t1)
            out["power_rows"] = power.counter_power_rows(self.power.samples, self.host)
        return out


def _machine_total(nodes: list[dict], per_host: dict[str, float]) -> tuple[float, int]:
    """The job's node CPU-s, each machine counted once, and the most hosts that share one kernel.
    Hosts on one kernel (network-namespaced nodes, containers) each see the whole machine's CPU in
    mpstat or psutil, so their readings are one machine's, averaged, not added."""
    kernels: dict[str, list[float]] = {}
    for n in nodes:
        kernels.setdefault(n.get("kernel") or n["host"], []).append(per_host[n["host"]])
    return float(sum(sum(v) / len(v) for v in kernels.values())), max(len(v) for v in kernels.values())


def _cpu_fields(cpu_nodes: list[dict]) -> dict:
    """The summary's node CPU fields from the nodes whose CPU monitor ran (all None without one).
    A host whose monitor's samples do not cover the window has none (``node_cpu_missing`` says
    why, ``node_cpu_coverage`` how much was seen), and then neither has the job's total."""
    if not cpu_nodes:
        return dict(cpu_source=None, node_cpu_seconds=None, node_cpu_seconds_total=None, per_core_busy_percent=None,
                    hosts_per_kernel=None, node_cpu_coverage=None, node_cpu_missing=None)
    per_host = {n["host"]: n["cpu"]["node_cpu_seconds"].get(n["host"]) for n in cpu_nodes}
    covered = {n["host"]: round(n["cpu"].get("coverage", {}).get(n["host"], 0.0), 4) for n in cpu_nodes}
    missing = {h: f"the CPU monitor ({n['cpu_source']}) on {h} stopped before the window ended: its samples cover "
                  f"{covered[h]:.0%} of the window, so no node CPU is reported for it"
               for n in cpu_nodes for h in [n["host"]] if per_host[h] is None}
    total, shared = _machine_total(cpu_nodes, per_host) if not missing else (None, None)
    return dict(cpu_source="+".join(sorted({n["cpu_source"] for n in cpu_nodes})), node_cpu_seconds=per_host,
                per_core_busy_percent={n["host"]: (n["cpu"]["per_core_busy_percent"].get(n["host"]) or {})
                                       for n in cpu_nodes},
                node_cpu_seconds_total=total, hosts_per_kernel=shared, node_cpu_coverage=covered,
                node_cpu_missing=missing or None)


def _headline(by_source: dict[str, float], requested: tuple[str, ...], seconds: float, n_nodes: int,
              idle_watts: float, idle_file: str | None) -> dict:
    """The headline energy: the first preferred group of sources that was read, and above idle."""
    headline = next((g for g in preference(requested) if any(s in by_source for s in g)), None)
    if headline is None:
        return dict(energy_joules=None, energy_above_idle_joules=None, mean_watts=None, energy_source=None,
                    energy_modelled=None, idle_watts=None, idle_source=None)
    used = [s for s in headline if s in by_source]
    energy = float(sum(by_source[s] for s in used))
    source = "+".join(used)
    if source != "modelled" and idle_file:
        with open(idle_file) as f:
            idle = json.load(f)
        idle_total, idle_source = idle["watts"] * n_nodes, f"{idle['source']} idle measurement ({idle_file})"
    else:
        idle_total, idle_source = idle_watts * n_nodes, "modelled (idle_watts parameter)"
    return dict(energy_joules=energy, energy_above_idle_joules=energy - idle_total * seconds,
                mean_watts=energy / seconds if seconds > 0 else None, energy_source=source,
                energy_modelled=source == "modelled", idle_watts=idle_total, idle_source=idle_source)


def job_fields(nodes: list[dict], t0: float, t1: float, requested: tuple[str, ...], *, idle_watts: float,
               watts_per_core: float, idle_file: str | None = None, power_csv: str | None = None,
               slurm_joules: float | None = None, slurm_why: str | None = None) -> tuple[dict, list[dict]]:
    """The summary's CPU and energy fields for the whole job, and the power-over-time rows."""
    seconds = t1 - t0
    fields: dict = {"measured_window": {"start": t0, "end": t1, "seconds": seconds}}
    unavailable: dict[str, str] = {}
    for node in nodes:
        for s, why in node["unavailable"].items():
            unavailable.setdefault(s, f"{node['host']}: {why}")
    cpu_nodes = [n for n in nodes if n["cpu"] is not None]
    fields.update(_cpu_fields(cpu_nodes))

    by_source: dict[str, float] = {}
    domains: dict[str, dict[str, float]] = {}
    rows = [r for n in nodes for r in n["power_rows"]]
    for source in power.COUNTER_SOURCES:
        have = [n for n in nodes if source in n["counter_energy"]]
        if have and len(have) == len(nodes):
            domains[source] = {f"{n['host']}/{d}": j for n in have for d, j in n["counter_energy"][source].items()}
            by_source[source] = float(sum(domains[source].values()))
        elif have:
            unavailable.setdefault(source, f"only {len(have)} of {len(nodes)} nodes have it")
    if slurm_joules is not None:
        by_source["slurm"] = slurm_joules
    elif slurm_why:
        unavailable["slurm"] = slurm_why
    if power_csv:
        try:
            t, w = power.read_meter_csv(power_csv)
            by_source["external"] = power.series_energy(t, w, t0, t1)
            rows += [{"t": float(a), "host": "*", "source": "external", "domain": "meter", "watts": float(b)}
                     for a, b in zip(t, w) if t0 - 5 <= a <= t1 + 5]
        except power.PowerUnavailable as e:
            if "external" in requested:
                raise
            unavailable["external"] = str(e)
    if fields["node_cpu_missing"]:
        unavailable.setdefault("modelled", "node CPU is missing: " + "; ".join(fields["node_cpu_missing"].values()))
    elif cpu_nodes:
        by_source["modelled"] = power.modelled_energy(fields["node_cpu_seconds"], seconds, idle_watts, watts_per_core)
        for n in cpu_nodes:
            rows += power.modelled_node_power(n["cpu_rows"], n["interval"], idle_watts, watts_per_core)
    elif "modelled" not in requested:
        unavailable.setdefault("modelled", "no CPU monitor ran")

    fields.update(_headline(by_source, requested, seconds, max(1, len(nodes)), idle_watts, idle_file))
    fields.update(energy_by_source=by_source, energy_domains=domains, energy_unavailable=unavailable,
                  power_model={"idle_watts": idle_watts, "watts_per_core": watts_per_core})
    return fields, sorted(rows, key=lambda r: (r["source"], r["host"], r["domain"], r["t"]))


def write_power_table(path: str, rows: list[dict]) -> None:
    write_csv_atomic(path, rows, POWER_COLUMNS)


def power_stats(rows: list[dict], sources: list[str], idle_watts: float) -> dict:
    """Min, max, mean and variance of the node's power over time from the given sources (their
    domains summed at each sample time, to 0.1 s); the model's idle figure is a constant."""
    if sources == ["modelled"]:
        return {"min": idle_watts, "max": idle_watts, "mean": idle_watts, "variance": 0.0, "samples": 0,
                "note": "constant: the power model's idle_watts parameter"}
    per_t: dict[float, float] = {}
    for r in rows:
        if r["source"] in sources:
            key = round(r["t"], 1)
            per_t[key] = per_t.get(key, 0.0) + r["watts"]
    w = np.array(list(per_t.values()))
    if not len(w):
        return {"min": None, "max": None, "mean": None, "variance": None, "samples": 0}
    return {"min": float(w.min()), "max": float(w.max()), "mean": float(w.mean()), "variance": float(w.var()),
            "samples": int(len(w))}


def measure_idle_power(out: str, seconds: float, requested: tuple[str, ...], power_csv: str | None,
                       idle_watts: float) -> dict:
    """Sample this node's power for ``seconds`` while it idles and store the mean watts.

    Uses the first available of the requested sources (as for a cell); where nothing can be
    measured the stored figure is the model's ``idle_watts``, labelled ``modelled``."""
    host = socket.gethostname()
    groups = preference(requested)
    names = [s for s in power.COUNTER_SOURCES if any(s in g for g in groups)]
    counters, why = power.open_counters(names)
    mon = power.PowerMonitor(counters, interval=0.5).start() if counters else None
    t0 = time.time()
    time.sleep(seconds)
    t1 = time.time()
    by_source: dict[str, float] = {}
    rows: list[dict] = []  # watts over time, per source and domain (Table 4's min / variance / max)
    if mon:
        mon.stop()
        for source, doms in power.counter_energy(mon.samples, t0, t1).items():
            by_source[source] = sum(doms.values()) / (t1 - t0)
        rows += power.counter_power_rows(mon.samples, host)
    if power_csv:
        try:
            t, w = power.read_meter_csv(power_csv)
            by_source["external"] = power.series_energy(t, w, t0, t1) / (t1 - t0)
            inside = (t >= t0) & (t <= t1)
            rows += [{"t": float(a), "host": host, "source": "external", "domain": "meter", "watts": float(b)}
                     for a, b in zip(t[inside], w[inside])]
        except power.PowerUnavailable as e:
            why["external"] = str(e)
    by_source["modelled"] = idle_watts
    if any("slurm" in g for g in groups):  # job-step energy includes the job: not an idle figure
        why["slurm"] = "use a measured node source for idle power"
    group = next(g for g in groups + (("modelled",),) if any(s in by_source for s in g))
    used = [s for s in group if s in by_source]
    idle = {"watts": float(sum(by_source[s] for s in used)), "source": "+".join(used), "host": host,
            "seconds": t1 - t0, "start": t0, "end": t1, "by_source": by_source, "unavailable": why,
            "modelled": used == ["modelled"], "series": power_stats(rows, used, idle_watts)}
    write_json_atomic(out, idle)
    return idle
