"""How the ceiling finding reads the clocks (:mod:`enspipe.report.collect` takes the reductions on
each): a cell's reduction on its processes' clocks, the finding's numbers on each clock, which
clock puts a cell above n, and where the node clock alone does, the node CPU outside the cells'
processes that makes it a clock artefact."""
from __future__ import annotations

import pandas as pd

from enspipe.report import tables
from enspipe.report.collect import (BASELINE_KEY, CEILING_TOLERANCE, MAX_CEILING_TOLERANCE, MIN_JUDGED_WINDOW,
                                    ratio_noise, repeat_noise)
from enspipe.report.verdicts import NOT_TESTABLE, WITHIN_NOISE


def own_reduction(d: pd.DataFrame) -> pd.Series:
    """A shared cell's reduction on its processes' clocks (the larger of process_time's and the ticks')."""
    cols = [c for c in ("cpu_reduction_process", "cpu_reduction_process_ticks") if c in d]
    return d[cols].max(axis=1)


def which_clock(r) -> str:
    """A cell above the ceiling, and on which clock it is."""
    own = pd.Series([getattr(r, c, None) for c in ("cpu_reduction_process", "cpu_reduction_process_ticks")],
                    dtype=float).max()  # NaN where neither reads
    if pd.notna(own) and own / r.n > 1 + (r.ceiling_tolerance if pd.notna(r.ceiling_tolerance) else CEILING_TOLERANCE):
        return f"{r.cell} ({own / r.n:.2f} n on its processes' clock)"
    why = "no process clock read it" if pd.isna(own) else "its node was not quiet (node CPU " + (
        f"{r.node_vs_process_cpu:.2f}x its processes'" if pd.notna(r.node_vs_process_cpu) else "off its processes'") + \
        " in it or its baseline)"
    return f"{r.cell} ({r.cpu_reduction_node / r.n:.2f} n on the node clock; {why})"


def unjudgeable(df: pd.DataFrame, above: pd.DataFrame) -> tuple[str, str]:
    """``(word, why)`` where the cells ``above`` n cannot be called a measuring error (``("", "")``
    where they can): not testable where every one measured a window too short to count only its own
    work; within noise where the run's repeats stray so far that a ratio of two cells may exceed the
    invariant's largest tolerance and every one is within that."""
    short = above["window_seconds"] < MIN_JUDGED_WINDOW
    if len(above) and short.all():
        windows = ", ".join(f"{c}: {w:.2g} s" for c, w in zip(above["cell"], above["window_seconds"]))
        return NOT_TESTABLE, (f"every cell above n measured a window shorter than {MIN_JUDGED_WINDOW:g} s ({windows}), too short "
                "to count only its own work; measure more steps (the config's `steps`, `--steps`) to judge it")
    noise = repeat_noise(df, "process")
    if len(above) and ratio_noise(noise) > MAX_CEILING_TOLERANCE and \
            (own_reduction(above) / above["n"] <= 1 + ratio_noise(noise)).all():
        return WITHIN_NOISE, (f"this run's own repeats of one cell differ by up to {noise:.0%}, so a ratio of two cells by up to "
                f"{ratio_noise(noise):.0%}, more than the {MAX_CEILING_TOLERANCE:.0%} the invariant allows, and every "
                f"cell above n is within that noise ({', '.join(above['cell'])}); a quieter machine, or more "
                "repeats, can judge it")
    return "", ""


def ceiling_text(d: pd.DataFrame) -> str:
    """The ceiling finding's numbers: the largest reduction over n on each clock, and what each allows."""
    own = (own_reduction(d) / d["n"]).max()
    tol = d["ceiling_tolerance"].max() if "ceiling_tolerance" in d else CEILING_TOLERANCE
    text = f"{len(d)} shared cells; largest reduction / n on the process clock: {own:.2f} (allowed: {1 + tol:.2f})"
    node = (d["cpu_reduction_node"] / d["n"]).max() if "cpu_reduction_node" in d else float("nan")
    if pd.notna(node):
        tol_node = d["ceiling_tolerance_node"].max() if "ceiling_tolerance_node" in d else tol
        tol_node = tol if pd.isna(tol_node) else tol_node
        text += f"; on the node clock: {node:.2f} (allowed: {1 + tol_node:.2f})"
    return text


def node_clock_note(df: pd.DataFrame, d: pd.DataFrame) -> str:
    """Where only the node clock reads above n: a clock artefact, with the node's CPU outside the
    cells' processes (baseline against shared) that makes it ("" where there is none)."""
    if "exceeds_ceiling_node" not in d:
        return ""
    only = d[tables.flag(d, "exceeds_ceiling_node") & ~tables.flag(d, "exceeds_ceiling")]
    if only.empty:
        return ""
    base = df[df["scheme"] == "baseline"].groupby(BASELINE_KEY, dropna=False)["node_outside_cores"].mean()
    parts = []
    for r in only.itertuples():
        outside = base.get(tuple(getattr(r, k) for k in BASELINE_KEY))
        own = own_reduction(only.loc[[r.Index]]).iloc[0] / r.n
        parts.append(f"{r.cell} {r.cpu_reduction_node / r.n:.2f} n by node CPU, {own:.2f} n by its processes' "
                     f"(node CPU outside the processes: baseline {cores(outside)}, shared "
                     f"{cores(r.node_outside_cores)})")
    return ("; the node clock alone reads above n in " + "; ".join(parts) + ": the host's CPU outside the cells' "
            "processes and the tick sampling of node CPU differ between the two cells, so that ratio is a clock "
            "artefact, not the cells' work")


def cores(v) -> str:
    return "?" if v is None or pd.isna(v) else f"{v:.2f} cores"
