"""The paper's own figures and tables (Figs. 3, 4, 10-14, Tables 1-5), each registered in
:data:`enspipe.report.outputs.OUTPUTS` with its writer."""
from __future__ import annotations

import numpy as np
import pandas as pd

from enspipe.report import tables
from enspipe.report.outputs import (ALONE, CPU, ENERGY, FIG, LIMITS, PEAK, TAB, Inputs, no_data, output, panel_row,
                                    placement_note, plt, save, write_table)
from enspipe.report.tables import provenance, scheme_order


def queue_figure(df: pd.DataFrame, path_stem: str) -> None:
    """Fig. 3: preprocessing- and compute-queue fill over the steps of one member alone."""
    title = "Fig. 3: queue occupancy, one member alone (baseline, full cores)"
    solo = tables.solo_cells(df, "all").sort_values(["network", "rep"]).drop_duplicates("network")
    if solo.empty:
        return no_data(path_stem, title, "the grid has no single-member baseline cells at full cores")
    fig, axes = panel_row(len(solo))
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
    save(fig, path_stem, provenance(solo))


def utilisation_figure(df: pd.DataFrame, path_stem: str) -> None:
    """Fig. 4: each core's utilisation over time, one member alone, per core limit."""
    title = "Fig. 4: per-core utilisation, one member alone (baseline)"
    solo = tables.solo_cells(df).sort_values(["network", "rep"])
    solo = solo[solo["network"] == solo["network"].iloc[0]] if len(solo) else solo
    solo = solo.drop_duplicates("cores").sort_values("cores", key=lambda c: c.map(lambda v: (v == "all", v)))
    if solo.empty:
        return no_data(path_stem, title, "the grid has no single-member baseline cells")
    fig, axes = panel_row(len(solo))
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
    save(fig, path_stem, provenance(solo) + f"; CPU source: {'/'.join(sorted(set(solo['cpu_source'].astype(str))))}")


def peak_figure(df: pd.DataFrame, rates: dict | None, path_stem: str, limited: bool) -> None:
    """Fig. 10a/b: peak(n) per scheme and P, one panel per network (and core limit), each
    network's accelerator rate rc as a horizontal line; points are medians over repeats, bars
    their min-max range."""
    import seaborn as sns

    which = "a core limit per member" if limited else "full cores"
    title = f"Fig. 10{'b' if limited else 'a'}: peak preprocessing throughput peak(n), {which}"
    cells = tables.peak_cells(df, limited)
    if cells.empty:
        return no_data(path_stem, title, f"the grid has no peak-consumer cells at {which}")
    panels = sorted(set(zip(cells["network"], cells["cores"])))
    fig, axes = panel_row(len(panels))
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
    save(fig, path_stem, f"{spread}. {placement_note(cells)}{provenance(cells)}")


def _bars(data: pd.DataFrame, x: str, y: str, hue: str, path_stem: str, title: str, ylabel: str, note: str,
          ref: float | None = 1.0, marker: str | None = None, marker_label: str = "",
          ceiling: str | None = None, flag: str | None = None) -> None:
    """Grouped bars of ``y`` (one per ``x`` and ``hue``), each labelled with its value; optionally
    a second measure of each bar as a black cross (``marker``), each bar's ceiling as a red dash,
    and bars whose ``flag`` is set hatched (a measuring error)."""
    xs = list(dict.fromkeys(data[x]))
    hues = sorted(data[hue].unique(), key=scheme_order)
    width = 0.8 / len(hues)
    fig, ax = plt().subplots(figsize=(min(13.0, max(6.0, 0.45 * len(xs) * max(1, len(hues)))), 4))
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
    save(fig, path_stem, note)


def broadcast_cpu_figure(t11: pd.DataFrame, df: pd.DataFrame, path_stem: str) -> None:
    title = "Fig. 11: CPU of Single- and Multi-Broadcast normalised to All-Shared"
    if t11.empty:
        return no_data(path_stem, title, "the grid has no All-Shared cells with Single/Multi-Broadcast peers")
    d = t11.assign(cell=[f"{net}\n{con}, n={n}, c={c}" for net, con, n, c in
                         zip(t11["network"], t11["consumer"], t11["n"], t11["cores"])],
                   scheme=[tables.scheme_label(s, p) for s, p in zip(t11["scheme"], t11["p"])])
    _bars(d, "cell", "relative_to_all_shared", "scheme", path_stem, title,
          "node CPU-s per image / All-Shared's", placement_note(t11) + provenance(df[df["scheme"] != "baseline"]),
          marker="relative_process", marker_label="the cells' own process CPU")


def pair_figure(t: pd.DataFrame, value: str, df: pd.DataFrame, path_stem: str, title: str, ylabel: str,
                **bars) -> None:
    """Figs. 12 and 13: All-Shared against the baseline per network, one bar per n and core limit."""
    if t.empty:
        return no_data(path_stem, title, "the grid has no baseline/All-Shared pairs with an accelerator and n > 1")
    d = t.assign(cell=[f"n={n}, cores per member: {c}" for n, c in zip(t["n"], t["cores"])])
    _bars(d, "network", value, "cell", path_stem, title, ylabel,
          placement_note(t) + provenance(df.query(tables.TRAINING)), **bars)


def power_figure(df: pd.DataFrame, idle: dict | None, path_stem: str) -> None:
    """Fig. 14: node power over time, All-Shared vs baseline (AlexNet where present, full cores,
    the largest n), from each cell's headline energy source; the idle power as a line."""
    title = "Fig. 14: power draw, All-Shared vs baseline"
    d = df.query(tables.TRAINING).dropna(subset=["energy_source"])
    d = d[(d["cores"] == "all") & (d["n"] > 1) & d["scheme"].isin(["baseline", "all_shared"])]
    pairs = [g for (net, n), g in d.groupby(["network", "n"]) if set(g["scheme"]) == {"baseline", "all_shared"}]
    if not pairs:
        return no_data(path_stem, title, "the grid has no baseline/All-Shared pair at full cores with energy data")
    pairs.sort(key=lambda g: (g["network"].iloc[0] != "alexnet_v2", -g["n"].iloc[0]))
    d = pairs[0].sort_values("rep").drop_duplicates("scheme")
    fig, ax = plt().subplots(figsize=(7, 4))
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
    save(fig, path_stem, provenance(d) + "." + modelled)


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
