"""The measurements the workflow makes once and keeps: ``calibrate-rc`` (the accelerator's training
rate), ``calibrate-comm`` (the collectives' costs), ``idle-power`` (the node's idle watts) and
``profile`` (a network's training rates on 1, 2, ... accelerators, for FLEET).
"""
from __future__ import annotations

import argparse
import os
import sys

from enspipe.commands.base import Command, Fail, say as _say
from enspipe.commands.cells import cell_config
from enspipe.common.tfimport import import_tensorflow
from enspipe.plan.errors import ConfigError
from enspipe.plan.options import counts, network_name, positive_int
from enspipe.run.run_options import add_options


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



def _user_cache(name: str) -> str:
    """``$XDG_CACHE_HOME/enspipe/<name>`` (``~/.cache`` without it): where measurements kept across runs live."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "enspipe", name)



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
            cell_config(
                ["--data", a.data, "--out", os.path.join(a.cache, "check"), "--consumer", "train",
                 "--network", a.network, "--data-parallel", str(g), "--batch-size", str(a.batch_size),
                 "--steps", str(a.steps), "--image-size", str(a.image_size), "--lr", str(a.lr), *run_args])
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


MEASURE_COMMANDS: dict[str, Command] = {
    "calibrate-rc": Command("measure the accelerator's training rate rc on a fixed batch", _calibrate_rc_args,
                            _calibrate_rc, show_defaults=True),
    "calibrate-comm": Command("time this machine's collectives and fit the cost model's latency and bandwidth "
                              "(use mpiexec -n N, N >= 2)", _calibrate_comm_args, _calibrate_comm, show_defaults=True),
    "idle-power": Command("measure this node's idle power and store it for energy above idle", _idle_power_args,
                          _idle_power, show_defaults=True),
    "profile": Command("measure a network's training rate on 1, 2, ... accelerators for FLEET's allocation "
                       "(cached per machine)", _profile_args, _profile, show_defaults=True),
}
