"""Several cells in one MPI job (enspipe run-cells): each keeps its own summary, window and exactly-once
ledger; a bad cell is refused before the job starts; a failed cell fails only itself."""
import json
import os

import pytest
from conftest import enspipe, manifest, said, summary

# the job's mechanics do not depend on the backend: the pillow one starts in a second, TensorFlow's in
# several (the workflow's jobs of tf cells run in tests/test_workflow.py and in the matrices' shared jobs)
CELL = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--warmup", "0", "--cores", "1",
        "--image-size", "32", "--shuffle-buffer", "16", "--cpu-monitor", "none", "--backend", "pillow"]


def _spec(tmp_path, dataset, cells: list[tuple[str, list[str]]], n: int = 2) -> str:
    spec = {"n": n, "cells": [{"name": name, "args": ["--data", dataset, "--out", str(tmp_path / name), *CELL, *args]}
                              for name, args in cells]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_a_job_of_cells_gives_each_its_own_summary_exactly_once(dataset, tmp_path):
    cells = [("as", ["--scheme", "all_shared", "--steps", "14"]), ("base", ["--scheme", "baseline", "--steps", "7"]),
             ("sb", ["--scheme", "single_broadcast", "--preprocessors", "1", "--steps", "14"])]
    r = enspipe("run-cells", _spec(tmp_path, dataset, cells))
    assert r.returncode == 0, said(r)
    assert "3 of 3 cells ran in shared jobs" in r.stdout
    want = manifest(dataset)["digest"]
    for i, (name, _) in enumerate(cells):
        s = summary(tmp_path / name)
        assert s["scheme"] == {"as": "all_shared", "base": "baseline", "sb": "single_broadcast"}[name]
        assert s["shared_job"]["cells"] == 3 and s["shared_job"]["position"] == i
        assert s["shared_job"]["first_in_process"] == (i == 0)
        epochs = [e for rank in s["ranks"] for e in rank["epochs"]]
        assert epochs and all(e["digest"] == want and e["missing"] == 0 for e in epochs), name
        assert os.path.exists(tmp_path / name / "events.rank0001.jsonl")


def test_a_bad_cell_is_refused_before_the_job_starts(dataset, tmp_path):
    cells = [("ok", ["--scheme", "all_shared", "--steps", "7"]), ("bad", ["--scheme", "all_shared", "--steps", "0"])]
    r = enspipe("run-cells", _spec(tmp_path, dataset, cells))
    assert r.returncode == 2 and "cell bad" in r.stderr and "--steps" in r.stderr, r.stderr
    assert not (tmp_path / "ok").exists()  # nothing ran
    mixed = [("one", ["--scheme", "all_shared", "--steps", "7"]),
             ("two", ["--scheme", "all_shared", "--steps", "7", "--cores", "2"])]
    r = enspipe("run-cells", _spec(tmp_path, dataset, mixed))
    assert r.returncode == 2 and "core limits" in r.stderr, r.stderr
    (tmp_path / "spec.json").write_text(json.dumps({"n": 2, "cells": []}))
    r = enspipe("run-cells", tmp_path / "spec.json")
    assert r.returncode == 2 and "spec" in r.stderr


def test_a_failed_cell_fails_only_itself(dataset, tmp_path):
    """Rank 1 raises at step 20, which only the middle cell reaches: that cell leaves
    summary.failed.json and its logs, never a summary.json; the job starts again for the cell after it."""
    cells = [("first", ["--scheme", "all_shared", "--steps", "7"]),
             ("breaks", ["--scheme", "all_shared", "--steps", "30"]),
             ("after", ["--scheme", "baseline", "--steps", "7"])]
    r = enspipe("run-cells", _spec(tmp_path, dataset, cells), env={"ENSPIPE_INJECT_FAULT": "1:20:raise"})
    assert r.returncode == 1, r.stderr[-3000:]
    assert "failed: breaks" in r.stderr
    assert summary(tmp_path / "first")["scheme"] == "all_shared"
    assert summary(tmp_path / "after")["shared_job"]["first_in_process"]  # a new job, after the failure
    assert not (tmp_path / "breaks" / "summary.json").exists()
    failed = json.loads((tmp_path / "breaks" / "summary.failed.json").read_text())
    assert "injected fault at step 20" in failed["failure"] and failed["job_exit"] != 0
    assert (tmp_path / "breaks" / "error.rank0001.txt").exists()


def test_a_cell_whose_rank_dies_in_native_code_leaves_its_python_stack(dataset, tmp_path):
    """As in ``enspipe run`` (tests/test_faults.py): a segmentation fault fails the cell, and the
    rank's Python stacks reach stderr."""
    r = enspipe("run-cells", _spec(tmp_path, dataset, [("crash", ["--scheme", "all_shared", "--steps", "7"])]),
                env={"ENSPIPE_INJECT_FAULT": "1:3:crash"})
    assert r.returncode != 0 and not (tmp_path / "crash" / "summary.json").exists()
    assert "Fatal Python error: Segmentation fault" in r.stderr and "in inject" in r.stderr, said(r)


@pytest.mark.slow
def test_a_cell_measures_in_a_shared_job_as_it_does_alone(dataset, tmp_path):
    """CPU per delivered image of one cell, 3 times alone and 3 times second in a shared job,
    interleaved: the medians agree within the repeats' own spread (at least 15%)."""
    import statistics

    args = ["--scheme", "all_shared", "--steps", "40", "--warmup", "5", "--backend", "tf"]  # start-up outside the window
    alone, shared = [], []
    for rep in range(3):
        out = tmp_path / f"alone{rep}"
        r = enspipe("run", "--data", dataset, "--out", out, *CELL, *args, n=2)
        assert r.returncode == 0, said(r)
        alone.append(summary(out)["cpu_seconds_total"] / sum(x["images"] for x in summary(out)["ranks"]))
        job = tmp_path / f"job{rep}"
        job.mkdir()
        r = enspipe("run-cells", _spec(job, dataset, [("warm", ["--scheme", "baseline", "--steps", "7"]),
                                                      ("cell", args)]))
        assert r.returncode == 0, said(r)
        s = summary(job / "cell")
        shared.append(s["cpu_seconds_total"] / sum(x["images"] for x in s["ranks"]))
    spread = max(max(v) / min(v) - 1 for v in (alone, shared))
    ratio = statistics.median(shared) / statistics.median(alone)
    assert abs(ratio - 1) <= max(spread, 0.15), (alone, shared)


def test_a_cell_is_taken_from_its_shared_job_summary_last(tmp_path):
    from enspipe.run.cells import take

    staged, out = tmp_path / "jobs" / "j" / "cell", tmp_path / "runs" / "cell"
    staged.mkdir(parents=True)
    out.mkdir(parents=True)
    (out / "events.rank0000.jsonl").write_text("an earlier run's\n")
    (out / "summary.failed.json").write_text("{}")
    assert not take(str(staged), str(out))  # no summary there: the cell runs alone
    for f in ("events.rank0000.jsonl", "cpu.csv", "summary.json"):
        (staged / f).write_text(f)
    assert take(str(staged), str(out))
    assert sorted(p.name for p in out.iterdir()) == ["cpu.csv", "events.rank0000.jsonl", "summary.json"]
    assert (out / "events.rank0000.jsonl").read_text() == "events.rank0000.jsonl" and not staged.exists()
