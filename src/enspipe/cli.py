"""enspipe: train DNN ensembles that share one preprocessed input stream; a subcommand per step.

Each subcommand is one entry of :data:`COMMANDS`: its help, the function that declares its
arguments and the function that runs it. Arguments are validated before any MPI or TensorFlow
work: a bad one exits 2 with a message that names the option and the fix.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from enspipe.commands.base import Command, Fail, say as _say
from enspipe.commands.cells import CELL_COMMANDS, config_from_args
from enspipe.commands.data import DATA_COMMANDS
from enspipe.commands.serve import SERVE_COMMANDS
from enspipe.common.tfimport import import_tensorflow
from enspipe.run.run_options import add_options
from enspipe.plan.options import counts, network_name, positive_int
from enspipe.plan.errors import ConfigError


# -- calibrate-rc, idle-power: measurements the workflow makes once ---------------------------------
def _calibrate_rc_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--network", required=True, type=network_name,
                   help="a registered network, or your factory as package.module:function")
    p.add_argument("--batch-size", type=positive_int, default=None, help="default: the network's")
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--steps", type=positive_int, default=50)
    p.add_argument("--warmup", type=positive_int, default=5)
    p.add_argument("--num-classes", type=positive_int, default=1000)
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--trainer", choices=("auto", "keras", "torch"), default="auto",
                   help="the framework that trains: keras (TensorFlow) or torch; auto: keras where TensorFlow is "
                        "installed, else torch")


def _calibrate_rc(a: argparse.Namespace, fail: Fail) -> int:
    if a.steps < 1 or a.batch_size == 0 or not 32 <= a.image_size <= 1024:
        fail("--steps, --batch-size and --image-size: need steps >= 1, a batch >= 1, 32 <= size <= 1024")
    import importlib.util

    from enspipe.common.atomic import write_json_atomic
    from enspipe.engine.config import tensorflow_installed

    trainer = a.trainer if a.trainer != "auto" else ("keras" if tensorflow_installed() else "torch")
    if not (tensorflow_installed() if trainer == "keras" else importlib.util.find_spec("torch") is not None):
        fail(f"--trainer {trainer}: {'TensorFlow' if trainer == 'keras' else 'PyTorch'} is not installed here; "
             f"pip install 'enspipe[{'tf' if trainer == 'keras' else 'torch'}]'")
    if trainer == "keras":
        import_tensorflow(trains=True)
    from enspipe.models.networks import network_spec
    from enspipe.run.calibration import measure_accelerator_rate

    r = measure_accelerator_rate(a.network, a.batch_size or network_spec(a.network).batch_size, a.image_size,
                                 a.steps, a.warmup, max(2, a.num_classes), trainer=trainer)
    write_json_atomic(a.out, r)
    _say(f"rc = {r['rc']:.1f} images/s for {a.network} ({trainer}) on {r['device']} -> {a.out}")
    return 0


def _calibrate_comm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the JSON file to write (comm.json, beside rates.json)")
    p.add_argument("--max-mb", type=positive_int, default=32, help="the largest payload timed, MiB")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs per payload (the median counts)")
    p.add_argument("--inter-node-gbps", type=float, default=None,
                   help="the inter-node bandwidth in Gb/s for multi-node predictions where the ranks are on one "
                        "node (default: 100, InfiniBand EDR); on several nodes (2+ ranks each) it is measured")


def _calibrate_comm(a: argparse.Namespace, fail: Fail) -> int:
    if a.max_mb < 1 or a.repeats < 1:
        fail("--max-mb and --repeats: need at least 1 MiB and 1 repeat")
    if a.inter_node_gbps is not None and not a.inter_node_gbps > 0:
        fail(f"--inter-node-gbps: must be > 0, got {a.inter_node_gbps}; pass e.g. 100")
    from mpi4py import MPI

    from enspipe.common.atomic import write_json_atomic
    from enspipe.exchange.calibrate import measure_collectives
    from enspipe.plan.model import fit_comm

    comm = MPI.COMM_WORLD
    if comm.Get_size() < 2:
        fail("needs at least 2 ranks: run it under mpiexec -n 2 (or more)")
    try:
        measured = measure_collectives(comm, a.max_mb << 20, a.repeats)
    except ValueError as e:
        fail(str(e))
    if comm.Get_rank() == 0:
        costs = fit_comm(measured, a.inter_node_gbps * 1e9 / 8 if a.inter_node_gbps else None)
        write_json_atomic(a.out, costs.as_dict() | {"measured": measured})
        inter = "measured" if "inter_node" in measured else "assumed"
        _say(f"alpha {costs.alpha * 1e6:.1f} us, MPI {costs.bandwidth / 1e9:.2f} GB/s, copy "
             f"{costs.copy_bandwidth / 1e9:.2f} GB/s, node sync {costs.alpha_node * 1e6:.1f} us, inter-node "
             f"{costs.inter_node_bandwidth / 1e9:.2f} GB/s ({inter}) -> {a.out}")
    return 0


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
        config_from_args(build_parser().parse_args(cmd[cmd.index("run"):]))
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


def _user_cache(name: str) -> str:
    """``$XDG_CACHE_HOME/enspipe/<name>`` (``~/.cache`` without it): where measurements kept across runs live."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "enspipe", name)


# -- summarize: a finished workflow run, on the terminal ------------------------------------------
def _summarize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", default="results", help="the workflow's results directory")


def _summarize(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.report.terminal import summary_lines

    if not os.path.isdir(a.results):
        fail(f"--results: {a.results!r} is not a directory; run the workflow first (make run)")
    print("\n".join(summary_lines(a.results)))
    return 0


# -- profile: a network's measured training rates on 1, 2, ... accelerators -------------------------
def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--network", required=True, type=network_name,
                   help="the network to profile: a registered one, or your factory as package.module:function")
    p.add_argument("--data", required=True, help="a dataset (enspipe make-dataset) to train on")
    p.add_argument("--cache", default=_user_cache("profiles"), help="where profiles are kept, one per network, "
                   "image size, batch and machine (default: the user's cache, $XDG_CACHE_HOME or ~/.cache)")
    p.add_argument("--accelerators", type=counts, default=(1, 2), help="the accelerator counts g to measure "
                   "(a job of g ranks each; beyond the largest the allocator extrapolates)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="the global batch")
    p.add_argument("--steps", type=positive_int, default=20, help="measured training steps per count")
    p.add_argument("--image-size", type=positive_int, default=224, help="preprocessed image side (px)")
    p.add_argument("--lr", type=float, default=0.01, help="the learning rate of the profiling steps")
    p.add_argument("--force", action="store_true", help="measure again even if a cached profile exists")
    p.add_argument("--launcher", default=None, help="how a job's ranks start (default: the mpiexec beside this Python)")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="after --: more `enspipe run` options")


def _profile(a: argparse.Namespace, fail: Fail) -> int:
    import shlex

    from enspipe.engine.config import tensorflow_installed
    from enspipe.run.profile import measure

    if not tensorflow_installed():
        fail("profile: it measures a Keras model's layers, and TensorFlow is not installed here; "
             "pip install 'enspipe[tf]'")

    run_args = a.run_args[1:] if a.run_args[:1] == ["--"] else a.run_args
    if not a.accelerators or min(a.accelerators) < 1 or len(set(a.accelerators)) != len(a.accelerators):
        fail(f"--accelerators: distinct counts >= 1, got {list(a.accelerators)}; pass e.g. 1,2,4")
    if min(a.batch_size, a.steps) < 1 or a.batch_size < max(a.accelerators):
        fail(f"--batch-size/--steps: a batch of at least one image per accelerator and >= 1 step, got batch "
             f"{a.batch_size}, steps {a.steps}")
    try:  # every job's options checked before the first starts
        for g in a.accelerators:
            config_from_args(build_parser().parse_args(
                ["run", "--data", a.data, "--out", os.path.join(a.cache, "check"), "--consumer", "train",
                 "--network", a.network, "--data-parallel", str(g), "--batch-size", str(a.batch_size),
                 "--steps", str(a.steps), "--image-size", str(a.image_size), "--lr", str(a.lr), *run_args]))
    except ConfigError as e:
        fail(str(e))
    launcher = shlex.split(a.launcher) if a.launcher else [os.path.join(os.path.dirname(sys.executable), "mpiexec")]
    try:
        record = measure(a.network, a.data, a.cache, tuple(a.accelerators), a.batch_size, a.steps, a.image_size,
                         a.lr, run_args, launcher, a.force, say=_say)
    except RuntimeError as e:
        print(f"enspipe profile: {e}", file=sys.stderr)
        return 1
    _say(f"{a.network}: " + ", ".join(f"{g}: {r:.1f}" for g, r in zip(record["accelerators"], record["rates"]))
         + f" images/s ({record['source']}, {record['device']})")
    return 0


def _idle_power_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the idle-power JSON file to write")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to sample (keep the node idle)")
    add_options(p, only=("energy",))


def _idle_power(a: argparse.Namespace, fail: Fail) -> int:
    if a.seconds <= 0:
        fail("--seconds: must be > 0; pass how long to sample, e.g. 30")
    from enspipe.measure.node import measure_idle_power
    from enspipe.run.concerns import PowerOptions

    try:
        PowerOptions(power=a.power, power_csv=a.power_csv, idle_watts=a.idle_watts, watts_per_core=a.watts_per_core)
        idle = measure_idle_power(a.out, a.seconds, a.power, a.power_csv, a.idle_watts)
    except ValueError as e:
        fail(str(e))
    _say(f"idle power {idle['watts']:.1f} W ({idle['source']}) on {idle['host']} -> {a.out}")
    return 0


COMMANDS: dict[str, Command] = {
    **DATA_COMMANDS,
    **SERVE_COMMANDS,
    **CELL_COMMANDS,
    "calibrate-rc": Command("measure the accelerator's training rate rc on a fixed batch", _calibrate_rc_args,
                            _calibrate_rc, show_defaults=True),
    "calibrate-comm": Command("time this machine's collectives and fit the cost model's latency and bandwidth "
                              "(use mpiexec -n N, N >= 2)", _calibrate_comm_args, _calibrate_comm, show_defaults=True),
    "idle-power": Command("measure this node's idle power and store it for energy above idle", _idle_power_args,
                          _idle_power, show_defaults=True),
    "summarize": Command("print a finished workflow run's findings and headline ratios", _summarize_args,
                         _summarize),
    "plan": Command("rank the schemes and P for an ensemble from measured costs (the cost model)", _plan_args,
                    _plan, show_defaults=True),
    "ensemble": Command("train a heterogeneous ensemble (trained for real, or emulated accelerators) in one arm's "
                        "rounds: default, homogeneous or fleet", _ensemble_args, _ensemble, show_defaults=True),
    "profile": Command("measure a network's training rate on 1, 2, ... accelerators for FLEET's allocation "
                       "(cached per machine)", _profile_args, _profile, show_defaults=True),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="enspipe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, c in COMMANDS.items():
        c.declare(sub.add_parser(name, help=c.help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
                                 if c.show_defaults else argparse.HelpFormatter))
    return p


def main(argv: list[str] | None = None) -> int:
    from enspipe.common import spelling

    spelling.command_line()  # this process's messages name flags, not keywords
    parser = build_parser()
    a = parser.parse_args(argv)
    return COMMANDS[a.command].run(a, parser.error)


if __name__ == "__main__":
    sys.exit(main())
