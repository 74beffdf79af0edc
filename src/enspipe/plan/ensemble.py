"""A heterogeneous ensemble and the rounds each arm trains it in (pure: no MPI, nothing run).

An :class:`Ensemble` lists its members (a name, the emulated one-accelerator rate rc and the
epochs it trains to converge) and the accelerators it may use. :func:`plan_rounds` turns it into
the runs of one arm, each run a set of members trained together from one shared, exactly-once
stream (``enspipe run`` with ``--member-rates``, ``--data-parallel`` and ``--member-epochs``):

* ``default``: each member alone with its own pipeline on one accelerator; the accelerators take
  members in a seeded random order as they free up (list scheduling), so up to G runs, and G
  input pipelines, at once.
* ``homogeneous`` (SC'18 sharing): the members in a seeded random order, G at a time, one
  accelerator each, sharing one pipeline; a round ends when its slowest member is done.
* ``fleet`` (FLEET-G): the paper's greedy flotilla (:func:`enspipe.plan.fleet.create_flotilla`)
  over the members not yet done, with their remaining epochs as work; a flotilla stops at the
  first epoch end at which fewer than ``replan_below`` x G accelerators would stay busy, and the
  members not done join the next plan with the epochs they have left.

Members train whole epochs, so a round ends on an epoch boundary and a member resumed in a later
round goes on at the next epoch: each of its epochs is one whole, exactly-once pass (every round
draws a fresh epoch order from its own seed). Because every member's epochs are known, the whole
plan is known before anything runs; the runner executes it and measures how long it really took.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from enspipe.plan.errors import require
from enspipe.plan.fleet import (Member, assign_accelerators, create_flotilla, efficiency_per_doubling,
                                emulated_profile, flotilla_time)

ARMS = ("default", "homogeneous", "fleet")


@dataclass(frozen=True)
class EnsembleMember:
    """One member: its name, its emulated accelerator's rate rc (images/s on one) and the epochs
    it trains to converge."""

    name: str
    rate: float
    epochs: int


@dataclass(frozen=True)
class Ensemble:
    """A heterogeneous ensemble on ``accelerators`` emulated accelerators.

    Attributes:
      members: the members, in order (their index is their identity in every output).
      accelerators: G, the accelerators of the job (one MPI rank each when they train).
      per_node: accelerators per node, for the node-aware placement (default: all on one node).
      efficiency: the emulated scaling efficiency per doubling of a member's accelerators.
      replan_below: FLEET's alpha: re-plan when fewer than this share of G would stay busy.
      tolerance: the greedy's rate tolerance, relative to the flotilla's fastest member.
      seed: the random order of the default and homogeneous arms.
    """

    members: tuple[EnsembleMember, ...]
    accelerators: int
    per_node: int | None = None
    efficiency: float = 0.9
    replan_below: float = 0.8
    tolerance: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        require(len(self.members) >= 1, "members", "the ensemble has no members", "list at least one")
        names = [m.name for m in self.members]
        require(len(set(names)) == len(names), "members", f"names repeat: {names}", "give each member its own name")
        for m in self.members:
            require(isinstance(m.rate, (int, float)) and m.rate > 0, "members",
                    f"{m.name}: rate must be > 0 images/s, got {m.rate!r}", "pass its accelerator's rate rc")
            require(isinstance(m.epochs, int) and m.epochs >= 1, "members",
                    f"{m.name}: epochs must be a whole number >= 1, got {m.epochs!r}",
                    "bound its training: the epochs it takes to converge")
        require(self.accelerators >= 1, "accelerators", f"must be >= 1, got {self.accelerators}",
                "pass the accelerators the ensemble may use")
        require(self.per_node is None or 1 <= self.per_node <= self.accelerators, "per_node",
                f"must be in 1..{self.accelerators}, got {self.per_node}", "pass the accelerators of one node")
        require(0 < self.efficiency <= 1, "efficiency", f"must be in (0, 1], got {self.efficiency}", "e.g. 0.9")
        require(0 < self.replan_below <= 1, "replan_below", f"must be in (0, 1], got {self.replan_below}",
                "the paper's 0.8")
        require(self.tolerance > 0, "tolerance", f"must be > 0, got {self.tolerance}", "e.g. 0.15")

    @classmethod
    def from_dict(cls, d: dict) -> "Ensemble":
        """From a config section: ``members`` (each ``name``, ``rate``, ``epochs``) and the other
        fields by name; unknown keys are refused."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        require(not unknown, "ensemble", f"unknown keys {sorted(unknown)}", f"use {sorted(known)}")
        require(isinstance(d.get("members"), list), "members", "must be a list of {name, rate, epochs}",
                "list the members")
        members = []
        for i, m in enumerate(d["members"]):
            require(isinstance(m, dict) and set(m) == {"name", "rate", "epochs"}, "members",
                    f"member {i} must have exactly name, rate and epochs, got {m!r}", "e.g. {name: a, rate: 40, epochs: 3}")
            members.append(EnsembleMember(str(m["name"]), m["rate"], m["epochs"]))
        return cls(**{**d, "members": tuple(members)})

    def allocation_members(self, epochs: dict[int, int], num_images: int) -> list[Member]:
        """The allocator's view of every member: its emulated profile on 1..G accelerators and its
        remaining work (``epochs[i]`` x the dataset's images; 0 for a member that is done)."""
        eff = efficiency_per_doubling(self.efficiency)
        return [Member(emulated_profile(m.name, m.rate, self.accelerators, eff), epochs.get(i, 0) * num_images)
                for i, m in enumerate(self.members)]


@dataclass(frozen=True)
class Round:
    """One run of an arm: which members train together, on how many accelerators each, for how
    many epochs, and what the time model predicts for it."""

    index: int
    members: tuple[int, ...]
    widths: tuple[int, ...]
    epochs: tuple[int, ...]          # epochs each trains in this round
    predicted_seconds: float
    placement: dict = field(default_factory=dict, compare=False)  # member -> accelerator indices

    @property
    def ranks(self) -> int:
        return sum(self.widths)

    def steps(self, steps_per_epoch: int) -> int:
        return max(self.epochs) * steps_per_epoch

    def as_dict(self, ensemble: Ensemble) -> dict:
        return {"index": self.index, "members": [ensemble.members[i].name for i in self.members],
                "widths": list(self.widths), "epochs": list(self.epochs), "predicted_seconds": self.predicted_seconds,
                "placement": {ensemble.members[i].name: v for i, v in self.placement.items()}}


def _predicted(ens: Ensemble, idx, widths, epochs, num_images: int) -> float:
    eff = efficiency_per_doubling(ens.efficiency)
    return flotilla_time([e * num_images for e in epochs],
                         [ens.members[i].rate * g * eff(g) for i, g in zip(idx, widths)])


def plan_rounds(ens: Ensemble, arm: str, num_images: int) -> list[Round]:
    """The rounds of ``arm`` (see the module). ``default`` rounds are one member each and may run
    at once (at most G together); the others run one after another."""
    require(arm in ARMS, "arm", f"unknown arm {arm!r}", f"choose one of {', '.join(ARMS)}")
    order = list(range(len(ens.members)))
    random.Random(ens.seed).shuffle(order)
    if arm == "default":
        return [Round(k, (i,), (1,), (ens.members[i].epochs,), _predicted(ens, (i,), (1,), (ens.members[i].epochs,),
                                                                          num_images))
                for k, i in enumerate(order)]
    if arm == "homogeneous":
        out = []
        for k in range(0, len(order), ens.accelerators):
            idx = tuple(sorted(order[k:k + ens.accelerators]))
            epochs = tuple(ens.members[i].epochs for i in idx)
            out.append(Round(len(out), idx, (1,) * len(idx), epochs, _predicted(ens, idx, (1,) * len(idx), epochs,
                                                                                 num_images)))
        return out
    left = {i: m.epochs for i, m in enumerate(ens.members)}
    out = []
    while left:
        members = ens.allocation_members(left, num_images)
        f = create_flotilla(members, sorted(left), ens.accelerators, ens.tolerance)
        epochs = [left[i] for i in f.members]
        stop = max(epochs)
        for k in sorted(set(epochs)):  # the first epoch end at which too few accelerators stay busy
            if sum(g for g, e in zip(f.accelerators, epochs) if e > k) < ens.replan_below * ens.accelerators:
                stop = k
                break
        trained = tuple(min(e, stop) for e in epochs)
        placement = assign_accelerators(f.accelerators, ens.per_node or ens.accelerators, f.members)
        out.append(Round(len(out), f.members, f.accelerators, trained,
                         _predicted(ens, f.members, f.accelerators, trained, num_images), placement))
        for i, e in zip(f.members, trained):
            left[i] -= e
            if left[i] == 0:
                del left[i]
    return out


def list_schedule(durations: list[float], slots: int) -> float:
    """The makespan of jobs of these durations taken in order by whichever of ``slots`` frees first."""
    free = [0.0] * slots
    for d in durations:
        free.sort()
        free[0] += d
    return max(free)


def arm_slots(ens: Ensemble, arm: str) -> int:
    """How many of an arm's rounds run at once: G for default (a member per accelerator), else 1."""
    return ens.accelerators if arm == "default" else 1


def predicted_makespan(ens: Ensemble, arm: str, rounds: list[Round]) -> float:
    """The time model's makespan: rounds one after another, or (default) list-scheduled on G."""
    return list_schedule([r.predicted_seconds for r in rounds], arm_slots(ens, arm))
