"""Planning and heterogeneous ensembles: ``plan`` (the schemes and P ranked by the cost model),
``ensemble`` (one arm's rounds, FLEET's) and ``summarize`` (a finished workflow run's findings).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from enspipe.commands.base import Command, Fail, say as _say
from enspipe.commands.cells import cell_config
from enspipe.plan.errors import ConfigError
from enspipe.plan.options import network_name, positive_int


def _plan_args(p: argparse.ArgumentParser) -> None:
    from enspipe.run.concerns import WIRE_DTYPES
    from enspipe.plan.options import numbers

    p.add_argument("--n", type=positive_int, default=None, help="ensemble members (required unless --config)")
    p.add_argument("--config", default=None,
                   help="predict every peak cell of this config's grid from its model section instead "
                        "(e.g. config/paper.yaml: the paper's Fig. 10, and the n at which each pipeline falls "
                        "below rc)")
    p.add_argument("--network", type=network_name, default=None,
                   help="read its rp (and rc) from --rates; its batch size is the default")
    p.add_argument("--rates", default=None, help="the calibration's rates.json (rp per core count, rc)")
    p.add_argument("--rp", default=None, metavar="CORES:RATE[,...]",
                   help="one member's preprocessing images/s by cores instead of --rates, e.g. 1:90,2:170")
    p.add_argument("--rc", type=float, default=None,
                   help="the accelerator's images/s per member (default: the network's in --rates; none: peak)")
    p.add_argument("--peak", action="store_true", help="no accelerator: predict peak throughput")
    p.add_argument("--comm", default=None, help="calibrate-comm's comm.json (default: assumed costs, labelled)")
    p.add_argument("--nodes", type=positive_int, default=1)
    p.add_argument("--cores-per-node", type=positive_int, default=None, help="default: this machine's")
    p.add_argument("--accelerators-per-node", type=positive_int, default=None,
                   help="members beyond these on a node share an accelerator (default: one each)")
    p.add_argument("--core-limit", type=float, default=None, help="cores per member (default: the node's, shared)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: the network's")
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--wire-dtype", choices=list(WIRE_DTYPES), default="float32")
    p.add_argument("--schemes", default=None, help="comma list (default: every modelled scheme)")
    p.add_argument("--p", type=numbers, default=None, metavar="P[,P...]",
                   help="the P values to consider (default: every valid one)")
    p.add_argument("--top", type=positive_int, default=10, help="rows to print")
    p.add_argument("--json", action="store_true", help="print the ranked predictions as JSON")


def _plan(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.plan.planner import PlanRequest, run_grid_plan, run_plan

    try:
        if a.config:
            return run_grid_plan(a.config, a.network, as_json=a.json)
        request = PlanRequest.from_args(a)
    except ConfigError as e:
        fail(str(e))
    return run_plan(request, as_json=a.json, top=a.top)


# -- ensemble: a heterogeneous ensemble in one arm's rounds (FLEET) -------------------------------
def _ensemble_args(p: argparse.ArgumentParser) -> None:
    from enspipe.plan.ensemble import ARMS

    p.add_argument("--spec", required=True, help="the ensemble, YAML or JSON: members (name, rate, epochs, and to "
                   "train them for real network, lr, patience), accelerators and optionally per_node, efficiency, "
                   "replan_below, tolerance, seed, min_delta")
    p.add_argument("--arm", required=True, choices=ARMS, help="default: a pipeline per member; homogeneous: "
                   "SC'18 sharing, G at a time; fleet: FLEET-G's flotillas, re-planned when too few accelerators "
                   "stay busy; fleet_local: FLEET-L, a finished member's accelerators to its flotilla's slowest")
    p.add_argument("--data", required=True, help="the dataset (its images must be a whole number of batches)")
    p.add_argument("--out", required=True, help="the arm's directory: a run per round, ensemble.json last")
    p.add_argument("--batch-size", type=positive_int, required=True, help="the shared global batch")
    p.add_argument("--seed", type=int, default=0, help="round k draws its epoch order from seed + k")
    p.add_argument("--validation", default=None, help="a dataset (enspipe make-dataset, another seed) the "
                   "members' early stopping judges them on (needed when a member has patience)")
    p.add_argument("--launcher", default=None, help="how a round's ranks start, e.g. 'srun' inside a Slurm "
                   "allocation (default: the mpiexec beside this Python)")
    p.add_argument("--in-job", action="store_true", help="run the whole arm as one MPI job of G ranks, each round "
                   "a communicator split from it (no process, TensorFlow or MPI start per round; FLEET's "
                   "runtime); default: a job (or srun step) per round")
    p.add_argument("--fresh", action="store_true", help="empty --out first and train from scratch; without it "
                   "the same arm (ensemble, data, batch, seed, options) resumes from its finished rounds and "
                   "checkpoints, and another arm's directory is refused")
    p.add_argument("--as-job", action="store_true", help=argparse.SUPPRESS)  # one rank of --in-job's job
    p.add_argument("run_args", nargs=argparse.REMAINDER,
                   help="after --: more `enspipe run` options for every round (e.g. --network tiny --image-size 64)")


def _checked_arm(a: argparse.Namespace, run_args: list[str]):
    """The ensemble and its dataset's image count, once the spec, the data, every round's run
    options, the output folder and the members' checkpoints were checked (raises ConfigError)."""
    import yaml

    from enspipe.data.manifest import read_manifest
    from enspipe.plan.ensemble import Ensemble, plan_rounds
    from enspipe.run.ensemble import claim_directory, identity, resume_problems, round_command

    with open(a.spec) as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, dict):
        raise ConfigError("spec", f"{a.spec} holds no mapping", "write members: [...] and accelerators: G")
    ens = Ensemble.from_dict(_with_profiles(spec, a.spec))
    images = read_manifest(a.data).num_images
    if images % a.batch_size:
        raise ConfigError("batch_size", f"the dataset's {images} images are not a whole number of batches of "
                          f"{a.batch_size} (members leave at an epoch's end)", "pick a batch size that divides it")
    if any(m.patience for m in ens.members) and not a.validation:
        raise ConfigError("validation", "a member stops early on its validation loss, and no validation set "
                          "is given", "pass --validation DIR (enspipe make-dataset --seed S with another seed)")
    rounds = plan_rounds(ens, a.arm, images)
    for r in rounds:  # the rounds' run options checked before anything is touched
        cmd = round_command(ens, r, a.data, a.out, images // a.batch_size, a.seed,
                            ["--batch-size", str(a.batch_size), *run_args], [], a.validation)
        cell_config(cmd[cmd.index("run") + 1:])
    problem = claim_directory(a.out, identity(ens, a.arm, read_manifest(a.data).digest, a.batch_size, a.seed,
                                              run_args, a.validation), a.fresh)
    if problem:
        raise ConfigError("out", problem, "pass --fresh to start over there, or another --out")
    problems = resume_problems(ens, a.out)
    if problems:  # never silently restart a member from scratch
        raise ConfigError("checkpoint", "; ".join(problems), "restore the files, or start the arm over")
    return ens, images


def _ensemble(a: argparse.Namespace, fail: Fail) -> int:
    import shlex

    import yaml

    from enspipe.data.manifest import DataError, read_manifest
    from enspipe.plan.ensemble import Ensemble
    from enspipe.run.ensemble import run_arm, run_arm_in_job

    run_args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    if a.as_job:  # a rank of the arm's one job: the driver checked everything before launching it
        from enspipe.run.ensemble import job_rank

        with open(a.spec) as f:
            ens = Ensemble.from_dict(_with_profiles(yaml.safe_load(f), a.spec))
        return job_rank(ens, a.arm, a.data, a.out, a.batch_size, read_manifest(a.data).num_images, a.seed,
                        ["--batch-size", str(a.batch_size), *run_args], a.validation)
    try:
        ens, images = _checked_arm(a, run_args)
    except (OSError, yaml.YAMLError, DataError) as e:
        fail(f"--spec/--data: {e}")
    except ConfigError as e:
        fail(str(e))
    launcher = shlex.split(a.launcher) if a.launcher else None
    try:
        if a.in_job:
            job = [sys.executable, "-m", "enspipe", "ensemble", "--spec", a.spec, "--arm", a.arm, "--data", a.data,
                   "--out", a.out, "--batch-size", str(a.batch_size), "--seed", str(a.seed),
                   *(["--validation", a.validation] if a.validation else []), "--as-job", "--", *run_args]
            record = run_arm_in_job(ens, a.arm, a.out, images, job, launcher, say=_say)
        else:
            record = run_arm(ens, a.arm, a.data, a.out, a.batch_size, images, a.seed,
                             ["--batch-size", str(a.batch_size), *run_args], launcher, a.validation, say=_say)
    except RuntimeError as e:
        print(f"enspipe ensemble: {e}", file=sys.stderr)
        return 1
    _say(f"{a.arm}: makespan {record['makespan_seconds'] or float('nan'):.1f} s (model "
         f"{record['predicted_makespan_seconds']:.1f} s), accelerators busy "
         f"{(record['accelerator_busy_fraction'] or 0):.0%}{' (emulated)' if record['emulated'] else ''} -> {a.out}")
    return 0


def _with_profiles(spec: dict, spec_path: str) -> dict:
    """The spec with each member's ``profile: FILE`` (enspipe profile's JSON, relative to the spec)
    read into its measured ``rates`` (and ``rate``, the one-accelerator rate, when not given)."""
    from enspipe.run.profile import rates_by_count

    members = []
    for m in spec.get("members") or []:
        if isinstance(m, dict) and "profile" in m:
            path = os.path.join(os.path.dirname(os.path.abspath(spec_path)), str(m["profile"]))
            try:
                with open(path) as f:
                    record = json.load(f)
                rates = rates_by_count(record)
            except (OSError, ValueError, KeyError) as e:
                raise ConfigError("spec", f"member {m.get('name')!r}: profile {path} is unreadable ({e})",
                                  "measure it with enspipe profile") from None
            if record["network"] != m.get("network"):
                raise ConfigError("spec", f"member {m.get('name')!r} trains {m.get('network')!r} but its profile "
                                  f"{path} is {record['network']!r}'s", "point it at its network's profile")
            m = {k: v for k, v in m.items() if k != "profile"} | {"rates": list(rates)}
            m.setdefault("rate", rates[0])
        members.append(m)
    return {**spec, "members": members} if "members" in spec else spec



# -- summarize: a finished workflow run, on the terminal ------------------------------------------
def _summarize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", help="the workflow's results directory")


def _summarize(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.report.terminal import summary_lines

    if not os.path.isdir(a.results):
        fail(f"--results: {a.results!r} is not a directory; run the workflow first (make run)")
    print("\n".join(summary_lines(a.results)))
    return 0


PLAN_COMMANDS: dict[str, Command] = {
    "summarize": Command("print a finished workflow run's findings and headline ratios", _summarize_args,
                         _summarize),
    "plan": Command("rank the schemes and P for an ensemble from measured costs (the cost model)", _plan_args,
                    _plan, show_defaults=True),
    "ensemble": Command("train a heterogeneous ensemble (trained for real, or emulated accelerators) in one arm's "
                        "rounds: default, homogeneous or fleet", _ensemble_args, _ensemble, show_defaults=True),
}
