"""A heterogeneous ensemble trained in one arm's rounds (issue 19): the rounds each arm plans
(pure), and the runner's real rounds under mpiexec with emulated accelerators, resumed after a
kill without redoing a finished round."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import enspipe, said
from enspipe.plan.ensemble import ARMS, Ensemble, EnsembleMember, model_times, plan_rounds
from enspipe.plan.errors import ConfigError

SIX = Ensemble(tuple(EnsembleMember(n, r, e) for n, r, e in
                     [("a", 200, 2), ("b", 150, 6), ("c", 60, 3), ("d", 40, 4), ("e", 25, 2), ("f", 20, 5)]), 4)


@pytest.mark.parametrize("arm", ARMS)
def test_every_arm_trains_every_member_its_epochs_within_the_accelerators(arm):
    rounds = plan_rounds(SIX, arm, 256)
    trained = {i: 0 for i in range(6)}
    for r in rounds:
        assert r.ranks <= SIX.accelerators and min(r.widths) >= 1 and len(set(r.members)) == len(r.members)
        for i, e in zip(r.members, r.epochs):
            trained[i] += e
    assert trained == {i: m.epochs for i, m in enumerate(SIX.members)}
    if not arm.startswith("fleet"):
        assert all(set(r.widths) == {1} for r in rounds)


def test_fleet_replans_when_too_few_accelerators_stay_busy_and_beats_both_arms_in_the_model():
    rounds = plan_rounds(SIX, "fleet", 256)
    for r in rounds:  # a round stops at the first epoch end where fewer than 0.8 G would stay busy
        stop = max(r.epochs)
        assert sum(g for g, e in zip(r.widths, r.epochs) if e >= stop) >= 1
        for k in range(1, stop):
            assert sum(g for g, e in zip(r.widths, r.epochs) if e > k) >= 0.8 * SIX.accelerators
    assert all(sum(r.widths) == SIX.accelerators for r in rounds)  # the greedy hands out every accelerator
    fleet, default, homog = (model_times(SIX, a, plan_rounds(SIX, a, 256), 256).makespan
                             for a in ("fleet", "default", "homogeneous"))
    assert fleet < default < homog


def test_fleet_local_keeps_its_flotilla_and_hands_a_finished_members_accelerators_to_the_slowest():
    """FLEET-L: a round ends when the first of its members is done, and the next has the same
    members but that one, its accelerator given to the slowest of the others. FLEET-G keeps 4 of
    5 busy (not below 0.8 G) and leaves the freed one idle to the flotilla's end."""
    ens = Ensemble(tuple(EnsembleMember(n, r, e) for n, r, e in [("a", 100, 1), ("b", 100, 3), ("c", 95, 3),
                                                                    ("d", 95, 3), ("e", 90, 3)]), 5)
    local = plan_rounds(ens, "fleet_local", 100)
    assert [(r.widths, r.epochs) for r in local] == [((1, 1, 1, 1, 1), (1, 1, 1, 1, 1)), ((1, 1, 1, 2), (2, 2, 2, 2))]
    assert [ens.members[i].name for i in local[1].members] == ["b", "c", "d", "e"]  # e, the slowest, gets a's
    glob = plan_rounds(ens, "fleet", 100)
    assert [(r.widths, r.epochs) for r in glob] == [((1, 1, 1, 1, 1), (1, 3, 3, 3, 3))]
    local_t, glob_t = model_times(ens, "fleet_local", local, 100), model_times(ens, "fleet", glob, 100)
    assert local_t.makespan < glob_t.makespan
    # G leaves a's accelerator idle for 2 of its 3 epochs' time (at the slowest's 90/s) after a's 1 s
    assert glob_t.wait_per_accelerator == pytest.approx(
        glob_t.makespan - (100 / 100 + 3 * 100 / 100 + 2 * 300 / 95 + 300 / 90) / 5)
    assert local_t.wait_per_accelerator < glob_t.wait_per_accelerator


@pytest.mark.parametrize("arm", ["fleet", "fleet_local"])
def test_replanning_after_each_round_keeps_the_plan_and_fleet_local_its_flotilla(arm):
    """A runner re-plans after every round from what is left (and, FLEET-L, the flotilla it ran
    last): with fixed epochs that is the plan made up front. FLEET-L's flotilla goes on without
    a re-plan of everyone left: d, waiting outside it, never joins it."""
    ens = Ensemble(tuple(EnsembleMember(n, r, e) for n, r, e in [("a", 9.6, 3), ("b", 24, 2), ("c", 12, 6),
                                                                    ("d", 4.8, 4), ("e", 24, 4)]), 4)
    full = plan_rounds(ens, arm, 16)
    left, got, last = {i: m.epochs for i, m in enumerate(ens.members)}, [], None
    while plan := plan_rounds(ens, arm, 16, left, len(got), last):
        last = plan[0]
        got.append(last)
        left = {i: e - dict(zip(last.members, last.epochs)).get(i, 0) for i, e in left.items()}
        left = {i: e for i, e in left.items() if e > 0}
    assert got == full
    if arm == "fleet_local":
        names = [{ens.members[i].name for i in r.members} for r in full]
        assert names[:3] == [{"b", "c", "e"}, {"c", "e"}, {"c"}]  # the first flotilla to its last member
        assert len(full) > len(plan_rounds(ens, "fleet", 16))


def test_the_default_arm_is_list_scheduled_and_homogeneous_waits_for_each_group():
    two = Ensemble((EnsembleMember("slow", 10, 1), EnsembleMember("fast", 100, 1), EnsembleMember("x", 100, 1)), 2)
    default = model_times(two, "default", plan_rounds(two, "default", 100), 100)
    assert default.makespan == pytest.approx(10.0)
    rounds = plan_rounds(two, "homogeneous", 100)
    assert [len(r.members) for r in rounds] == [2, 1]
    homog = model_times(two, "homogeneous", rounds, 100)
    assert homog.makespan == pytest.approx(sum(r.predicted_seconds for r in rounds))
    # each round costs its set-up once, one after another (default: on whichever accelerator frees first)
    assert model_times(two, "homogeneous", rounds, 100, 2.0).makespan == pytest.approx(homog.makespan + 4.0)
    assert model_times(two, "default", plan_rounds(two, "default", 100), 100, 2.0).makespan == pytest.approx(12.0)


def test_run_lengths_and_waits_follow_the_lockstep():
    """Two members in lockstep at the slower's pace: the fast one (100/s) trains 100 images in the
    slow one's (10/s) 10 s; it finishes with it, its accelerator busy 1 s of them."""
    pair = Ensemble((EnsembleMember("slow", 10, 1), EnsembleMember("fast", 100, 1)), 2)
    t = model_times(pair, "homogeneous", plan_rounds(pair, "homogeneous", 100), 100)
    assert t.run_lengths == pytest.approx((10.0, 10.0))
    assert t.wait_per_accelerator == pytest.approx(10.0 - (10.0 + 1.0) / 2)
    # one member that needs twice the other's work: the faster leaves early, then the pace is its own
    uneven = Ensemble((EnsembleMember("a", 10, 1), EnsembleMember("b", 20, 2)), 2)
    t = model_times(uneven, "homogeneous", plan_rounds(uneven, "homogeneous", 100), 100)
    assert t.run_lengths == pytest.approx((10.0, 15.0)) and t.makespan == pytest.approx(15.0)


@pytest.mark.parametrize("spec, field", [
    ({"members": [], "accelerators": 2}, "members"),
    ({"members": [{"name": "a", "rate": 10, "epochs": 0}], "accelerators": 2}, "members"),
    ({"members": [{"name": "a", "rate": 10}], "accelerators": 2}, "members"),
    ({"members": [{"name": "a", "rate": 10, "epochs": 1}] * 2, "accelerators": 2}, "members"),
    ({"members": [{"name": "a", "rate": 10, "epochs": 1}], "accelerators": 0}, "accelerators"),
    ({"members": [{"name": "a", "rate": 10, "epochs": 1}], "accelerators": 2, "alpha": 1}, "ensemble"),
])
def test_a_bad_ensemble_is_refused_naming_the_field(spec, field):
    with pytest.raises(ConfigError) as e:
        Ensemble.from_dict(spec)
    assert e.value.field == field


SPEC = {"accelerators": 2, "members": [{"name": "quick", "rate": 60, "epochs": 1},
                                       {"name": "slow", "rate": 15, "epochs": 2},
                                       {"name": "mid", "rate": 30, "epochs": 1}]}
RUN = ["--", "--network", "tiny", "--image-size", "32", "--shuffle-buffer", "16", "--cores", "1"]


def _ensemble(spec_path, data, out, arm="fleet", batch=10):
    return [sys.executable, "-m", "enspipe", "ensemble", "--spec", spec_path, "--arm", arm, "--data", data,
            "--out", out, "--batch-size", str(batch), *RUN]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_fleet_arm_runs_its_rounds_and_a_killed_arm_resumes_without_redoing_one(dataset, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    out = tmp_path / "fleet"
    rounds = plan_rounds(Ensemble.from_dict(SPEC), "fleet", 50)
    assert len(rounds) >= 2
    first = out / "round00" / "summary.json"
    proc = subprocess.Popen(_ensemble(spec, dataset, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while not first.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert first.exists(), "the first round never finished"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the round it had started next
    proc.wait()
    assert not (out / "ensemble.json").exists()
    kept = first.stat().st_mtime_ns
    r = subprocess.run(_ensemble(spec, dataset, out), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, said(r)
    assert first.stat().st_mtime_ns == kept  # the finished round was kept, not rerun
    rec = json.loads((out / "ensemble.json").read_text())
    assert rec["emulated"] and 0 in rec["resumed_rounds"] and rec["makespan_seconds"] is None
    trained = {}
    for t in rec["timeline"]:
        trained[t["member"]] = trained.get(t["member"], 0) + t["trained_images"]
        assert t["busy_seconds"] >= t["trained_images"] / (t["width"] * 60) * 0.99  # no faster than its rate
    assert trained == {"quick": 50, "slow": 100, "mid": 50}  # every epoch once, across the rounds


@pytest.mark.mpi
@pytest.mark.slow
def test_the_default_arm_runs_members_side_by_side(dataset, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    r = subprocess.run(_ensemble(spec, dataset, tmp_path / "d", "default"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, said(r)
    rec = json.loads((tmp_path / "d" / "ensemble.json").read_text())
    walls = sorted(x["wall"] for x in rec["rounds"])
    assert walls[1][0] < walls[0][1]  # the first two members ran at once, on the two accelerators
    assert 0 < rec["accelerator_busy_fraction"] <= 1 and rec["makespan_seconds"] > 0


@pytest.mark.mpi
@pytest.mark.parametrize("arm", ["fleet", pytest.param("default", marks=pytest.mark.slow),
                                 pytest.param("fleet_local", marks=pytest.mark.slow)])
def test_an_arm_in_one_job_trains_the_same_epochs_with_one_launch(dataset, tmp_path, arm):
    fast = SPEC | {"members": [m | {"rate": 2 * m["rate"]} for m in SPEC["members"]]}  # the same plan, half the wait
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(fast))
    cmd = _ensemble(spec, dataset, tmp_path / arm, arm)
    r = subprocess.run(cmd[:cmd.index("--")] + ["--in-job"] + cmd[cmd.index("--"):], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, said(r)
    rec = json.loads((tmp_path / arm / "ensemble.json").read_text())
    assert rec["in_job"] and rec["launches"] == 1 and rec["makespan_seconds"] > 0
    assert len(rec["rounds"]) == len(plan_rounds(Ensemble.from_dict(fast), arm, 50)) \
        == len(plan_rounds(Ensemble.from_dict(SPEC), arm, 50))
    trained = {}
    for t in rec["timeline"]:
        trained[t["member"]] = trained.get(t["member"], 0) + t["trained_images"]
    assert trained == {"quick": 50, "slow": 100, "mid": 50}
    walls = sorted(x["wall"] for x in rec["rounds"])
    if arm == "default":  # two ranks take the members as they free up: the first two ran at once
        assert walls[1][0] < walls[0][1]
    else:  # one round after another, split from the same ranks
        assert all(a[1] <= b[0] for a, b in zip(walls, walls[1:]))


@pytest.mark.parametrize("extra, says", [
    (["--batch-size", "8"], "--batch-size"),       # 50 images are not whole batches of 8
    (["--batch-size", "10", "--", "--network", "nope"], "--network"),
])
def test_bad_ensemble_options_exit_2_before_any_round(dataset, tmp_path, extra, says):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    r = enspipe("ensemble", "--spec", spec, "--arm", "fleet", "--data", dataset, "--out", tmp_path / "o", *extra)
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_a_missing_spec_exits_2(dataset, tmp_path):
    r = enspipe("ensemble", "--spec", tmp_path / "none.yaml", "--arm", "fleet", "--data", dataset, "--out",
                tmp_path / "o", "--batch-size", "10")
    assert r.returncode == 2 and "--spec" in r.stderr



def test_the_paper_scale_is_simulated_by_the_same_allocator():
    from enspipe.report.heterogeneous import PAPER_FIG5, paper_scale, paper_waits, simulate_paper_scale

    sim = simulate_paper_scale(accelerators=(20, 80, 160))
    t = paper_scale(sim)
    assert list(t["accelerators"]) == [20, 80, 160] and (t["members"] == 100).all()
    assert t["source"].str.startswith("simulated").all()
    assert (t[["default_s", "homogeneous_s", "fleet_s", "fleet_local_s"]] > 0).all().all()
    assert (t["fleet_over_homogeneous"] > 1).all()  # lockstep groups wait for their slowest member
    assert t["paper_fleet_over_default"].tolist() == [PAPER_FIG5[g][2] for g in (20, 80, 160)]
    assert t["paper_fleet_local_over_default"].tolist() == [PAPER_FIG5[g][1] for g in (20, 80, 160)]
    # FLEET-L ends a round at every member's finish: its rounds' costs weigh more than G's
    assert (t["fleet_local_rounds"] > t["fleet_rounds"]).all()
    assert (t["fleet_over_fleet_local"] > t["fleet_over_fleet_local_without_round_cost"]).all()
    w = paper_waits(sim)
    assert len(w) == 3 * len(ARMS) and (w["wait_per_accelerator_s"] >= 0).all() and (w["run_length_std_s"] >= 0).all()
    assert w.loc[(w["accelerators"] == 80) & (w["arm"] == "default"), "paper_run_length_mean_std_at_80"].item() == (
        "10372 / 4179")


def test_a_failed_round_is_named_with_the_end_of_its_log(tmp_path):
    """The arm stops at a round that fails and says why from the round's log, without TensorFlow's
    start-up lines (a CI run keeps only the arm's stderr)."""
    from enspipe.run.ensemble import run_arm

    ens = Ensemble.from_dict({"accelerators": 1, "members": [{"name": "a", "rate": 10, "epochs": 1}]})
    fails = "import sys; print('I0000 00:00 port.cc:153] oneDNN'); print('enspipe run: rank 0: boom'); sys.exit(1)"
    with pytest.raises(RuntimeError) as e:
        run_arm(ens, "fleet", "/nowhere", str(tmp_path / "arm"), 10, 50, launcher=[sys.executable, "-c", fails],
                say=lambda *_: None)
    said = str(e.value)
    assert "round 0 failed (exit 1)" in said and "round00.log" in said
    assert said.endswith("\n  enspipe run: rank 0: boom") and "oneDNN" not in said
