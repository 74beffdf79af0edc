"""The registry of the report's figures and tables (:data:`OUTPUTS`: name, formats, report
section, writer; each declared once with :func:`output` in its family's module) and what every
writer shares: its :class:`Inputs`, the report's sections and the atomic table and figure writers.

Example::

    @output("fig99_example", FIG, PEAK)
    def _fig99(ins: Inputs, stem: str) -> None:
        write_table(ins.tables["fig12"], stem, "caption")
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from enspipe.common.atomic import atomic_open
from enspipe.report import tables
from enspipe.report.tables import provenance

FIG, TAB = ("png", "pdf"), ("csv", "md")
REPORTED = ("png", "csv")  # the formats the HTML report shows; the others sit beside them
ALONE, PEAK, CPU, LIMITS, ENERGY, PAPER, PEER, MODEL, FLEET = (
    "1 One member alone", "2 Peak throughput", "3 CPU", "4 Core limits", "5 Energy", "0 Paper vs this run",
    "6 The tf.data service", "7 The cost model", "8 Heterogeneous ensembles (FLEET)")


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


OUTPUTS: dict[str, Output] = {}  # the registry, in the report's order; filled by @output in each family's module


def output(name: str, formats: tuple[str, ...], category: str):
    def register(write):
        OUTPUTS[name] = Output(name, formats, category, write)
        return write
    return register


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


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path_stem: str, note: str) -> None:
    fig.text(0.01, -0.02, note, fontsize=7, color="0.35", ha="left", va="top", wrap=True)
    for ext in FIG:
        fig.savefig(f"{path_stem}.{ext}", dpi=130, bbox_inches="tight")
    plt().close(fig)


def no_data(path_stem: str, title: str, why: str) -> None:
    fig, ax = plt().subplots(figsize=(6, 2.5))
    ax.axis("off")
    ax.text(0.5, 0.6, title, ha="center", fontsize=11, weight="bold")
    ax.text(0.5, 0.35, f"No data: {why}", ha="center", fontsize=10)
    save(fig, path_stem, "")


def panel_row(k: int, width: float = 5.0, height: float = 3.8):
    fig, axes = plt().subplots(1, k, figsize=(width * k, height), squeeze=False, layout="constrained")
    return fig, axes[0]


def placement_note(d: pd.DataFrame) -> str:
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
