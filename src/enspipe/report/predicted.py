"""The cost model against the run, and the paper's grid predicted.

:func:`versus_measured` predicts every cell of the cell table with
:func:`enspipe.plan.model.predict`, from what the workflow measured before the cells ran (the
calibration's rp and CPU per image by cores, the emulated accelerator's rate, the fitted
collective costs of ``enspipe calibrate-comm``) and the cell's own placement (its host's cores,
members per host, core limit), and puts the prediction beside the measurement: images/s per
member and CPU-s per delivered image (the cell's own processes), with the relative error
``predicted / measured - 1``. Cells the model does not cover (the tf.data service, the ``train``
consumer, whose training shares the CPU with preprocessing) stay in the table with the reason.
:func:`errors_by_scheme` gives the median absolute error per scheme, the figure and the judge's
measure. :func:`paper_grid` is :mod:`enspipe.plan.curves` over a config's grid, as tables.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from enspipe.plan.curves import CROSSING_COLUMNS, CURVE_COLUMNS, ModelInputs, crossings, peak_curves
from enspipe.plan.errors import ConfigError
from enspipe.plan.model import CommCosts, Machine, predict
from enspipe.plan.schemes import SCHEME_KINDS

GOAL = 0.15  # median |error| per scheme, rate and CPU per image, on the default grid
COLUMNS = ("cell", "network", "scheme", "n", "p", "cores", "consumer", "rep", "predicted_rate", "measured_rate",
           "rate_error", "predicted_cpu", "measured_cpu", "cpu_error", "bound", "oversubscribed", "not_modelled",
           "comm_source")


def _cores(c, cpus: float) -> float:
    return float(cpus) if str(c) == "all" else float(c)


def machine_of(row, rates: dict, comm: CommCosts) -> Machine:
    """The model's inputs for one cell of the table: the calibrated rp (and CPU per image) of its
    network by cores, its accelerator (emulated rate; none for peak), its host's cores, the nodes
    its members spread over, its core limit."""
    entry = rates["networks"][row["network"]]
    cpus = (rates.get("machine") or {}).get("cpus") or row["host_cpus"]
    rp = {_cores(c, cpus): float(v) for c, v in entry["rp"].items()}
    cpu = {_cores(c, cpus): float(v) for c, v in (entry.get("rp_cpu") or {}).items()} or None
    host_cpus = int(row["host_cpus"]) if pd.notna(row.get("host_cpus")) else int(cpus)
    per_host = int(row["members_per_host"]) if pd.notna(row.get("members_per_host")) else int(row["n"])
    nodes = max(1, math.ceil(int(row["n"]) / max(1, per_host)))
    rc = float(row["rate"]) if row["consumer"] == "emulated" and pd.notna(row.get("rate")) else None
    limit = None if str(row["cores"]) == "all" else float(row["cores"])
    return Machine(rp=rp, rc=rc, cores_per_node=host_cpus, nodes=nodes, core_limit=limit, cpu_per_image=cpu,
                   comm=comm)


def _why_not(row, rates: dict) -> str | None:
    kind = SCHEME_KINDS.get(row["scheme"])
    if kind is None or kind.service:
        return "the tf.data service's gRPC path is not modelled"
    if row["consumer"] == "train":
        return "the train consumer's training shares the CPU with preprocessing: not modelled"
    if row["network"] not in (rates or {}).get("networks", {}):
        return f"no calibrated rp for {row['network']}"
    if pd.notna(row.get("hosts_per_kernel")) and int(row["hosts_per_kernel"]) > 1:
        return (f"its {int(row['hosts_per_kernel'])} hosts share one machine's cores (namespaced nodes): "
                "the model gives each host its own")
    return None


def versus_measured(df: pd.DataFrame, rates: dict | None, comm: dict | None) -> pd.DataFrame:
    """One row per cell: predicted and measured images/s per member and CPU-s per delivered image,
    their relative errors, the predicted bound; ``not_modelled`` says why a cell has no prediction."""
    costs = CommCosts.from_dict(comm, source=comm.get("source", "comm.json")) if comm else CommCosts()
    rows = []
    for _, row in df.iterrows():
        out = {k: row.get(k) for k in ("cell", "network", "scheme", "n", "p", "cores", "consumer", "rep")}
        out |= {"measured_rate": row["images_per_second_per_member"],
                "measured_cpu": row["process_cpu_seconds_per_image"], "comm_source": costs.source}
        why = _why_not(row, rates) if rates else "no calibration (rates.json)"
        if why is None:
            try:
                kind = SCHEME_KINDS[row["scheme"]]
                x = predict(row["scheme"], int(row["n"]), int(row["p"]) if kind.takes_p else None,
                            int(row["batch_size"]), int(row["image_size"]), machine_of(row, rates, costs),
                            str(row.get("wire_dtype") or "float32"))
            except (ConfigError, KeyError, ValueError) as e:
                why = f"not predictable: {e}"
        if why is None:
            out |= {"predicted_rate": x.images_per_second, "predicted_cpu": x.cpu_seconds_per_image,
                    "bound": x.bound, "oversubscribed": x.oversubscribed, "not_modelled": None}
        else:
            out |= {"predicted_rate": None, "predicted_cpu": None, "bound": None, "oversubscribed": None,
                    "not_modelled": why}
        rows.append(out)
    t = pd.DataFrame(rows, columns=list(COLUMNS))
    for what in ("rate", "cpu"):
        p, m = t[f"predicted_{what}"].astype(float), t[f"measured_{what}"].astype(float)
        t[f"{what}_error"] = (p / m - 1).where(m > 0).round(4)
    return t


def errors_by_scheme(t: pd.DataFrame) -> pd.DataFrame:
    """Per scheme: cells predicted, median absolute error of the rate and of the CPU per image,
    their largest, and whether both medians meet :data:`GOAL`."""
    d = t.dropna(subset=["rate_error", "cpu_error"])
    rows = []
    for scheme, g in d.groupby("scheme", sort=False):
        r, c = g["rate_error"].abs(), g["cpu_error"].abs()
        rows.append({"scheme": scheme, "cells": len(g), "rate_median_abs_error": float(np.median(r)),
                     "rate_max_abs_error": float(r.max()), "cpu_median_abs_error": float(np.median(c)),
                     "cpu_max_abs_error": float(c.max()),
                     "within_goal": bool(np.median(r) <= GOAL and np.median(c) <= GOAL)})
    return pd.DataFrame(rows, columns=["scheme", "cells", "rate_median_abs_error", "rate_max_abs_error",
                                       "cpu_median_abs_error", "cpu_max_abs_error", "within_goal"])


def paper_grid(cfg: dict | None) -> tuple[pd.DataFrame, pd.DataFrame, dict | None]:
    """(curves, crossings, the model's inputs as a dict) of a config with a ``model`` section;
    empty tables where there is none."""
    if not cfg or "model" not in cfg:
        return pd.DataFrame(columns=list(CURVE_COLUMNS)), pd.DataFrame(columns=list(CROSSING_COLUMNS)), None
    inputs = ModelInputs.from_config(cfg)
    curves = pd.DataFrame(peak_curves(cfg, inputs), columns=list(CURVE_COLUMNS))
    cross = pd.DataFrame(crossings(cfg, inputs), columns=list(CROSSING_COLUMNS))
    return curves, cross, {"source": inputs.source, "comm": inputs.comm.as_dict(), "rc": inputs.rc,
                           "cores_per_node": inputs.cores_per_node, "network": next(iter(inputs.rp))}


PLANNER_COLUMNS = ("cell", "network", "n", "cores", "consumer", "chosen", "chosen_rate", "chosen_cpu", "predicted_rate",
                   "best_measured", "best_rate", "best_cpu", "rate_vs_best", "candidates")
PLANNER_GOAL = 0.9  # the plan's choice delivers at least 90% of the best measured scheme's rate


def _label(scheme: str, p) -> str:
    kind = SCHEME_KINDS.get(scheme)
    return f"{scheme} (P={int(p)})" if kind is not None and kind.takes_p else scheme


def planner_choices(df: pd.DataFrame, prediction: pd.DataFrame) -> pd.DataFrame:
    """Each auto cell (``planned``) beside the grid's own cells of the same network, n, core limit,
    consumer, batch and image size: the scheme the plan chose and its measured rate and CPU per
    image, against the best measured of enspipe's schemes there (medians over repeats)."""
    if "planned" not in df or df["planned"].isna().all():
        return pd.DataFrame(columns=list(PLANNER_COLUMNS))
    key = ["network", "n", "cores", "consumer", "batch_size", "image_size"]
    grid = df[df["planned"].isna() & df["scheme"].isin([k for k, v in SCHEME_KINDS.items() if not v.service])]
    pred = prediction.set_index("cell")["predicted_rate"]
    rows = []
    for _, a in df[df["planned"].notna()].iterrows():
        same = grid[(grid[key] == a[key]).all(axis=1)]
        med = same.groupby(["scheme", "p"], as_index=False)[["images_per_second_per_member",
                                                             "process_cpu_seconds_per_image"]].median()
        best = med.sort_values("images_per_second_per_member", ascending=False).head(1)
        b = best.iloc[0] if len(best) else None
        rows.append({"cell": a["cell"], "network": a["network"], "n": a["n"], "cores": a["cores"],
                     "consumer": a["consumer"], "chosen": _label(a["scheme"], a["p"]),
                     "chosen_rate": a["images_per_second_per_member"], "chosen_cpu": a["process_cpu_seconds_per_image"],
                     "predicted_rate": pred.get(a["cell"]),
                     "best_measured": _label(b["scheme"], b["p"]) if b is not None else None,
                     "best_rate": b["images_per_second_per_member"] if b is not None else None,
                     "best_cpu": b["process_cpu_seconds_per_image"] if b is not None else None,
                     "rate_vs_best": (a["images_per_second_per_member"] / b["images_per_second_per_member"])
                     if b is not None else None, "candidates": len(med)})
    return pd.DataFrame(rows, columns=list(PLANNER_COLUMNS))
