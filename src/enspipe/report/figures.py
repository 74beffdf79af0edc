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

import pandas as pd

# each family registers its outputs when imported, in the report's order
from enspipe.report import figures_paper, figures_peers, figures_fleet  # noqa: F401, I001
from enspipe.report import findings, heterogeneous, predicted, tables
from enspipe.report.outputs import OUTPUTS, PAPER, REPORTED, TAB, Inputs, output, write_table
from enspipe.report.tables import provenance

__all__ = ["OUTPUTS", "REPORTED", "render", "workflow_outputs"]


def workflow_outputs(report, figures_dir: str, captions_dir: str) -> list:
    """The figures rule's outputs under ``figures_dir``, each reported format wrapped by Snakemake's
    ``report`` with its caption ``<captions_dir>/<name>.rst``."""
    return [report(f"{figures_dir}/{o.name}.{ext}", caption=f"{captions_dir}/{o.name}.rst", category=o.category)
            if ext in REPORTED else f"{figures_dir}/{o.name}.{ext}"
            for o in OUTPUTS.values() for ext in o.formats]


def render(table_csv: str, rates_json: str | None, idle_json: str | None, out_dir: str,
           lag_csv: str | None = None, comm_json: str | None = None, paper_config: str | None = None,
           ensemble_jsons: list[str] | None = None) -> list[str]:
    """Render every output of :data:`OUTPUTS` into ``out_dir``; returns the paths written."""
    ins = inputs(table_csv, rates_json, idle_json, lag_csv, comm_json, paper_config, ensemble_jsons)
    os.makedirs(out_dir, exist_ok=True)
    for o in OUTPUTS.values():
        o.write(ins, os.path.join(out_dir, o.name))
    return [os.path.join(out_dir, f"{o.name}.{ext}") for o in OUTPUTS.values() for ext in o.formats]


def inputs(table_csv: str, rates_json: str | None, idle_json: str | None, lag_csv: str | None = None,
           comm_json: str | None = None, paper_config: str | None = None,
           ensemble_jsons: list[str] | None = None) -> Inputs:
    """The cell table and every table derived from it that the outputs read (:func:`render`'s)."""
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
    return Inputs(df, derived, rates, idle, ensembles)


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
