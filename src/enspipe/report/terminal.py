"""What a finished workflow run prints on the terminal: where the report is, every finding of
``paper_vs_run`` with its verdict, and the headline ratios (All-Shared's CPU reduction at n = 2
and 4, FLEET's makespan against the other arms), read from the figures' tables."""
from __future__ import annotations

import os

import pandas as pd

HEADLINE_N = (2, 4)


def summary_lines(results: str) -> list[str]:
    """The lines to print for the workflow outputs under ``results`` (tables missing: said so)."""
    figures = os.path.join(results, "figures")
    lines = [f"enspipe: report {os.path.join(results, 'report.html')}; figures and tables in {figures}/", ""]
    findings = _read(figures, "paper_vs_run")
    if findings is None:
        lines.append("  (no paper_vs_run table: run the workflow's figures rule)")
    else:
        width = max(len(str(s)) for s in findings["source"])
        said = max(18, *(len(str(h)) for h in findings["holds"]))
        lines.append(f"  {'source':<{width}}  {'holds':<{said}}  finding")
        for r in findings.itertuples():
            claim = r.finding if len(r.finding) <= 70 else r.finding[:67] + "..."
            lines.append(f"  {r.source:<{width}}  {r.holds:<{said}}  {claim}")
    lines += ["", *_reductions(_read(figures, "fig12_cpu_reduction")), *_fleet(_read(figures, "heterogeneous_arms"))]
    return lines


def _read(figures: str, name: str) -> pd.DataFrame | None:
    path = os.path.join(figures, f"{name}.csv")
    if not os.path.exists(path):
        return None
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _reductions(t: pd.DataFrame | None) -> list[str]:
    """All-Shared's node CPU reduction against the baseline, per network and core limit, at n = 2 and 4."""
    rows = t[t["n"].isin(HEADLINE_N)] if t is not None and len(t) else pd.DataFrame()
    if rows.empty:
        return ["  CPU reduction, All-Shared vs baseline: no data at n = 2 or 4"]
    parts = [f"{r.network} n={r.n} cores {r.cores}: {r.reduction:.2f}x" for r in rows.itertuples()]
    return ["  CPU reduction, All-Shared vs baseline (node CPU per image): " + "; ".join(parts)]


def _fleet(t: pd.DataFrame | None) -> list[str]:
    """FLEET's speed-up: each other arm's makespan over FLEET's."""
    if t is None or t.empty or "fleet" not in set(t["arm"]):
        return []
    others = t[t["arm"] != "fleet"]
    parts = [f"over {r.arm} {r.makespan_over_fleet:.2f}x" for r in others.itertuples()]
    label = f" ({t['accelerator'].iloc[0]} accelerators)" if "accelerator" in t else ""
    return [f"  FLEET's makespan speed-up{label}: " + "; ".join(parts)]
