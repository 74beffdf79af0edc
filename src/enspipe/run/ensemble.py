"""Train a heterogeneous ensemble in one arm's rounds, for real, and measure it (``enspipe ensemble``).

Each round is one ``enspipe run`` job (one MPI rank per accelerator: ``--data-parallel``,
``--member-epochs`` and, emulated, ``--member-rates``; trained for real, ``--consumer train`` with
each member's network, learning rate and early-stopping patience) under the launcher it is given,
inside one allocation: ``mpiexec`` locally, ``srun`` inside a Slurm job (job steps, never a new
``sbatch``). ``fleet`` and ``homogeneous`` rounds run one after another, and after each the arm is
re-planned (:func:`enspipe.plan.ensemble.plan_rounds`) from what the members have left, read from
their checkpoints: a member that converged early (early stopping) is done, and the freed
accelerators go to the others in the next round. A round ends itself at the first epoch end
where fewer ranks train than its ``stop_below`` (FLEET's re-plan point, 0.8 G; 1 for the other
arms). ``default`` rounds (one member, its own pipeline) run up to G at once, an accelerator
taking the next member when it frees up.

**Checkpoints** (``out/checkpoints/<member>``, :mod:`enspipe.run.checkpoint`): every member
checkpoints at each of its epoch ends (its weights and optimizer when it trains, and its state:
epochs, images, validation losses, converged). A killed arm, started again with the same
ensemble and options, keeps every round that finished, sets aside the one that was interrupted
(``roundNN.interrupted``) and re-plans from the checkpoints: a member loses at most the epoch it
was in. A checkpoint that cannot be read stops the arm before any round, naming it.

The arm's record (``ensemble.json``, written atomically when the arm is done) holds the makespan
(from the first launch to the last exit, launches included), the launch-free makespan (the rounds'
training times, scheduled as they ran: what an in-job reallocation would approach), each round's
wall and training time, each member's start and end on its accelerators with its epoch ends and
checkpoints (the timeline), the accelerator-busy fraction, the processes' CPU-s, node CPU-s (mpstat
or psutil, per round; concurrent ``default`` rounds see each other, so there it is an upper bound
and labelled so), the energy and the time model's prediction (from the members' epoch bounds).
Emulated accelerators are labelled ``emulated``.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import resource
import subprocess
import sys
import time

from enspipe.common.atomic import write_json_atomic
from enspipe.exchange.base import allreduce_quietly
from enspipe.plan.ensemble import Ensemble, Round, arm_slots, list_schedule, model_times, plan_rounds
from enspipe.run import checkpoint
from enspipe.run.member import before_mpi, run_on
from enspipe.run.run_options import parse_run_args

RESULT = "ensemble.json"
ROUND = "round.json"  # a round's plan, written when it starts


def checkpoints(out: str) -> str:
    return os.path.join(out, "checkpoints")


def round_command(ens: Ensemble, r: Round, data: str, out: str, steps_per_epoch: int, seed: int,
                  run_args: list[str], launcher: list[str], validation: str | None = None) -> list[str]:
    """The ``enspipe run`` job of round ``r`` in the arm directory ``out`` (a fresh epoch order
    per round: ``seed`` + index)."""
    scheme = "all_shared" if r.ranks > 1 else "baseline"
    members = [ens.members[i] for i in r.members]
    if ens.trains:
        consumer = ["--consumer", "train", "--member-networks", ",".join(m.network for m in members),
                    "--lr", ",".join(str(m.lr) for m in members),
                    "--member-patience", ",".join(str(m.patience) for m in members), "--min-delta", str(ens.min_delta),
                    "--member-batch-multipliers", ",".join(str(m.batch_multiplier) for m in members),
                    *(["--validation-data", validation] if validation else [])]
    else:
        consumer = ["--consumer", "emulated", "--member-rates", ",".join(str(m.rate) for m in members),
                    "--scaling-efficiency", str(ens.efficiency)]
    return [*launcher, "-n", str(r.ranks), sys.executable, "-m", "enspipe", "run", "--data", data,
            "--out", _round_dir(out, r), "--scheme", scheme, *consumer, "--warmup", "0",
            "--steps", str(r.steps(steps_per_epoch)), "--data-parallel", ",".join(map(str, r.widths)),
            "--member-epochs", ",".join(map(str, r.epochs)), "--member-names", ",".join(m.name for m in members),
            "--checkpoint-dir", checkpoints(out), "--stop-below", str(r.stop_below), "--seed", str(seed + r.index),
            *run_args]


def _round_dir(out: str, r: Round | int) -> str:
    return os.path.join(out, f"round{r if isinstance(r, int) else r.index:02d}")


def _round_log(out: str, r: Round) -> str:
    return os.path.join(out, f"round{r.index:02d}.log")


def _finished(out: str, index: int) -> bool:
    return os.path.exists(os.path.join(_round_dir(out, index), "summary.json"))


IDENTITY = "arm.json"  # what the arm in a directory trains: its rounds and checkpoints belong to it


def identity(ens: Ensemble, arm: str, data_digest: str, batch: int, seed: int, run_args: list[str],
             validation: str | None) -> dict:
    """What makes an arm's rounds and checkpoints its own: a run with another ensemble, data,
    batch, seed or options must not resume from them."""
    return {"arm": arm, "ensemble": json.loads(json.dumps(dataclasses.asdict(ens))),  # its fields, nothing cached
            "data_digest": data_digest, "batch_size": batch, "seed": seed, "run_args": list(run_args),
            "validation": os.path.abspath(validation) if validation else None}


def claim_directory(out: str, ident: dict, fresh: bool) -> str | None:
    """Make ``out`` the arm's directory: new or empty, or holding this very arm (it resumes from its
    finished rounds and checkpoints), or with ``fresh`` emptied first whatever it held; another
    arm's (or an unknown one's) is refused: returns why."""
    import shutil

    held = os.listdir(out) if os.path.isdir(out) else []
    path = os.path.join(out, IDENTITY)
    if held and not fresh:
        try:
            with open(path) as f:
                same = json.load(f) == ident
        except (OSError, ValueError):
            same = False
        if not same:
            return (f"{out} holds another arm's rounds and checkpoints (or ones without {IDENTITY}); "
                    "resuming from them would mix two experiments")
    if held and fresh:
        for name in held:
            p = os.path.join(out, name)
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
    os.makedirs(out, exist_ok=True)
    write_json_atomic(path, ident)
    return None


def member_states(ens: Ensemble, out: str) -> dict[int, checkpoint.MemberState | None]:
    """Every member's checkpointed state (None: not trained yet); raises CheckpointError."""
    return {i: checkpoint.load(checkpoints(out), m.name, m.network) for i, m in enumerate(ens.members)}


def epochs_left(ens: Ensemble, out: str) -> dict[int, int]:
    """The epochs each unfinished member has left, from its checkpoint (converged: none)."""
    left = {}
    for i, s in member_states(ens, out).items():
        e = ens.members[i].epochs - (s.epochs if s else 0)
        if e > 0 and not (s and s.converged):
            left[i] = e
    return left


def resume_problems(ens: Ensemble, out: str) -> list[str]:
    """Why the arm in ``out`` cannot go on from its checkpoints (empty: it can, or it is new): a
    checkpoint unreadable, or missing or behind what the finished rounds say its member trained."""
    trained: dict[str, int] = {}
    for index in _round_indices(out):
        if not _finished(out, index):
            continue
        with open(os.path.join(_round_dir(out, index), "summary.json")) as f:
            ranks = json.load(f)["ranks"]
        for x in ranks:  # each member's first rank speaks for it
            if x["rank"] == min(y["rank"] for y in ranks if y["member"] == x["member"]):
                trained[x["member_name"]] = trained.get(x["member_name"], 0) + x["epochs_trained"]
    out_problems = []
    for m in ens.members:
        p = checkpoint.problem(checkpoints(out), m.name, m.network)
        if p is None:
            state = checkpoint.load(checkpoints(out), m.name, m.network)
            done = state.epochs if state else 0
            if done < trained.get(m.name, 0):
                p = (f"{os.path.join(checkpoints(out), m.name)}: the finished rounds trained {m.name} "
                     f"{trained[m.name]} epochs but its checkpoint holds {done}"
                     + (" (missing)" if state is None else "") + "; remove the arm's directory to start over")
        if p is not None:
            out_problems.append(p)
    return out_problems


def _round_indices(out: str) -> list[int]:
    return sorted(int(d[5:]) for d in os.listdir(out) if d.startswith("round") and d[5:].isdigit()) \
        if os.path.isdir(out) else []


def _set_aside_interrupted(out: str) -> list[int]:
    """Rename rounds that started but never finished (a killed arm) to ``roundNN.interrupted``;
    their members' progress is in their checkpoints. Returns their indices."""
    gone = [i for i in _round_indices(out) if not _finished(out, i)]
    for i in gone:
        for path in (_round_dir(out, i), _round_dir(out, i) + ".log"):
            if os.path.exists(path):
                os.replace(path, path.replace(f"round{i:02d}", f"round{i:02d}.interrupted")
                           if path.endswith(".log") else path + ".interrupted")
    return gone


_NOISE = ("I0000 ", "W0000 ", "WARNING: All log messages before absl")  # TensorFlow's start-up lines


def _why(log: str, lines: int = 8) -> str:
    """The last lines of a failed round's log that are not TensorFlow's start-up chatter, indented
    under the failure (empty when the log is unreadable or says nothing)."""
    try:
        with open(log, errors="replace") as f:
            said = [ln.rstrip() for ln in f if ln.strip() and not ln.startswith(_NOISE)]
    except OSError:
        return ""
    return "".join("\n  " + ln for ln in said[-lines:])


def run_arm(ens: Ensemble, arm: str, data: str, out: str, batch: int, num_images: int, seed: int = 0,
            run_args: list[str] | None = None, launcher: list[str] | None = None, validation: str | None = None,
            say=print) -> dict:
    """Run ``arm``'s rounds (see the module) and write ``out/ensemble.json``; returns the record.
    Raises RuntimeError naming the round and its log when a round fails."""
    run_args, launcher = run_args or [], launcher or [os.path.join(os.path.dirname(sys.executable), "mpiexec")]
    steps_per_epoch = num_images // batch
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, RESULT)):
        os.remove(os.path.join(out, RESULT))  # a rerun's record appears only when it is complete
    interrupted = _set_aside_interrupted(out)
    resumed = _round_indices(out)  # finished before this start
    done = [_read_round(ens, out, i) for i in resumed]
    slots = arm_slots(ens, arm)
    running: list[tuple[Round, subprocess.Popen, float, object]] = []
    times: dict[int, tuple[float, float]] = {}
    pending = plan_rounds(ens, arm, num_images, epochs_left(ens, out), _next_index(out), _last_round(ens, out))
    t0 = time.time()
    while pending or running:
        while pending and len(running) < slots:
            r = pending.pop(0)
            os.makedirs(_round_dir(out, r), exist_ok=True)
            write_json_atomic(os.path.join(_round_dir(out, r), ROUND), r.as_dict(ens))
            log = open(_round_log(out, r), "w")
            cmd = round_command(ens, r, data, out, steps_per_epoch, seed, run_args, launcher, validation)
            say(f"{arm} round {r.index}: {', '.join(ens.members[i].name for i in r.members)} on "
                f"{'+'.join(map(str, r.widths))} accelerators, at most {'/'.join(map(str, r.epochs))} epochs")
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
                path = _round_log(out, r)
                raise RuntimeError(f"{arm} round {r.index} failed (exit {proc.returncode}); see {path}{_why(path)}")
            times[r.index] = (started - t0, time.time() - t0)
            done.append(r)
            if slots == 1:  # re-plan from the checkpoints: early stopping may have finished members
                pending = plan_rounds(ens, arm, num_images, epochs_left(ens, out), r.index + 1, r)
    return _finish(ens, arm, out, sorted(done, key=lambda r: r.index), times, resumed, interrupted, t0, num_images,
                   in_job=False)


def _finish(ens: Ensemble, arm: str, out: str, done: list[Round], times: dict, resumed: list[int],
            interrupted: list[int], t0: float, num_images: int, in_job: bool) -> dict:
    left = epochs_left(ens, out)
    if left:
        raise RuntimeError(f"{arm}: every round finished but members still have epochs left: "
                           f"{ {ens.members[i].name: e for i, e in left.items()} }")
    record = _record(ens, arm, done, out, times, resumed, interrupted, t0, time.time() - t0, num_images)
    record["in_job"] = in_job
    record["launches"] = 1 if in_job else len(times)
    write_json_atomic(os.path.join(out, RESULT), record)
    return record


# -- in one job: every round a communicator of the job's ranks (--in-job) ----------------------------
WALL = "wall.json"  # a round's start and end (Unix s), written by its first rank


def run_arm_in_job(ens: Ensemble, arm: str, out: str, num_images: int, job: list[str],
                   launcher: list[str] | None = None, say=print) -> dict:
    """Run ``arm`` as ONE MPI job of G ranks (``job``: the command each rank runs, see
    :func:`job_rank`) and write ``out/ensemble.json``: the rounds are communicators split from the
    job's ranks, so a round costs no process, TensorFlow or MPI start, only its pipeline's and
    models' set-up (FLEET's runtime reallocates inside its job the same way)."""
    launcher = launcher or [os.path.join(os.path.dirname(sys.executable), "mpiexec")]
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, RESULT)):
        os.remove(os.path.join(out, RESULT))
    interrupted = _set_aside_interrupted(out)
    resumed = _round_indices(out)
    t0 = time.time()
    say(f"{arm}: one job of {ens.accelerators} ranks; rounds are split from it -> {out}/job.log")
    with open(os.path.join(out, "job.log"), "w") as log:
        rc = subprocess.run([*launcher, "-n", str(ens.accelerators), *job], stdout=log, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        path = os.path.join(out, "job.log")
        raise RuntimeError(f"{arm}: the arm's job failed (exit {rc}); see {path}{_why(path)}")
    done = [_read_round(ens, out, i) for i in _round_indices(out)]
    times = {}
    for r in done:
        path = os.path.join(_round_dir(out, r), WALL)
        if r.index not in resumed and os.path.exists(path):
            with open(path) as f:
                w = json.load(f)
            times[r.index] = (w["start"] - t0, w["end"] - t0)
    record = _finish(ens, arm, out, done, times, resumed, interrupted, t0, num_images, in_job=True)
    with open(os.path.join(out, JOB_END)) as f:  # the job's exit after its last round (MPI, TensorFlow)
        record["job_exit_seconds"] = time.time() - json.load(f)["t"]
    write_json_atomic(os.path.join(out, RESULT), record)
    return record


def job_rank(ens: Ensemble, arm: str, data: str, out: str, batch: int, num_images: int, seed: int = 0,
             run_args: list[str] | None = None, validation: str | None = None) -> int:
    """One rank of an in-job arm (:func:`run_arm_in_job`). ``fleet`` and ``homogeneous``: rank 0
    plans each round from the checkpoints and the job's first ``ranks`` ranks run it on a
    communicator of their own while the others wait (quietly); ``default``: every rank takes the
    next member's round as it frees up (claimed by creating its directory), alone on its own
    communicator. Returns the exit status; a failed round aborts the job."""
    before_mpi()
    from mpi4py import MPI

    world, run_args = MPI.COMM_WORLD, run_args or []
    rank, spe = world.Get_rank(), num_images // batch

    def run_round(r: Round, comm) -> int:
        cmd = round_command(ens, r, data, out, spe, seed, run_args, [], validation)
        cfg = parse_run_args(cmd[cmd.index("run") + 1:])
        start = time.time()
        rc = run_on(cfg, comm)
        end = time.time()
        gc.collect()  # the round's pipeline, model and graphs, held in cycles: freed now, not at the job's exit
        if comm.Get_rank() == 0:
            write_json_atomic(os.path.join(_round_dir(out, r), WALL), {
                "start": start, "end": end, "rc": rc, "collect_seconds": time.time() - end,
                "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        return rc

    try:
        first = world.bcast(_next_index(out) if rank == 0 else None, root=0)
        rc = _job_rounds(ens, arm, out, num_images, first, run_round, world)
    except BaseException:  # noqa: BLE001 - outside a round (its own failures abort it): the arm's plan
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)  # the others wait in a collective for this rank: end the job, never hang
    if rank == 0:  # the rounds are done: what follows until the driver sees the job exit is its teardown
        write_json_atomic(os.path.join(out, JOB_END), {"t": time.time(), "rc": rc})
    return rc


JOB_END = "job-end.json"


def _job_rounds(ens: Ensemble, arm: str, out: str, num_images: int, first: int, run_round, world) -> int:
    from mpi4py import MPI

    rank = world.Get_rank()
    if arm_slots(ens, arm) > 1:
        rounds = plan_rounds(ens, arm, num_images, epochs_left(ens, out), first)  # every rank: the same plan
        _quiet(world, 0)  # read by all before any round writes a checkpoint
        rc = 0
        for r in rounds:
            if rc == 0 and _claim(out, r):
                write_json_atomic(os.path.join(_round_dir(out, r), ROUND), r.as_dict(ens))
                self_comm = MPI.COMM_SELF.Dup()
                rc = run_round(r, self_comm)
                self_comm.Free()
        return _quiet(world, rc)
    index, last = first, _last_round(ens, out) if rank == 0 else None  # rank 0 plans, before any round starts
    while True:
        r = None
        if rank == 0:
            plan = plan_rounds(ens, arm, num_images, epochs_left(ens, out), index, last)
            r = plan[0] if plan else None
            if r is not None:
                os.makedirs(_round_dir(out, r), exist_ok=True)
                write_json_atomic(os.path.join(_round_dir(out, r), ROUND), r.as_dict(ens))
        r = world.bcast(r, root=0)
        if r is None:
            return 0
        sub = world.Split(0 if rank < r.ranks else MPI.UNDEFINED, rank)
        rc = 0
        if sub != MPI.COMM_NULL:
            rc = run_round(r, sub)
            sub.Free()
        if _quiet(world, rc):
            return 1
        index, last = r.index + 1, r


def _quiet(comm, rc: int) -> int:
    """The largest ``rc`` over ``comm``'s ranks, waited for without spinning (idle ranks sleep)."""
    from mpi4py import MPI

    return allreduce_quietly(comm, rc, MPI.MAX)


def _claim(out: str, r: Round) -> bool:
    """Whether this rank took round ``r`` (its directory created here first: atomic)."""
    try:
        os.mkdir(_round_dir(out, r))
        return True
    except FileExistsError:
        return False


def _next_index(out: str) -> int:
    """The index after every round started in ``out``, finished or set aside."""
    names = os.listdir(out) if os.path.isdir(out) else []
    used = [int(d[5:].split(".")[0]) for d in names if d.startswith("round") and d[5:].split(".")[0].isdigit()]
    return max(used, default=-1) + 1


def _last_round(ens: Ensemble, out: str) -> Round | None:
    """The last round that finished (a resumed arm's flotilla goes on from it), or None."""
    done = _round_indices(out)
    return _read_round(ens, out, done[-1]) if done else None


def _read_round(ens: Ensemble, out: str, index: int) -> Round:
    with open(os.path.join(_round_dir(out, index), ROUND)) as f:
        return Round.from_dict(json.load(f), ens)


def _member_events(rdir: str, rank: int) -> tuple[float | None, float | None, list[dict]]:
    """Wall times of a rank's first and last training (not idle) step, and its epoch ends."""
    first = last = None
    epochs = []
    with open(os.path.join(rdir, f"events.rank{rank:04d}.jsonl")) as f:
        for e in map(json.loads, f):
            if e["event"] == "step" and not e.get("idle"):
                t = e["t"]
                first = t - e.get("wait_s", 0.0) - e.get("compute_s", 0.0) if first is None else first
                last = t
            elif e["event"] == "member_epoch":
                epochs.append(e)
    return first, last, epochs


def _record(ens: Ensemble, arm: str, rounds: list[Round], out: str, times: dict, resumed: list[int],
            interrupted: list[int], t0: float, makespan: float, num_images: int) -> dict:
    rows, timeline = [], []
    busy = cpu = node_cpu = energy = 0.0
    for r in rounds:
        rdir = _round_dir(out, r)
        with open(os.path.join(rdir, "summary.json")) as f:
            s = json.load(f)
        ranks = s["ranks"]
        first_rank = {m: min(x["rank"] for x in ranks if x["member"] == k) for k, m in enumerate(r.members)}
        for k, m in enumerate(r.members):
            start, end, epochs = _member_events(rdir, first_rank[m])
            mine = [x for x in ranks if x["member"] == k]
            timeline.append({"round": r.index, "member": ens.members[m].name, "accelerators": r.placement.get(m),
                             "width": r.widths[k], "epochs_planned": r.epochs[k],
                             "epochs": mine[0]["epochs_trained"],
                             "start": None if start is None else start - t0,  # s since the arm began
                             "end": None if end is None else end - t0,
                             "checkpoints": [{"t": e["t"] - t0, "epochs": e["epochs"], "val_loss": e["val_loss"],
                                              "converged": e["converged"]} for e in epochs],
                             "converged": bool(epochs and epochs[-1]["converged"]),
                             "trained_images": mine[0]["trained_images"],
                             "busy_seconds": sum(x["accelerator_busy_seconds"] for x in mine)})
        busy += sum(x["accelerator_busy_seconds"] for x in ranks)
        cpu += s["cpu_seconds_total"]
        node_cpu += s.get("node_cpu_seconds_total") or 0.0
        energy += s.get("energy_joules") or 0.0
        rows.append({**r.as_dict(ens), "ranks": r.ranks, "wall": times.get(r.index),
                     "train_seconds": s["measured_window"]["seconds"],
                     "stopped_early": any(x["stopped_early"] for x in ranks),
                     "resumed": r.index in resumed, "node_cpu_seconds": s.get("node_cpu_seconds_total"),
                     "cpu_seconds": s["cpu_seconds_total"], "energy_joules": s.get("energy_joules"),
                     "energy_source": s.get("energy_source")})
    concurrent = arm == "default" and ens.accelerators > 1
    whole = not resumed and not interrupted
    states = member_states(ens, out)
    model = model_times(ens, arm, plan_rounds(ens, arm, num_images), num_images)
    return {
        "arm": arm, "emulated": not ens.trains, "accelerators": ens.accelerators,
        "members": [m.__dict__ for m in ens.members],
        "member_states": {ens.members[i].name: s.as_dict() if s else None for i, s in states.items()},
        "num_images": num_images, "efficiency": ens.efficiency, "replan_below": ens.replan_below,
        "tolerance": ens.tolerance, "resumed_rounds": resumed, "interrupted_rounds": interrupted,
        "makespan_seconds": makespan if whole else None,
        # without the rounds' start-up (a job per round, or in one job --in-job its set-up and report):
        # the rounds' training times one after another, or (default) list-scheduled on G as they ran
        "launch_free_makespan_seconds": list_schedule([x["train_seconds"] for x in rows], arm_slots(ens, arm)),
        "predicted_makespan_seconds": model.makespan,
        "predicted_wait_per_accelerator_seconds": model.wait_per_accelerator,
        "predicted_run_lengths_seconds": list(model.run_lengths),
        "predicted_note": "the time model on the members' epoch bounds (early stopping can only end sooner)"
        + ("; the training rates are the spec's profiles, not emulated" if ens.trains else ""),
        "accelerator_busy_fraction": busy / (ens.accelerators * makespan) if makespan > 0 and whole else None,
        "accelerator_busy_seconds": busy, "cpu_seconds": cpu,
        "node_cpu_seconds": node_cpu, "node_cpu_note": "summed over concurrent rounds that each saw the whole "
        "node: an upper bound" if concurrent else "summed over rounds, one after another",
        "energy_joules": energy, "energy_note": "per round, summed (each round's source: see rounds)",
        "rounds": rows, "timeline": timeline,
    }
