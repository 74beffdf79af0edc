"""Heterogeneous ensembles (FLEET) in the report: the four arms as run (``enspipe ensemble``'s
``ensemble.json`` per arm), the fleet arm's timeline, and the paper's scale simulated with the same
allocator.

* :func:`arms_table`: per arm, the makespan with and without the rounds' launches, the time
  model's prediction, accelerator-busy fraction, the wait per accelerator (the paper's Fig. 6: the
  makespan less the seconds an accelerator trained), the members' run lengths (mean and standard
  deviation: the paper's Table 3), CPU-s and energy, and each arm's makespan over fleet's
  (measured; accelerators emulated).
* :func:`timeline_rows`: which member ran on which accelerators when (seconds since the arm began).
* :func:`simulate_paper_scale`: SIMULATED: 100 members (one-accelerator rates 21-176 images/s and
  10-24 epochs, the ranges of the paper's Fig. 8) on 20..160 accelerators, 4 per node, Caltech256's
  30,606 images per epoch, every round costing :data:`PAPER_ROUND_SECONDS`; one row per
  (accelerators, arm). :func:`paper_scale` and :func:`paper_waits` are its views beside the
  paper's Fig. 5, Fig. 6 and Table 3.
"""
from __future__ import annotations

import random
import statistics

import pandas as pd

from enspipe.plan.ensemble import (
    ARMS,
    Ensemble,
    EnsembleMember,
    model_times,
    plan_rounds,
)

# The paper's Fig. 5 (read off the figure; ../shared/notes/fleet-notes.md): speed-up over the
# default arm of homogeneous, FLEET-L and FLEET-G by GPU count, 100 DNNs on SummitDev.
PAPER_FIG5 = {20: (0.66, 1.16, 1.13), 40: (0.61, 1.09, 1.20), 60: (0.67, 1.04, 1.14), 80: (0.54, 0.89, 1.04),
              100: (1.00, 0.96, 1.24), 120: (1.00, 1.11, 1.48), 140: (1.00, 1.58, 1.70), 160: (1.00, 1.67, 1.92)}
PAPER_OVER_DEFAULT, PAPER_OVER_HOMOGENEOUS = (1.12, 1.92), (1.23, 1.97)
# Fig. 6 (wait per GPU, log scale, read as ranges) and Table 3 (run length at 80 GPUs, mean/std s)
PAPER_FIG6 = {"homogeneous": "130-300 s", "fleet_local": "25-150 s", "fleet": "17 s at 20 GPUs, 1-2 s at 100+"}
PAPER_TABLE3 = {"default": "10372 / 4179", "fleet_local": "6213 / 3580", "fleet": "per flotilla, std 26-364"}
# A round's cost at the paper's scale: its Table 4 gives FLEET-G 6.3% of 11,825 s checkpointing at
# 160 GPUs, ~745 s over its 22 flotillas: about 30 s to checkpoint and restart each one.
PAPER_ROUND_SECONDS = 30.0


def _run_lengths(record: dict) -> list[float]:
    """Each member's run length in an arm as run: its first training step to its last, across rounds."""
    spans: dict[str, list[float]] = {}
    for t in record["timeline"]:
        if t["start"] is not None and t["end"] is not None:
            s = spans.setdefault(t["member"], [t["start"], t["end"]])
            s[0], s[1] = min(s[0], t["start"]), max(s[1], t["end"])
    return [end - start for start, end in spans.values()]


def _mean_std(xs) -> tuple[float | None, float | None]:
    xs = [x for x in (xs or []) if x is not None]
    return (statistics.fmean(xs), statistics.pstdev(xs)) if xs else (None, None)


def _wait(makespan, busy: float, accelerators: int) -> float | None:
    return None if makespan is None else makespan - busy / accelerators


def arms_table(records: dict[str, dict]) -> pd.DataFrame:
    """One row per arm that ran (see the module)."""
    rows = []
    for arm in ARMS:
        r = records.get(arm)
        if r is None:
            continue
        g, busy = r["accelerators"], r["accelerator_busy_seconds"]
        mean, std = _mean_std(_run_lengths(r))
        model_mean, model_std = _mean_std(r.get("predicted_run_lengths_seconds"))
        rows.append({"arm": arm, "members": len(r["members"]), "accelerators": g,
                     "rounds": len(r["rounds"]), "makespan_s": r["makespan_seconds"],
                     "launch_free_makespan_s": r["launch_free_makespan_seconds"],
                     "model_makespan_s": r["predicted_makespan_seconds"],
                     "accelerator_busy_fraction": r["accelerator_busy_fraction"],
                     "wait_per_accelerator_s": _wait(r["makespan_seconds"], busy, g),
                     "launch_free_wait_per_accelerator_s": _wait(r["launch_free_makespan_seconds"], busy, g),
                     "model_wait_per_accelerator_s": r.get("predicted_wait_per_accelerator_seconds"),
                     "run_length_mean_s": mean, "run_length_std_s": std,
                     "model_run_length_mean_s": model_mean, "model_run_length_std_s": model_std,
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


def simulate_paper_scale(members: int = 100, accelerators=(20, 40, 60, 80, 100, 120, 140, 160), per_node: int = 4,
                         images: int = 30_606, efficiency: float = 0.9, round_seconds: float = PAPER_ROUND_SECONDS,
                         seed: int = 0) -> pd.DataFrame:
    """SIMULATED (see the module): one row per (accelerators, arm): the rounds, the makespan with
    and without the rounds' costs, the wait per accelerator and the members' run lengths."""
    rng = random.Random(seed)
    ms = tuple(EnsembleMember(f"m{i}", 21 * (176 / 21) ** rng.random(), rng.randint(10, 24)) for i in range(members))
    rows = []
    for g in accelerators:
        ens = Ensemble(ms, g, per_node=per_node, efficiency=efficiency, seed=seed)
        for arm in ARMS:
            rounds = plan_rounds(ens, arm, images)
            t = model_times(ens, arm, rounds, images, round_seconds)
            mean, std = _mean_std(t.run_lengths)
            rows.append({"accelerators": g, "nodes": -(-g // per_node), "members": members, "arm": arm,
                         "rounds": len(rounds), "makespan_s": t.makespan,
                         "makespan_without_round_cost_s": model_times(ens, arm, rounds, images).makespan,
                         "wait_per_accelerator_s": t.wait_per_accelerator,
                         "run_length_mean_s": mean, "run_length_std_s": std,
                         "source": f"simulated (emulated profiles, efficiency {efficiency}/doubling, "
                                   f"{round_seconds:g} s per round)"})
    return pd.DataFrame(rows)


def paper_scale(sim: pd.DataFrame) -> pd.DataFrame:
    """The simulation's makespans per accelerator count, each arm's speed-up over default, FLEET-G's
    over homogeneous and over FLEET-L (with and without the rounds' costs), beside the paper's Fig. 5."""
    if sim.empty:
        return pd.DataFrame()
    t = sim.pivot(index="accelerators", columns="arm", values="makespan_s")
    free = sim.pivot(index="accelerators", columns="arm", values="makespan_without_round_cost_s")
    rounds = sim.pivot(index="accelerators", columns="arm", values="rounds")
    out = pd.DataFrame({"accelerators": t.index, "members": sim.groupby("accelerators")["members"].first().values})
    for arm in ARMS:
        out[f"{arm}_s"] = t[arm].values
        out[f"{arm}_rounds"] = rounds[arm].values
    for arm in ("homogeneous", "fleet", "fleet_local"):
        out[f"{arm}_over_default"] = (t["default"] / t[arm]).values
    out["fleet_over_homogeneous"] = (t["homogeneous"] / t["fleet"]).values
    out["fleet_over_fleet_local"] = (t["fleet_local"] / t["fleet"]).values
    out["fleet_over_fleet_local_without_round_cost"] = (free["fleet_local"] / free["fleet"]).values
    paper = [PAPER_FIG5.get(g, (None, None, None)) for g in t.index]
    out["paper_homogeneous_over_default"] = [p[0] for p in paper]
    out["paper_fleet_local_over_default"] = [p[1] for p in paper]
    out["paper_fleet_over_default"] = [p[2] for p in paper]
    out["paper_fleet_over_fleet_local"] = [None if p[1] is None else p[2] / p[1] for p in paper]
    out["source"] = sim.groupby("accelerators")["source"].first().values
    return out


def paper_waits(sim: pd.DataFrame) -> pd.DataFrame:
    """The simulation's wait per accelerator and run lengths per (accelerators, arm), beside the
    paper's Fig. 6 and Table 3 (where it gives them)."""
    if sim.empty:
        return pd.DataFrame()
    t = sim[["accelerators", "arm", "rounds", "wait_per_accelerator_s", "run_length_mean_s", "run_length_std_s",
             "source"]].copy()
    t["paper_wait_per_gpu"] = t["arm"].map(PAPER_FIG6)
    t["paper_run_length_mean_std_at_80"] = [PAPER_TABLE3.get(a) if g == 80 else None
                                           for a, g in zip(t["arm"], t["accelerators"])]
    return t


def speedups(arms: pd.DataFrame, column: str, of: str = "fleet",
             over: tuple[str, ...] = ("default", "homogeneous")) -> dict[str, float] | None:
    """Arm ``of``'s speed-up over each arm of ``over`` in ``column`` (a makespan), or None where an
    arm is missing."""
    if not len(arms) or not {*over, of} <= set(arms["arm"]):
        return None
    get = arms.set_index("arm")[column].astype(float)
    return {a: get[a] / get[of] for a in over}
