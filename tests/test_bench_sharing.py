"""benchmarks/sharing.py's judging, on made-up repeats: its ratios pair the repeats (a drift of the
machine's speed cancels), its goals can fail, and a reduction above N is never left unexplained."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
sharing = pytest.importorskip("sharing")

STAGES = sharing.STAGES
BASE = {n: ("baseline", n, None, None) for n in (1, 2, 4)}
ALL = {n: ("all_shared", n, n, None) for n in (1, 2, 4)}


def run(cpu_ms: float, rate: float, exch: float = 0.02, balance: float = 1.0, started: float = 0.0) -> dict:
    stages = {s: 0.0 for s in STAGES}
    stages["preprocess"] = cpu_ms / 1000
    return {"rate": rate, "cpu": cpu_ms / 1000, "stages": stages, "exch_prep": exch, "unit": 1,
            "balance": balance, "started": started}


def grid(speeds=(1.0, 1.0, 1.0), reduction4=4.0, rate4=1.0, exch=0.02, balance=1.0) -> tuple[list, dict]:
    """Three repeats; in repeat i the machine runs at ``speeds[i]`` (every cell of it slower alike)."""
    todo = [BASE[1], ALL[1], BASE[2], ALL[2], BASE[4], ALL[4]]
    runs = {c: [] for c in todo}
    for i, k in enumerate(speeds):
        runs[BASE[1]].append(run(2.5 * k, 400 / k, 0, started=60 * i))
        runs[ALL[1]].append(run(2.5 * k, 400 / k, 0))
        runs[BASE[2]].append(run(2.6 * k, 380 / k, 0))
        runs[ALL[2]].append(run(1.3 * k, 390 / k, exch))
        runs[BASE[4]].append(run(2.8 * k, 180 / k, 0))
        runs[ALL[4]].append(run(2.8 * k / reduction4, 400 * rate4 / k, exch, balance))
    return todo, runs


def verdicts(capsys, *args, **kw) -> tuple[str, dict]:
    todo, runs = grid(*args, **kw)
    sharing.report(todo, runs, 3)
    out = capsys.readouterr().out
    goals = {}
    for line in out.splitlines():
        if line.strip().startswith(("met", "MISS")):
            ok, text = line.split(None, 1)
            goals[text] = ok == "met"
    return out, goals


def test_paired_ratios_cancel_a_drift_of_the_machine_that_unpaired_medians_would_not():
    todo, runs = grid(speeds=(1.0, 1.3, 0.8))
    assert sharing.paired(runs, BASE[4], ALL[4], "cpu") == pytest.approx([4.0, 4.0, 4.0])
    assert sharing.paired(runs, ALL[4], ALL[1], "rate") == pytest.approx([1.0, 1.0, 1.0])
    runs[ALL[4]][1] = None  # a failed repeat keeps its place: the others stay paired
    assert sharing.paired(runs, BASE[4], ALL[4], "cpu") == pytest.approx([4.0, 4.0])


def test_every_goal_is_met_on_an_ideal_quiet_grid(capsys):
    out, goals = verdicts(capsys)
    assert goals and all(goals.values()), out
    assert "Per repeat" in out and "(+1)" in out  # each repeat's own numbers, with when it ran


@pytest.mark.parametrize("kw, failing", [
    ({"reduction4": 3.0}, "CPU reduction 3.00x"),
    ({"exch": 0.08}, "exchange + copies 8.0%"),
    ({"rate4": 0.7}, "70% of one member's rate"),
    ({"speeds": (1.0, 1.0, 1.4)}, "repeat spread"),
])
def test_each_goal_fails_when_its_number_misses(capsys, kw, failing):
    out, goals = verdicts(capsys, **kw)
    missed = [text for text, ok in goals.items() if not ok]
    assert any(failing in text for text in missed), out


def test_a_reduction_above_n_is_explained(capsys):
    out, _ = verdicts(capsys, reduction4=4.6, balance=0.85)
    assert "above the ceiling: all_shared N=4" in out and "balance is 0.85" in out
    out, _ = verdicts(capsys, reduction4=4.6)  # balanced, every repeat above N, the baseline alone as costly
    assert "a measuring bug to find" not in out  # 2.8 ms at N=4 against 2.5 alone: shared cores
    assert "pays for sharing the cores" in out


def test_a_balanced_reduction_above_n_with_nothing_to_explain_it_is_called_a_bug(capsys):
    todo, runs = grid(reduction4=4.6)
    for r in runs[BASE[4]]:
        r["cpu"] = 2.5e-3  # the 4-member baseline as cheap per image as one member alone
    for r in runs[ALL[4]]:
        r["cpu"] = 2.5e-3 / 4.6
    sharing.report(todo, runs, 3)
    assert "a measuring bug to find" in capsys.readouterr().out


def test_every_other_repeat_runs_the_cells_in_reverse_so_a_steady_drift_biases_no_ratio_one_way():
    todo = [BASE[1], ALL[1], BASE[4], ALL[4]]
    order = sharing.schedule(todo, 3)
    assert [rep for rep, _ in order] == [0] * 4 + [1] * 4 + [2] * 4
    assert [c for _, c in order] == todo + todo[::-1] + todo
    # the machine slows 10% per cell it runs: N=4 against N=1 leans one way in forward repeats,
    # the other way in reversed ones
    speed = {}
    for i, (rep, cell) in enumerate(order):
        speed[rep, cell] = 1.1 ** i
    ratios = [speed[rep, ALL[1]] / speed[rep, ALL[4]] for rep in range(3)]  # rate ~ 1 / slowness
    assert min(ratios) < 1 < max(ratios)


def test_a_spread_miss_names_the_spread_of_one_member_alone_in_the_same_repeats(capsys):
    out, goals = verdicts(capsys, speeds=(1.0, 1.0, 1.4))
    missed = [text for text, ok in goals.items() if not ok and text.split()[:2] == ["all_shared", "4"]]
    assert missed and "spread 40%" in missed[0] and "(one member alone, nothing shared: 40%)" in missed[0], out
