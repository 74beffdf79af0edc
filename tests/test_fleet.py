"""FLEET's allocation (issue 19, first part): profiles, lockstep flotilla time, the greedy, the
exact solver and node-aware placement (pure Python, no MPI)."""
import itertools
import math
import random

import pytest

from enspipe.plan.errors import ConfigError
from enspipe.plan.fleet import (Member, Profile, assign_accelerators, create_flotilla, efficiency_per_doubling,
                                emulated_profile, extrapolate, flotilla_time, greedy_schedule, nodes_spanned,
                                optimal_schedule, schedule_time)


def test_lockstep_time_runs_at_the_slowest_unfinished_members_pace():
    # 100 images at min(10, 20) = 10/s, then the second alone: 100 more at 20/s
    assert flotilla_time([100, 200], [10, 20]) == pytest.approx(15.0)
    assert flotilla_time([200, 100], [10, 20]) == pytest.approx(20.0)  # the slow one needs longest: 200/10
    assert flotilla_time([50], [5]) == pytest.approx(10.0)


def test_profiles_emulated_and_extrapolated():
    p = emulated_profile("a", 100.0, 4, efficiency_per_doubling(0.9))
    assert p.source == "emulated" and p.rates[0] == 100.0
    assert p.rate(2) == pytest.approx(180.0) and p.rate(4) == pytest.approx(400 * 0.81)
    assert extrapolate((10.0, 20.0), 4) == pytest.approx(40.0)  # linear stays linear
    assert extrapolate((10.0, 18.0), 3) == pytest.approx(3 * 9 * 0.9)  # the paper's decay per added accelerator
    assert extrapolate((10.0, 18.0), 2) == 18.0  # measured wins
    with pytest.raises(ConfigError):
        Profile("bad", (0.0,))
    with pytest.raises(ConfigError):
        efficiency_per_doubling(1.5)


def _members(rcs, works, m, e=0.9):
    return [Member(emulated_profile(f"m{i}", rc, m, efficiency_per_doubling(e)), w)
            for i, (rc, w) in enumerate(zip(rcs, works))]


def test_the_greedy_matches_rates_then_gives_spares_to_the_slowest():
    members = _members([100, 50, 25, 10], [1000] * 4, 8, e=1.0)  # linear: 50 x 2 = 100, 25 x 4 = 100
    f = create_flotilla(members, [0, 1, 2, 3], 8, tolerance=0.15)
    got = dict(zip(f.members, f.accelerators))
    assert got[1] == 2 and got[2] == 4  # each brought to the reference's 100 images/s
    assert 3 not in got  # 10/s on its 1 free accelerator is 90% off: it waits for the next flotilla
    assert got[0] == 2 and sum(f.accelerators) == 8  # the spare goes to the slowest (a tie: the first)
    uneven = _members([100, 60, 30], [1000] * 3, 8, e=1.0)
    f2 = create_flotilla(uneven, [0, 1, 2], 8, tolerance=0.5)
    g = dict(zip(f2.members, f2.accelerators))
    # 30 x 3 = 90 joins first (nearest 100), then 60 x 2 = 120; the 2 spares go to the slowest each time
    assert g == {0: 2, 1: 2, 2: 4} and sum(g.values()) == 8


def test_every_member_is_scheduled_once_within_the_accelerators():
    rng = random.Random(3)
    members = _members([rng.uniform(20, 200) for _ in range(9)], [rng.uniform(1e4, 3e4) for _ in range(9)], 4)
    sched = greedy_schedule(members, 4, per_node=2)
    placed = [i for f in sched for i in f.members]
    assert sorted(placed) == list(range(9))
    assert all(sum(f.accelerators) <= 4 and all(a >= 1 for a in f.accelerators) for f in sched)
    assert schedule_time(sched) == pytest.approx(sum(f.time for f in sched))


def _brute_force(members, M):
    """Every set partition, every count vector: the definition, for a handful of members."""
    n = len(members)

    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for p in partitions(rest):
            for k in range(len(p)):
                yield p[:k] + [[first] + p[k]] + p[k + 1:]
            yield [[first]] + p

    best = math.inf
    for part in partitions(list(range(n))):
        total = 0.0
        for block in part:
            if len(block) > M:
                total = math.inf
                break
            t = min((flotilla_time([members[i].work for i in block], [members[i].profile.rate(m) for i, m in
                                                                      zip(block, acc)])
                     for acc in itertools.product(range(1, M + 1), repeat=len(block)) if sum(acc) <= M),
                    default=math.inf)
            total += t
        best = min(best, total)
    return best


def test_the_exact_solver_is_the_optimum_and_never_worse_than_the_greedy():
    rng = random.Random(11)
    for _ in range(15):
        n, M = rng.randint(2, 5), rng.choice([2, 3, 4])
        members = _members([rng.uniform(20, 200) for _ in range(n)], [rng.uniform(1e3, 3e3) for _ in range(n)], M,
                           e=rng.uniform(0.7, 1.0))
        opt = schedule_time(optimal_schedule(members, M))
        assert opt == pytest.approx(_brute_force(members, M), rel=1e-9)
        assert opt <= schedule_time(greedy_schedule(members, M)) * (1 + 1e-9)
    with pytest.raises(ConfigError):
        optimal_schedule(_members([10] * 11, [1] * 11, 2), 2)


def test_placement_keeps_members_on_whole_nodes_where_counts_allow():
    counts = (4, 2, 2, 1, 3)
    out = assign_accelerators(counts, 4)
    flat = sorted(i for v in out.values() for i in v)
    assert flat == list(range(12))  # every accelerator once, consecutive
    assert all(nodes_spanned(out[j], 4) == 1 for j in range(5))  # 4; 2 + 2; 1 + 3: no member spans nodes
    assert [len(out[j]) for j in range(5)] == list(counts)
    odd = assign_accelerators((3, 3), 4)  # 3 + 3 cannot pair into a node: one member must span two
    assert sorted(nodes_spanned(v, 4) for v in odd.values()) == [1, 2]
