"""The paper's figures and tables from the tidy table of cells (the workflow's ``cells.csv``).

:func:`render` writes every output registered in :data:`OUTPUTS` (its name, formats, report section
and writer, declared once with :func:`output`) into one folder: figures as PNG and PDF,
tables as CSV and Markdown. Each says where its numbers came from (measured / emulated
accelerator / modelled power) and on what machine; where the grid produced no data for one, it
says so in its place instead of failing. The data come from :mod:`enspipe.report.tables`, the paper
comparison from :mod:`enspipe.report.findings`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from enspipe.report import findings, heterogeneous, predicted, tables
from enspipe.common.atomic import atomic_open
from enspipe.report.tables import provenance, scheme_order

FIG, TAB = ("png", "pdf"), ("csv", "md")
REPORTED = ("png", "csv")  # the formats the HTML report shows; the others sit beside them


@dataclass(frozen=True)
class Output:
    """One figure or table: its file stem, formats, section of the HTML report (whose caption is
    ``workflow/report/<name>.rst``) and the function that writes it at a path stem."""

    name: str
    formats: tuple[str, ...]
    category: str
    write: Callable[["Inputs", str], None]


@dataclass(frozen=True)
class Inputs:
    """What every output is drawn from: the cell table, its derived tables, calibration, idle power."""

    df: pd.DataFrame
    tables: dict
    rates: dict | None
    idle: dict | None
    ensembles: dict | None = None     # arm -> enspipe ensemble's ensemble.json, where the workflow ran them

    @property
    def source(self) -> str:  # where the training cells' numbers came from
        return provenance(self.df.query(tables.TRAINING))


OUTPUTS: dict[str, Output] = {}  # the registry, in the report's order; filled by @output below


def output(name: str, formats: tuple[str, ...], category: str):
    def register(write):
        OUTPUTS[name] = Output(name, formats, category, write)
        return write
    return register


def workflow_outputs(report, figures_dir: str, captions_dir: str) -> list:
    """The figures rule's outputs under ``figures_dir``, each reported format wrapped by Snakemake's
    ``report`` with its caption ``<captions_dir>/<name>.rst``."""
    return [report(f"{figures_dir}/{o.name}.{ext}", caption=f"{captions_dir}/{o.name}.rst", category=o.category)
            if ext in REPORTED else f"{figures_dir}/{o.name}.{ext}"
            for o in OUTPUTS.values() for ext in o.formats]


# -- writing --------------------------------------------------------------------------------------
def write_table(df: pd.DataFrame, path_stem: str, caption: str) -> None:
    """``<stem>.csv`` and ``<stem>.md`` (with the caption; "no data" where the table is empty),
    each written atomically."""
    os.makedirs(os.path.dirname(path_stem) or ".", exist_ok=True)
    with atomic_open(path_stem + ".csv", newline="") as f:
        df.to_csv(f, index=False)
    body = _markdown(df) if not df.empty else "*No data: the grid has no cells for this table.*"
    with atomic_open(path_stem + ".md") as f:
        f.write(f"{caption}\n\n{body}\n")


def _markdown(df: pd.DataFrame) -> str:
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if np.isnan(v) else f"{v:.3g}"
        return str(v).replace("|", "/")

    rows = [" | ".join(map(str, df.columns)), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(cell(v) for v in r) for r in df.itertuples(index=False)]
    return "\n".join(f"| {r} |" for r in rows)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path_stem: str, note: str) -> None:
    fig.text(0.01, -0.02, note, fontsize=7, color="0.35", ha="left", va="top", wrap=True)
    for ext in FIG:
        fig.savefig(f"{path_stem}.{ext}", dpi=130, bbox_inches="tight")
    _plt().close(fig)


def _no_data(path_stem: str, title: str, why: str) -> None:
    fig, ax = _plt().subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.6, title, ha="center", fontsize=11, weight="bold")
    ax.text(0.5, 0.35, f"No data: {why}", ha="center", fontsize=10)
    _save(fig, path_stem, "")


def _panels(k: int, width: float = 5.0, height: float = 3.8):
    fig, axes = _plt().subplots(1, k, figsize=(width * k, height), squeeze=False, layout="constrained")
    return fig, axes[0]


# -- figures --------------------------------------------------------------------------------------
def queue_figure(df: pd.DataFrame, path_stem: str) -> None:
    """Fig. 3: preprocessing- and compute-queue fill over the steps of one member alone."""
    title = "Fig. 3: queue occupancy, one member alone (baseline, full cores)"
    solo = tables.solo_cells(df, "all").sort_values(["network", "rep"]).drop_duplicates("network")
    if solo.empty:
        return _no_data(path_stem, title, "the grid has no single-member baseline cells at full cores")
    fig, axes = _panels(len(solo))
    for ax, (_, row) in zip(axes, solo.iterrows()):
        q = tables.queue_series(row)
        for name, style in (("preprocessing", "-"), ("compute", "--")):
            ax.plot(q["step"], q[name], style, label=f"{name} queue")
        warm = q[~q["measured"]]["step"]
        if len(warm):
            ax.axvspan(warm.min() - 0.5, warm.max() + 0.5, color="0.9", label="warm-up")
        ax.set(title=f"{row['network']} (batch {row['batch_size']}, {row['accelerator']} accelerator)",
               xlabel="step", ylabel="queue fill (fraction of capacity)", ylim=(-0.05, 1.05))
        ax.legend(fontsize=7)
    fig.suptitle(title)
    _save(fig, path_stem, provenance(solo))


def utilisation_figure(df: pd.DataFrame, path_stem: str) -> None:
    """Fig. 4: each core's utilisation over time, one member alone, per core limit."""
    title = "Fig. 4: per-core utilisation, one member alone (baseline)"
    solo = tables.solo_cells(df).sort_values(["network", "rep"])
    solo = solo[solo["network"] == solo["network"].iloc[0]] if len(solo) else solo
    solo = solo.drop_duplicates("cores").sort_values("cores", key=lambda c: c.map(lambda v: (v == "all", v)))
    if solo.empty:
        return _no_data(path_stem, title, "the grid has no single-member baseline cells")
    fig, axes = _panels(len(solo))
    for ax, (_, row) in zip(axes, solo.iterrows()):
        cpu, marks = tables.core_series(row)
        for core, g in cpu.groupby("cpu", sort=False):
            ax.plot(g["seconds"], g["busy"], lw=1, label=f"core {core}")
        for key in ("measure_start", "measure_end"):
            ax.axvline(marks[key] - marks["launch"], color="k", ls=":", lw=0.8)
        u = tables.utilisation(cpu, marks)
        after = f"{u['after_startup']:.1f}%" if u["after_startup"] is not None else "n/a"
        limit = "all cores" if row["cores"] == "all" else f"{row['cores']}-core limit"
        ax.set(title=f"{row['network']}, {limit}\nmean {u['whole_run']:.1f}% (whole run), {after} (measured window)",
               xlabel="seconds since launch (dotted: measured window)", ylabel="busy %", ylim=(-2, 102))
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    _save(fig, path_stem, provenance(solo) + f"; CPU source: {'/'.join(sorted(set(solo['cpu_source'].astype(str))))}")


def peak_figure(df: pd.DataFrame, rates: dict | None, path_stem: str, limited: bool) -> None:
    """Fig. 10a/b: peak(n) per scheme and P, one panel per network (and core limit), each
    network's accelerator rate rc as a horizontal line; points are medians over repeats, bars
    their min-max range."""
    import seaborn as sns

    which = "a core limit per member" if limited else "full cores"
    title = f"Fig. 10{'b' if limited else 'a'}: peak preprocessing throughput peak(n), {which}"
    cells = tables.peak_cells(df, limited)
    if cells.empty:
        return _no_data(path_stem, title, f"the grid has no peak-consumer cells at {which}")
    panels = sorted(set(zip(cells["network"], cells["cores"])))
    fig, axes = _panels(len(panels))
    order = sorted(cells["scheme (P)"].unique(), key=scheme_order)
    for ax, (net, cores) in zip(axes, panels):
        d = cells[(cells["network"] == net) & (cells["cores"] == cores)]
        sns.lineplot(d, x="n", y="images_per_second_per_member", hue="scheme (P)", hue_order=order, marker="o",
                     ax=ax, estimator="median", errorbar=("pi", 100), err_style="bars", err_kws={"capsize": 3})
        rc = ((rates or {}).get("networks", {}).get(net) or {}).get("rc")
        if rc:
            ax.axhline(rc, color="k", ls="--", lw=1, label=f"rc {net} = {rc:.0f} img/s")
        ax.legend(fontsize=7)
        ax.set(title=f"{net}, cores per member: {cores}", xlabel="ensemble size n", ylabel="images/s per member",
               xticks=sorted(d["n"].unique()))
    reps = cells.groupby(["scheme", "p", "n", "cores"]).size()
    spread = f"median of {reps.min()}" + (f"-{reps.max()}" if reps.max() > reps.min() else "") + \
        " repeats per point, bars: min-max"
    fig.suptitle(title)
    _save(fig, path_stem, f"{spread}. {_placement_note(cells)}{provenance(cells)}")


def _placement_note(d: pd.DataFrame) -> str:
    """Which of the figure's cells had members sharing cores, or a node that was not quiet."""
    notes = []
    over = d[tables.flag(d, "oversubscribed")]
    if len(over):
        notes.append("members share cores (oversubscribed) at n = " + ", ".join(map(str, sorted(set(over["n"])))))
    loud = d[~tables.flag(d, "node_quiet", default=True)]
    if len(loud):
        what = loud["cell"] if "cell" in loud else loud["network"] + " n=" + loud["n"].astype(str)
        notes.append("NODE NOT QUIET (node CPU differs from the cells' own process CPU by more than 20%) in: "
                     + ", ".join(sorted(set(what.astype(str)))))
    return "".join(f"{n}. " for n in notes)


def _bars(data: pd.DataFrame, x: str, y: str, hue: str, path_stem: str, title: str, ylabel: str, note: str,
          ref: float | None = 1.0, marker: str | None = None, marker_label: str = "",
          ceiling: str | None = None, flag: str | None = None) -> None:
    """Grouped bars of ``y`` (one per ``x`` and ``hue``), each labelled with its value; optionally
    a second measure of each bar as a black cross (``marker``), each bar's ceiling as a red dash,
    and bars whose ``flag`` is set hatched (a measuring error)."""
    xs = list(dict.fromkeys(data[x]))
    hues = sorted(data[hue].unique(), key=scheme_order)
    width = 0.8 / len(hues)
    fig, ax = _plt().subplots(figsize=(min(13.0, max(6.0, 0.45 * len(xs) * max(1, len(hues)))), 4))
    seen: set[str] = set()

    def once(label: str) -> str:
        return "_" if label in seen or seen.add(label) else label

    for j, h in enumerate(hues):
        d = data[data[hue] == h].set_index(x)
        here = [(i, xv) for i, xv in enumerate(xs) if xv in d.index]
        pos = np.array([i + (j - (len(hues) - 1) / 2) * width for i, _ in here])
        rows = [d.loc[xv] for _, xv in here]
        bars = ax.bar(pos, [r[y] for r in rows], width, label=str(h))
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
        if marker:
            ax.plot(pos, [r[marker] for r in rows], "kx", ms=6, label=once(marker_label))
        if ceiling:
            ax.hlines([r[ceiling] for r in rows], pos - width / 2, pos + width / 2, colors="red", linestyles="--",
                      label=once("ceiling: n (sharing saves at most n x)"))
        if flag:
            for b, r in zip(bars, rows):
                if tables.flags(pd.Series([r[flag]])).iloc[0]:
                    b.set_hatch("//")
                    b.set_edgecolor("red")
                    b.set_label(once("above the ceiling: a measuring error"))
    if ref is not None:
        ax.axhline(ref, color="k", lw=0.8)
    ax.set(title=title, ylabel=ylabel, xlabel="")
    ax.set_xticks(range(len(xs)), xs)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path_stem, note)


def broadcast_cpu_figure(t11: pd.DataFrame, df: pd.DataFrame, path_stem: str) -> None:
    title = "Fig. 11: CPU of Single- and Multi-Broadcast normalised to All-Shared"
    if t11.empty:
        return _no_data(path_stem, title, "the grid has no All-Shared cells with Single/Multi-Broadcast peers")
    d = t11.assign(cell=[f"{net}\n{con}, n={n}, c={c}" for net, con, n, c in
                         zip(t11["network"], t11["consumer"], t11["n"], t11["cores"])],
                   scheme=[tables.scheme_label(s, p) for s, p in zip(t11["scheme"], t11["p"])])
    _bars(d, "cell", "relative_to_all_shared", "scheme", path_stem, title,
          "node CPU-s per image / All-Shared's", _placement_note(t11) + provenance(df[df["scheme"] != "baseline"]),
          marker="relative_process", marker_label="the cells' own process CPU")


def pair_figure(t: pd.DataFrame, value: str, df: pd.DataFrame, path_stem: str, title: str, ylabel: str,
                **bars) -> None:
    """Figs. 12 and 13: All-Shared against the baseline per network, one bar per n and core limit."""
    if t.empty:
        return _no_data(path_stem, title, "the grid has no baseline/All-Shared pairs with an accelerator and n > 1")
    d = t.assign(cell=[f"n={n}, cores per member: {c}" for n, c in zip(t["n"], t["cores"])])
    _bars(d, "network", value, "cell", path_stem, title, ylabel,
          _placement_note(t) + provenance(df.query(tables.TRAINING)), **bars)


def peer_figure(t: pd.DataFrame, path_stem: str) -> None:
    """Every scheme beside the tf.data service: CPU-s per delivered image and images/s per member
    (medians over repeats, bars: min-max), one panel pair per core limit."""
    title = "enspipe's schemes and the tf.data service, side by side (peak, no accelerator)"
    if t.empty:
        return _no_data(path_stem, title, "the grid has no tfdata_service cells beside the schemes'")
    limits = sorted(set(t["cores"]), key=lambda c: (c != "all", c))
    fig, axes = _plt().subplots(2, len(limits), figsize=(6.5 * len(limits), 7.5), squeeze=False, layout="constrained")
    labels = sorted(set(t["label"]), key=scheme_order)
    width = 0.8 / len(labels)
    for j, cores in enumerate(limits):
        d = t[t["cores"] == cores]
        ns = sorted(set(d["n"]))
        for i, label in enumerate(labels):
            rows = d[d["label"] == label].set_index("n").reindex(ns)
            xs = np.arange(len(ns)) + (i - (len(labels) - 1) / 2) * width
            hatch = "xx" if label.startswith(tables.PEERS) else None
            axes[0][j].bar(xs, rows["process_cpu_seconds_per_image"] * 1e3, width, label=label, hatch=hatch)
            err = [rows["images_per_second_per_member"] - rows["rate_min"],
                   rows["rate_max"] - rows["images_per_second_per_member"]]
            axes[1][j].bar(xs, rows["images_per_second_per_member"], width, yerr=err, capsize=2, label=label,
                           hatch=hatch)
        for k, ylabel in enumerate(("CPU ms per delivered image (own processes)", "images/s per member")):
            ax = axes[k][j]
            ax.set_xticks(range(len(ns)), [f"n={n}" for n in ns])
            ax.set(ylabel=ylabel, title=f"cores per member: {cores}")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    seen = t.dropna(subset=["distinct_min"])
    repeats = f"{int(t['repeats'].min())}+ repeats per bar" if len(t) else ""
    short = seen[seen["distinct_min"] < seen["window_samples"]]
    what = ("; fewest distinct samples in an epoch-length window: " + ", ".join(
        f"{r.label} n={r.n} c={r.cores}: {int(r.distinct_min)}/{int(r.window_samples)}" for r in short.itertuples())
        if len(short) else "")
    _save(fig, path_stem, f"Hatched: the tf.data service (at most once per member). {repeats}{what}. "
                          f"{_placement_note(t)}{provenance(t)}")


def prediction_figure(t: pd.DataFrame, path_stem: str) -> None:
    """The cost model against the run: predicted vs measured images/s per member and CPU-s per
    delivered image, one point per cell, the identity line, each scheme's median |error| in the
    legend; cells the model does not cover are listed, never dropped silently."""
    from enspipe.report.predicted import GOAL, errors_by_scheme

    title = "The cost model (enspipe plan) against the run"
    d = t.dropna(subset=["predicted_rate", "measured_rate", "predicted_cpu", "measured_cpu"])
    if d.empty:
        return _no_data(path_stem, title, "no cell the model covers (or no calibration to predict from)")
    errs = errors_by_scheme(t).set_index("scheme")
    fig, axes = _plt().subplots(1, 2, figsize=(11, 4.8), layout="constrained")
    for ax, what, scale, unit in ((axes[0], "rate", 1, "images/s per member"),
                                  (axes[1], "cpu", 1e3, "CPU ms per delivered image")):
        for i, (scheme, g) in enumerate(d.groupby("scheme", sort=False)):
            e = errs.loc[scheme, f"{what}_median_abs_error"]
            shared = g["oversubscribed"].astype(bool)
            for k, (part, marker) in enumerate(((g[~shared], "o"), (g[shared], "x"))):
                ax.scatter(part[f"measured_{what}"] * scale, part[f"predicted_{what}"] * scale, s=22, marker=marker,
                           color=f"C{i}", label=None if k else f"{scheme}: median |err| {e:.0%} ({len(g)})")
        lo = min(d[f"measured_{what}"].min(), d[f"predicted_{what}"].min()) * scale * 0.8
        hi = max(d[f"measured_{what}"].max(), d[f"predicted_{what}"].max()) * scale * 1.2
        ax.plot([lo, hi], [lo, hi], "k-", lw=1)
        ax.fill_between([lo, hi], [lo * (1 - GOAL), hi * (1 - GOAL)], [lo * (1 + GOAL), hi * (1 + GOAL)],
                        color="0.9", zorder=0, label=f"within {GOAL:.0%}")
        ax.set(xscale="log", yscale="log", xlabel=f"measured {unit}", ylabel=f"predicted {unit}")
        ax.legend(fontsize=7)
    skipped = t[t["not_modelled"].notna()].groupby("not_modelled").size()
    fig.suptitle(title)
    _save(fig, path_stem, "Line: prediction = measurement; band: the goal; crosses: members sharing cores. "
          + ("Not predicted: " + "; ".join(f"{k} ({v} cells)" for k, v in skipped.items()) + ". " if len(skipped) else "")
          + f"Collective costs: {t['comm_source'].iloc[0]}.")


def paper_grid_figure(curves: pd.DataFrame, meta: dict | None, path_stem: str) -> None:
    """The paper's Fig. 10, predicted: peak(n) of each scheme and P over the paper's grid (its
    first network's preprocessing, one member per node), each network's rc as a line, one panel
    per core limit. Nothing here ran: every panel says PREDICTED."""
    title = "PREDICTED: the paper's Fig. 10 from its own measurements (enspipe plan --config config/paper.yaml)"
    if curves.empty or not meta:
        return _no_data(path_stem, title, "config/paper.yaml has no model section")
    d = curves[curves["network"] == meta["network"]]
    limits = sorted(set(d["cores"].astype(str)), key=lambda c: (c != "all", c))
    fig, axes = _plt().subplots(1, len(limits), figsize=(6 * len(limits), 4.6), squeeze=False, layout="constrained")
    for ax, cores in zip(axes[0], limits):
        g = d[d["cores"].astype(str) == cores]
        for (scheme, p), c in g.groupby(["scheme", g["p"].fillna(0)], sort=False):
            label = f"{scheme} (P={int(p)})" if p else scheme
            ax.plot(c["n"], c["images_per_second"], marker=".", label=label)
        for k, (net, rc) in enumerate(meta["rc"].items()):
            ax.axhline(rc, color="k", ls=("--", ":", "-.")[k % 3], lw=1, label=f"rc {net} = {rc:.0f}")
        ax.set(yscale="log", xlabel="ensemble size n (one member per node)", ylabel="images/s per member (PREDICTED)",
               title=f"{meta['network']} preprocessing, cores per member: {cores}")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    c = meta["comm"]
    _save(fig, path_stem, f"PREDICTED by enspipe's cost model, not run. Inputs: {meta['source']}; "
          f"{meta['cores_per_node']} cores per node; collectives: {c['bcast']} broadcast, "
          f"{c['inter_node_bandwidth'] / 1e9:g} GB/s between nodes ({c['source']}).")


def arms_figure(t: pd.DataFrame, path_stem: str) -> None:
    """The heterogeneous ensemble's makespan per arm: with the rounds' launches, without them, and
    the time model's; the accelerator-busy fraction on each arm's bar."""
    title = "A heterogeneous ensemble: makespan per arm (emulated accelerators)"
    if t.empty:
        return _no_data(path_stem, title, "no heterogeneous experiment in the config")
    fig, ax = _plt().subplots(figsize=(7, 4), layout="constrained")
    cols = [("makespan_s", "measured, launches included"), ("launch_free_makespan_s", "measured, without launches"),
            ("model_makespan_s", "time model")]
    x = np.arange(len(t))
    for k, (col, label) in enumerate(cols):
        bars = ax.bar(x + (k - 1) * 0.27, t[col].astype(float), 0.27, label=label, color=f"C{k}")
        if k == 0:
            for b, busy in zip(bars, t["accelerator_busy_fraction"]):
                if pd.notna(busy):
                    ax.annotate(f"busy {busy:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                                va="bottom", fontsize=7)
    ax.set(xticks=x, xticklabels=t["arm"], ylabel="seconds", title=title)
    ax.legend(fontsize=7)
    _save(fig, path_stem, f"{int(t['members'].iloc[0])} members, {int(t['accelerators'].iloc[0])} EMULATED "
          "accelerators; busy: accelerator-busy fraction of the makespan with launches.")


def wait_figure(t: pd.DataFrame, sim: pd.DataFrame, path_stem: str) -> None:
    """The paper's Fig. 6 and Table 3 for this run's arms and at the paper's scale: the wait per
    accelerator (the makespan less the seconds it trained) and the members' run lengths."""
    title = "Wait per accelerator and members' run lengths, per arm"
    if t.empty and sim.empty:
        return _no_data(path_stem, title, "no heterogeneous experiment in the config")
    fig, (ax, ax_run, ax_sim) = _plt().subplots(1, 3, figsize=(13, 4), layout="constrained")
    if not t.empty:
        x = np.arange(len(t))
        cols = [("wait_per_accelerator_s", "measured, launches included"),
                ("launch_free_wait_per_accelerator_s", "measured, without launches"),
                ("model_wait_per_accelerator_s", "time model")]
        for k, (col, label) in enumerate(cols):
            ax.bar(x + (k - 1) * 0.27, t[col].astype(float), 0.27, label=label, color=f"C{k}")
        ax.set(xticks=x, xticklabels=t["arm"], ylabel="seconds", title="this run: wait per accelerator")
        ax.legend(fontsize=7)
        ax_run.bar(x - 0.2, t["run_length_mean_s"].astype(float), 0.4, yerr=t["run_length_std_s"].astype(float),
                   capsize=3, label="measured (mean, std)", color="C0")
        ax_run.bar(x + 0.2, t["model_run_length_mean_s"].astype(float), 0.4,
                   yerr=t["model_run_length_std_s"].astype(float), capsize=3, label="time model", color="C2")
        ax_run.set(xticks=x, xticklabels=t["arm"], ylabel="seconds", title="this run: members' run lengths")
        ax_run.legend(fontsize=7)
    if not sim.empty:
        for arm, g in sim.groupby("arm", sort=False):
            ax_sim.plot(g["accelerators"], g["wait_per_accelerator_s"], "o-", label=arm, ms=4)
        ax_sim.set(yscale="log", xlabel="accelerators", ylabel="seconds (log)",
                   title="SIMULATED, 100 members: wait per accelerator")
        ax_sim.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    _save(fig, path_stem, "This run: EMULATED accelerators; a wait is an accelerator's idle seconds in the arm "
          "(in lockstep a faster member waits for the shared stream; freed accelerators idle until the next round; "
          "the rounds' set-up). Right: SIMULATED by the time model at the paper's scale (the paper's Fig. 6: "
          "homogeneous 130-300 s, FLEET-L 25-150 s, FLEET-G 1-17 s per GPU, where its wait may count otherwise).")


def timeline_figure(t: pd.DataFrame, path_stem: str) -> None:
    """The fleet arm's timeline: each member's training on its accelerators (one row each), the
    rounds (flotillas; a round's end is every member's checkpoint) as shaded spans."""
    title = "FLEET's flotillas: which member trained on which accelerators, when"
    if t.empty or t["start"].isna().all():
        return _no_data(path_stem, title, "no fleet arm in the heterogeneous experiment")
    fig, ax = _plt().subplots(figsize=(9, 3.6), layout="constrained")
    colours = {m: f"C{i % 10}" for i, m in enumerate(dict.fromkeys(t["member"]))}
    for r in t.itertuples():
        for acc in (r.accelerators or []):
            ax.barh(acc, r.end - r.start, left=r.start, color=colours[r.member], edgecolor="k", lw=0.4)
            ax.text(r.start + (r.end - r.start) / 2, acc, r.member, ha="center", va="center", fontsize=6)
            ax.plot(r.checkpoints, [acc] * len(r.checkpoints), "|", color="k", ms=9, mew=1.2)
            if r.converged:
                ax.plot([r.end], [acc], "*", color="gold", mec="k", ms=9)
    for k, (_, g) in enumerate(t.groupby("round")):
        ax.axvspan(g["start"].min(), g["end"].max(), color="0.93" if k % 2 else "0.85", zorder=0)
    accs = sorted({a for r in t["accelerators"] for a in (r or [])})
    ax.set(yticks=accs, yticklabels=[f"acc {a}" for a in accs], xlabel="seconds since the arm began", title=title,
           xlim=(0, None))
    ax.invert_yaxis()
    _save(fig, path_stem, ("EMULATED accelerators. " if t["emulated"].any() else "Members trained for real. ")
          + "Ticks: a member's checkpoints (one per epoch); star: it converged (early stopping). Shaded spans: "
          "rounds (flotillas); between them the allocator re-plans from the checkpoints (in one job, --in-job, "
          "the gaps are its ~2 s per round; with a job per round they are the jobs' starts).")


def power_figure(df: pd.DataFrame, idle: dict | None, path_stem: str) -> None:
    """Fig. 14: node power over time, All-Shared vs baseline (AlexNet where present, full cores,
    the largest n), from each cell's headline energy source; the idle power as a line."""
    title = "Fig. 14: power draw, All-Shared vs baseline"
    d = df.query(tables.TRAINING).dropna(subset=["energy_source"])
    d = d[(d["cores"] == "all") & (d["n"] > 1) & d["scheme"].isin(["baseline", "all_shared"])]
    pairs = [g for (net, n), g in d.groupby(["network", "n"]) if set(g["scheme"]) == {"baseline", "all_shared"}]
    if not pairs:
        return _no_data(path_stem, title, "the grid has no baseline/All-Shared pair at full cores with energy data")
    pairs.sort(key=lambda g: (g["network"].iloc[0] != "alexnet_v2", -g["n"].iloc[0]))
    d = pairs[0].sort_values("rep").drop_duplicates("scheme")
    fig, ax = _plt().subplots(figsize=(7, 4))
    for _, row in d.sort_values("scheme", key=lambda c: c.map(scheme_order)).iterrows():
        p = tables.headline_power(row)
        line, = ax.plot(p["seconds"], p["watts"], label=f"{row['scheme']} ({row['energy_source']})")
        ax.axvline(row["window_seconds"], color=line.get_color(), ls=":", lw=0.8)
    if idle:
        ax.axhline(idle["watts"], color="k", ls="--", lw=1, label=f"idle {idle['watts']:.0f} W ({idle['source']})")
    row = d.iloc[0]
    ax.axvline(0, color="0.5", ls=":", lw=0.8)
    ax.set(title=f"{title}\n{row['network']}, n={row['n']}, full cores",
           xlabel="seconds since the measured window's start (dotted: its start and each end)", ylabel="watts")
    ax.legend(fontsize=7)
    modelled = d["energy_modelled"].astype(bool).any()
    modelled = " MODELLED power (no meter or counter on this machine)." if modelled else ""
    _save(fig, path_stem, provenance(d) + "." + modelled)


# -- everything -----------------------------------------------------------------------------------
def render(table_csv: str, rates_json: str | None, idle_json: str | None, out_dir: str,
           lag_csv: str | None = None, comm_json: str | None = None, paper_config: str | None = None,
           ensemble_jsons: list[str] | None = None) -> list[str]:
    """Render every output of :data:`OUTPUTS` into ``out_dir``; returns the paths written."""
    import yaml

    everything = tables.load(table_csv)
    # the paper's figures and the peer's: the grid's own cells; auto cells (the planner's choice,
    # labelled planned) appear in the cost model's outputs, not twice in a scheme's points
    df = everything[everything["planned"].isna()] if "planned" in everything else everything
    derived = {"table1": tables.solo_vs_parallel(df), "table2": tables.core_usage_under_limit(df),
               "fig11": tables.broadcast_cpu(df), "fig12": tables.cpu_reduction(df),
               "fig13": tables.core_limit_speedup(df), "table3": tables.slowdown_at_one_core(df),
               "table5": tables.energy(df), "peer": tables.peer_comparison(df)}
    idle = _json(idle_json)
    derived["table4"] = tables.idle_power(idle, df)
    # the lag cells' members (collect.lag_rows), where the workflow ran them
    derived["lag"] = pd.read_csv(lag_csv) if lag_csv and os.path.getsize(lag_csv) else pd.DataFrame()
    rates = _json(rates_json)
    derived["prediction"] = predicted.versus_measured(everything, rates, _json(comm_json))
    derived["planner"] = predicted.planner_choices(everything, derived["prediction"])
    paper = None
    if paper_config and os.path.exists(paper_config):
        with open(paper_config) as f:
            paper = yaml.safe_load(f)
    derived["paper_curves"], derived["paper_crossings"], derived["paper_model"] = predicted.paper_grid(paper)
    ensembles = {r["arm"]: r for r in map(_json, ensemble_jsons or []) if r}
    derived["heterogeneous"] = heterogeneous.arms_table(ensembles)
    derived["timeline"] = heterogeneous.timeline_rows(ensembles.get("fleet"))
    sim = heterogeneous.simulate_paper_scale()
    derived["paper_scale"], derived["paper_waits"] = heterogeneous.paper_scale(sim), heterogeneous.paper_waits(sim)
    derived["paper_sim"] = sim
    ins = Inputs(df, derived, rates, idle, ensembles)
    os.makedirs(out_dir, exist_ok=True)
    for o in OUTPUTS.values():
        o.write(ins, os.path.join(out_dir, o.name))
    return [os.path.join(out_dir, f"{o.name}.{ext}") for o in OUTPUTS.values() for ext in o.formats]


ALONE, PEAK, CPU, LIMITS, ENERGY, PAPER, PEER, MODEL, FLEET = (
    "1 One member alone", "2 Peak throughput", "3 CPU", "4 Core limits", "5 Energy", "0 Paper vs this run",
    "6 The tf.data service", "7 The cost model", "8 Heterogeneous ensembles (FLEET)")


@output("fig03_queue_occupancy", FIG, ALONE)
def _fig03(ins: Inputs, stem: str) -> None:
    queue_figure(ins.df, stem)


@output("fig04_core_utilisation", FIG, ALONE)
def _fig04(ins: Inputs, stem: str) -> None:
    utilisation_figure(ins.df, stem)


@output("table1_solo_vs_parallel", TAB, ALONE)
def _table1(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["table1"], stem,
                "Table 1: runtime (s) of the measured steps, one member alone vs the baseline ensemble's members "
                f"in parallel; `hosts`: nodes the members shared ({ins.source})")


@output("table2_core_usage", TAB, ALONE)
def _table2(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["table2"], stem,
                "Table 2: average busy % per core in the measured window, one member alone under a core limit; "
                "`allowed`: the member was pinned there (mpstat)")


@output("fig10a_peak_full_cores", FIG, PEAK)
def _fig10a(ins: Inputs, stem: str) -> None:
    peak_figure(ins.df, ins.rates, stem, limited=False)


@output("fig10b_peak_core_limit", FIG, PEAK)
def _fig10b(ins: Inputs, stem: str) -> None:
    peak_figure(ins.df, ins.rates, stem, limited=True)


@output("fig11_broadcast_cpu", FIG + TAB, CPU)
def _fig11(ins: Inputs, stem: str) -> None:
    broadcast_cpu_figure(ins.tables["fig11"], ins.df, stem)
    write_table(ins.tables["fig11"], stem,
                f"Fig. 11 data: CPU-s per delivered image, node (mpstat) and the cells' own processes ({ins.source})")


@output("fig12_cpu_reduction", FIG + TAB, CPU)
def _fig12(ins: Inputs, stem: str) -> None:
    pair_figure(ins.tables["fig12"], "reduction", ins.df, stem,
                "Fig. 12: CPU reduction, All-Shared vs baseline", "baseline / All-Shared (node CPU-s per image)",
                marker="reduction_process", marker_label="by the cells' own process CPU", ceiling="n",
                flag="exceeds_ceiling")
    write_table(ins.tables["fig12"], stem,
                "Fig. 12 data: CPU-s per delivered image, node (mpstat) and the cells' own processes (`_process`); "
                f"`exceeds_ceiling`: a reduction above n, a measuring error ({ins.source})")


@output("fig13_core_limit_speedup", FIG + TAB, LIMITS)
def _fig13(ins: Inputs, stem: str) -> None:
    pair_figure(ins.tables["fig13"], "speedup", ins.df, stem,
                "Fig. 13: runtime improvement of All-Shared over the baseline under core limits",
                "baseline runtime / All-Shared runtime")
    write_table(ins.tables["fig13"], stem,
                f"Fig. 13 data: images/s per member, and CPU-s per delivered image, node and process ({ins.source})")


@output("table3_slowdown_1core", TAB, LIMITS)
def _table3(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["table3"], stem, f"Table 3: slowdown at 1 core vs full cores ({ins.source})")


@output("table4_idle_power", TAB, ENERGY)
def _table4(ins: Inputs, stem: str) -> None:
    idle = ins.idle
    idle_src = f"{idle['source']}{' (MODELLED)' if idle.get('modelled') else ''}" if idle else "none"
    write_table(ins.tables["table4"], stem,
                f"Table 4: idle power of the node (source: {idle_src}) and the largest power any cell drew")


@output("table5_energy", TAB, ENERGY)
def _table5(ins: Inputs, stem: str) -> None:
    train = ins.df.query(tables.TRAINING)
    write_table(ins.tables["table5"], stem,
                "Table 5: mean power during training with and without idle, and All-Shared's savings above idle "
                f"({provenance(train.dropna(subset=['energy_source']))})")


@output("fig14_power_over_time", FIG, ENERGY)
def _fig14(ins: Inputs, stem: str) -> None:
    power_figure(ins.df, ins.idle, stem)


@output("peer_tfdata_service", FIG + TAB, PEER)
def _peer(ins: Inputs, stem: str) -> None:
    t = ins.tables["peer"]
    peer_figure(t, stem)
    write_table(t, stem, "enspipe's schemes and the tf.data service at the same n and core limit (peak cells, medians "
                "over repeats): CPU-s per delivered image (own processes; node), images/s per member (min, max), "
                "CPU reduction vs the baseline, fewest distinct samples in an epoch-length window, samples "
                "skipped. " + provenance(t))


@output("peer_lag", TAB, PEER)
def _peer_lag(ins: Inputs, stem: str) -> None:
    lag = ins.tables["lag"]
    write_table(lag, stem, "One member's accelerator slower than the others' (--slow-member, emulated): enspipe keeps "
                "its members in lockstep (every member at the slow one's pace, nothing skipped); the tf.data service "
                "lets the others run ahead and the slow one skip what its cache no longer holds. Per member: images/s, "
                "its share of the fastest member's, samples skipped, fewest distinct samples in an epoch-length window. "
                + (provenance(lag) if len(lag) else ""))


@output("prediction_vs_measurement", FIG + TAB, MODEL)
def _prediction(ins: Inputs, stem: str) -> None:
    t = ins.tables["prediction"]
    prediction_figure(t, stem)
    write_table(t, stem, "The cost model (enspipe plan) against every cell: predicted and measured images/s per "
                "member and CPU-s per delivered image (own processes), error = predicted / measured - 1; "
                "`not_modelled` says why a cell has no prediction. Inputs: the calibration's rp and CPU per "
                "image, the cell's accelerator rate, its placement, and the collective costs "
                f"({t['comm_source'].iloc[0] if len(t) else 'none'}). {provenance(ins.df)}")


@output("predicted_fig10_paper_grid", FIG + TAB, MODEL)
def _paper_grid(ins: Inputs, stem: str) -> None:
    meta = ins.tables["paper_model"]
    paper_grid_figure(ins.tables["paper_curves"], meta, stem)
    write_table(ins.tables["paper_crossings"], stem,
                "PREDICTED, not run: for each pipeline of the paper's grid (one member per node), the first n at "
                "which its predicted peak(n) falls below each network's rc (empty: never, up to the grid's "
                "largest n), at the assumed inter-node bandwidth and the others given for sensitivity. "
                + (f"Inputs: {meta['source']}." if meta else "No model section in config/paper.yaml."))


@output("planner_choices", TAB, MODEL)
def _planner(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["planner"], stem,
                "scheme: auto: the scheme and P the plan chose for each auto cell when it started, its measured "
                "images/s per member and CPU-s per delivered image, beside the best of enspipe's schemes the grid "
                f"measured in the same setting (medians over repeats). {provenance(ins.df)}")


@output("heterogeneous_arms", FIG + TAB, FLEET)
def _heterogeneous_arms(ins: Inputs, stem: str) -> None:
    t = ins.tables["heterogeneous"]
    arms_figure(t, stem)
    write_table(t, stem, "A heterogeneous ensemble (config heterogeneous) trained by each arm, accelerators EMULATED: "
                "makespan from the first launch to the last exit (each round is one MPI job here), without the "
                "rounds' launches (their training times, scheduled as they ran), and the time model's; accelerator-"
                "busy fraction, CPU-s of the runs' processes and node CPU-s (mpstat/psutil), energy (per round, "
                "its source in the runs' summaries); *_over_fleet: each arm's makespan over fleet's.")


@output("heterogeneous_wait", FIG + TAB, FLEET)
def _heterogeneous_wait(ins: Inputs, stem: str) -> None:
    t = ins.tables["heterogeneous"]
    wait_figure(t, ins.tables["paper_sim"], stem)
    cols = ["arm", "rounds", "wait_per_accelerator_s", "launch_free_wait_per_accelerator_s",
            "model_wait_per_accelerator_s", "run_length_mean_s", "run_length_std_s", "model_run_length_mean_s",
            "model_run_length_std_s", "accelerator"]
    write_table(t[cols] if len(t) else t, stem,
                "The paper's Fig. 6 and Table 3 for this run's arms, accelerators EMULATED: each accelerator's mean "
                "wait (the makespan, with the rounds' launches or without them, less the seconds it trained) and the "
                "members' run lengths (a member's first training step to its last, across rounds: mean and standard "
                "deviation), measured and from the time model.")


@output("heterogeneous_timeline", FIG, FLEET)
def _heterogeneous_timeline(ins: Inputs, stem: str) -> None:
    timeline_figure(ins.tables["timeline"], stem)


@output("fleet_paper_scale_simulated", TAB, FLEET)
def _paper_scale(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["paper_scale"], stem,
                "SIMULATED, nothing trained: the paper's scale (100 members with one-accelerator rates 21-176 "
                "images/s and 10-24 epochs, as in its Fig. 8; 4 accelerators per node; Caltech256's 30,606 "
                "images per epoch) planned by the same allocator and timed by its lockstep model, each round "
                f"costing {heterogeneous.PAPER_ROUND_SECONDS:g} s (the paper's Table 4: FLEET-G's checkpointing "
                "at 160 GPUs over its flotillas); each arm's makespan, its speed-ups, FLEET-G's over FLEET-L with "
                "and without the rounds' cost, beside the paper's measured ones (Fig. 5).")


@output("fleet_paper_scale_waits_simulated", TAB, FLEET)
def _paper_waits(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["paper_waits"], stem,
                "SIMULATED, nothing trained: the same simulation's wait per accelerator (the makespan less the seconds "
                "it trained) and the members' run lengths per arm, beside the paper's Fig. 6 (wait per GPU, read "
                "as ranges; its wait may count otherwise) and Table 3 (run lengths at 80 GPUs).")


@output("paper_vs_run", TAB, PAPER)
def _paper_vs_run(ins: Inputs, stem: str) -> None:
    write_table(findings.paper_vs_run(ins.df, ins.tables), stem,
                "Paper vs this run: each headline finding, the paper's numbers (16-core Titan nodes, one member per "
                f"node), this run's, and whether it holds here ({provenance(ins.df)})")


def _json(path: str | None) -> dict | None:
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return None
