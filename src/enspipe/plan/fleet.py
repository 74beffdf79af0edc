"""FLEET's allocation of accelerators to a heterogeneous ensemble: profiles, flotillas, the greedy
and an exact solver for small instances (Guan et al., MLSys 2020; ``../shared/notes/fleet-notes.md``).

A member i trains data-parallel on m accelerators at ``r_i(m)`` images/s (its :class:`Profile`).
A **flotilla** is a set of unfinished members trained together from one shared, exactly-once
preprocessed stream, each on its own accelerators (at most ``M`` in all, at least one each).
Sharing is synchronous, so the members advance in lockstep at the pace of the slowest one still
training; a member leaves when it has consumed its ``work`` (images: epochs x dataset size), and
the pace then rises to the slowest of those left. The flotilla's time is therefore

    T(F) = sum over j of (W_(j) - W_(j-1)) / min{ r_i(m_i) : W_i >= W_(j) }

with the members' work sorted ``W_(1) <= W_(2) <= ...``. An ensemble is trained in rounds of
flotillas; the objective is the sum of the rounds' times (:func:`schedule_time`), which the paper
argues is NP-hard to minimise.

* :func:`create_flotilla` is the paper's greedy (Alg. 2): the unplaced member fastest on one
  accelerator is the reference; repeatedly add the (member, m) whose rate on m accelerators is
  nearest the reference's, if within the tolerance; then give each spare accelerator to the member
  whose rate is lowest. The paper's tolerance is 20 images/s, absolute and so bound to its
  hardware; here it is relative to the reference's rate (``tolerance``, default 0.15).
* :func:`greedy_schedule` applies it round after round until every member is placed.
* :func:`give_spare` is its last step alone: FLEET-L (the paper's local variant) gives a finished
  member's accelerators to its flotilla's others with it, instead of re-planning the flotilla.
* :func:`optimal_schedule` finds the minimum of the same objective exactly by dynamic programming
  over subsets (the best allocation of every subset, then the best partition), for up to about 10
  members; ``benchmarks/fleet_allocation.py`` reports the greedy's gap to it on random instances.
* :func:`assign_accelerators` numbers accelerators node by node and places each member on
  consecutive ones (the paper's Alg. 3), so members of a multiple of a node stay whole nodes.

Profiles come from measurement (``measured``) or from an emulated accelerator's rate and a
configurable scaling efficiency (``emulated``): ``r(g) = rc x g x efficiency(g)``; the label
travels with every profile.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from functools import lru_cache

from enspipe.plan.errors import require


@dataclass(frozen=True)
class Profile:
    """One member's training rates (images/s) on 1..max accelerators, and where they came from.

    Attributes:
      name: the member's name (its network and hyper-parameters).
      rates: ``rates[g - 1]`` is the rate on g accelerators, g = 1..len(rates).
      source: ``measured`` or ``emulated`` (stated in every output).
    """

    name: str
    rates: tuple[float, ...]
    source: str = "emulated"

    def __post_init__(self) -> None:
        require(len(self.rates) >= 1 and all(r > 0 and math.isfinite(r) for r in self.rates), "profile",
                f"{self.name}: rates must be finite and > 0, got {self.rates}", "measure or emulate it again")
        require(self.source in ("measured", "emulated"), "profile", f"{self.name}: source {self.source!r}",
                "use measured or emulated")

    def rate(self, g: int) -> float:
        return self.rates[g - 1]

    @property
    def max_accelerators(self) -> int:
        return len(self.rates)


def efficiency_per_doubling(e: float):
    """The scaling efficiency ``efficiency(g) = e ** log2(g)``: each doubling of the accelerators
    keeps ``e`` of the linear speed-up (1.0: linear)."""
    require(0 < e <= 1, "efficiency", f"must be in (0, 1], got {e}", "e.g. 0.9 per doubling")
    return lambda g: e ** math.log2(g)


def emulated_profile(name: str, rc: float, max_accelerators: int, efficiency=efficiency_per_doubling(0.9)) -> Profile:
    """``r(g) = rc x g x efficiency(g)`` for g = 1..max_accelerators, labelled ``emulated``."""
    require(rc > 0, "rc", f"{name}: must be > 0, got {rc}", "pass the one-accelerator rate")
    return Profile(name, tuple(rc * g * efficiency(g) for g in range(1, max_accelerators + 1)), "emulated")


def extrapolate(measured: tuple[float, ...], m: int) -> float:
    """The paper's extrapolation beyond the measured counts (Section 4):
    ``r(m) = m (r(Mb) / Mb) [ (r(Mb) / r(Mb - 1)) ((Mb - 1) / Mb) ] ** (m - Mb)``, Mb the largest
    count measured (at least 2); measured counts are returned as measured."""
    mb = len(measured)
    if m <= mb:
        return measured[m - 1]
    require(mb >= 2, "profile", "extrapolation needs rates on at least 2 accelerators", "profile g = 1 and 2")
    decay = (measured[mb - 1] / measured[mb - 2]) * ((mb - 1) / mb)
    return m * (measured[mb - 1] / mb) * decay ** (m - mb)


def fill_rates(counts: list[int], rates: list[float]) -> tuple[float, ...]:
    """Rates measured on some accelerator counts (say 1, 2, 4) as rates on every count 1..max:
    measured counts as measured, counts between two measured ones interpolated linearly, counts
    below the smallest scaled down linearly from it."""
    require(len(counts) == len(rates) >= 1 and len(set(counts)) == len(counts) and min(counts) >= 1, "profile",
            f"counts {counts} and rates {rates} do not pair up", "measure it again (enspipe profile)")
    at = dict(zip(counts, rates))
    out = []
    for g in range(1, max(counts) + 1):
        lo = max((x for x in counts if x <= g), default=None)
        hi = min(x for x in counts if x >= g)
        if lo == g:
            out.append(at[g])
        elif lo is None:
            out.append(at[hi] * g / hi)
        else:
            out.append(at[lo] + (at[hi] - at[lo]) * (g - lo) / (hi - lo))
    return tuple(out)


def measured_profile(name: str, rates: tuple[float, ...], max_accelerators: int) -> Profile:
    """A measured profile on 1..``max_accelerators``: the rates measured, and beyond them the
    paper's extrapolation (:func:`extrapolate`; with one count measured, linear from it)."""
    def at(g):
        if g <= len(rates) or len(rates) >= 2:
            return extrapolate(rates, g)
        return rates[0] * g
    return Profile(name, tuple(at(g) for g in range(1, max_accelerators + 1)), "measured")


@dataclass(frozen=True)
class Member:
    """A member of the ensemble: its profile and the images it still has to train on."""

    profile: Profile
    work: float  # images (epochs to convergence x the dataset's size), > 0

    @property
    def name(self) -> str:
        return self.profile.name


@dataclass(frozen=True)
class Flotilla:
    """Members trained together (indices into the member list) and each one's accelerator count."""

    members: tuple[int, ...]
    accelerators: tuple[int, ...]
    time: float = 0.0
    placement: dict = field(default_factory=dict, compare=False)  # member -> its accelerator indices

    def as_dict(self, members: list[Member]) -> dict:
        return {"members": [members[i].name for i in self.members], "accelerators": list(self.accelerators),
                "rates": [members[i].profile.rate(m) for i, m in zip(self.members, self.accelerators)],
                "time": self.time, "placement": {members[i].name: v for i, v in self.placement.items()}}


def lockstep_finishes(work: list[float], rates: list[float]) -> list[float]:
    """When each member with these remaining ``work`` (images) and rates is done, training in
    lockstep: all at the slowest unfinished member's pace, which rises as members finish."""
    order = sorted(range(len(work)), key=lambda i: work[i])
    t, done, out = 0.0, 0.0, [0.0] * len(work)
    for k, i in enumerate(order):
        pace = min(rates[j] for j in order[k:])
        t += (work[i] - done) / pace
        done = work[i]
        out[i] = t
    return out


def flotilla_time(work: list[float], rates: list[float]) -> float:
    """Lockstep training time of members with these remaining ``work`` and rates (the module's
    formula): its last member's finish."""
    return max(lockstep_finishes(work, rates))


def _time(members: list[Member], idx: tuple[int, ...], acc: tuple[int, ...]) -> float:
    return flotilla_time([members[i].work for i in idx], [members[i].profile.rate(m) for i, m in zip(idx, acc)])


def create_flotilla(members: list[Member], candidates: list[int], accelerators: int,
                    tolerance: float = 0.15) -> Flotilla:
    """The paper's greedy choice of one flotilla among ``candidates`` on ``accelerators`` (see the
    module): the reference is the fastest on one accelerator; members join at the count that
    brings their rate nearest the reference's (within ``tolerance`` of it); spare accelerators go,
    one at a time, to the member that is slowest."""
    require(accelerators >= 1 and bool(candidates), "accelerators", "a flotilla needs accelerators and members",
            "pass at least one of each")
    rate = {i: members[i].profile.rate for i in candidates}
    ref = max(candidates, key=lambda i: (rate[i](1), -i))
    r_fast = rate[ref](1)
    chosen, free = {ref: 1}, accelerators - 1
    while free > 0:
        best = None
        for i in candidates:
            if i in chosen:
                continue
            for m in range(1, min(free, members[i].profile.max_accelerators) + 1):
                gap = abs(rate[i](m) - r_fast)
                if best is None or gap < best[0]:
                    best = (gap, i, m)
        if best is None or best[0] > tolerance * r_fast:
            break
        _, i, m = best
        chosen[i], free = m, free - m
    give_spare(members, chosen, free)
    idx = tuple(sorted(chosen))
    acc = tuple(chosen[i] for i in idx)
    return Flotilla(idx, acc, _time(members, idx, acc))


def give_spare(members: list[Member], chosen: dict[int, int], free: int) -> int:
    """The greedy's last step: each of ``free`` spare accelerators, one at a time, to the member of
    ``chosen`` (member -> its accelerators, updated in place) that is slowest on what it has and can
    use another. Returns the accelerators nobody could use. FLEET-L hands a finished member's
    accelerators to its flotilla's others the same way."""
    rate = {i: members[i].profile.rate for i in chosen}
    while free > 0:
        growable = [i for i in chosen if chosen[i] < members[i].profile.max_accelerators]
        if not growable:
            break
        slow = min(growable, key=lambda i: (rate[i](chosen[i]), i))
        chosen[slow] += 1
        free -= 1
    return free


def greedy_schedule(members: list[Member], accelerators: int, per_node: int | None = None,
                    tolerance: float = 0.15) -> list[Flotilla]:
    """Flotillas by :func:`create_flotilla`, round after round, until every member is placed (each
    round runs to its last member's end, the paper's analysis); placed node-aware when
    ``per_node`` is given."""
    left, out = list(range(len(members))), []
    while left:
        f = create_flotilla(members, left, accelerators, tolerance)
        if per_node:
            f = Flotilla(f.members, f.accelerators, f.time, assign_accelerators(f.accelerators, per_node, f.members))
        out.append(f)
        left = [i for i in left if i not in f.members]
    return out


def schedule_time(schedule: list[Flotilla]) -> float:
    return sum(f.time for f in schedule)


def optimal_schedule(members: list[Member], accelerators: int, max_members: int = 10) -> list[Flotilla]:
    """The schedule of least :func:`schedule_time`, exactly: for every subset of members its best
    accelerator counts (every composition of at most ``accelerators``), then the best partition of
    all members into flotillas by dynamic programming over subsets. Exponential: refused beyond
    ``max_members``."""
    n = len(members)
    require(1 <= n <= max_members, "members", f"the exact solver takes 1..{max_members} members, got {n}",
            "use greedy_schedule for larger ensembles")

    @lru_cache(maxsize=None)
    def best_block(mask: int) -> tuple[float, tuple[int, ...]]:
        idx = tuple(i for i in range(n) if mask >> i & 1)
        if len(idx) > accelerators:
            return math.inf, ()
        best = (math.inf, ())
        caps = [members[i].profile.max_accelerators for i in idx]
        for acc in _counts(len(idx), accelerators, tuple(caps)):
            t = _time(members, idx, acc)
            if t < best[0]:
                best = (t, acc)
        return best

    @lru_cache(maxsize=None)
    def best_partition(mask: int) -> tuple[float, tuple[int, ...]]:
        if mask == 0:
            return 0.0, ()
        low = mask & -mask  # the block holding the lowest member: each partition counted once
        rest = mask ^ low
        best = (math.inf, ())
        sub = rest
        while True:
            block = sub | low
            t_block = best_block(block)[0]
            if t_block < best[0]:
                t_rest, blocks = best_partition(mask ^ block)
                if t_block + t_rest < best[0]:
                    best = (t_block + t_rest, (block,) + blocks)
            if sub == 0:
                break
            sub = (sub - 1) & rest
        return best

    _, blocks = best_partition((1 << n) - 1)
    out = []
    for mask in blocks:
        t, acc = best_block(mask)
        out.append(Flotilla(tuple(i for i in range(n) if mask >> i & 1), acc, t))
    return sorted(out, key=lambda f: f.members)


def _counts(k: int, total: int, caps: tuple[int, ...]):
    """Every tuple of k accelerator counts, each in 1..cap, summing to at most ``total``."""
    def rec(j: int, left: int):
        if j == k:
            yield ()
            return
        for m in range(1, min(caps[j], left - (k - j - 1)) + 1):
            for tail in rec(j + 1, left - m):
                yield (m,) + tail
    yield from rec(0, total)


def assign_accelerators(counts: tuple[int, ...], per_node: int, members: tuple[int, ...] | None = None,
                        max_orders: int = 1024) -> dict:
    """Accelerator indices (numbered node by node, ``per_node`` each) for members needing
    ``counts``, each on consecutive indices (the paper's Alg. 3): first members of a multiple of
    ``per_node``, then pairs whose counts sum to a multiple of it, then the rest in the order (of at
    most ``max_orders`` tried) that minimises the sum over members of nodes spanned / count."""
    members = tuple(range(len(counts))) if members is None else members
    require(per_node >= 1, "per_node", f"must be >= 1, got {per_node}", "pass the accelerators of one node")
    pending = list(range(len(counts)))
    order = [j for j in pending if counts[j] % per_node == 0]
    pending = [j for j in pending if j not in order]
    by_rest: dict[int, list[int]] = {}
    for j in pending:
        by_rest.setdefault(counts[j] % per_node, []).append(j)
    paired = set()
    for j in pending:
        if j in paired:
            continue
        want = (per_node - counts[j] % per_node) % per_node
        mate = next((k for k in by_rest.get(want, []) if k != j and k not in paired), None)
        if mate is not None:
            order += [j, mate]
            paired |= {j, mate}
    rest = [j for j in pending if j not in paired]

    def place(seq, start):
        spans, at = 0.0, start
        for j in seq:
            spans += ((at + counts[j] - 1) // per_node - at // per_node + 1) / counts[j]
            at += counts[j]
        return spans

    start = sum(counts[j] for j in order)
    best = min(itertools.islice(itertools.permutations(rest), max_orders), key=lambda seq: place(seq, start),
               default=())
    out, at = {}, 0
    for j in order + list(best):
        out[members[j]] = list(range(at, at + counts[j]))
        at += counts[j]
    return out


def nodes_spanned(indices: list[int], per_node: int) -> int:
    return len({i // per_node for i in indices})
