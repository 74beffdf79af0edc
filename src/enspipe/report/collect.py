"""One tidy table of all cells: a row per cell summary, with what every later table and figure needs.

Members' per-rank numbers are reduced to the cell (means, spreads, sums); every row keeps the
labels that say where its numbers came from (``accelerator``: measured / emulated / none;
``energy_source`` and ``energy_modelled``; ``cpu_source``) and on what machine, and how it ran:
``oversubscribed`` (members on fewer cores than members x cores per member), whether its window
opened in the steady state and describes the work done in it (``window_balance``: images
preprocessed inside the window over those it needed, 1.0 ideally).

CPU comes on two clocks, and every ratio keeps to one of them. The node's (``node_cpu_*``, mpstat
or psutil: the kernel's tick-sampled per-core counters, everything on the host; the paper's
measure) and the cell's own processes' (``process_cpu_*``: ``process_time``, the scheduler's
nanoseconds; ``process_tick_cpu_*``: the same processes in the kernel's ticks, from
``/proc/self/stat``). ``node_quiet`` says whether node and process CPU agree within
:data:`QUIET_TOLERANCE`; ``node_outside_cores`` is their difference in cores over the window (the
host's CPU outside the cell's processes, and the tick sampling's error). Each shared cell's CPU
reduction against the baseline of the same network, consumer, n and core limit is taken on each
clock (``cpu_reduction_node``, ``cpu_reduction_process``, ``cpu_reduction_process_ticks``) and
checked against its ceiling: sharing between n members saves at most n x, so a reduction above
``n * (1 + tolerance)`` is a measuring error. The tolerance is each clock's own noise
(:func:`ceiling_tolerance`): one repeat of a cell on a small shared machine differs from the next
by several percent, so a single-repeat reduction of 2.1x at n = 2 is noise, not a bug.
``exceeds_ceiling`` judges the cell's own processes (either process clock): a measuring error,
never silently plotted. ``exceeds_ceiling_node`` judges the node clock alone: where only it is
above n, the host's CPU outside the cell's processes made the difference (a clock artefact of the
node's measure, which the ceiling finding names as such). The ceiling finding in
``paper_vs_run.md`` does not judge cells whose windows are shorter than
:data:`MIN_JUDGED_WINDOW`: it says to measure more steps.
"""
from __future__ import annotations

import json
import os

import numpy as np

from enspipe.common.atomic import atomic_open
from enspipe.run.grid import Cell

ROW_COLUMNS = (  # one cell's own summary (cell_row)
    "cell", "network", "scheme", "n", "p", "cores", "consumer", "rep",
    "accelerator", "emulated", "rate", "batch_size", "image_size", "steps", "warmup", "wire_dtype", "transport",
    "exchange_path", "window_seconds",
    "images_per_member", "images_per_second_per_member", "images_per_second_min", "images_per_second_max",
    "runtime_mean", "runtime_std", "runtime_min", "runtime_max", "step_time_p50", "wait_time_mean",
    "process_cpu_seconds", "process_cpu_seconds_per_image", "process_tick_cpu_seconds",
    "process_tick_cpu_seconds_per_image", "preprocess_cpu_seconds_per_image", "node_cpu_seconds",
    "node_cpu_seconds_per_image",
    "per_core_busy_mean", "cpu_source", "node_cpu_missing", "collective_cpu_seconds", "collective_seconds_mean",
    "bytes_sent",
    "energy_joules", "energy_above_idle_joules", "mean_watts", "energy_source", "energy_modelled",
    "idle_watts", "idle_source", "energy_modelled_joules",
    "queue_preprocessing_mean", "queue_compute_mean", "epochs_exact", "hosts", "machine", "summary",
    "warmup_steps", "steady", "window_balance", "starved_fraction",
    "members_per_host", "host_cpus", "cores_per_member", "oversubscribed", "hosts_per_kernel", "node_vs_process_cpu",
    "node_quiet", "node_outside_cores",
    "exactly_once", "distinct_min", "window_samples", "skipped_samples", "planned", "preprocessing_path",
)
COLUMNS = ROW_COLUMNS + (  # and against its baseline (add_reductions)
    "reduction_ceiling", "ceiling_tolerance", "ceiling_tolerance_node", "cpu_reduction_node", "cpu_reduction_process",
    "cpu_reduction_process_ticks", "exceeds_ceiling", "exceeds_ceiling_node",
)
# The clocks CPU is read on, each a column of CPU-s per delivered image per member: a ratio keeps to one
CLOCKS = {"process": "process_cpu_seconds_per_image",          # process_time: the scheduler's nanoseconds
          "process_ticks": "process_tick_cpu_seconds_per_image",  # /proc/self/stat: the same CPU in ticks
          "node": "node_cpu_seconds_per_image"}                # mpstat/psutil: ticks, everything on the host
QUIET_TOLERANCE = 0.20     # node CPU within 20% of the cell's processes' CPU: nothing else ran
CEILING_TOLERANCE = 0.05      # a reduction above n by more than this (or the repeats' noise) is a measuring error
MAX_CEILING_TOLERANCE = 0.15  # however noisy the repeats, never more than this
# A window shorter than this can't be judged against the ceiling: a pipeline's once-a-second costs land in
# one cell's window and miss the other's (2-member pairs at 0.3 s measured 1.34-2.07x, at 2 s 1.73-1.95x)
MIN_JUDGED_WINDOW = 2.0  # seconds
BASELINE_KEY = ["network", "consumer", "n", "cores", "batch_size", "image_size"]


def preprocessing_path(s: dict) -> str:
    """Which path preprocessed a cell's images, in words: backend, implementation, decode cache."""
    impl = s.get("preprocess_impl", "reference")
    backend = s.get("backend", "tf")  # (a summary from before backends were recorded: tf's)
    # a backend of one implementation labels it by its own name (enspipe.engine.backends.Backend.label)
    path = impl if impl == "user" or impl.split()[0] == backend else f"{backend} {impl}"
    approx = s.get("approximation")
    if approx:
        path += f" (APPROXIMATION: mean abs error {approx['mean_abs_error']:.3f} of [-1, 1])"
    cache = s.get("decode_cache")
    return path + (f" + decode cache {cache['budget_bytes_per_node'] / 1e9:g} GB" if cache else "")


def cell_row(s: dict, path: str = "") -> dict:
    """The table row of one cell's summary (read from ``path``); the cell is the one the summary
    names, never inferred from where the file lies."""
    if "cell" not in s:
        raise ValueError(f"{path or 'a summary'} names no cell (written before summaries recorded their cell): "
                         "rerun the cell")
    cell = Cell.of(s["cell"])
    ranks = s["ranks"]
    rates = [r["images_per_second"] for r in ranks]
    runtimes = [r["seconds"] for r in ranks]
    images = float(np.mean([r["images"] for r in ranks]))  # delivered per member
    node_cpu = s.get("node_cpu_seconds_total")
    want = s["dataset"]["digest"]
    done = [e for r in ranks for e in r["epochs"]]  # None: no member completed an epoch to check
    exact = all(e["digest"] == want and e["missing"] == 0 for e in done) if done else None
    paths = sorted({p for r in ranks for p in r.get("exchange_paths", {}).values()})
    occ = [r.get("queue_occupancy") or {} for r in ranks]
    planned = s.get("planned")  # an auto cell: the row is the scheme that ran, labelled planned
    return {
        "cell": cell.name, "network": cell.network, "scheme": s["scheme"] if planned else cell.scheme, "n": cell.n,
        "p": s["p"] if planned else cell.p, "planned": planned["requested"] if planned else None,
        "cores": cell.cores, "consumer": cell.consumer, "rep": cell.rep,
        "accelerator": s["accelerator"], "emulated": s["emulated"], "rate": s.get("rate"),
        "batch_size": s["batch_size"], "image_size": s["image_size"], "steps": s["steps"], "warmup": s["warmup"],
        "wire_dtype": s["wire_dtype"], "transport": s["transport"], "exchange_path": "+".join(paths) or "none",
        "preprocessing_path": preprocessing_path(s),
        "window_seconds": (s.get("measured_window") or {}).get("seconds"),
        "images_per_member": images, "images_per_second_per_member": s["images_per_second_per_member"],
        "images_per_second_min": min(rates), "images_per_second_max": max(rates),
        "runtime_mean": float(np.mean(runtimes)), "runtime_std": float(np.std(runtimes)),
        "runtime_min": min(runtimes), "runtime_max": max(runtimes),
        "step_time_p50": float(np.mean([r["step_time_p50"] for r in ranks])),
        "wait_time_mean": float(np.mean([r["wait_time_mean"] for r in ranks])),
        **_cpu(s, images, cell.n),
        "collective_cpu_seconds": float(sum(r["collective_cpu_seconds"] for r in ranks)),
        "collective_seconds_mean": float(np.mean([r["collective_seconds"] for r in ranks])),
        "bytes_sent": int(sum(r["bytes_sent"] for r in ranks)),
        "energy_joules": s.get("energy_joules"), "energy_above_idle_joules": s.get("energy_above_idle_joules"),
        "mean_watts": s.get("mean_watts"), "energy_source": s.get("energy_source"),
        "energy_modelled": s.get("energy_modelled"), "idle_watts": s.get("idle_watts"),
        "idle_source": s.get("idle_source"), "energy_modelled_joules": (s.get("energy_by_source") or {}).get("modelled"),
        "queue_preprocessing_mean": _mean([o.get("preprocessing", {}).get("mean") for o in occ]),
        "queue_compute_mean": _mean([o.get("compute", {}).get("mean") for o in occ]),
        "epochs_exact": exact, "hosts": ",".join(sorted({r["host"] for r in ranks})),
        "machine": _machine(s), "summary": path,
        **_window(s), **_placement(s, ranks), **_delivery(s),
        **_quiet(node_cpu, s["cpu_seconds_total"], (s.get("measured_window") or {}).get("seconds")),
    }


def _cpu(s: dict, images: float, n: int) -> dict:
    """A cell's CPU: its processes' own (on the scheduler's clock and on the tick clock), and its
    nodes' (none where a host's monitor missed the window)."""
    node_cpu, ticks = s.get("node_cpu_seconds_total"), s.get("cpu_seconds_ticks_total")
    busy = [v for host in (s.get("per_core_busy_percent") or {}).values() for v in host.values()]
    return {
        "process_cpu_seconds": s["cpu_seconds_total"],
        "process_cpu_seconds_per_image": s["cpu_seconds_total"] / images / n if images else None,
        "process_tick_cpu_seconds": ticks,
        "preprocess_cpu_seconds_per_image": ((s.get("stages_per_image") or {}).get("preprocess") or {}).get("cpu"),
        "process_tick_cpu_seconds_per_image": ticks / images / n if ticks is not None and images else None,
        "node_cpu_seconds": node_cpu,
        "node_cpu_seconds_per_image": node_cpu / images / n if node_cpu is not None and images else None,
        "per_core_busy_mean": float(np.mean(busy)) if busy else None, "cpu_source": s.get("cpu_source"),
        "node_cpu_missing": "; ".join((s.get("node_cpu_missing") or {}).values()) or None,
    }


def _delivery(s: dict) -> dict:
    """What the members saw: whether the arm promises exactly once, the fewest distinct samples in
    an epoch-length window of one member's deliveries, and the samples skipped in all."""
    d = s.get("delivery") or {}
    return {"exactly_once": d.get("exactly_once"), "distinct_min": d.get("distinct_min"),
            "window_samples": d.get("window_samples"), "skipped_samples": d.get("skipped_samples")}


LAG_COLUMNS = ("scheme", "p", "member", "slow", "slowdown", "accelerator_rate", "images_per_second", "rate_share",
               "skipped_samples",
               "distinct_min", "window_samples", "exactly_once", "cell", "accelerator", "summary")


def lag_rows(paths: list[str]):
    """The lag cells' table (``--slow-member``): one row per member of each cell, its delivered
    rate (and as a share of the fastest member's), the samples it skipped and the fewest distinct
    samples in an epoch-length window of its deliveries."""
    import pandas as pd

    rows = []
    for path in paths:
        with open(path) as f:
            s = json.load(f)
        slow = (s.get("delivery") or {}).get("slow_member") or [None, 1.0]
        top = max(r["images_per_second"] or 0 for r in s["ranks"]) or None
        for r in s["ranks"]:
            d = r.get("delivery") or {}
            rows.append({"scheme": s["scheme"], "p": s["p"], "member": r["rank"], "slow": r["rank"] == slow[0],
                         "slowdown": slow[1] if r["rank"] == slow[0] else 1.0,
                         "accelerator_rate": s["rate"] / slow[1] if s.get("rate") and r["rank"] == slow[0]
                         else s.get("rate"),
                         "images_per_second": r["images_per_second"],
                         "rate_share": r["images_per_second"] / top if top and r["images_per_second"] else None,
                         "skipped_samples": d.get("skipped_samples"), "distinct_min": d.get("distinct_min"),
                         "window_samples": d.get("window_samples"),
                         "exactly_once": (s.get("delivery") or {}).get("exactly_once"),
                         "cell": Cell.of(s["cell"]).name, "accelerator": s["accelerator"], "summary": path})
    return pd.DataFrame(rows, columns=list(LAG_COLUMNS))


def _window(s: dict) -> dict:
    w = s.get("window") or {}
    return {"warmup_steps": w.get("warmup_steps"), "steady": w.get("steady"), "window_balance": w.get("balance"),
            "starved_fraction": w.get("starved_fraction")}


def _placement(s: dict, ranks: list[dict]) -> dict:
    """Members per host, the host's cores, the cores a member really has (its limit, or its share
    of the host when members outnumber them) and whether members share cores."""
    p = s.get("placement") or {}
    members, cpus = p.get("members_per_host"), p.get("host_cpus")
    share = cpus / members if members and cpus else None
    limit = s.get("cores") or cpus
    return {"members_per_host": members, "host_cpus": cpus,
            "cores_per_member": min(limit, share) if share and limit else None,
            "oversubscribed": p.get("oversubscribed", any(r.get("sharing_cores") for r in ranks)),
            "hosts_per_kernel": s.get("hosts_per_kernel")}


def _quiet(node_cpu: float | None, process_cpu: float, seconds: float | None) -> dict:
    """Node CPU against the cell's own: their ratio, whether they agree, and the node's CPU outside
    the cell's processes in cores over the window."""
    if node_cpu is None or not process_cpu:
        return {"node_vs_process_cpu": None, "node_quiet": None, "node_outside_cores": None}
    ratio = node_cpu / process_cpu
    return {"node_vs_process_cpu": ratio, "node_quiet": bool(abs(ratio - 1) <= QUIET_TOLERANCE),
            "node_outside_cores": (node_cpu - process_cpu) / seconds if seconds else None}


def ceiling_tolerance(df, clock: str = "process") -> float:
    """How far above the ceiling n a reduction on ``clock`` (:data:`CLOCKS`) may measure before it
    counts as a measuring error: :func:`ratio_noise` of that clock's :func:`repeat_noise`, at least
    :data:`CEILING_TOLERANCE` and at most :data:`MAX_CEILING_TOLERANCE`."""
    return float(min(max(ratio_noise(repeat_noise(df, clock)), CEILING_TOLERANCE), MAX_CEILING_TOLERANCE))


def ratio_noise(noise: float) -> float:
    """How far a ratio of two cells may stray from the truth when each strays by up to ``noise``:
    a reduction is one cell's CPU over another's, so (1 + noise) / (1 - noise) - 1, about twice
    either's (at 6.5% per cell, 13.9%: the fast run's n = 1 All-Shared repeats at 1.08-1.09x their
    baseline, identical work, were this and not a measuring error)."""
    return (1 + noise) / (1 - noise) - 1 if noise < 1 else float("inf")


PAIR_KEY = ["network", "consumer", "n", "cores", "batch_size", "image_size", "rep"]  # two cells run side by side


def paired_ratios(df, col: str, a, b) -> list[float]:
    """The cells picked by mask ``a`` over those picked by ``b``, on ``col``: one ratio per repeat
    in which both ran, matched on :data:`PAIR_KEY` (a shared job runs such cells next to each
    other, repeat after repeat: :func:`enspipe.run.grid.rounds`). Each mask picks one scheme and P."""
    key = [k for k in PAIR_KEY if k in df]
    left, right = df[a].set_index(key)[col].rename("a"), df[b].set_index(key)[col].rename("b")
    joined = left.to_frame().join(right.to_frame(), how="inner").dropna()
    return [float(x) for x in joined["a"] / joined["b"] if np.isfinite(x)]


def repeat_noise(df, clock: str = "process") -> float:
    """The noise of this table's own repeats on ``clock``: over every cell repeated at least 3
    times, the largest repeat's distance from its cell's median CPU per delivered image on that
    clock (0 without)."""
    return spread(df, CLOCKS[clock])


def spread(df, col: str) -> float:
    """The noise of this table's own repeats of ``col`` (CPU per image, images/s, ...): over every
    cell repeated at least 3 times, the largest repeat's relative distance from its cell's median
    (0 without)."""
    key = [k for k in ("network", "scheme", "n", "p", "cores", "consumer", "batch_size", "image_size") if k in df]
    noise = 0.0
    if len(df) and col in df:
        for _, g in df.dropna(subset=[col]).groupby(key, dropna=False):
            noise = max(noise, relative_spread(g[col].to_numpy(float)))
    return noise


def relative_spread(values) -> float:
    """The largest relative distance of one of ``values`` (a cell's repeats) from their median; 0
    for fewer than 3."""
    v = np.asarray(values, float)
    return float(np.max(np.abs(v / np.median(v) - 1))) if len(v) >= 3 else 0.0


def add_reductions(df):
    """Each non-baseline cell's CPU reduction against the baseline (mean over its repeats) of the
    same network, consumer, n, core limit, batch and image size, on each clock of :data:`CLOCKS`,
    and whether it breaks the ceiling of n (:func:`above_ceiling`)."""
    out = df.copy()
    for col in CLOCKS.values():  # a table from older summaries may lack a clock: its reductions are empty
        if col not in out:
            out[col] = float("nan")
    base = out[out["scheme"] == "baseline"].groupby(BASELINE_KEY, as_index=False)[list(CLOCKS.values())].mean()
    ref = out[BASELINE_KEY].merge(base, on=BASELINE_KEY, how="left")  # row order kept
    shared = (out["scheme"] != "baseline").to_numpy()
    for clock, col in CLOCKS.items():
        out[f"cpu_reduction_{clock}"] = (ref[col].to_numpy(float) / out[col].to_numpy(float)).round(6)
        out.loc[~shared, f"cpu_reduction_{clock}"] = float("nan")
    has = shared & out[["cpu_reduction_node", "cpu_reduction_process"]].notna().any(axis=1).to_numpy()
    tol = {"process": ceiling_tolerance(df, "process"), "node": ceiling_tolerance(df, "node")}
    quiet = flags(out["node_quiet"] if "node_quiet" in out else out["scheme"].map(lambda _: None), True)
    base_quiet = quiet[out["scheme"] == "baseline"].groupby([out[k] for k in BASELINE_KEY], dropna=False).all()
    pair_quiet = quiet & out[BASELINE_KEY].apply(lambda r: bool(base_quiet.get(tuple(r), True)), axis=1)
    error, node = above_ceiling(df["n"], {c: out[f"cpu_reduction_{c}"] for c in CLOCKS}, tol, pair_quiet)
    out["reduction_ceiling"] = df["n"].where(has)
    out["ceiling_tolerance"] = np.where(has, tol["process"], np.nan)
    out["ceiling_tolerance_node"] = np.where(has, tol["node"], np.nan)
    out["exceeds_ceiling"] = error.where(has)
    out["exceeds_ceiling_node"] = node.where(has)
    return out


def flags(col, default: bool = False):
    """A yes/no column as booleans (read back from CSV as bools, strings or floats); empty cells
    are ``default``."""
    import pandas as pd

    return col.map(lambda v: default if pd.isna(v) else str(v).strip().lower() in ("true", "1", "1.0")).astype(bool)


def above_ceiling(n, reductions: dict, tolerance: dict, quiet):
    """``(error, node)`` for shared cells' reductions (by clock, as in :data:`CLOCKS`) against the
    ceiling of ``n``, each clock against its own tolerance (``tolerance["process"]`` serves both
    process clocks). ``node``: the node clock reads above n. ``error``, a measuring error: either
    process clock reads above n; or the node clock does where no process clock reads, or where the
    pair's node was not quiet (``quiet``: both cells' node CPU within :data:`QUIET_TOLERANCE` of
    their processes'). A node-clock reading above n whose process clocks are within it, on a quiet
    node, is the node clock's own disagreement (the host's CPU outside the cells' processes, tick
    sampling): a clock artefact, not an error."""
    process = reductions["process"]
    own = process > n * (1 + tolerance["process"])
    ticks = reductions.get("process_ticks")
    if ticks is not None:
        own = own | (ticks > n * (1 + tolerance["process"]))
    node = reductions["node"] > n * (1 + tolerance["node"])
    artefact = node & ~own & process.notna() & quiet
    return own | (node & ~artefact), node


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _machine(s: dict) -> str:
    m = s.get("machine") or {}
    return f"{m.get('cpu_model', '?')} ({m.get('cpus', '?')} CPUs), {m.get('gpus') or 'no GPU'}"


def collect(paths: list[str]):
    """The tidy table (a pandas DataFrame) of the given cell summaries, sorted by cell."""
    import pandas as pd

    rows = []
    for path in paths:
        with open(path) as f:
            rows.append(cell_row(json.load(f), path))
    df = pd.DataFrame(rows, columns=list(ROW_COLUMNS))
    return add_reductions(df)[list(COLUMNS)].sort_values("cell").reset_index(drop=True)


def write_cells_csv(df, path: str) -> None:
    """The table as ``path``, written atomically."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_open(path, newline="") as f:
        df.to_csv(f, index=False)
