"""The paper's figures and tables from the tidy table of cells (``results/tables/cells.csv``).

Every output states where its numbers came from (measured / emulated accelerator / modelled
power) and on what machine; where the grid produced no data for one, the output says so in its
place instead of failing. Figures are written as PNG and PDF, tables as CSV and Markdown.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd

SCHEME_ORDER = ["baseline", "all_shared", "single_broadcast", "multi_broadcast"]


def provenance(df: pd.DataFrame) -> str:
    """One line: accelerator kind, energy source and machine of the rows behind an output."""
    if df.empty:
        return "no data"
    acc = "/".join(sorted(set(df["accelerator"].dropna().astype(str)))) or "none"
    energy = "/".join(sorted(set(df["energy_source"].dropna().astype(str)))) or "none"
    machines = "; ".join(sorted(set(df["machine"].dropna().astype(str))))
    return f"accelerator: {acc}; energy: {energy}; machine: {machines}"


# -- tables ---------------------------------------------------------------------------------------
def cpu_reduction(df: pd.DataFrame) -> pd.DataFrame:
    """Fig. 12's data: node CPU-seconds per delivered image, baseline over All-Shared, per network,
    n and core limit (cells with an accelerator: emulated or real)."""
    cells = df[(df["consumer"] != "peak") & df["scheme"].isin(["baseline", "all_shared"]) & (df["n"] > 1)]
    key = ["network", "n", "cores"]
    piv = cells.pivot_table(index=key, columns="scheme", values="node_cpu_seconds_per_image", aggfunc="mean")
    if piv.empty or not {"baseline", "all_shared"} <= set(piv.columns):
        return pd.DataFrame(columns=[*key, "baseline", "all_shared", "reduction"])
    piv = piv.dropna(subset=["baseline", "all_shared"])
    piv["reduction"] = piv["baseline"] / piv["all_shared"]
    return piv.reset_index()[[*key, "baseline", "all_shared", "reduction"]]


def slowdown_at_one_core(df: pd.DataFrame) -> pd.DataFrame:
    """Table 3: per scheme and network, images/s per member at full cores over at 1 core."""
    cells = df[df["consumer"] != "peak"]
    piv = cells.pivot_table(index=["network", "scheme", "n", "p"], columns="cores",
                            values="images_per_second_per_member", aggfunc="mean")
    if piv.empty or not {"1", "all"} <= set(piv.columns.astype(str)):
        return pd.DataFrame(columns=["network", "scheme", "n", "p", "full_cores", "one_core", "slowdown"])
    piv.columns = piv.columns.astype(str)
    out = piv[["all", "1"]].dropna().rename(columns={"all": "full_cores", "1": "one_core"})
    out["slowdown"] = out["full_cores"] / out["one_core"]
    return out.reset_index()


def write_table(df: pd.DataFrame, path_stem: str, caption: str) -> None:
    """``<stem>.csv`` and ``<stem>.md`` (with the caption; "no data" where the table is empty)."""
    os.makedirs(os.path.dirname(path_stem) or ".", exist_ok=True)
    df.to_csv(path_stem + ".csv", index=False)
    body = _markdown(df) if not df.empty else "*No data: the grid has no cells for this table.*"
    with open(path_stem + ".md", "w") as f:
        f.write(f"{caption}\n\n{body}\n")


def _markdown(df: pd.DataFrame) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, (float, np.floating)) else str(v)

    rows = [" | ".join(map(str, df.columns)), " | ".join("---" for _ in df.columns)]
    rows += [" | ".join(cell(v) for v in r) for r in df.itertuples(index=False)]
    return "\n".join(f"| {r} |" for r in rows)


# -- figures --------------------------------------------------------------------------------------
def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path_stem: str, note: str) -> None:
    fig.text(0.01, -0.03, note, fontsize=7, color="0.35", ha="left", va="top", wrap=True)
    for ext in ("png", "pdf"):
        fig.savefig(f"{path_stem}.{ext}", dpi=130, bbox_inches="tight")


def _empty(path_stem: str, title: str, why: str) -> None:
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.6, title, ha="center", fontsize=11, weight="bold")
    ax.text(0.5, 0.35, f"No data: {why}", ha="center", fontsize=10)
    _save(fig, path_stem, "")
    plt.close(fig)


def peak_throughput(df: pd.DataFrame, rates: dict | None, path_stem: str) -> None:
    """Fig. 10: peak(n) per scheme (and P), one panel per network and core limit, with the
    network's accelerator rate rc as a horizontal line."""
    import seaborn as sns

    cells = df[df["consumer"] == "peak"].copy()
    title = "Fig. 10: peak preprocessing throughput peak(n)"
    if cells.empty:
        return _empty(path_stem, title, "the grid has no peak-consumer cells")
    plt = _figure()
    cells["scheme (P)"] = [s if s in ("baseline", "all_shared") else f"{s} (P={p})" for s, p in zip(cells["scheme"], cells["p"])]
    panels = sorted(set(zip(cells["network"], cells["cores"])))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (net, cores) in zip(axes[0], panels):
        d = cells[(cells["network"] == net) & (cells["cores"] == cores)]
        sns.lineplot(d, x="n", y="images_per_second_per_member", hue="scheme (P)", marker="o", ax=ax,
                     errorbar=None)
        rc = ((rates or {}).get("networks", {}).get(net) or {}).get("rc")
        if rc:
            ax.axhline(rc, color="k", ls="--", lw=1, label=f"rc = {rc:.0f} img/s")
            ax.legend(fontsize=7)
        ax.set(title=f"{net}, cores per member: {cores}", xlabel="ensemble size n", ylabel="images/s per member",
               xticks=sorted(d["n"].unique()))
    fig.suptitle(title)
    _save(fig, path_stem, provenance(cells))
    plt.close(fig)


def cpu_reduction_figure(red: pd.DataFrame, df: pd.DataFrame, path_stem: str) -> None:
    """Fig. 12: CPU reduction of All-Shared vs baseline per network and n."""
    import seaborn as sns

    title = "Fig. 12: CPU reduction, All-Shared vs baseline"
    if red.empty:
        return _empty(path_stem, title, "the grid has no baseline/All-Shared pairs with an accelerator and n > 1")
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    d = red.assign(cell=[f"n={n}, cores per member: {c}" for n, c in zip(red["n"], red["cores"])])
    sns.barplot(d, x="network", y="reduction", hue="cell", ax=ax)
    ax.axhline(1, color="k", lw=0.8)
    ax.set(ylabel="baseline CPU / All-Shared CPU (node CPU-s per image)", title=title)
    _save(fig, path_stem, provenance(df[df["consumer"] != "peak"]))
    plt.close(fig)


def render(table_csv: str, rates_json: str | None, out_dir: str) -> list[str]:
    """Render the figures and tables this module knows into ``out_dir``; returns the stems."""
    import json

    df = pd.read_csv(table_csv, dtype={"cores": str})
    rates = None
    if rates_json and os.path.exists(rates_json):
        with open(rates_json) as f:
            rates = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    stems = []
    stem = os.path.join(out_dir, "fig10_peak_throughput")
    peak_throughput(df, rates, stem)
    stems.append(stem)
    red = cpu_reduction(df)
    stem = os.path.join(out_dir, "fig12_cpu_reduction")
    cpu_reduction_figure(red, df, stem)
    write_table(red, stem, f"Fig. 12 data: node CPU-s per delivered image ({provenance(df[df['consumer'] != 'peak'])})")
    stems.append(stem)
    stem = os.path.join(out_dir, "table3_slowdown_1core")
    slow = slowdown_at_one_core(df)
    write_table(slow, stem, f"Table 3: slowdown at 1 core vs full cores ({provenance(df[df['consumer'] != 'peak'])})")
    stems.append(stem)
    return stems
