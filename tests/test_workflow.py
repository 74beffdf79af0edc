"""The Snakemake workflow: lint, dry runs, a full local run of config/test.yaml, a rerun of one
cell by its target name, and the same grid through a real Slurm cluster where a one-node cluster
is up (`.ci/slurm-up`; with `.ci/slurm-up --nodes 3`, as CI runs, tests/test_cluster.py runs the
Slurm profile across namespaced hosts instead)."""
import io
import json
import os
import shutil
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from PIL import Image

from conftest import said, slurm_nodes
from enspipe.run import grid

pytestmark = pytest.mark.workflow
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
SNAKEMAKE = os.path.join(BIN, "snakemake")


def snakemake(*args, workdir=None, timeout=1200):
    cmd = [SNAKEMAKE, "-s", os.path.join(ROOT, "Snakefile"), *map(str, args)]
    if workdir is not None:
        cmd += ["--directory", str(workdir)]
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _config(name):
    with open(os.path.join(ROOT, "config", f"{name}.yaml")) as f:
        return yaml.safe_load(f)


@pytest.mark.slow
def test_lint_is_clean():
    r = snakemake("--lint")
    assert r.returncode == 0 and "Lints for" not in r.stdout + r.stderr, r.stdout + r.stderr


def _summary(cell) -> str:
    """Where the workflow writes a cell's summary (common.smk's RUNS)."""
    return f"results/runs/{cell.name}/summary.json"


def _planned_cells(r) -> set[str]:
    """The cell summaries a dry run (``snakemake -n``) would make."""
    return {line.split("output: ", 1)[1].strip() for line in r.stdout.splitlines()
            if "output: results/runs/" in line}


@pytest.mark.timing
@pytest.mark.parametrize("name", [None, *(pytest.param(name, marks=pytest.mark.slow)
                                          for name in ("config", "full", "test", "paper", "cluster"))])
def test_a_dry_run_lists_exactly_the_configs_own_cells(tmp_path, name):
    """Each shipped config is the whole experiment: its dry run plans its own cells, none inherited
    from the embedded default (None: no --configfile, the default itself)."""
    t = time.monotonic()
    args = ["--configfile", os.path.join(ROOT, "config", f"{name}.yaml")] if name else []
    r = snakemake("-n", *args, workdir=tmp_path)
    elapsed = time.monotonic() - t
    assert r.returncode == 0, said(r)
    assert _planned_cells(r) == {_summary(c) for c in grid.cells(_config(name or "config"))}
    assert elapsed < 60  # the paper's ~1200 cells resolve in seconds (generous bound for slow CI)


def test_a_bad_config_fails_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_config("test") | {"steps": 0}))
    r = snakemake("-n", "--configfile", bad, workdir=tmp_path / "wd")
    assert r.returncode != 0 and "instance['steps']" in r.stdout + r.stderr


@pytest.mark.parametrize("path, says", [
    ("/no/such/data", "dataset.path: '/no/such/data' is not a directory"),
    pytest.param("../..", "dataset.path:", marks=pytest.mark.slow),  # a directory, but no dataset
    pytest.param("data; rm -rf ~", "does not match", marks=pytest.mark.slow),  # shell metacharacters: the schema
])
def test_a_wrong_dataset_path_fails_the_dry_run_naming_it(tmp_path, path, says):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_config("test") | {"dataset": {"path": path}}))
    (tmp_path / "wd" / "a" / "b").mkdir(parents=True)
    (tmp_path / "wd" / "notes.txt").write_text("not a dataset")
    r = snakemake("-n", "--configfile", bad, workdir=tmp_path / "wd" / "a" / "b")
    assert r.returncode != 0 and says in r.stdout + r.stderr, (r.stdout + r.stderr)[-2000:]


SMOKE = {"training": {"consumer": "emulated", "networks": ["vgg_a"], "schemes": ["baseline", "all_shared"],
                      "n": [2], "cores": [1]}}


# The smoke cells' measured window: 40 steps (about 2 s here). The test grid's 6 steps (0.3 s) are
# shorter than the 1 s monitor interval, and a pipeline's once-a-second costs then land in one
# window and miss the other: 15 interleaved pairs here measured 1.34-2.07x at 6 steps, 1.73-1.95x
# at 40, and CI once measured 3.49x at 6.
SMOKE_STEPS = 40


def test_a_short_workflow_run_end_to_end(tmp_path):
    """The quick suite's end-to-end run (`make test`): data stage, calibration, idle power, a
    baseline and an All-Shared cell under mpiexec, the cell table and every figure (the lag cells
    and FLEET's arms run in the test grid's whole run, marked slow)."""
    cfg = {k: v for k, v in _config("test").items() if k not in ("lag", "heterogeneous")}
    cfg |= {"experiments": SMOKE, "steps": SMOKE_STEPS, "cells_per_job": 2}  # both cells in one MPI job
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = snakemake("--cores", "2", "--configfile", path, workdir=tmp_path)
    assert r.returncode == 0, said(r)
    table = pd.read_csv(tmp_path / "results" / "tables" / "cells.csv")
    assert sorted(table["cell"]) == sorted(c.name for c in grid.cells(cfg))
    for cell in grid.cells(cfg):  # each ran in the shared job and was taken into its own folder
        with open(tmp_path / _summary(cell)) as f:
            assert json.load(f)["shared_job"]["cells"] == 2, cell.name
    assert not list((tmp_path / "results" / "jobs").glob("*/vgg_a"))  # nothing left behind there
    assert table["epochs_exact"].all() and table["steady"].notna().all()
    shared = table[table["scheme"] == "all_shared"].iloc[0]
    # The judge ran and gave a verdict. Its threshold is tested on constructed tables (test_grid):
    # one repeat's window here is noisier than its 5% floor, so the verdict itself is not asserted;
    # a gross measuring bug (3x between 2) still fails.
    assert shared["reduction_ceiling"] == 2 and shared["exceeds_ceiling"] in (True, False, "True", "False")
    seen = ["scheme", "process_cpu_seconds_per_image", "window_seconds", "window_balance", "warmup_steps", "steady"]
    assert 1 < shared["cpu_reduction_process"] < 3, table[seen].to_string()
    assert (tmp_path / "results" / "figures" / "paper_vs_run.md").stat().st_size > 0


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("local")
    r = snakemake("--cores", "2", "--configfile", os.path.join(ROOT, "config", "test.yaml"), workdir=wd)
    return wd, r


@pytest.mark.slow
def test_local_run_of_the_test_grid(local_run):
    wd, r = local_run
    assert r.returncode == 0, said(r)
    table = pd.read_csv(wd / "results" / "tables" / "cells.csv")
    cells = grid.cells(_config("test"))
    assert sorted(table["cell"]) == sorted(c.name for c in cells)
    assert table["epochs_exact"].all()
    assert (table["node_cpu_seconds"] > 0).all() and table["energy_source"].notna().all()
    emulated = table[table["consumer"] == "emulated"]
    assert emulated["accelerator"].eq("emulated").all() and (emulated["rate"] > 0).all()
    assert (wd / "results" / "calibration" / "rates.json").exists() and (wd / "results" / "idle" / "power.json").exists()
    for one in cells:  # mpstat's log where sysstat is installed (CI), else the psutil sampler's
        d = wd / os.path.dirname(_summary(one))
        with open(wd / _summary(one)) as f:
            source = json.load(f)["cpu_source"]
        assert source == ("mpstat" if shutil.which("mpstat") else "psutil"), one.name
        assert list(d.glob("mpstat.*.json" if source == "mpstat" else "psutil-cpu.*.jsonl")), one.name


@pytest.mark.slow
def test_every_figure_and_table_and_the_html_report(local_run):
    """The figures rule leaves every output figures.OUTPUTS names (real data where the test grid
    has cells for it, a 'no data' placeholder elsewhere), and `snakemake --report` builds."""
    from enspipe.report.figures import OUTPUTS

    wd, r = local_run
    assert r.returncode == 0, said(r)
    figs = wd / "results" / "figures"
    for stem, o in OUTPUTS.items():
        for ext in o.formats:
            assert (figs / f"{stem}.{ext}").stat().st_size > 0, f"{stem}.{ext}"
    t2 = pd.read_csv(figs / "table2_core_usage.csv")  # the test grid's solo cell at 1 core
    assert t2["allowed"].sum() == 1 and len(t2) == os.cpu_count()
    findings = (figs / "paper_vs_run.md").read_text()
    assert "Table 3" in findings and "emulated" in findings
    assert "No data" in (figs / "table5_energy.md").read_text() or "modelled" in (figs / "table5_energy.md").read_text()
    rep = snakemake("--configfile", os.path.join(ROOT, "config", "test.yaml"), "--report", "report.html", workdir=wd)
    assert rep.returncode == 0, said(rep)
    html = (wd / "report.html").read_text(errors="replace")
    assert "fig12_cpu_reduction.png" in html and "Paper vs this run" in html
    embedded = _report_images(html)  # every figure is in the report, and every image in it loads
    assert {p.name for p in figs.glob("*.png")} <= set(embedded)
    for name, data in embedded.items():
        Image.open(io.BytesIO(data)).load()


def _report_images(html: str) -> dict[str, bytes]:
    """The PNG images a Snakemake report embeds, by file name, decoded from their data URIs."""
    import base64
    import re

    return {name: base64.b64decode(b) for name, b in
            re.findall(r"data:image/png;charset=utf8;filename=([^;]+);base64,([A-Za-z0-9+/=]+)", html)}


@pytest.mark.slow
def test_one_cell_reruns_by_its_target_name_alone(local_run):
    """`make cell` (snakemake -f on one summary) after a run in shared jobs: that cell runs again,
    alone, and its job does not."""
    wd, r = local_run
    assert r.returncode == 0
    cell = next(c for c in grid.cells(_config("test")) if c.n == 2 and c.scheme == "all_shared")
    with open(wd / _summary(cell)) as f:
        assert json.load(f)["shared_job"]["cells"] > 1  # it ran in a shared job
    before = os.path.getmtime(wd / _summary(cell))
    rr = snakemake("--cores", "2", "--configfile", os.path.join(ROOT, "config", "test.yaml"), "-f", _summary(cell),
                   workdir=wd)
    assert rr.returncode == 0, said(rr)
    assert os.path.getmtime(wd / _summary(cell)) > before
    assert "1 of 1 steps" in rr.stderr and "cell_job" not in rr.stdout + rr.stderr  # that cell alone
    with open(wd / _summary(cell)) as f:
        assert "shared_job" not in json.load(f)


def _slurm_up() -> bool:
    return any(s in state for state in slurm_nodes().values() for s in ("idle", "mixed"))


def _namespaced_cluster() -> bool:
    from test_cluster import _nodes

    return len(_nodes()) >= 3


@pytest.mark.slow
@pytest.mark.skipif(not _slurm_up(), reason="no Slurm cluster here (.ci/slurm-up starts one on localhost)")
@pytest.mark.skipif(_namespaced_cluster(), reason="tests/test_cluster.py runs the Slurm profile across the namespaced "
                    "hosts (the test grid runs once, locally)")
def test_slurm_profile_runs_the_test_grid(tmp_path):
    # the localhost cluster keeps no accounting database: account and status come from squeue
    r = snakemake("--profile", "slurm", "--configfile", os.path.join(ROOT, "config", "test.yaml"),
                  "--slurm-no-account", "--slurm-status-command", "squeue", workdir=tmp_path, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    table = pd.read_csv(tmp_path / "results" / "tables" / "cells.csv")
    assert len(table) == len(grid.cells(_config("test"))) and table["epochs_exact"].all()
    for path in table["summary"]:  # every cell ran as a Slurm job; MPI cells as a step of n tasks
        with open(tmp_path / path) as f:
            s = json.load(f)
        assert s["slurm"] and s["slurm"]["job_id"], path
        if s["n"] > 1:
            assert s["slurm"]["ntasks"] == str(s["n"]) and "step_id" in s["slurm"]
