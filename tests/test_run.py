"""The per-cell program, one member (a singleton MPI job)."""
import json
import os
import sys

import numpy as np
import pytest

from conftest import enspipe, events, manifest, summary, with_option

BASE = ["--network", "tiny", "--batch-size", "8", "--steps", "7", "--warmup", "0", "--cores", "1",
        "--image-size", "32", "--shuffle-buffer", "16", "--cpu-monitor", "none"]


def test_peak_run_consumes_the_dataset_exactly_once_and_leaves_the_warm_up_out(dataset, tmp_path):
    tmp = tmp_path / "tmp"  # the temporary folder: TensorFlow's autograph writes a module per converted function
    tmp.mkdir()
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--consumer", "peak", *with_option(BASE, "--warmup", 3),
                env={"TMPDIR": str(tmp)})
    assert r.returncode == 0, r.stderr
    assert not list(tmp.iterdir())  # the process's own folder there, removed as it left
    s = summary(tmp_path)
    rank = s["ranks"][0]  # epoch 0 done during the warm-up (3 steps and the drain), counted
    assert rank["epochs"][0] == {"epoch": 0, "count": 50, "digest": manifest(dataset)["digest"], "missing": 0}
    assert rank["images"] == 56 and rank["images_per_second"] > 0 and rank["cpu_seconds"] > 0
    assert len(rank["cores"]) == 1 and rank["cores"][0] in os.sched_getaffinity(0)
    assert set(rank["queue_occupancy"]) >= {"preprocessing", "exchange", "compute"}
    ev = events(tmp_path)
    assert ev[0]["event"] == "config" and ev[0]["config"]["network"] == "tiny"
    assert sum(e["event"] == "step" and e["measured"] for e in ev) == 7 and any(e["event"] == "occupancy" for e in ev)
    assert s["window"]["warmup_steps"] >= 3 and sum(e["event"] == "step" for e in ev) == 7 + s["window"]["warmup_steps"]
    assert r.stdout.startswith("enspipe: baseline n=1")
    assert s["malloc"] == "keep" or not sys.platform.startswith("linux")  # --malloc's default, where glibc is
    # every key written is declared, with its meaning, in one place (enspipe.common.keys)
    from enspipe.common.keys import EVENTS, RANK, SUMMARY

    assert set(s) <= set(SUMMARY), set(s) - set(SUMMARY)
    assert set(rank) == set(RANK), set(rank) ^ set(RANK)
    assert {e["event"] for e in ev} <= set(EVENTS)


def test_train_really_trains_on_a_uint8_wire(dataset, tmp_path):
    """(The float32 wire, the default: every other cell.)"""
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--consumer", "train", "--lr", "0.05",
                "--wire-dtype", "uint8", *BASE)
    assert r.returncode == 0, r.stderr
    s = summary(tmp_path)
    losses = [e["loss"] for e in events(tmp_path) if e["event"] == "step"]
    assert len(losses) == 7 and np.isfinite(losses).all() and len(set(losses)) > 1
    assert s["accelerator"] == "measured" and s["ranks"][0]["learning_rate"] == 0.05
    assert s["wire_dtype"] == "uint8"


def test_emulated_is_labelled(dataset, tmp_path):
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--consumer", "emulated", "--rate", "400", *BASE,
                "--backend", "pillow")  # the label is the consumer's, whatever the backend
    assert r.returncode == 0, r.stderr
    s = summary(tmp_path)
    assert s["emulated"] is True and s["accelerator"] == "emulated" and "emulated" in r.stdout
    assert s["ranks"][0]["seconds"] >= 56 / 400


def test_undecodable_jpeg_fails_naming_the_record(bad_jpeg_dataset, tmp_path):
    data, key = bad_jpeg_dataset
    r = enspipe("run", "--data", data, "--out", tmp_path, "--consumer", "peak", *BASE, timeout=120)
    assert r.returncode != 0
    assert key in r.stderr and "--on-corrupt skip" in r.stderr
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.slow  # quick: the same across two members (tests/test_mpi.py)
def test_skip_corrupt_skips_and_counts(bad_jpeg_dataset, tmp_path):
    data, key = bad_jpeg_dataset
    r = enspipe("run", "--data", data, "--out", tmp_path, "--consumer", "peak", "--skip-corrupt", *BASE)
    assert r.returncode == 0, r.stderr
    rank = summary(tmp_path)["ranks"][0]
    assert key in rank["skipped"]
    assert rank["epochs"][0]["count"] == 11 and rank["epochs"][0]["missing"] == 1


def test_calibrate_rc_measures_real_training_steps(tmp_path):
    out = tmp_path / "rc.json"
    r = enspipe("calibrate-rc", "--network", "tiny", "--batch-size", "8", "--image-size", "32", "--steps", "3",
                "--warmup", "1", "--num-classes", "10", "--out", out)
    assert r.returncode == 0, r.stderr
    rc = json.loads(out.read_text())
    assert rc["rc"] > 0 and rc["device"] in ("CPU", "GPU") and rc["steps"] == 3


def _looks(*spec):
    from enspipe.run.steps import Look as _Look

    return [_Look(starved=s == "w", saturated=s == "F", held=h) for s, h in spec]


def test_a_start_up_wait_is_not_a_steady_state():
    """The window opens when the queues stop filling: a consumer that waited only at start-up,
    while its queues fill towards full, is not steady (the case that counted 80 preprocessed images
    against 48 delivered in a 6-step window); full queues, or queues that no longer grow, are."""
    from enspipe.run.window import is_steady as _steady

    assert not _steady(_looks(("w", 0), ("-", 7)))                       # too few steps to judge
    assert not _steady(_looks(("w", 0), ("-", 7), ("-", 9), ("-", 11)))  # filling after a start-up wait
    assert _steady(_looks(("w", 0), ("-", 7), ("F", 12)))                # full: the consumer sets the pace
    assert _steady(_looks(("w", 0), ("w", 0), ("-", 1), ("w", 0)))       # waits, queues not growing
    assert _steady(_looks(("-", 2), ("w", 1), ("-", 2), ("-", 2)))       # near balance: level
    assert _steady(_looks(("-", 2), ("-", 3), ("-", 2), ("-", 2)))       # never waits, never full: level
    assert not _steady(_looks(("-", 2), ("-", 3), ("w", 2), ("-", 3)))   # growing despite a wait


def test_stage_breakdown_adds_up_to_the_process_cpu():
    from enspipe.measure.stages import STAGES, StageClock, breakdown, mean_per_image

    clock = StageClock()
    before = clock.snapshot()
    with clock.timed("consume"):
        sum(range(200_000))
    clock.add("hand_off", 0.5, 0.01)
    clock.add("read", 0.3)
    exchange = {"copy_seconds": 0.02, "copy_cpu_seconds": 0.02, "collective_seconds": 0.25,
                "collective_cpu_seconds": 0.05}
    st = breakdown(before, clock.snapshot(), {"enspipe-read": 0.1, "enspipe-preproc": 0.6}, exchange, 1.0)
    assert list(st) == list(STAGES)
    assert st["read"] == {"cpu_seconds": 0.1, "wall_seconds": 0.3}
    assert st["copy_in"] == {"cpu_seconds": 0.02, "wall_seconds": 0.02}
    assert st["collective"]["cpu_seconds"] == pytest.approx(0.03) and st["collective"]["wall_seconds"] == pytest.approx(0.23)
    assert st["hand_off"]["wall_seconds"] == 0.5 and st["consume"]["cpu_seconds"] > 0
    assert sum(v["cpu_seconds"] for v in st.values()) == pytest.approx(1.0)
    per = mean_per_image([{"images": 10, "stages": st}, {"images": 20, "stages": st}])
    assert per["preprocess"]["cpu"] == pytest.approx((0.06 + 0.03) / 2)
    workers = breakdown(before, clock.snapshot(), {"enspipe-preproc": 0.1, "enspipe-worker": 1.5}, exchange, 2.0)
    assert workers["preprocess"]["cpu_seconds"] == pytest.approx(1.6)  # the pillow backend's worker processes
    with pytest.raises(KeyError, match="unknown stage"):
        clock.add("decode", 1.0)


def test_the_results_table_reads_only_declared_summary_keys():
    """collect reads a summary by the keys enspipe.common.keys declares (ast: every literal key it
    subscripts or gets), so a renamed key cannot silently turn a column into blanks."""
    import ast

    from enspipe.common.keys import RANK, SUMMARY
    from enspipe.report import collect

    tree = ast.parse(open(collect.__file__).read())
    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("s", "r"):
            if isinstance(node.slice, ast.Constant):
                read.add(node.slice.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and isinstance(node.func.value, ast.Name) and node.func.value.id in ("s", "r")
                and node.args and isinstance(node.args[0], ast.Constant)):
            read.add(node.args[0].value)
    assert len(read) > 20
    assert read <= set(SUMMARY) | set(RANK), read - set(SUMMARY) - set(RANK)


def test_an_undeclared_event_is_refused(tmp_path):
    from enspipe.common.events import EventLog

    log = EventLog(str(tmp_path), 0)
    with pytest.raises(ValueError, match="declare it"):
        log.log("stepp", step=1)
    log.close()
