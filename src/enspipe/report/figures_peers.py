"""The tf.data service beside enspipe's schemes, and the cost model's predictions against the
measurements (each registered in :data:`enspipe.report.outputs.OUTPUTS` with its writer)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from enspipe.report import tables
from enspipe.report.outputs import (
    FIG,
    MODEL,
    PEER,
    TAB,
    Inputs,
    no_data,
    output,
    placement_note,
    plt,
    save,
    write_table,
)
from enspipe.report.predicted import GOAL, errors_by_scheme
from enspipe.report.tables import provenance, scheme_order


def peer_figure(t: pd.DataFrame, path_stem: str) -> None:
    """Every scheme beside the tf.data service: CPU-s per delivered image and images/s per member
    (medians over repeats, bars: min-max), one panel pair per core limit."""
    title = "enspipe's schemes and the tf.data service, side by side (peak, no accelerator)"
    if t.empty:
        return no_data(path_stem, title, "the grid has no tfdata_service cells beside the schemes'")
    limits = sorted(set(t["cores"]), key=lambda c: (c != "all", c))
    fig, axes = plt().subplots(2, len(limits), figsize=(6.5 * len(limits), 7.5), squeeze=False, layout="constrained")
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
    save(fig, path_stem, f"Hatched: the tf.data service (at most once per member). {repeats}{what}. "
                          f"{placement_note(t)}{provenance(t)}")


def prediction_figure(t: pd.DataFrame, path_stem: str) -> None:
    """The cost model against the run: predicted vs measured images/s per member and CPU-s per
    delivered image, one point per cell, the identity line, each scheme's median |error| in the
    legend; cells the model does not cover are listed, never dropped silently."""
    title = "The cost model (enspipe plan) against the run"
    d = t.dropna(subset=["predicted_rate", "measured_rate", "predicted_cpu", "measured_cpu"])
    if d.empty:
        return no_data(path_stem, title, "no cell the model covers (or no calibration to predict from)")
    errs = errors_by_scheme(t).set_index("scheme")
    fig, axes = plt().subplots(1, 2, figsize=(11, 4.8), layout="constrained")
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
    save(fig, path_stem, "Line: prediction = measurement; band: the goal; crosses: members sharing cores. "
          + ("Not predicted: " + "; ".join(f"{k} ({v} cells)" for k, v in skipped.items()) + ". " if len(skipped) else "")
          + f"Collective costs: {t['comm_source'].iloc[0]}.")


def paper_grid_figure(curves: pd.DataFrame, meta: dict | None, path_stem: str) -> None:
    """The paper's Fig. 10, predicted: peak(n) of each scheme and P over the paper's grid (its
    first network's preprocessing, one member per node), each network's rc as a line, one panel
    per core limit. Nothing here ran: every panel says PREDICTED."""
    title = "PREDICTED: the paper's Fig. 10 from its own measurements (enspipe plan --config config/paper.yaml)"
    if curves.empty or not meta:
        return no_data(path_stem, title, "config/paper.yaml has no model section")
    d = curves[curves["network"] == meta["network"]]
    limits = sorted(set(d["cores"].astype(str)), key=lambda c: (c != "all", c))
    fig, axes = plt().subplots(1, len(limits), figsize=(6 * len(limits), 4.6), squeeze=False, layout="constrained")
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
    save(fig, path_stem, f"PREDICTED by enspipe's cost model, not run. Inputs: {meta['source']}; "
          f"{meta['cores_per_node']} cores per node; collectives: {c['bcast']} broadcast, "
          f"{c['inter_node_bandwidth'] / 1e9:g} GB/s between nodes ({c['source']}).")


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
