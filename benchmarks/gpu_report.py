"""The GPU machine's cells as tables, judged by the workflow's own judges.

    python benchmarks/gpu_report.py DIR...   # DIR: benchmarks/gpu.sh's $OUT, summaries.tar.gz unpacked in DIR/s

Prints, as Markdown, the train cells per scheme, n and core limit (median and range of the
repeats: images/s per member, process CPU per delivered image, the node's CPU beside its
processes'), the reductions against the baseline, and every row of the workflow's ``paper_vs_run``
findings that these cells can judge, labelled ``measured on 1 GPU shared by n members``.
"""
from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np
import pandas as pd

from enspipe.report import findings, tables
from enspipe.report.collect import collect

from cells import spread
from gpu_cells import busy_fraction, train_row

LABEL = "measured on 1 GPU shared by n members"


def cells_table(rows: list[dict]) -> str:
    """gpu_cells.json's rows, the repeats of each scheme, n and core limit together."""
    out = ["| scheme | n | cores/member | images/s per member | process CPU ms/image | GPU busy | "
           "GPU J above idle/image | repeats |", "|---|---|---|---|---|---|---|---|"]
    df = pd.DataFrame([r for r in rows if r.get("ok")])
    for (n, cores, scheme), g in df.groupby(["n", "cores_per_member", "scheme"]):
        out.append(f"| {scheme} | {n} | {cores} | {spread(g['images_per_second_per_member'], digits=1)} | "
                   f"{spread(g['cpu_ms_per_image'], digits=2)} | {spread(100 * g['gpu_busy'], digits=1)}% | "
                   f"{spread(g['nvml_above_idle_per_image'], digits=3)} | {len(g)} |")
    return "\n".join(out)


def judged(df: pd.DataFrame) -> pd.DataFrame:
    derived = {"table1": tables.solo_vs_parallel(df), "table2": tables.core_usage_under_limit(df),
               "fig11": tables.broadcast_cpu(df), "fig12": tables.cpu_reduction(df),
               "fig13": tables.core_limit_speedup(df), "table3": tables.slowdown_at_one_core(df),
               "table5": tables.energy(df), "peer": tables.peer_comparison(df),
               "table4": tables.idle_power(None, df), "lag": pd.DataFrame()}
    pv = findings.paper_vs_run(df, derived)
    pv = pv[pv["holds"] != findings.NOT_ENOUGH].copy()
    pv["this_run"] = pv["this_run"] + f" ({LABEL})"
    return pv


class _Recorded:
    """The NVML sampler's recorded rows (nvml_samples.csv), read back."""

    def __init__(self, path: str):
        self.rows = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2) if os.path.exists(path) else []

    def busy_fraction(self, t0: float, t1: float):
        return busy_fraction(self.rows, t0, t1) if len(self.rows) else None


def main() -> None:
    rows, summaries = {}, {}
    for root in sys.argv[1:]:  # a later folder's cell replaces an earlier one of the same name
        recorded = _Recorded(os.path.join(root, "nvml_samples.csv"))
        for path in glob.glob(os.path.join(root, "s", "cells", "*", "summary.json")):
            name = os.path.basename(os.path.dirname(path))
            with open(path) as f:
                s = json.load(f)
            if s["measured_window"]["start"] >= (recorded.rows[0][0] if len(recorded.rows) else 0):
                rows[name], summaries[name] = train_row(name, s, recorded), path
    print(cells_table(list(rows.values())), "\n")
    for r in judged(collect(sorted(summaries.values()))).itertuples():
        print(f"- **{r.finding}** ({r.source}): {r.holds}. {r.this_run}. {r.basis}\n")


if __name__ == "__main__":
    main()
