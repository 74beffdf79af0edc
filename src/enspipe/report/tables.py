"""The paper's tables and the data behind its figures, from the tidy cell table and the cells' logs.

Every function takes the cell table (:func:`enspipe.report.collect.collect`, ``cores`` read as strings)
and returns a DataFrame; an empty frame means the grid produced no cells for it. Functions that
need more than the table read the cell's own files (``summary.json``, ``events.rank*.jsonl``,
``cpu.csv``, ``power.csv``) from the directory of the row's ``summary``.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np
import pandas as pd

from enspipe.common import keys
from enspipe.plan.schemes import SCHEME_KINDS
from enspipe.report.collect import above_ceiling, ceiling_tolerance, flags, relative_spread

TRAINING = "consumer != 'peak'"  # cells with an accelerator (emulated or real)


def load(table_csv: str) -> pd.DataFrame:
    return pd.read_csv(table_csv, dtype={"cores": str, "cell": str})


def summary(row) -> dict:
    with open(row["summary"]) as f:
        return json.load(f)


def cell_dir(row) -> str:
    return os.path.dirname(row["summary"])


def provenance(df: pd.DataFrame, machine: bool = True) -> str:
    """One line: accelerator kind, energy source (and machine) of the rows behind an output."""
    if df.empty:
        return "no data"
    def values(col, sep="/"):
        return sep.join(sorted(set(df[col].dropna().astype(str)))) if col in df else ""

    line = f"accelerator: {values('accelerator') or 'none'}"
    line += f"; preprocessing: {values('preprocessing_path', ', ')}" if "preprocessing_path" in df else ""
    line += f"; energy: {values('energy_source') or 'none'}" if "energy_source" in df else ""
    missing = int(df["node_cpu_missing"].notna().sum()) if "node_cpu_missing" in df else 0
    line += f"; node CPU missing in {missing} cells (CPU monitor stopped): left out of node-CPU values" if missing else ""
    return line + f"; machine: {values('machine', '; ')}" if machine and "machine" in df else line


def scheme_order(label: str) -> tuple[int, str]:
    """Sort key of a scheme or ``scheme (P=p)`` label: the schemes' order, then the label."""
    return next((i for i, s in enumerate(SCHEME_KINDS) if str(label).startswith(s)), len(SCHEME_KINDS)), str(label)


def flag(d: pd.DataFrame, column: str, default: bool = False) -> pd.Series:
    """:func:`flags` of ``d[column]``, or ``default`` everywhere where the column is missing."""
    return flags(d[column], default) if column in d else pd.Series(default, index=d.index, dtype=bool)


def _empty(*columns: str) -> pd.DataFrame:
    return pd.DataFrame(columns=list(columns))


def _pair(df: pd.DataFrame, value: str, key: list[str], a: str = "baseline", b: str = "all_shared") -> pd.DataFrame:
    """``value`` of schemes a and b side by side per ``key`` (means over repeats)."""
    cells = df[df["scheme"].isin([a, b])]
    piv = cells.pivot_table(index=key, columns="scheme", values=value, aggfunc="mean")
    if piv.empty or not {a, b} <= set(piv.columns):
        return _empty(*key, a, b)
    return piv.dropna(subset=[a, b]).reset_index()[[*key, a, b]]


def _flags(cells: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Per ``key``: whether every cell's node was quiet (node CPU within 20% of its processes'),
    whether any cell was oversubscribed, and the cells' accelerator kinds."""
    if cells.empty:
        return _empty(*key, "node_quiet", "oversubscribed", "accelerator")
    g = cells.groupby(key)
    return pd.DataFrame({
        "node_quiet": g["node_quiet"].agg(lambda v: bool(flags(v, True).all())),
        "oversubscribed": g["oversubscribed"].agg(lambda v: bool(flags(v).any())),
        "accelerator": g["accelerator"].agg(lambda v: "/".join(sorted(set(v.dropna().astype(str))))),
    }).reset_index()


def _pair_cpu(d: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """Baseline and All-Shared CPU-s per delivered image side by side per ``key``: the node's
    (mpstat, the paper's measure) and the cells' own processes' (``_process``), with the flags."""
    node = _pair(d, "node_cpu_seconds_per_image", key)
    proc = _pair(d, "process_cpu_seconds_per_image", key).rename(
        columns={"baseline": "baseline_process", "all_shared": "all_shared_process"})
    if node.empty:
        return _empty(*key, "baseline", "all_shared", "baseline_process", "all_shared_process", "node_quiet",
                      "oversubscribed", "accelerator")
    cells = d[d["scheme"].isin(["baseline", "all_shared"])]
    return node.merge(proc, on=key, how="left").merge(_flags(cells, key), on=key, how="left")


# -- Section 3: one member alone ------------------------------------------------------------------
def solo_cells(df: pd.DataFrame, cores: str | None = None) -> pd.DataFrame:
    """Single-member baseline cells with an accelerator, optionally at one core limit."""
    d = df.query(TRAINING)
    d = d[(d["scheme"] == "baseline") & (d["n"] == 1)]
    return d if cores is None else d[d["cores"] == cores]


def queue_series(row) -> pd.DataFrame:
    """Fig. 3's data: rank 0's preprocessing- and compute-queue fill (0..1) at every step."""
    path = sorted(glob.glob(os.path.join(cell_dir(row), "events.rank*.jsonl")))[0]
    capacity, rows = None, []
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == keys.OCCUPANCY and capacity is None:
                capacity = e["capacity"]
            elif e.get("event") == keys.STEP:
                rows.append({"step": e["step"], "measured": e["measured"],
                             **{q: e["queues"].get(q) for q in ("preprocessing", "compute")}})
    out = pd.DataFrame(rows, columns=["step", "measured", "preprocessing", "compute"])
    if capacity:
        out[["preprocessing", "compute"]] = out[["preprocessing", "compute"]] / capacity
    return out


def core_series(row) -> tuple[pd.DataFrame, dict]:
    """Fig. 4's data: each core's busy % over time (seconds since launch) and the cell's marks
    (launch, warm-up start, measured window), for the first host of the cell."""
    d = cell_dir(row)
    cpu = pd.read_csv(os.path.join(d, "cpu.csv"), dtype={"cpu": str})
    host = sorted(cpu["host"].unique())[0]
    with open(os.path.join(d, f"cpu-marks.{host}.json")) as f:
        marks = json.load(f)
    cpu = cpu[(cpu["host"] == host) & (cpu["cpu"] != "all")].copy()
    cpu["seconds"] = cpu["t"] - marks["launch"]
    return cpu[["seconds", "cpu", "busy", "source"]], marks


def utilisation(cpu: pd.DataFrame, marks: dict) -> dict:
    """Fig. 4's averages: mean core busy % over the whole log and after start-up (from the
    start of the measured window), as the paper reports 94.3% and 96.0%."""
    after = cpu[cpu["seconds"] >= marks["measure_start"] - marks["launch"]]
    return {"whole_run": float(cpu["busy"].mean()),
            "after_startup": float(after["busy"].mean()) if len(after) else None}


def core_usage_under_limit(df: pd.DataFrame) -> pd.DataFrame:
    """Table 2: average busy % of every core in the measured window, one member alone under a core
    limit; ``allowed`` marks the cores the member was pinned to (means over repeats)."""
    rows = []
    limited = solo_cells(df)
    for _, row in limited[limited["cores"] != "all"].iterrows():
        s = summary(row)
        allowed = {str(c) for r in s["ranks"] for c in (r.get("cores") or [])}
        for host, cores in (s.get("per_core_busy_percent") or {}).items():
            for core, busy in cores.items():
                rows.append({"network": row["network"], "core_limit": row["cores"], "host": host,
                             "core": int(core), "allowed": core in allowed, "busy_percent": busy})
    if not rows:
        return _empty("network", "core_limit", "host", "core", "allowed", "busy_percent", "repeats")
    out = pd.DataFrame(rows).groupby(["network", "core_limit", "host", "core", "allowed"], as_index=False)
    return out.agg(busy_percent=("busy_percent", "mean"), repeats=("busy_percent", "size"))


def solo_vs_parallel(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1: statistics of the members' runtimes (the measured steps), one member alone (every
    repeat) against members of the baseline ensemble run in parallel, same network and core limit."""
    base = df.query(TRAINING)
    base = base[base["scheme"] == "baseline"]
    rows = []
    for (network, cores, consumer), g in base.groupby(["network", "cores", "consumer"]):
        if not ((g["n"] == 1).any() and (g["n"] > 1).any()):
            continue
        for n, cells in g.groupby("n"):
            runs = [[r["seconds"] for r in summary(row)["ranks"]] for _, row in cells.iterrows()]
            times = [t for run in runs for t in run]
            means = [np.mean(run) for run in runs]
            hosts = len(set(",".join(cells["hosts"].astype(str)).split(",")))
            rows.append({"network": network, "cores": cores, "consumer": consumer,
                         "run": "solo" if n == 1 else f"parallel (n={n})", "n": n, "hosts": hosts,
                         "oversubscribed": bool(flag(cells, "oversubscribed").any()),
                         "runs": len(cells), "samples": len(times), "avg": float(np.mean(times)),
                         "std": float(np.std(times, ddof=1)) if len(times) > 1 else 0.0,
                         "min": float(np.min(times)), "max": float(np.max(times)),
                         "repeat_spread": relative_spread(means)})  # of the repeats' mean runtimes
    cols = ["network", "cores", "consumer", "run", "n", "hosts", "oversubscribed", "runs", "samples", "avg", "std",
            "min", "max", "repeat_spread"]
    return pd.DataFrame(rows, columns=cols)


# -- Section 6: sharing ---------------------------------------------------------------------------
ENSPIPE_SCHEMES = tuple(k for k, kind in SCHEME_KINDS.items() if not kind.service)  # the paper's figures' schemes
PEERS = tuple(k for k, kind in SCHEME_KINDS.items() if kind.service)  # measured beside them, in their own outputs


def scheme_label(scheme: str, p) -> str:
    return f"{scheme} (P={int(p)})" if SCHEME_KINDS[scheme].takes_p else scheme


def peak_cells(df: pd.DataFrame, limited: bool) -> pd.DataFrame:
    """Fig. 10a (full cores) or 10b (a core limit): peak(n) per scheme and P."""
    d = df[(df["consumer"] == "peak") & ((df["cores"] != "all") if limited else (df["cores"] == "all"))
           & df["scheme"].isin(ENSPIPE_SCHEMES)].copy()
    d["scheme (P)"] = [scheme_label(s, p) for s, p in zip(d["scheme"], d["p"])]
    return d


def broadcast_cpu(df: pd.DataFrame) -> pd.DataFrame:
    """Fig. 11: CPU-s per delivered image of Single- and Multi-Broadcast normalised to All-Shared at
    the same network, consumer, n > 1 and core limit: node CPU (the paper's) and the cells' own
    processes' (``relative_process``); and of the processes' CPU, the preprocessing's
    (``relative_preprocess``: the same work per image, so 1 but for how loaded the host's cores were)
    and the rest, the exchange's and the pipeline's (``relative_exchange``)."""
    key = ["network", "consumer", "n", "cores"]
    values = ["node_cpu_seconds_per_image", "process_cpu_seconds_per_image", "preprocess_cpu_seconds_per_image"]
    if "preprocess_cpu_seconds_per_image" not in df:
        df = df.assign(preprocess_cpu_seconds_per_image=float("nan"))
    d = df[df["scheme"].isin([k for k, kind in SCHEME_KINDS.items() if kind.shared and not kind.service])
           & (df["n"] > 1)]
    g = d.groupby([*key, "scheme", "p"], as_index=False)[values].mean()
    ref = g[g["scheme"] == "all_shared"].set_index(key)[values].rename(columns=lambda c: "all_shared_" + c[:4])
    out = g[g["scheme"] != "all_shared"].join(ref, on=key).dropna(subset=["all_shared_node"])
    if out.empty:
        return _empty(*key, "scheme", "p", *values, "all_shared_node", "all_shared_proc", "all_shared_prep",
                      "relative_to_all_shared", "relative_process", "relative_preprocess", "relative_exchange",
                      "node_quiet", "oversubscribed", "accelerator")
    out["relative_to_all_shared"] = out["node_cpu_seconds_per_image"] / out["all_shared_node"]
    out["relative_process"] = out["process_cpu_seconds_per_image"] / out["all_shared_proc"]
    out["relative_preprocess"] = out["preprocess_cpu_seconds_per_image"] / out["all_shared_prep"]
    out["relative_exchange"] = ((out["process_cpu_seconds_per_image"] - out["preprocess_cpu_seconds_per_image"])
                                / (out["all_shared_proc"] - out["all_shared_prep"]))
    return out.merge(_flags(d, key), on=key, how="left").reset_index(drop=True)


def cpu_reduction(df: pd.DataFrame) -> pd.DataFrame:
    """Fig. 12: CPU-s per delivered image, baseline over All-Shared, per network, n and core limit,
    with an accelerator and n > 1: by node CPU (``reduction``, the paper's) and by the cells' own
    process CPU (``reduction_process``), beside the ceiling n that sharing between n members
    cannot beat, each clock judged against its own noise (:func:`enspipe.report.collect.above_ceiling`):
    ``exceeds_ceiling`` flags a measuring error, ``exceeds_ceiling_node`` a node-clock reduction above n
    (a clock artefact where the process clock is within it on a quiet node)."""
    d = df.query(TRAINING)
    out = _pair_cpu(d[d["n"] > 1], ["network", "n", "cores"])
    if len(out):
        out["reduction"] = out["baseline"] / out["all_shared"]
        out["reduction_process"] = out["baseline_process"] / out["all_shared_process"]
        tol = {"process": ceiling_tolerance(df, "process"), "node": ceiling_tolerance(df, "node")}
        out["exceeds_ceiling"], out["exceeds_ceiling_node"] = above_ceiling(
            out["n"], {"process": out["reduction_process"], "node": out["reduction"]}, tol,
            flags(out["node_quiet"], True))
    else:
        out = out.assign(reduction=[], reduction_process=[], exceeds_ceiling=[], exceeds_ceiling_node=[])
    return out


def core_limit_speedup(df: pd.DataFrame) -> pd.DataFrame:
    """Fig. 13: runtime improvement of All-Shared over the baseline at each core limit (images/s
    per member, All-Shared over baseline: the same steps, so the runtime ratio), with both cells'
    CPU per image (node and process) beside it."""
    d = df.query(TRAINING)
    d = d[d["n"] > 1]
    key = ["network", "n", "cores"]
    out = _pair(d, "images_per_second_per_member", key)
    out["speedup"] = out["all_shared"] / out["baseline"] if len(out) else []
    cpu = _pair_cpu(d, key).rename(columns={"baseline": "baseline_cpu_per_image",
                                            "all_shared": "all_shared_cpu_per_image"})
    return out.merge(cpu, on=key, how="left") if len(out) else out.assign(
        **{c: [] for c in cpu.columns if c not in key})


def slowdown_at_one_core(df: pd.DataFrame) -> pd.DataFrame:
    """Table 3: per scheme and network, images/s per member at full cores over at 1 core, with the
    cores a member really had in each (``full_cores_per_member``: at full cores its share of the
    host when members outnumber the cores)."""
    cells = df.query(TRAINING)
    index = ["network", "scheme", "n", "p"]
    cols = [*index, "full_cores", "one_core", "slowdown", "full_cores_per_member", "one_core_per_member"]
    piv = cells.pivot_table(index=index, columns="cores", values="images_per_second_per_member", aggfunc="mean")
    if piv.empty or not {"1", "all"} <= set(piv.columns.astype(str)):
        return _empty(*cols)
    piv.columns = piv.columns.astype(str)
    out = piv[["all", "1"]].dropna().rename(columns={"all": "full_cores", "1": "one_core"}).reset_index()
    out["slowdown"] = out["full_cores"] / out["one_core"]
    have = cells.pivot_table(index=index, columns="cores", values="cores_per_member", aggfunc="mean")
    have.columns = have.columns.astype(str)
    have = have.reindex(columns=["all", "1"]).rename(
        columns={"all": "full_cores_per_member", "1": "one_core_per_member"}).reset_index()
    return out.merge(have, on=index, how="left")[cols]


# -- energy ---------------------------------------------------------------------------------------
def headline_power(row) -> pd.DataFrame:
    """A cell's node power over time from its headline energy source (domains and hosts summed at
    each sample time, to 0.1 s), with seconds since the measured window's start."""
    p = pd.read_csv(os.path.join(cell_dir(row), "power.csv"))
    sources = str(row["energy_source"]).split("+")
    p = p[p["source"].isin(sources)].assign(t=lambda x: x["t"].round(1))
    p = p.groupby("t", as_index=False)["watts"].sum()
    start = (summary(row).get("measured_window") or {}).get("start")
    p["seconds"] = p["t"] - (start if start is not None else p["t"].min())
    return p


def idle_power(idle: dict | None, df: pd.DataFrame) -> pd.DataFrame:
    """Table 4: the idle node's power (mean, min, variance over the idle window) and the maximum
    power observed in any cell, with their sources."""
    cols = ["source", "modelled", "idle_seconds", "mean_watts", "min_watts", "variance", "max_observed_watts",
            "max_observed_in", "idle_share_of_max"]
    if not idle:
        return _empty(*cols)
    peak, where = None, None
    for _, row in df.dropna(subset=["energy_source"]).iterrows():
        if os.path.exists(os.path.join(cell_dir(row), "power.csv")):
            p = headline_power(row)
            if len(p) and (peak is None or p["watts"].max() > peak):
                peak, where = float(p["watts"].max()), f"{row['cell']} ({row['energy_source']})"
    s = idle.get("series") or {}
    return pd.DataFrame([{
        "source": idle["source"], "modelled": idle.get("modelled"), "idle_seconds": idle.get("seconds"),
        "mean_watts": idle["watts"], "min_watts": s.get("min"), "variance": s.get("variance"),
        "max_observed_watts": peak, "max_observed_in": where,
        "idle_share_of_max": idle["watts"] / peak if peak else None}], columns=cols)


def energy(df: pd.DataFrame) -> pd.DataFrame:
    """Table 5: mean power with and without idle, and All-Shared's savings above idle, per network
    (full cores, n > 1, with an accelerator). ``savings_power_percent`` is the paper's metric (mean
    power above idle); ``savings_energy_percent`` compares energy above idle per delivered image."""
    d = df.query(TRAINING).dropna(subset=["energy_joules"])
    d = d[(d["n"] > 1) & (d["cores"] == "all") & d["scheme"].isin(["baseline", "all_shared"])].copy()
    cols = ["network", "n", "scheme", "energy_source", "mean_watts", "watts_above_idle",
            "joules_above_idle_per_image", "savings_power_percent", "savings_energy_percent"]
    if d.empty:
        return _empty(*cols)
    d["watts_above_idle"] = d["energy_above_idle_joules"] / d["window_seconds"]
    d["joules_above_idle_per_image"] = d["energy_above_idle_joules"] / (d["images_per_member"] * d["n"])
    g = d.groupby(["network", "n", "scheme", "energy_source"], as_index=False)[
        ["mean_watts", "watts_above_idle", "joules_above_idle_per_image"]].mean()
    base = g[g["scheme"] == "baseline"].set_index(["network", "n"])
    rows = []
    for _, r in g.iterrows():
        r = r.to_dict()
        b = base.loc[(r["network"], r["n"])] if (r["network"], r["n"]) in base.index else None
        shared = r["scheme"] == "all_shared" and b is not None
        r["savings_power_percent"] = 100 * (1 - r["watts_above_idle"] / b["watts_above_idle"]) if shared else None
        r["savings_energy_percent"] = (100 * (1 - r["joules_above_idle_per_image"] / b["joules_above_idle_per_image"])
                                       if shared else None)
        rows.append(r)
    order = {"baseline": 0, "all_shared": 1}
    out = pd.DataFrame(rows, columns=cols)
    return out.sort_values(["scheme", "network"], key=lambda c: c.map(order) if c.name == "scheme" else c,
                           ignore_index=True)


# -- the peer: the tf.data service beside enspipe's schemes ------------------------------------------
PEER_VALUES = ("process_cpu_seconds_per_image", "node_cpu_seconds_per_image", "images_per_second_per_member")


def peer_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Every scheme beside the tf.data service at the same network, n > 1 and core limit (peak
    cells): medians over repeats of CPU-s per delivered image (the cells' own processes', and the
    node's) and images/s per member (with the repeats' min and max), the CPU reduction against
    the baseline, and what the members saw (the fewest distinct samples in an epoch-length window,
    samples skipped)."""
    key = ["network", "n", "cores"]
    d = df[(df["consumer"] == "peak") & (df["n"] > 1)]
    with_peer = d[d["scheme"].isin(PEERS)][key].drop_duplicates()
    d = d.merge(with_peer, on=key)
    cols = [*key, "scheme", "p", "label", "repeats", *PEER_VALUES, "rate_min", "rate_max",
            "reduction_vs_baseline", "distinct_min", "window_samples", "skipped_samples", "exactly_once",
            "oversubscribed", "accelerator", "machine"]
    if d.empty:
        return _empty(*cols)
    g = d.groupby([*key, "scheme", "p"], as_index=False).agg(
        repeats=("cell", "size"), **{v: (v, "median") for v in PEER_VALUES},
        rate_min=("images_per_second_per_member", "min"), rate_max=("images_per_second_per_member", "max"),
        distinct_min=("distinct_min", "min"), window_samples=("window_samples", "max"),
        skipped_samples=("skipped_samples", "sum"), exactly_once=("exactly_once", "first"),
        oversubscribed=("oversubscribed", "max"), accelerator=("accelerator", "first"), machine=("machine", "first"))
    base = g[g["scheme"] == "baseline"].set_index(key)["process_cpu_seconds_per_image"].rename("base")
    g = g.join(base, on=key)
    g["reduction_vs_baseline"] = g["base"] / g["process_cpu_seconds_per_image"]
    g["label"] = [scheme_label(s, p) for s, p in zip(g["scheme"], g["p"])]
    g["order"] = [scheme_order(label)[0] for label in g["label"]]
    g = g.sort_values(["network", "cores", "n", "order", "p"], key=lambda c: c.astype(str) if c.name == "cores" else c)
    return g[cols].reset_index(drop=True)


def peer_verdict(t: pd.DataFrame) -> dict | None:
    """Which is cheaper, the tf.data service or All-Shared, per (n, core limit) with both: the
    CPU-s per delivered image of each (their own processes') and the ratio service / All-Shared."""
    out = {}
    for (net, n, cores), g in t.groupby(["network", "n", "cores"]):
        a = g[g["scheme"] == "all_shared"]["process_cpu_seconds_per_image"]
        for _, r in g[g["scheme"].isin(PEERS)].iterrows():
            if len(a):
                out[(net, n, cores, r["label"])] = (float(a.iloc[0]), float(r["process_cpu_seconds_per_image"]))
    return out or None
