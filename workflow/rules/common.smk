"""Configuration check and every helper of the workflow (the rules stay declarative)."""
import os
import re
import shlex
import sys
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import min_version, validate

SRC = os.path.join(workflow.basedir, "src")
sys.path.insert(0, SRC)
from enspipe.run import grid  # noqa: E402
from enspipe.plan.ensemble import ARMS, Ensemble  # noqa: E402
from enspipe.plan.errors import ConfigError  # noqa: E402
from enspipe.plan.schemes import AUTO, SCHEME_KINDS  # noqa: E402
from enspipe.report import figures  # noqa: E402

min_version("9.0")

# Rules run enspipe from this checkout's src/, in the active environment or in
# workflow/envs/enspipe.yaml (--use-conda).
ENSPIPE = f"env PYTHONPATH={shlex.quote(SRC)}${{PYTHONPATH:+:$PYTHONPATH}} python -m enspipe"  # a user's models too
ENV = "../envs/enspipe.yaml"

validate(config, schema="../schemas/config.schema.yaml")

if config["dataset"].get("path"):  # the data stage reads it: refuse a wrong one before any job
    from enspipe.data.manifest import check as check_dataset

    _problem = check_dataset(config["dataset"]["path"])
    if _problem:
        raise WorkflowError(
            f"config: dataset.path: {_problem}; point it at TF-Slim TFRecord shards or JPEG class folders, "
            "or set it to null to generate the embedded dataset"
        )

try:
    CELLS, GRID_NOTES = grid.expand(config)
    PER_NODE = grid.members_per_node(config)  # cells whose experiment spreads them its own way
    LAG_CELLS = {c.scheme: c for c in grid.lag_cells(config)}
except grid.GridError as e:
    raise WorkflowError(f"config: {e}") from None
for note in GRID_NOTES:
    logger.warning(f"config: {note}")
JOBS = grid.cell_jobs(config, CELLS, PER_NODE)  # several cells in one MPI job (config cells_per_job)
JOB_OF = {cell: job for job, cells in JOBS.items() for cell in cells}
CALIBRATIONS = grid.calibrations(config)
RC_MEASURED = grid.trained_networks(config)
DATASET = "results/dataset"
RUNS = "results/runs/{cell}/summary.json"  # a cell's summary, by its name (grid.CELL_NAME; cells.smk's patterns)
LAG = "results/lag/{scheme}/summary.json"  # the lag cells (config ``lag``), one per scheme
RATES = "results/calibration/rates.json"
COMM = "results/calibration/comm.json"  # enspipe calibrate-comm: the cost model's collective costs
PAPER_CONFIG = os.path.join(workflow.basedir, "config", "paper.yaml")  # its model section: the paper's grid predicted
IDLE = "results/idle/power.json"
TABLE = "results/tables/cells.csv"
SLURM = config.get("slurm", {})
# its ranks: 2 on one node; where cells spread over nodes, 2 on each of 2 (the network timed too)
COMM_TASKS = 4 if SLURM.get("members_per_node") or any(
    e.get("members_per_node") for e in config["experiments"].values()) else 2
HET = config.get("heterogeneous")  # a heterogeneous ensemble (FLEET), trained by each of its arms
HET_DATA = "results/heterogeneous/dataset"
ENSEMBLES = []
if HET:

    try:
        Ensemble.from_dict(HET["ensemble"])
    except ConfigError as e:
        raise WorkflowError(f"config: heterogeneous.ensemble: {e}") from None
    if HET["num_images"] % HET["batch_size"]:
        raise WorkflowError(
            f"config: heterogeneous: num_images {HET['num_images']} is not a whole number of batches of "
            f"{HET['batch_size']} (members leave at an epoch's end); make it a multiple"
        )
    if any(m.get("patience") for m in HET["ensemble"]["members"]) and not HET.get("validation_images"):
        raise WorkflowError(
            "config: heterogeneous: a member has patience (early stopping) but validation_images is 0; "
            "set validation_images (e.g. 32) for its validation set"
        )
    ENSEMBLES = [f"results/heterogeneous/{arm}/ensemble.json" for arm in HET.get("arms", ARMS)]
HET_VALIDATION = "results/heterogeneous/validation" if HET and HET.get("validation_images") else None


wildcard_constraints:
    network="|".join(map(re.escape, config["networks"])),
    scheme="|".join([*SCHEME_KINDS, AUTO]),
    n=r"[1-9][0-9]*",
    p=r"[1-9][0-9]*",
    cores=r"all|[1-9][0-9]*",
    consumer="train|emulated|peak",
    rep=r"[0-9]+",


def cell_of(wildcards, n=None):
    fields = {k: getattr(wildcards, k) for k in grid.CELL_FIELDS if k != "n"}
    return grid.Cell.of(dict(fields, n=n or wildcards.n))


def cell_slurm(wildcards) -> dict:
    """The cell's Slurm request: extra flags and memory per node (grid.slurm_request)."""
    return grid.slurm_request(config, int(wildcards.n), PER_NODE.get(cell_of(wildcards)))


def cell_inputs(wildcards, shared=True):
    """The data stage, the idle power, the calibrated rates where the accelerator is emulated or
    the plan chooses the scheme (auto), the collective costs the plan uses, and (``shared``) the
    shared job the cell runs in first."""
    inputs = {"manifest": f"{DATASET}/manifest.json", "idle": IDLE}
    if wildcards.consumer == "emulated" or wildcards.scheme == AUTO:
        inputs["rates"] = RATES
    if wildcards.scheme == AUTO:
        inputs["comm"] = COMM
    job = job_of(wildcards, getattr(wildcards, "n", 1)) if shared else None
    if job is not None:
        inputs["job"] = f"results/jobs/{job}/done.json"
    return inputs


def job_of(wildcards, n=None):
    """The shared MPI job the cell runs in first (None: alone)."""
    return JOB_OF.get(cell_of(wildcards, n))


def staged(job: str, cell) -> str:
    """A cell's folder in its shared job, taken into results/runs by the cell's own rule."""
    return f"results/jobs/{job}/{cell.name}"


def take_first(wildcards, output, n=None) -> str:
    """The cell rule's first step: take the cell from its shared job, where it ran there; else (it
    failed there, or runs alone) the rule runs it itself. '' for a cell that runs alone."""
    job = job_of(wildcards, n)
    if job is None:
        return ""
    out = os.path.dirname(output.summary)
    return f"{ENSPIPE} take-cell {shlex.quote(staged(job, cell_of(wildcards, n)))} {shlex.quote(out)} || "


def job_inputs(wildcards):
    """What a shared job's cells need (cell_inputs of each)."""
    inputs = {}
    for cell in JOBS[wildcards.job]:
        inputs.update(cell_inputs(_wildcards_of(cell), shared=False))
    return inputs


def job_spec(wildcards, input) -> dict:
    """The spec of a shared job (enspipe run-cells): its n and each cell's enspipe run options."""
    cells = JOBS[wildcards.job]
    return {"n": cells[0].n, "cells": [
        {"name": c.name, "args": grid.run_args(config, c, input.get("rates"), input.get("comm"))
         + ["--data", DATASET, "--idle-power", input.idle, "--out", staged(wildcards.job, c)]} for c in cells]}


def job_cell(wildcards):
    """A shared job's first cell: the n, core limit and Slurm request every cell of it shares."""
    return _wildcards_of(JOBS[wildcards.job][0])


def _wildcards_of(cell):
    """A cell as its own rule's wildcards (strings), for the helpers that take them."""
    return SimpleNamespace(**{k: str(getattr(cell, k)) for k in grid.CELL_FIELDS})


def cell_args(wildcards, input, n=None):
    """``enspipe run`` arguments of a cell, quoted for the shell."""
    cell = cell_of(wildcards, n)
    args = grid.run_args(config, cell, input.get("rates"), input.get("comm"))
    return grid.shell_args(args + ["--data", DATASET, "--idle-power", input.idle])


def lag_args(wildcards, input):
    """``enspipe run`` arguments of the lag cell of a scheme (config ``lag``), quoted for the shell."""
    args = grid.lag_args(config, LAG_CELLS[wildcards.scheme], input.rates)
    return grid.shell_args(args + ["--data", DATASET, "--idle-power", input.idle])


def cores_per_task(wildcards):
    return SLURM["full_cores"] if wildcards.cores == "all" else int(wildcards.cores)


def exclusive_threads(wildcards):
    """Locally every core, so measurements run one at a time and never disturb each other; on a
    cluster (no local core count) the job's own cores, its node being exclusive."""
    try:
        return workflow.cores
    except WorkflowError:
        return cores_per_task(wildcards) if hasattr(wildcards, "cores") else 1


def slurm_extra(wildcards):
    return "--exclusive" if SLURM["exclusive"] else ""


def dataset_command():
    d = config["dataset"]
    if d.get("path"):
        return f"{ENSPIPE} stage --data {shlex.quote(d['path'])} --out {DATASET}"
    return (f"{ENSPIPE} make-dataset --out {DATASET} --num-images {int(d['num_images'])} "
            f"--num-classes {int(d.get('num_classes', 100))} --seed {int(d.get('seed', 0))}")


def calibration_args(wildcards):
    cal = config.get("calibration", {})
    cell = grid.Cell(wildcards.network, "baseline", 1, 1, wildcards.cores, "peak", 0)
    args = grid.run_args(config | {"steps": cal.get("steps", 30), "warmup": cal.get("warmup", 5)}, cell)
    return grid.shell_args(args + ["--data", DATASET])


def calibration_summaries(wildcards=None):
    """Inputs of the rates: rp runs (``net__cC``) and accelerator measurements (``rc__net``)."""
    runs = {f"{net}__c{cores}": f"results/calibration/{net}/c{cores}/summary.json" for net, cores in CALIBRATIONS}
    return runs | {f"rc__{net}": f"results/calibration/{net}/rc.json" for net in RC_MEASURED}


def rc_args(wildcards):
    cal = config.get("calibration", {})
    args = ["--network", wildcards.network, "--batch-size", str(grid.batch_size(config, wildcards.network)),
            "--image-size", str(config["image_size"]), "--steps", str(cal.get("steps", 30)),
            "--warmup", str(cal.get("warmup", 5))]
    return grid.shell_args(args)


def idle_args():
    p = config["power"]  # the schema's defaults filled in (tests/test_grid.py holds them to RunConfig's)
    args = ["--seconds", str(p["idle_seconds"]), "--power", ",".join(p["sources"]), "--idle-watts", str(p["idle_watts"])]
    if p.get("csv"):
        args += ["--power-csv", str(p["csv"])]
    return grid.shell_args(args)
