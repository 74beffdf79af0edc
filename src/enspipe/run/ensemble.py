"""Train a heterogeneous ensemble in one arm's rounds, for real, and measure it (``enspipe ensemble``).

:func:`enspipe.plan.ensemble.plan_rounds` says which members train together, on how many
accelerators and for how many epochs; this module runs each round as one ``enspipe run`` job
(emulated accelerators, one MPI rank each: ``--member-rates``, ``--data-parallel``,
``--member-epochs``) under the launcher it is given, inside one allocation: ``mpiexec`` locally,
``srun`` inside a Slurm job (job steps, never a new ``sbatch``). ``fleet`` and ``homogeneous``
rounds run one after another; ``default`` rounds (one member, its own pipeline) run up to G at
once, an accelerator taking the next member when it frees up.

The arm's record (``ensemble.json``, written atomically when the arm is done) holds the makespan
(from the first launch to the last exit, launches included), the launch-free makespan (the rounds'
training times, scheduled as they ran: what an in-job reallocation would approach), each round's wall time and its
training time (first to last step, without the launch), each member's start and end on its
accelerators (the timeline), the accelerator-busy fraction, the processes' CPU-s, node CPU-s
(mpstat or psutil, per round; concurrent ``default`` rounds see each other, so there it is
summed over rounds only as an upper bound and labelled so), the modelled energy and the time
model's prediction beside the measurement. Everything is labelled ``emulated``.

Checkpoints: a round's result is its ``summary.json`` (atomic). A killed arm, started again with
the same ensemble and options, keeps every round that finished and reruns only those that had
not: a member loses at most the round it was in (its checkpoint interval). Emulated members have
no weights; their state is the epochs they have trained, which the plan carries.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from enspipe.common.atomic import write_json_atomic
from enspipe.plan.ensemble import Ensemble, Round, arm_slots, list_schedule, plan_rounds, predicted_makespan

RESULT = "ensemble.json"


def round_command(ens: Ensemble, r: Round, data: str, out: str, steps_per_epoch: int, seed: int,
                  run_args: list[str], launcher: list[str]) -> list[str]:
    """The ``enspipe run`` job of round ``r`` (a fresh epoch order per round: ``seed`` + index)."""
    scheme = "all_shared" if r.ranks > 1 else "baseline"
    return [*launcher, "-n", str(r.ranks), sys.executable, "-m", "enspipe", "run", "--data", data, "--out", out,
            "--scheme", scheme, "--consumer", "emulated", "--warmup", "0", "--steps", str(r.steps(steps_per_epoch)),
            "--member-rates", ",".join(str(ens.members[i].rate) for i in r.members),
            "--data-parallel", ",".join(map(str, r.widths)), "--member-epochs", ",".join(map(str, r.epochs)),
            "--scaling-efficiency", str(ens.efficiency), "--seed", str(seed + r.index), *run_args]


def _round_dir(out: str, r: Round) -> str:
    return os.path.join(out, f"round{r.index:02d}")


def _done(out: str, r: Round) -> bool:
    return os.path.exists(os.path.join(_round_dir(out, r), "summary.json"))


def run_arm(ens: Ensemble, arm: str, data: str, out: str, batch: int, num_images: int, seed: int = 0,
            run_args: list[str] | None = None, launcher: list[str] | None = None, say=print) -> dict:
    """Run ``arm``'s rounds (see the module) and write ``out/ensemble.json``; returns the record.
    Raises RuntimeError naming the round and its log when a round fails."""
    run_args, launcher = run_args or [], launcher or [os.path.join(os.path.dirname(sys.executable), "mpiexec")]
    steps_per_epoch = num_images // batch
    rounds = plan_rounds(ens, arm, num_images)
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, RESULT)):
        os.remove(os.path.join(out, RESULT))  # a rerun's record appears only when it is complete
    resumed = [r.index for r in rounds if _done(out, r)]
    slots = arm_slots(ens, arm)
    pending = [r for r in rounds if not _done(out, r)]
    running: list[tuple[Round, subprocess.Popen, float, object]] = []
    times: dict[int, tuple[float, float]] = {}
    t0 = time.time()
    while pending or running:
        while pending and len(running) < slots:
            r = pending.pop(0)
            os.makedirs(_round_dir(out, r), exist_ok=True)
            log = open(os.path.join(out, f"round{r.index:02d}.log"), "w")
            cmd = round_command(ens, r, data, _round_dir(out, r), steps_per_epoch, seed, run_args, launcher)
            say(f"{arm} round {r.index}: {', '.join(ens.members[i].name for i in r.members)} on "
                f"{'+'.join(map(str, r.widths))} accelerators, {'/'.join(map(str, r.epochs))} epochs")
            running.append((r, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), time.time(), log))
        time.sleep(0.05)
        for item in list(running):
            r, proc, started, log = item
            if proc.poll() is None:
                continue
            log.close()
            running.remove(item)
            if proc.returncode != 0:
                for _, other, _, other_log in running:  # fail fast: the arm's result would be wrong
                    other.kill()
                    other_log.close()
                raise RuntimeError(f"{arm} round {r.index} failed (exit {proc.returncode}); see "
                                   f"{os.path.join(out, f'round{r.index:02d}.log')}")
            times[r.index] = (started - t0, time.time() - t0)
    record = _record(ens, arm, rounds, out, times, resumed, t0, time.time() - t0, num_images)
    write_json_atomic(os.path.join(out, RESULT), record)
    return record


def _member_span(rdir: str, rank: int) -> tuple[float | None, float | None]:
    """Wall times of a rank's first and last training (not idle) step, from its event log."""
    first = last = None
    with open(os.path.join(rdir, f"events.rank{rank:04d}.jsonl")) as f:
        for e in map(json.loads, f):
            if e["event"] == "step" and not e.get("idle"):
                t = e["t"]
                first = t - e.get("wait_s", 0.0) - e.get("compute_s", 0.0) if first is None else first
                last = t
    return first, last


def _record(ens: Ensemble, arm: str, rounds: list[Round], out: str, times: dict, resumed: list[int],
            t0: float, makespan: float, num_images: int) -> dict:
    rows, timeline = [], []
    busy = cpu = node_cpu = energy = 0.0
    for r in rounds:
        rdir = _round_dir(out, r)
        with open(os.path.join(rdir, "summary.json")) as f:
            s = json.load(f)
        ranks = s["ranks"]
        first_rank = {m: min(x["rank"] for x in ranks if x["member"] == k) for k, m in enumerate(r.members)}
        for k, m in enumerate(r.members):
            start, end = _member_span(rdir, first_rank[m])
            mine = [x for x in ranks if x["member"] == k]
            timeline.append({"round": r.index, "member": ens.members[m].name, "accelerators": r.placement.get(m),
                             "width": r.widths[k], "epochs": r.epochs[k],
                             "start": None if start is None else start - t0,  # s since the arm began
                             "end": None if end is None else end - t0,
                             "trained_images": mine[0]["trained_images"],
                             "busy_seconds": sum(x["accelerator_busy_seconds"] for x in mine)})
        busy += sum(x["accelerator_busy_seconds"] for x in ranks)
        cpu += s["cpu_seconds_total"]
        node_cpu += s.get("node_cpu_seconds_total") or 0.0
        energy += s.get("energy_joules") or 0.0
        rows.append({**r.as_dict(ens), "ranks": r.ranks, "wall": times.get(r.index),
                     "train_seconds": s["measured_window"]["seconds"],
                     "resumed": r.index in resumed, "node_cpu_seconds": s.get("node_cpu_seconds_total"),
                     "cpu_seconds": s["cpu_seconds_total"], "energy_joules": s.get("energy_joules"),
                     "energy_source": s.get("energy_source")})
    concurrent = arm == "default" and ens.accelerators > 1
    return {
        "arm": arm, "emulated": True, "accelerators": ens.accelerators, "members": [m.__dict__ for m in ens.members],
        "num_images": num_images, "efficiency": ens.efficiency, "replan_below": ens.replan_below,
        "tolerance": ens.tolerance, "resumed_rounds": resumed,
        "makespan_seconds": makespan if not resumed else None,
        # without the rounds' launches (a job per round here; FLEET's runtime reallocates inside one):
        # the rounds' training times one after another, or (default) list-scheduled on G as they ran
        "launch_free_makespan_seconds": list_schedule([x["train_seconds"] for x in rows], arm_slots(ens, arm)),
        "predicted_makespan_seconds": predicted_makespan(ens, arm, rounds),
        "accelerator_busy_fraction": busy / (ens.accelerators * makespan) if makespan > 0 and not resumed else None,
        "accelerator_busy_seconds": busy, "cpu_seconds": cpu,
        "node_cpu_seconds": node_cpu, "node_cpu_note": "summed over concurrent rounds that each saw the whole "
        "node: an upper bound" if concurrent else "summed over rounds, one after another",
        "energy_joules": energy, "energy_note": "per round, summed (each round's source: see rounds)",
        "rounds": rows, "timeline": timeline,
    }
