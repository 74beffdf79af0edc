"""Heterogeneous ensembles (FLEET, issue 19) in the report: the three arms as run
(``enspipe ensemble``'s ``ensemble.json`` per arm), the fleet arm's timeline, and the paper's scale
simulated with the same allocator.

* :func:`arms_table`: per arm, the makespan with and without the rounds' launches, the time
  model's prediction, accelerator-busy fraction, CPU-s and energy, and FLEET's speed-up over the
  other two arms (measured; accelerators emulated).
* :func:`timeline_rows`: which member ran on which accelerators when (seconds since the arm began).
* :func:`paper_scale`: SIMULATED: 100 members (one-accelerator rates 21-176 images/s and 10-24
  epochs, the ranges of the paper's Fig. 8) on 20..160 accelerators, 4 per node, Caltech256's
  30,606 images per epoch; each arm's makespan from the time model, beside the paper's Fig. 5.
"""
from __future__ import annotations

import random

import pandas as pd

from enspipe.plan.ensemble import ARMS, Ensemble, EnsembleMember, plan_rounds, predicted_makespan

# The paper's Fig. 5 (read off the figure; ../shared/notes/fleet-notes.md): speed-up over the
# default arm of homogeneous and FLEET-G, by GPU count, 100 DNNs on SummitDev. FLEET-L's: 0.89-1.67x.
PAPER_FIG5 = {20: (0.66, 1.13), 40: (0.61, 1.20), 60: (0.67, 1.14), 80: (0.54, 1.04), 100: (1.00, 1.24),
              120: (1.00, 1.48), 140: (1.00, 1.70), 160: (1.00, 1.92)}
PAPER_OVER_DEFAULT, PAPER_OVER_HOMOGENEOUS = (1.12, 1.92), (1.23, 1.97)


def arms_table(records: dict[str, dict]) -> pd.DataFrame:
    """One row per arm that ran (see the module)."""
    rows = []
    for arm in ARMS:
        r = records.get(arm)
        if r is None:
            continue
        rows.append({"arm": arm, "members": len(r["members"]), "accelerators": r["accelerators"],
                     "rounds": len(r["rounds"]), "makespan_s": r["makespan_seconds"],
                     "launch_free_makespan_s": r["launch_free_makespan_seconds"],
                     "model_makespan_s": r["predicted_makespan_seconds"],
                     "accelerator_busy_fraction": r["accelerator_busy_fraction"],
                     "cpu_s": r["cpu_seconds"], "node_cpu_s": r["node_cpu_seconds"], "energy_j": r["energy_joules"],
                     "resumed_rounds": len(r["resumed_rounds"]),
                     "converged_early": sum(bool(x and x["converged"]) for x in (r.get("member_states") or {}).values()),
                     "accelerator": "emulated" if r["emulated"] else "trained (measured)"})
    t = pd.DataFrame(rows)
    if "fleet" in records and len(t):
        for col in ("makespan_s", "launch_free_makespan_s", "model_makespan_s"):
            fleet = t.loc[t["arm"] == "fleet", col].iloc[0]
            t[f"{col.removesuffix('_s')}_over_fleet"] = t[col] / fleet if fleet else None
    return t


def timeline_rows(record: dict | None) -> pd.DataFrame:
    """The arm's members on their accelerators: one row per (round, member)."""
    if not record:
        return pd.DataFrame()
    return pd.DataFrame([{k: t[k] for k in ("round", "member", "width", "epochs", "start", "end", "trained_images",
                                            "busy_seconds")}
                         | {"accelerators": t["accelerators"], "checkpoints": [c["t"] for c in t.get("checkpoints", [])],
                            "converged": t.get("converged", False), "emulated": record["emulated"]}
                         for t in record["timeline"]])


def paper_scale(members: int = 100, accelerators=(20, 40, 60, 80, 100, 120, 140, 160), per_node: int = 4,
                images: int = 30_606, efficiency: float = 0.9, seed: int = 0) -> pd.DataFrame:
    """SIMULATED (see the module): each arm's modelled makespan and FLEET's speed-ups, with the
    paper's measured ones beside them."""
    rng = random.Random(seed)
    ms = tuple(EnsembleMember(f"m{i}", 21 * (176 / 21) ** rng.random(), rng.randint(10, 24)) for i in range(members))
    rows = []
    for g in accelerators:
        ens = Ensemble(ms, g, per_node=per_node, efficiency=efficiency, seed=seed)
        t = {arm: predicted_makespan(ens, arm, plan_rounds(ens, arm, images)) for arm in ARMS}
        homog, fleet = PAPER_FIG5.get(g, (None, None))
        rows.append({"accelerators": g, "nodes": -(-g // per_node), "members": members,
                     "default_s": t["default"], "homogeneous_s": t["homogeneous"], "fleet_s": t["fleet"],
                     "fleet_local_s": t["fleet_local"],
                     "fleet_over_default": t["default"] / t["fleet"], "fleet_over_homogeneous": t["homogeneous"] / t["fleet"],
                     "fleet_local_over_default": t["default"] / t["fleet_local"],
                     "paper_fleet_over_default": fleet,
                     "paper_fleet_over_homogeneous": None if fleet is None else fleet / homog,
                     "source": f"simulated (emulated profiles, efficiency {efficiency}/doubling)"})
    return pd.DataFrame(rows)


def speedups(arms: pd.DataFrame, column: str) -> dict[str, float] | None:
    """FLEET's speed-up over the default and homogeneous arms in ``column`` (a makespan), or None
    where an arm is missing."""
    others = ("default", "homogeneous")
    if not len(arms) or not {*others, "fleet"} <= set(arms["arm"]):
        return None
    get = arms.set_index("arm")[column].astype(float)
    return {a: get[a] / get["fleet"] for a in others}
