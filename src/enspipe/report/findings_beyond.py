"""The findings beyond the paper's: the invariants of any honest measurement, the tf.data
service as a peer, one member lagging, the cost model and planner, and FLEET's heterogeneous
ensembles; each a registered judge."""
from __future__ import annotations

import pandas as pd

from enspipe.report import tables
from enspipe.report.ceiling import ceiling_text, node_clock_note, unjudgeable, which_clock
from enspipe.report.collect import (
    CEILING_TOLERANCE,
    MAX_CEILING_TOLERANCE,
    MIN_JUDGED_WINDOW,
    ratio_noise,
    repeat_noise,
)
from enspipe.report.heterogeneous import speedups
from enspipe.report.predicted import GOAL, PLANNER_GOAL, errors_by_scheme
from enspipe.report.verdicts import (
    FULL_RUN,
    IDENTICAL_WORK_SPREAD,
    NOT_ENOUGH,
    NOT_QUIET,
    NOT_TESTABLE,
    OUTSIDE_SHARE,
    Verdict,
    against,
    all_of,
    cells_like,
    finding,
    holds_all,
    node_cpu_gaps,
    noise_text,
    rate_noise,
    within,
)


# -- invariants of any honest measurement ----------------------------------------------------------
@finding("invariant", "Sharing between n members saves at most n x CPU (a larger ratio is a measuring error)",
         "-", f"every shared cell's CPU reduction against its baseline at most n (+ that clock's repeat noise, "
              f"{CEILING_TOLERANCE:.0%}-{MAX_CEILING_TOLERANCE:.0%}), judged on the cells' own processes' clocks "
              f"(process_time, /proc ticks); the node clock (mpstat) beside it, in windows of {MIN_JUDGED_WINDOW:g} s "
              "or more")
def ceiling_finding(df, t):
    if "exceeds_ceiling" not in df:
        return None
    d = df[df["exceeds_ceiling"].notna()]
    if d.empty:
        return None
    text = ceiling_text(d)
    above = d[tables.flag(d, "exceeds_ceiling")]
    if len(above):
        word, why = unjudgeable(df, above)
        if word:
            return Verdict(text, word, why, tuple(above["cell"]))
        return Verdict(text, False, "above n: " + ", ".join(which_clock(r) for r in above.itertuples())
                       + node_cpu_gaps(df), tuple(above["cell"]))
    return Verdict(text, True, "reductions from cells.csv, judged on the process clock" + node_clock_note(df, d)
                   + node_cpu_gaps(df))


@finding("invariant", "Cells of identical work agree: at n = 1 every scheme does the same work",
         "-", f"median peak images/s of every n = 1 scheme within {IDENTICAL_WORK_SPREAD:.0%} of their median")
def identical_work_finding(df, t):
    d = df[(df["n"] == 1) & (df["consumer"] == "peak")]
    groups = [g for _, g in d.groupby(["network", "cores"]) if g["scheme"].nunique() > 1]
    if not groups:
        return None
    noise = rate_noise(df)
    parts, answers = [], []
    for g in groups:
        med = g.groupby("scheme")["images_per_second_per_member"].median()
        spread = (med.max() - med.min()) / med.median()
        reps = g.groupby("scheme").size().min()
        answers.append(within(spread, IDENTICAL_WORK_SPREAD, ratio_noise(noise)))
        parts.append(f"{g['network'].iloc[0]} cores {g['cores'].iloc[0]}: {med.min():.0f}-{med.max():.0f} img/s "
                     f"({spread:.0%}, {reps}+ repeats)")
    cells = tuple(c for g in groups for c in g["cell"])
    if min(g.groupby("scheme").size().min() for g in groups) < 3:  # one run's noise is not the schemes' spread
        return Verdict("; ".join(parts), NOT_ENOUGH, f"needs 3 repeats of each n = 1 peak cell; {FULL_RUN}")
    return Verdict("; ".join(parts), all_of(answers), f"medians over repeats; {noise_text(noise)}", cells)


# -- the peer --------------------------------------------------------------------------------------
@finding("peer (not in the paper)", "All-Shared delivers an image for no more CPU than TensorFlow's tf.data service "
         "(cross-trainer cache) at the same n and core limit",
         "- (the paper predates the service)",
         "All-Shared's CPU-s per delivered image (own processes, median over repeats) at most 1.05x the service's "
         "at every n and core limit with both")
def peer_finding(df, t):
    pairs = tables.peer_verdict(t["peer"]) if "peer" in t and len(t["peer"]) else None
    if not pairs:
        return None
    noise = repeat_noise(df, "process")
    parts, ok = [], []
    for (net, n, cores, label), (shared, service) in sorted(pairs.items(), key=lambda kv: str(kv[0])):
        cheaper = "All-Shared" if shared <= service else label
        ratio = max(shared, service) / min(shared, service)
        parts.append(f"n={n} c={cores}: AS {shared * 1e3:.2f} vs {label} {service * 1e3:.2f} ms/img, "
                     f"{cheaper} cheaper by {ratio:.2f}x")
        ok.append(against(shared, 1.05 * service, ratio_noise(noise), at_least=False))
    cells = cells_like(df[df["scheme"].isin(["all_shared", "tfdata_service"])], t["peer"], ["network", "n", "cores"])
    return Verdict("; ".join(parts), holds_all(ok), "peer_tfdata_service.csv (process CPU per delivered image); "
                   + noise_text(noise, "process CPU per image"), cells)


@finding("lag (not in the paper)", "With one member's accelerator slowed, enspipe keeps every member at its pace "
         "and skips nothing; the tf.data service lets the others run ahead and the slow one skip",
         "- (the paper predates the service)",
         "the slow member is the bottleneck (its images/s at least 0.9x its accelerator's rate; else the judge "
         "fails: the trade-off was not shown); enspipe's fast members within 10% of the slow one, nothing skipped")
def lag_finding(df, t):
    lag = t.get("lag")
    if lag is None or lag.empty:
        return None
    parts, ok = [], []
    cells = tuple(lag["cell"].dropna().unique()) if "cell" in lag else ()
    for scheme, g in lag.groupby("scheme"):
        slow = g[tables.flags(g["slow"])]
        if slow.empty or slow["accelerator_rate"].isna().all():
            continue
        s = slow.iloc[0]
        bottleneck = s["images_per_second"] >= 0.9 * s["accelerator_rate"]
        fast = g[~tables.flags(g["slow"])]["images_per_second"]
        parts.append(f"{scheme}: slow member {s['images_per_second']:.0f} img/s of its accelerator's "
                     f"{s['accelerator_rate']:.0f}, the others {fast.mean():.0f}, skipped {int(g['skipped_samples'].sum())}")
        if not bottleneck:
            return Verdict("; ".join(parts), False, f"under {scheme} the slow member got {s['images_per_second']:.0f} "
                           f"img/s, below its accelerator's {s['accelerator_rate']:.0f}: its input, not its "
                           "accelerator, set the pace, so the lag cells show no trade-off (lower lag.slowdown's rate "
                           "or raise the members' cores)", cells)
        if scheme != "tfdata_service":
            ok.append(bool((fast <= 1.1 * s["images_per_second"]).all() and g["skipped_samples"].fillna(0).sum() == 0))
    if not parts:
        return None
    return Verdict("; ".join(parts), all(ok) if ok else NOT_TESTABLE, "lag.csv (the lag cells' members)", cells)


@finding("cost model (not in the paper)", "enspipe plan's cost model predicts every modelled cell's images/s per member "
         "and CPU-s per delivered image from calibration and collective timings alone",
         "- (the paper leaves the choice of scheme to the user)",
         "median |predicted / measured - 1| at most 15% for both, for every scheme with cells")
def prediction_finding(df, t):
    if "prediction" not in t or t["prediction"]["rate_error"].notna().sum() == 0:
        return None
    e = errors_by_scheme(t["prediction"])
    parts = [f"{r.scheme} ({r.cells}): rate {r.rate_median_abs_error:.0%}, CPU {r.cpu_median_abs_error:.0%}"
             for r in e.itertuples()]
    # a prediction rests on a calibration and is judged against a cell: each as noisy as the run's repeats
    rate, cpu = ratio_noise(rate_noise(df)), ratio_noise(repeat_noise(df, "process"))
    ok = [all_of([within(r.rate_median_abs_error, GOAL, rate), within(r.cpu_median_abs_error, GOAL, cpu)])
          for r in e.itertuples()]
    worst = e.assign(w=e[["rate_median_abs_error", "cpu_median_abs_error"]].max(axis=1)).sort_values("w").iloc[-1]
    return Verdict("median |error|: " + "; ".join(parts), holds_all(ok),
                   f"prediction_vs_measurement.csv; goal {GOAL:.0%}; furthest: {worst.scheme}; the errors' noise: rate "
                   f"{rate:.0%}, CPU {cpu:.0%} (a ratio of two of the run's repeats)",
                   tuple(t["prediction"].dropna(subset=["rate_error"])["cell"]))


def _planner_answer(r, noise: float) -> bool | str:
    """One auto cell: where auto chose the scheme that measured best, its cell is one more cell of
    that scheme, so it holds unless its rate is both under the goal and outside the scheme's spread
    from its median; where it chose another, its rate against the goal, within noise where closer."""
    if r.chosen == r.best_measured:
        return bool(r.rate_vs_best >= PLANNER_GOAL or r.rate_vs_best >= 1 - noise)
    return against(r.rate_vs_best, PLANNER_GOAL, noise)


@finding("planner (not in the paper)", "scheme: auto (enspipe plan's choice of scheme and P) runs as fast as the best "
         "scheme the grid measured in the same setting",
         "- (the paper leaves the choice to the user)",
         "each auto cell's images/s per member at least 0.9x the best measured enspipe scheme's (median over "
         "repeats) at its network, n, core limit and consumer, or, where auto chose that scheme, within the run's "
         "spread of it")
def planner_finding(df, t):
    p = t.get("planner")
    if p is None or p.empty or p["rate_vs_best"].isna().all():
        return None
    p = p.dropna(subset=["rate_vs_best"])
    noise = ratio_noise(rate_noise(df))  # one auto cell against one (or the median of) the best scheme's cells
    answers = [_planner_answer(r, noise) for r in p.itertuples()]
    parts = [f"{r.network} n={r.n} c={r.cores} {r.consumer}: chose {r.chosen} {r.chosen_rate:.0f} img/s vs best "
             f"{r.best_measured} {r.best_rate:.0f} ({r.rate_vs_best:.2f}x; "
             f"{'the best measured' if r.chosen == r.best_measured else 'not the best measured'})"
             for r in p.itertuples()]
    cells = tuple(p["cell"]) + cells_like(df[df["planned"].isna()] if "planned" in df else df, p,
                                          ["network", "n", "cores", "consumer"])
    return Verdict("; ".join(parts), holds_all(answers), f"planner_choices.csv; {noise_text(rate_noise(df))}", cells)


# -- heterogeneous ensembles (FLEET, the group's follow-up) ----------------------------------------
@finding("FLEET (MLSys 2020), Fig. 5", "FLEET's flotillas train a heterogeneous ensemble faster than a pipeline per "
         "member (default) and than SC'18 sharing (homogeneous)",
         "1.12-1.92x over default, 1.23-1.97x over homogeneous (100 DNNs, 20-160 GPUs)",
         "fleet's makespan without the rounds' launches below both other arms' (each round is a job here; FLEET "
         "reallocates inside one)")
def fleet_finding(df, t):
    arms, scale = t.get("heterogeneous"), t.get("paper_scale")
    free = speedups(arms, "launch_free_makespan_s") if arms is not None else None
    if free is None:
        return None
    launched = speedups(arms, "makespan_s")
    fleet = arms.set_index("arm").loc["fleet"]
    sim = ""
    if scale is not None and len(scale):
        sim = (f"; SIMULATED, 100 members on {scale['accelerators'].min()}-{scale['accelerators'].max()} accelerators: "
               f"{scale['fleet_over_default'].min():.2f}-{scale['fleet_over_default'].max():.2f}x over default, "
               f"{scale['fleet_over_homogeneous'].min():.2f}-{scale['fleet_over_homogeneous'].max():.2f}x over "
               "homogeneous")
    noise = rate_noise(df)
    holds = all_of([against(free[arm], 1.0, ratio_noise(noise)) for arm in ("default", "homogeneous")])
    return _arms_verdict(df, arms, Verdict(
        f"{int(fleet['members'])} members on {int(fleet['accelerators'])} emulated accelerators: "
        f"{free['default']:.2f}x over default, {free['homogeneous']:.2f}x over homogeneous without the "
        f"rounds' launches; {launched['default']:.2f}x and {launched['homogeneous']:.2f}x with them{sim}", holds,
        "heterogeneous_arms.csv, fleet_paper_scale_simulated.csv; emulated accelerators; each arm ran once, so "
        f"its makespan is judged against the run's measured spread: {noise_text(noise)}"))


def _arms_verdict(df, arms, v: Verdict) -> Verdict:
    """The verdict, or where it would be no or partly and an arm's host was busy outside it (node
    CPU outside its processes above the stated share of the host's cores), node not quiet."""
    host = pd.to_numeric(df["host_cpus"], errors="coerce").max() if "host_cpus" in df and len(df) else None
    if v.holds not in (False, "partly") or not host or not {"node_cpu_s", "cpu_s", "makespan_s"} <= set(arms):
        return v
    outside = (arms["node_cpu_s"] - arms["cpu_s"]) / arms["makespan_s"]
    loud = arms[outside > OUTSIDE_SHARE * host]
    if loud.empty:
        return v
    said = ", ".join(f"{r.arm} ({o:.2f} of {int(host)} cores busy outside it)" for r, o in
                     zip(loud.itertuples(), outside[loud.index]))
    return Verdict(v.this_run, NOT_QUIET, f"{v.basis}; node not quiet in {said}, more than {OUTSIDE_SHARE:.0%} of the "
                   f"host: its verdict would be '{'no' if v.holds is False else v.holds}'")


LOCAL_TOLERANCE = 1.05  # G's makespan may exceed L's by this much in a run and still count as ahead
SIMULATED_AHEAD = 6     # of the simulation's 8 accelerator counts, G ahead of L at least at this many


@finding("FLEET (MLSys 2020), Figs. 5-6", "FLEET-G (global re-planning) trains a heterogeneous ensemble faster "
         "than FLEET-L (a flotilla kept to its end, freed accelerators handed to its others)",
         "G 1.04-1.92x over default, L 0.89-1.67x; G ahead at 7 of 8 GPU counts; wait per GPU G 1-17 s, L 25-150 s",
         f"fleet's makespan without the rounds' launches at most {LOCAL_TOLERANCE:g}x fleet_local's in this run, and "
         f"G's makespan at most L's at {SIMULATED_AHEAD}+ of the simulation's 8 accelerator counts")
def fleet_local_finding(df, t):
    arms, scale = t.get("heterogeneous"), t.get("paper_scale")
    free = speedups(arms, "launch_free_makespan_s", over=("fleet_local",)) if arms is not None else None
    if free is None:
        return None
    a = arms.set_index("arm")
    noise = rate_noise(df)
    run_ok = against(free["fleet_local"], 1 / LOCAL_TOLERANCE, ratio_noise(noise))
    this = (f"fleet {a.loc['fleet', 'launch_free_makespan_s']:.1f} s ({int(a.loc['fleet', 'rounds'])} rounds) vs "
            f"fleet_local {a.loc['fleet_local', 'launch_free_makespan_s']:.1f} s ({int(a.loc['fleet_local', 'rounds'])}"
            f" rounds) without launches: G {free['fleet_local']:.2f}x L; wait per accelerator "
            f"{a.loc['fleet', 'launch_free_wait_per_accelerator_s']:.1f} s vs "
            f"{a.loc['fleet_local', 'launch_free_wait_per_accelerator_s']:.1f} s")
    if scale is None or scale.empty:
        return _arms_verdict(df, arms, Verdict(this, run_ok, "heterogeneous_arms.csv; emulated accelerators; no "
                                               f"simulation; {noise_text(noise)}"))
    ahead = int((scale["fleet_over_fleet_local"] >= 1).sum())
    sim_ok = ahead >= SIMULATED_AHEAD
    this += (f"; SIMULATED at 100 members: G ahead at {ahead} of {len(scale)} counts "
             f"({scale['fleet_over_fleet_local'].min():.2f}-{scale['fleet_over_fleet_local'].max():.2f}x L; "
             f"{scale['fleet_over_fleet_local_without_round_cost'].min():.2f}-"
             f"{scale['fleet_over_fleet_local_without_round_cost'].max():.2f}x without the rounds' cost)")
    return _arms_verdict(df, arms, Verdict(
        this, holds_all([run_ok, sim_ok]), "heterogeneous_arms.csv, heterogeneous_wait.csv, "
        "fleet_paper_scale_simulated.csv; emulated accelerators. L ends a round at every member's finish (a checkpoint "
        "and restart each); G re-plans only when fewer than 0.8 G accelerators would stay busy; this run's makespans "
        f"against its measured spread: {noise_text(noise)}"))
