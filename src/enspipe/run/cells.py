"""Several cells in one MPI job: the ranks start (Python, MPI, TensorFlow) once and run the cells
one after another, each exactly as ``enspipe run`` would, with its own window, monitors, summary
and output folder.

A job's cells come from a spec file (``enspipe run-cells SPEC``)::

    {"n": 2, "cells": [{"name": "alexnet_v2/all_shared/n2_p2/c1/peak/rep0",
                        "args": ["--data", "d", "--out", "runs/a", "--scheme", "all_shared", ...]}, ...]}

Every cell's options are checked before the job starts (a bad one names the cell and the option,
exit 2). A cell that fails inside the job aborts it, as a failed rank aborts any cell; the driver
(:func:`drive`) then leaves that cell ``summary.failed.json`` beside its logs and starts the job
again for the cells after it, so a failed cell fails only itself. The cells of one job share the
core limit: TensorFlow sizes its thread pools once per process.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from enspipe.common.atomic import write_json_atomic
from enspipe.common.liveness import die_with_launcher
from enspipe.engine.affinity import available_cores, pin_process
from enspipe.plan.errors import ConfigError
from enspipe.plan.schemes import AUTO, SCHEME_KINDS
from enspipe.run.member import before_mpi, check_fit, run_on
from enspipe.run.summary import FAILED_SUMMARY, SUMMARY

SPEC_KEYS = {"n", "cells"}


@dataclass(frozen=True)
class CellSpec:
    """One cell of a job: its name (for messages) and its ``enspipe run`` options."""

    name: str
    args: tuple[str, ...]

    @property
    def out(self) -> str:
        return self.args[self.args.index("--out") + 1]

    def done(self) -> bool:
        """Whether the cell has its outcome: a summary, or the record of its failure."""
        return any(os.path.exists(os.path.join(self.out, f)) for f in (SUMMARY, FAILED_SUMMARY))


def read_spec(path: str) -> tuple[int, list[CellSpec]]:
    """``(n, cells)`` of a job's spec file; raises :class:`ConfigError` naming what is wrong."""
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError("spec", f"{path}: {e}", "pass the JSON file that lists the job's cells") from None
    if not isinstance(spec, dict) or set(spec) != SPEC_KEYS or not isinstance(spec["cells"], list) \
            or not spec["cells"] or not isinstance(spec["n"], int) or spec["n"] < 1:
        raise ConfigError("spec", f"{path}: wants {{\"n\": ranks, \"cells\": [{{\"name\", \"args\"}}, ...]}} with "
                          "at least one cell", "write it as the workflow does (enspipe.run.grid.job_spec)")
    cells = []
    for i, c in enumerate(spec["cells"]):
        if not isinstance(c, dict) or set(c) != {"name", "args"} or not all(isinstance(a, str) for a in c["args"]) \
                or "--out" not in c["args"][:-1]:
            raise ConfigError("spec", f"{path}: cell {i} wants a name and args with --out", "fix the spec")
        cells.append(CellSpec(str(c["name"]), tuple(c["args"])))
    outs = [c.out for c in cells]
    if len(set(outs)) != len(outs):
        raise ConfigError("spec", f"{path}: two cells write to one --out", "give every cell its own folder")
    return spec["n"], cells


def check_cells(n: int, cells: list[CellSpec], parse) -> list:
    """Every cell's validated config (``parse``: ``enspipe run``'s options -> RunConfig, raising
    :class:`ConfigError`), each checked against the job's ``n`` ranks; raises :class:`ConfigError`
    naming the first bad cell. The cells must share a core limit, and the planner's choice and the
    tf.data service peer run alone."""
    cfgs = []
    for c in cells:
        try:
            cfg = parse(list(c.args))
            scheme = cfg.stream.scheme
            if scheme == AUTO or SCHEME_KINDS[scheme].service:
                raise ConfigError("scheme", f"{scheme} runs in a job of its own", "run it with enspipe run")
            check_fit(cfg, n)
        except ConfigError as e:
            raise ConfigError("cells", f"cell {c.name}: {e}", "fix that cell's options") from None
        cfgs.append(cfg)
    limits = {cfg.measure.cores for cfg in cfgs}
    if len(limits) > 1:
        raise ConfigError("cells", f"the cells ask for core limits {sorted(limits, key=str)}",
                          "put cells of one core limit in a job (TensorFlow sizes its pools once per process)")
    return cfgs


def run_in_job(cells: list[CellSpec], cfgs: list) -> int:
    """One rank of the job: every cell not yet done, in order, on the whole job's communicator.
    A failed cell aborts the job (:func:`enspipe.run.job.fail`)."""
    die_with_launcher()
    before_mpi()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    todo = comm.bcast([i for i, c in enumerate(cells) if not c.done()] if comm.Get_rank() == 0 else None, root=0)
    cores = available_cores()  # each cell places and pins its ranks from the same cores
    for position, i in enumerate(todo):
        pin_process(cores)
        started = time.time()
        rc = run_on(cfgs[i], comm)
        gc.collect()  # the cell's pipeline, model and graphs, held in cycles: freed before the next
        if comm.Get_rank() == 0 and rc == 0:
            _record_job(cells[i], {"cells": len(cells), "position": i, "first_in_process": position == 0,
                                   "started": started})
        comm.Barrier()
    return 0


def _record_job(cell: CellSpec, job: dict) -> None:
    """Say in the cell's summary that it ran in a shared job, and where in it."""
    path = os.path.join(cell.out, SUMMARY)
    with open(path) as f:
        summary = json.load(f)
    write_json_atomic(path, summary | {"shared_job": job})


def drive(spec: str, n: int, cells: list[CellSpec], launcher: list[str]) -> int:
    """Run the job's cells to their outcomes: start the job (``launcher`` + this command in-job),
    and where it fails, leave the cell it failed in ``summary.failed.json`` and start it again for
    the cells after it. Returns 0 when every cell has its summary, else 1."""
    job = [*launcher, sys.executable, "-m", "enspipe", "run-cells", spec, "--in-job"]
    for c in cells:  # an earlier run's outcomes and failure records are not this run's
        old = os.listdir(c.out) if os.path.isdir(c.out) else []
        for f in old:
            if f in (SUMMARY, FAILED_SUMMARY) or f.startswith(("failed.rank", "error.rank")):
                os.remove(os.path.join(c.out, f))
    while True:
        pending = [c for c in cells if not c.done()]
        if not pending:
            break
        rc = subprocess.run(job).returncode
        left = [c for c in pending if not c.done()]
        if rc == 0 and not left:
            break
        failed = left[0] if left else None
        if failed is not None:  # the job ended inside this cell (or before it): its failure is on record
            _record_failure(failed, rc)
    failed = [c.name for c in cells if os.path.exists(os.path.join(c.out, FAILED_SUMMARY))]
    print(f"enspipe run-cells: {len(cells) - len(failed)} of {len(cells)} cells ran in shared jobs"
          + (f"; failed: {', '.join(failed)} (each has {FAILED_SUMMARY} and its logs)" if failed else ""),
          file=sys.stderr if failed else sys.stdout, flush=True)
    return 1 if failed else 0


def _record_failure(cell: CellSpec, rc: int) -> None:
    """``summary.failed.json`` for a cell its job failed in: why (its ranks' own records, where they
    left any) and the job's exit status; never a ``summary.json``."""
    os.makedirs(cell.out, exist_ok=True)
    ranks = []
    for f in sorted(os.listdir(cell.out)):
        if f.startswith("failed.rank") and f.endswith(".json"):
            with open(os.path.join(cell.out, f)) as fh:
                ranks.append(json.load(fh))
    reasons = [r.get("reason", "?") for r in ranks]
    failure = "; ".join(reasons) if reasons else f"its job ended (exit {rc}) before the cell wrote its summary"
    write_json_atomic(os.path.join(cell.out, FAILED_SUMMARY), {
        "cell_name": cell.name, "failure": failure, "job_exit": rc, "failed_ranks": ranks, "time": time.time()})
    print(f"enspipe run-cells: cell {cell.name} failed: {failure}", file=sys.stderr, flush=True)


def take(staged: str, out: str) -> bool:
    """Move a cell that ran in a shared job from its folder there (``staged``) into its own
    (``out``, emptied of an earlier run's files), its summary last; False where it has no summary
    there (it failed, or never ran there: run it alone)."""
    import shutil

    if not os.path.exists(os.path.join(staged, SUMMARY)):
        return False
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        path = os.path.join(out, f)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    for f in sorted(os.listdir(staged), key=lambda f: f == SUMMARY):
        shutil.move(os.path.join(staged, f), os.path.join(out, f))
    os.rmdir(staged)
    try:
        os.removedirs(os.path.dirname(staged))  # the folders above it that are empty now
    except OSError:
        pass
    return True

