"""The cell commands: ``run`` (one cell, one member per MPI rank), ``run-cells`` (several cells one
after another in one MPI job) and ``take-cell`` (the workflow's step that moves a cell from its
shared job into its own folder). Every cell's options are checked before MPI starts; a bad one
exits 2 naming the option (and, in a shared job, the cell).
"""
from __future__ import annotations

import argparse
import os
import sys

from enspipe.commands.base import Command, Fail, say
from enspipe.run.config import RunConfig
from enspipe.plan.errors import ConfigError
from enspipe.run.run_options import add_options, from_options, raising_parser


# -- run: one cell ----------------------------------------------------------------------------------
def run_args(p: argparse.ArgumentParser) -> None:
    add_options(p)  # every RunConfig field, declared there once
    p.add_argument("--rate-from", default=None,
                   help="the calibration file (the workflow's rates.json): the emulated accelerator's rc, and the "
                        "rates --scheme auto plans from")
    p.add_argument("--skip-corrupt", dest="on_corrupt", action="store_const", const="skip",
                   help="the same as --on-corrupt skip")


def config_from_args(a: argparse.Namespace) -> RunConfig:
    if a.rate_from is None:
        return from_options(a, rate_source="--rate" if a.rate is not None else None)
    if a.rate is not None:
        raise ConfigError("rate_from", "--rate and --rate-from both given", "pass one of them")
    if a.consumer != "emulated":  # the calibration only for --scheme auto's plan: no accelerator rate to read
        return from_options(a, calibration=a.rate_from)
    from enspipe.run.calibration import read_rate

    rate, source = read_rate(a.rate_from, a.network)
    return from_options(a, rate=rate, rate_source=source, calibration=a.rate_from)


def _run(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.common import phases

    phases.mark("imports")
    try:
        cfg = config_from_args(a)
    except ConfigError as e:
        fail(str(e))
    phases.mark("checked")
    from enspipe.common import tempdirs
    from enspipe.run.member import leave, run

    tempdirs.own()
    return leave(run(cfg))


# -- run-cells: several cells in one MPI job ------------------------------------------------------------
def _run_cells_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help='the job\'s cells: a JSON file {"n": ranks, "cells": [{"name", "args"}, ...]}, each '
                                "cell's args those of enspipe run (with its own --out)")
    p.add_argument("--launcher", default=None,
                   help='how to start the job\'s n ranks, e.g. "mpiexec -n 2" or "srun --mpi=pmi2 -n 2" '
                        "(default: mpiexec -n N; none for one rank)")
    p.add_argument("--in-job", action="store_true", help=argparse.SUPPRESS)  # one rank of the job the driver started


def cell_config(args: list[str]) -> RunConfig:
    """A cell's config from its enspipe run options, exactly as enspipe run checks them."""
    p = raising_parser("fix the cell's enspipe run options")
    run_args(p)
    return config_from_args(p.parse_args(args))


def _run_cells(a: argparse.Namespace, fail: Fail) -> int:
    import shlex
    import shutil

    from enspipe.common.host import launched
    from enspipe.run.cells import check_cells, drive, read_spec, run_in_job

    try:
        n, cells = read_spec(a.spec)
        cfgs = check_cells(n, cells, cell_config)
    except ConfigError as e:
        if a.in_job and (launched() or (0, 1))[0] != 0:
            return 2  # rank 0 says it
        fail(str(e))
    if a.in_job:
        from enspipe.common import tempdirs
        from enspipe.run.member import leave

        tempdirs.own()
        return leave(run_in_job(cells, cfgs))
    launcher = shlex.split(a.launcher) if a.launcher else (["mpiexec", "-n", str(n)] if n > 1 else [])
    if launcher and launcher[0] == "mpiexec" and not shutil.which("mpiexec"):  # the venv's, where it is not on PATH
        launcher[0] = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if launcher and not shutil.which(launcher[0]):
        fail(f"--launcher: {launcher[0]} is not found; pass how to start {n} ranks, e.g. --launcher 'mpiexec -n {n}'")
    return drive(os.path.abspath(a.spec), n, cells, launcher)


def _take_cell_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("staged", help="the cell's folder in its shared job (its --out in the job's spec)")
    p.add_argument("out", help="the cell's own folder")


def _take_cell(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.run.cells import take

    if take(a.staged, a.out):
        say(f"took the cell that ran in a shared job: {a.staged} -> {a.out}")
        return 0
    say(f"no summary in {a.staged}: the cell did not run in a shared job, or failed there")
    return 3


CELL_COMMANDS: dict[str, Command] = {
    "run": Command("run one cell: one ensemble member per MPI rank (use mpiexec -n N)", run_args, _run,
                   show_defaults=True),
    "run-cells": Command("run several cells one after another in one MPI job (Python, MPI and TensorFlow start "
                         "once); each keeps its own window, monitors and summary", _run_cells_args, _run_cells),
    "take-cell": Command("move a cell that ran in a shared job into its own folder (exit 3 where it has no "
                         "summary there)", _take_cell_args, _take_cell),
}
