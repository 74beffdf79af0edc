"""The GPU machine's recipe (benchmarks/gpu.sh: rc, rp, the schemes' cells with the torch trainer,
NVML) runs end to end where there is no GPU and no TensorFlow, at toy sizes, and says where each
number came from. Its results on the lent H200 are in docs/results-gpu.md; the NVML recording it
made is tests/fixtures/nvml_h200 (tests/test_power.py)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_gpu_recipe_runs_without_a_gpu_and_labels_its_device(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), TMPDIR=str(tmp_path),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               RATES_ARGS="--steps 1 --warmup 0 --repeats 1 --batch-scale 0.02 --cores 1 --seconds 0.3 --images 8",
               SCALING_ARGS="--paths engine --cores 1 --images-per-core 8",
               CELLS_OUT=str(tmp_path / "cells"), CELLS_ARGS="--skip peak --n 2 --cores 1 --repeats 1 --steps 1 "
                                                             "--warmup 0 --images 16 --batch-size 4 --network tiny",
               FEED_ARGS="--device cpu --ns 2 --extra= --network tiny --image-size 32 --batch-size 8 "
                         "--images 256 --steps 30 --warmup 2 --timeout 60")
    r = subprocess.run(["bash", "benchmarks/gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "mpi ranks [0, 1] of 2" in r.stdout and "gpu_rates: exit 0" in r.stdout and "gpu_cells: exit 0" in r.stdout
    assert "scaling: exit 0" in r.stdout and "gpu_checks: exit 0" in r.stdout  # (skipped here: no CUDA)
    assert "feed: exit 0" in r.stdout
    scaling = json.loads((out / "scaling.json").read_text())
    assert [(row["path"], row["backend"], row["cores"]) for row in scaling] == [("engine", "pillow", 1)]
    assert scaling[0]["runs"][0]["images"] > 0 and scaling[0]["runs"][0]["cpu"] > 0
    rates = json.loads((out / "gpu_rates.json").read_text())
    enspipe_rc = [row for row in rates["rc"] if row["implementation"] == "enspipe torch.nn"]
    assert {row["network"] for row in enspipe_rc} == {"alexnet_v2", "inception_v1", "vgg_a"}
    assert all(row["device"] == "CPU" and row["rc"] > 0 for row in enspipe_rc)
    rp = {row["library"]: row for row in rates["rp"]}
    assert rp["pillow"]["rp"] > 0 and rp["enspipe-pillow"]["rp"] > 0 and rp["pillow"]["cores"] == 1
    assert all(row["rp"] or row["why"] for row in rp.values())  # a library that does not load says why
    cells = json.loads((out / "gpu_cells.json").read_text())
    assert cells["gpu"] is False and "nvml" not in cells
    assert {(c["scheme"], c["ok"]) for c in cells["cells"]} == {("baseline", True), ("all_shared", True)}
    assert all(c["accelerator"] == "measured" and c["gpu_busy"] is None for c in cells["cells"])
    _check_feed(json.loads((out / "feed.json").read_text()))


def _check_feed(feed: dict) -> None:
    """Every feed ran at each n, or says why: the ones that need CUDA say so; the rest trained."""
    import sys

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from feed import FEEDS

    rows = {(r["feed"], r["n"]): r for r in feed["rows"]}
    assert set(rows) == {(f, 2) for f in FEEDS} and feed["nvml"] is False
    assert "CUDA is not available" in rows["enspipe-gpu", 2]["failed"]
    for (name, n), row in rows.items():
        if name in ("enspipe-gpu", "tensorsocket") and "failed" in row:
            continue
        assert row["images_per_s_per_member"] > 0 and row["device"] == "cpu", row
        assert row.get("cpu_ms_per_image", 0) > 0 or row["why"], row
        assert "gpu_busy" not in row, row
