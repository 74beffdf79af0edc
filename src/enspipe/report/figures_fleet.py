"""Heterogeneous ensembles (FLEET): the arms, the waits, the timeline and the paper-scale
simulation (each registered in :data:`enspipe.report.outputs.OUTPUTS` with its writer)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from enspipe.report import heterogeneous
from enspipe.report.outputs import FIG, FLEET, TAB, Inputs, no_data, output, plt, save, write_table


def arms_figure(t: pd.DataFrame, path_stem: str) -> None:
    """The heterogeneous ensemble's makespan per arm: with the rounds' launches, without them, and
    the time model's; the accelerator-busy fraction on each arm's bar."""
    title = "A heterogeneous ensemble: makespan per arm (emulated accelerators)"
    if t.empty:
        return no_data(path_stem, title, "no heterogeneous experiment in the config")
    fig, ax = plt().subplots(figsize=(7, 4), layout="constrained")
    cols = [("makespan_s", "measured, launches included"), ("launch_free_makespan_s", "measured, without launches"),
            ("model_makespan_s", "time model")]
    x = np.arange(len(t))
    for k, (col, label) in enumerate(cols):
        bars = ax.bar(x + (k - 1) * 0.27, t[col].astype(float), 0.27, label=label, color=f"C{k}")
        if k == 0:
            for b, busy in zip(bars, t["accelerator_busy_fraction"]):
                if pd.notna(busy):
                    ax.annotate(f"busy {busy:.0%}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                                va="bottom", fontsize=7)
    ax.set(xticks=x, xticklabels=t["arm"], ylabel="seconds", title=title)
    ax.legend(fontsize=7)
    save(fig, path_stem, f"{int(t['members'].iloc[0])} members, {int(t['accelerators'].iloc[0])} EMULATED "
          "accelerators; busy: accelerator-busy fraction of the makespan with launches.")


def wait_figure(t: pd.DataFrame, sim: pd.DataFrame, path_stem: str) -> None:
    """The paper's Fig. 6 and Table 3 for this run's arms and at the paper's scale: the wait per
    accelerator (the makespan less the seconds it trained) and the members' run lengths."""
    title = "Wait per accelerator and members' run lengths, per arm"
    if t.empty and sim.empty:
        return no_data(path_stem, title, "no heterogeneous experiment in the config")
    fig, (ax, ax_run, ax_sim) = plt().subplots(1, 3, figsize=(13, 4), layout="constrained")
    if not t.empty:
        x = np.arange(len(t))
        cols = [("wait_per_accelerator_s", "measured, launches included"),
                ("launch_free_wait_per_accelerator_s", "measured, without launches"),
                ("model_wait_per_accelerator_s", "time model")]
        for k, (col, label) in enumerate(cols):
            ax.bar(x + (k - 1) * 0.27, t[col].astype(float), 0.27, label=label, color=f"C{k}")
        ax.set(xticks=x, xticklabels=t["arm"], ylabel="seconds", title="this run: wait per accelerator")
        ax.legend(fontsize=7)
        ax_run.bar(x - 0.2, t["run_length_mean_s"].astype(float), 0.4, yerr=t["run_length_std_s"].astype(float),
                   capsize=3, label="measured (mean, std)", color="C0")
        ax_run.bar(x + 0.2, t["model_run_length_mean_s"].astype(float), 0.4,
                   yerr=t["model_run_length_std_s"].astype(float), capsize=3, label="time model", color="C2")
        ax_run.set(xticks=x, xticklabels=t["arm"], ylabel="seconds", title="this run: members' run lengths")
        ax_run.legend(fontsize=7)
    if not sim.empty:
        for arm, g in sim.groupby("arm", sort=False):
            ax_sim.plot(g["accelerators"], g["wait_per_accelerator_s"], "o-", label=arm, ms=4)
        ax_sim.set(yscale="log", xlabel="accelerators", ylabel="seconds (log)",
                   title="SIMULATED, 100 members: wait per accelerator")
        ax_sim.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    save(fig, path_stem, "This run: EMULATED accelerators; a wait is an accelerator's idle seconds in the arm "
          "(in lockstep a faster member waits for the shared stream; freed accelerators idle until the next round; "
          "the rounds' set-up). Right: SIMULATED by the time model at the paper's scale (the paper's Fig. 6: "
          "homogeneous 130-300 s, FLEET-L 25-150 s, FLEET-G 1-17 s per GPU, where its wait may count otherwise).")


def timeline_figure(t: pd.DataFrame, path_stem: str) -> None:
    """The fleet arm's timeline: each member's training on its accelerators (one row each), the
    rounds (flotillas; a round's end is every member's checkpoint) as shaded spans."""
    title = "FLEET's flotillas: which member trained on which accelerators, when"
    if t.empty or t["start"].isna().all():
        return no_data(path_stem, title, "no fleet arm in the heterogeneous experiment")
    fig, ax = plt().subplots(figsize=(9, 3.6), layout="constrained")
    colours = {m: f"C{i % 10}" for i, m in enumerate(dict.fromkeys(t["member"]))}
    for r in t.itertuples():
        for acc in (r.accelerators or []):
            ax.barh(acc, r.end - r.start, left=r.start, color=colours[r.member], edgecolor="k", lw=0.4)
            ax.text(r.start + (r.end - r.start) / 2, acc, r.member, ha="center", va="center", fontsize=6)
            ax.plot(r.checkpoints, [acc] * len(r.checkpoints), "|", color="k", ms=9, mew=1.2)
            if r.converged:
                ax.plot([r.end], [acc], "*", color="gold", mec="k", ms=9)
    for k, (_, g) in enumerate(t.groupby("round")):
        ax.axvspan(g["start"].min(), g["end"].max(), color="0.93" if k % 2 else "0.85", zorder=0)
    accs = sorted({a for r in t["accelerators"] for a in (r or [])})
    ax.set(yticks=accs, yticklabels=[f"acc {a}" for a in accs], xlabel="seconds since the arm began", title=title,
           xlim=(0, None))
    ax.invert_yaxis()
    save(fig, path_stem, ("EMULATED accelerators. " if t["emulated"].any() else "Members trained for real. ")
          + "Ticks: a member's checkpoints (one per epoch); star: it converged (early stopping). Shaded spans: "
          "rounds (flotillas); between them the allocator re-plans from the checkpoints (in one job, --in-job, "
          "the gaps are its ~2 s per round; with a job per round they are the jobs' starts).")


@output("heterogeneous_arms", FIG + TAB, FLEET)
def _heterogeneous_arms(ins: Inputs, stem: str) -> None:
    t = ins.tables["heterogeneous"]
    arms_figure(t, stem)
    write_table(t, stem, "A heterogeneous ensemble (config heterogeneous) trained by each arm, accelerators EMULATED: "
                "makespan from the first launch to the last exit (each round is one MPI job here), without the "
                "rounds' launches (their training times, scheduled as they ran), and the time model's; accelerator-"
                "busy fraction, CPU-s of the runs' processes and node CPU-s (mpstat/psutil), energy (per round, "
                "its source in the runs' summaries); *_over_fleet: each arm's makespan over fleet's.")


@output("heterogeneous_wait", FIG + TAB, FLEET)
def _heterogeneous_wait(ins: Inputs, stem: str) -> None:
    t = ins.tables["heterogeneous"]
    wait_figure(t, ins.tables["paper_sim"], stem)
    cols = ["arm", "rounds", "wait_per_accelerator_s", "launch_free_wait_per_accelerator_s",
            "model_wait_per_accelerator_s", "run_length_mean_s", "run_length_std_s", "model_run_length_mean_s",
            "model_run_length_std_s", "accelerator"]
    write_table(t[cols] if len(t) else t, stem,
                "The paper's Fig. 6 and Table 3 for this run's arms, accelerators EMULATED: each accelerator's mean "
                "wait (the makespan, with the rounds' launches or without them, less the seconds it trained) and the "
                "members' run lengths (a member's first training step to its last, across rounds: mean and standard "
                "deviation), measured and from the time model.")


@output("heterogeneous_timeline", FIG, FLEET)
def _heterogeneous_timeline(ins: Inputs, stem: str) -> None:
    timeline_figure(ins.tables["timeline"], stem)


@output("fleet_paper_scale_simulated", TAB, FLEET)
def _paper_scale(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["paper_scale"], stem,
                "SIMULATED, nothing trained: the paper's scale (100 members with one-accelerator rates 21-176 "
                "images/s and 10-24 epochs, as in its Fig. 8; 4 accelerators per node; Caltech256's 30,606 "
                "images per epoch) planned by the same allocator and timed by its lockstep model, each round "
                f"costing {heterogeneous.PAPER_ROUND_SECONDS:g} s (the paper's Table 4: FLEET-G's checkpointing "
                "at 160 GPUs over its flotillas); each arm's makespan, its speed-ups, FLEET-G's over FLEET-L with "
                "and without the rounds' cost, beside the paper's measured ones (Fig. 5).")


@output("fleet_paper_scale_waits_simulated", TAB, FLEET)
def _paper_waits(ins: Inputs, stem: str) -> None:
    write_table(ins.tables["paper_waits"], stem,
                "SIMULATED, nothing trained: the same simulation's wait per accelerator (the makespan less the seconds "
                "it trained) and the members' run lengths per arm, beside the paper's Fig. 6 (wait per GPU, read "
                "as ranges; its wait may count otherwise) and Table 3 (run lengths at 80 GPUs).")
