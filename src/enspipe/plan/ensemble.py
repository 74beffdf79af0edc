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
* ``fleet_local`` (FLEET-L): the same greedy flotilla, kept until its last member is done: each
  time one of its members finishes, the accelerators it freed go to the flotilla's others by the
  greedy's spare-accelerator rule (:func:`enspipe.plan.fleet.give_spare`), with no new members
  and no global re-plan; a round is the flotilla between two such finishes. Then the next
  flotilla is chosen from the members left.

Members train whole epochs, so a round ends on an epoch boundary and a member resumed in a later
round goes on at the next epoch from its checkpoint: each of its epochs is one whole, exactly-once
pass (every round draws a fresh epoch order from its own seed). A member's ``epochs`` bound its
training; with early stopping (``patience``) it may converge sooner, so the runner re-plans from
what each member has left after every round (:func:`plan_rounds` with ``left``). With fixed epochs
the re-plans equal the plan made up front, which the time model predicts from.
"""
from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field

from enspipe.models.networks import NetworkError, network_spec
from enspipe.plan.options import plain_name
from enspipe.plan.errors import require
from enspipe.plan.fleet import (Member, Profile, assign_accelerators, create_flotilla, efficiency_per_doubling,
                                emulated_profile, flotilla_time, give_spare, lockstep_finishes, measured_profile)

ARMS = ("default", "homogeneous", "fleet", "fleet_local")
MEMBER_KEYS = ("name", "rate", "epochs", "network", "lr", "patience", "rates", "batch_multiplier")


@dataclass(frozen=True)
class EnsembleMember:
    """One member: its name, its accelerator's rate rc (images/s on one: the profile the plan
    uses; emulated members train at it), the epochs it trains (with early stopping: at most) and,
    trained for real, its network, learning rate, early-stopping patience (epochs without a
    better validation loss; 0: none), measured rates (``enspipe profile``) and batch-size
    multiplier (an update every k shared batches)."""

    name: str
    rate: float
    epochs: int
    network: str | None = None   # None: an emulated member
    lr: float = 0.01
    patience: int = 0
    rates: tuple[float, ...] | None = None  # measured on 1, 2, ... accelerators (enspipe profile)
    batch_multiplier: int = 1    # an update every k shared batches (its batch: k x the global batch)


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
    min_delta: float = 0.0

    def __post_init__(self) -> None:
        require(len(self.members) >= 1, "members", "the ensemble has no members", "list at least one")
        names = [m.name for m in self.members]
        require(len(set(names)) == len(names), "members", f"names repeat: {names}", "give each member its own name")
        for m in self.members:
            require(isinstance(m.rate, (int, float)) and m.rate > 0, "members",
                    f"{m.name}: rate must be > 0 images/s, got {m.rate!r}", "pass its accelerator's rate rc")
            require(isinstance(m.epochs, int) and m.epochs >= 1, "members",
                    f"{m.name}: epochs must be a whole number >= 1, got {m.epochs!r}",
                    "bound its training: the epochs it takes to converge (with patience: at most)")
            problem = None
            if m.network is not None:
                try:
                    network_spec(m.network)
                except NetworkError as e:
                    problem = e
            require(problem is None, "members", f"{m.name}: {problem and problem.problem}",
                    str(problem and problem.fix))
            require(isinstance(m.lr, (int, float)) and math.isfinite(m.lr) and m.lr > 0, "members",
                    f"{m.name}: lr must be a finite number > 0, got {m.lr!r}", "e.g. lr: 0.01")
            require(isinstance(m.patience, int) and m.patience >= 0, "members",
                    f"{m.name}: patience must be a whole number >= 0, got {m.patience!r}", "e.g. patience: 2")
            require(m.rates is None or (m.network is not None and len(m.rates) >= 1 and all(
                isinstance(r, (int, float)) and math.isfinite(r) and r > 0 for r in m.rates)), "members",
                f"{m.name}: measured rates are a network's (enspipe profile), finite and > 0; got {m.rates!r}",
                "give it its network and its profile")
            require(isinstance(m.batch_multiplier, int) and m.batch_multiplier >= 1 and
                    (m.batch_multiplier == 1 or m.network is not None), "members", f"{m.name}: batch_multiplier "
                    f"must be a whole number >= 1, and > 1 only for a trained member; got {m.batch_multiplier!r}",
                    "e.g. batch_multiplier: 2, with its network")
            require(m.patience == 0 or m.network is not None, "members", f"{m.name}: early stopping needs a "
                    "validation loss, and an emulated member (no network) has none",
                    "give it a network, or leave patience out")
            require(plain_name(m.name), "members",
                    f"{m.name!r}: a name is a directory of its checkpoints", "use letters, digits, '-', '_', '.'")
        trained = {m.network is not None for m in self.members}
        require(len(trained) == 1, "members", "some members name a network and some do not: a round's members "
                "either all train for real or all are emulated", "give every member a network, or none")
        require(self.accelerators >= 1, "accelerators", f"must be >= 1, got {self.accelerators}",
                "pass the accelerators the ensemble may use")
        require(self.per_node is None or 1 <= self.per_node <= self.accelerators, "per_node",
                f"must be in 1..{self.accelerators}, got {self.per_node}", "pass the accelerators of one node")
        require(0 < self.efficiency <= 1, "efficiency", f"must be in (0, 1], got {self.efficiency}", "e.g. 0.9")
        require(0 < self.replan_below <= 1, "replan_below", f"must be in (0, 1], got {self.replan_below}",
                "the paper's 0.8")
        require(self.tolerance > 0, "tolerance", f"must be > 0, got {self.tolerance}", "e.g. 0.15")
        require(math.isfinite(self.min_delta) and self.min_delta >= 0, "min_delta",
                f"must be a finite number >= 0, got {self.min_delta}", "e.g. 0.001")

    @property
    def trains(self) -> bool:
        """Whether its members train networks for real (else their accelerators are emulated)."""
        return self.members[0].network is not None

    @classmethod
    def from_dict(cls, d: dict) -> "Ensemble":
        """From a config section: ``members`` (each ``name``, ``rate``, ``epochs`` and optionally
        ``network``, ``lr``, ``patience``) and the other fields by name; unknown keys are refused."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        require(not unknown, "ensemble", f"unknown keys {sorted(unknown)}", f"use {sorted(known)}")
        require(isinstance(d.get("members"), list), "members", "must be a list of {name, rate, epochs}",
                "list the members")
        members = []
        for i, m in enumerate(d["members"]):
            require(isinstance(m, dict) and {"name", "rate", "epochs"} <= set(m) <= set(MEMBER_KEYS), "members",
                    f"member {i} must have name, rate and epochs, and may have network, lr and patience; got {m!r}",
                    "e.g. {name: a, rate: 40, epochs: 3}")
            members.append(EnsembleMember(**{**m, "name": str(m["name"]),
                                             **({"rates": tuple(m["rates"])} if m.get("rates") else {})}))
        return cls(**{**d, "members": tuple(members)})

    def allocation_members(self, epochs: dict[int, int], num_images: int) -> list[Member]:
        """The allocator's view of every member: its emulated profile on 1..G accelerators and its
        remaining work (``epochs[i]`` x the dataset's images; 0 for a member that is done)."""
        return [Member(self.profile(i), epochs.get(i, 0) * num_images) for i in range(len(self.members))]

    def profile(self, i: int) -> Profile:
        """Member ``i``'s rates on 1..G accelerators: measured (``rates``) or emulated (``rate`` x g
        x the efficiency)."""
        return self._profiles[i]

    @functools.cached_property
    def _profiles(self) -> tuple[Profile, ...]:  # made once: the allocator asks for them over and over
        def of(m: EnsembleMember) -> Profile:
            if m.rates:
                return measured_profile(m.name, m.rates, self.accelerators)
            return emulated_profile(m.name, m.rate, self.accelerators, efficiency_per_doubling(self.efficiency))
        return tuple(of(m) for m in self.members)


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
    stop_below: int = 1  # the run ends at the first epoch end where fewer ranks train (FLEET's re-plan point)

    @property
    def ranks(self) -> int:
        return sum(self.widths)

    def steps(self, steps_per_epoch: int) -> int:
        return max(self.epochs) * steps_per_epoch

    def as_dict(self, ensemble: Ensemble) -> dict:
        return {"index": self.index, "members": [ensemble.members[i].name for i in self.members],
                "widths": list(self.widths), "epochs": list(self.epochs), "predicted_seconds": self.predicted_seconds,
                "placement": {ensemble.members[i].name: v for i, v in self.placement.items()},
                "stop_below": self.stop_below}

    @classmethod
    def from_dict(cls, d: dict, ensemble: Ensemble) -> "Round":
        """The round of :meth:`as_dict` (a resumed arm reads its finished rounds back)."""
        at = {m.name: i for i, m in enumerate(ensemble.members)}
        return cls(d["index"], tuple(at[x] for x in d["members"]), tuple(d["widths"]), tuple(d["epochs"]),
                   d["predicted_seconds"], {at[k]: v for k, v in d["placement"].items()}, d["stop_below"])


def _predicted(ens: Ensemble, idx, widths, epochs, num_images: int) -> float:
    return flotilla_time([e * num_images for e in epochs], [ens.profile(i).rate(g) for i, g in zip(idx, widths)])


def plan_rounds(ens: Ensemble, arm: str, num_images: int, left: dict[int, int] | None = None,
                first: int = 0, after: Round | None = None) -> list[Round]:
    """The rounds of ``arm`` (see the module) for the epochs ``left`` to each member (default: all
    of every member's; a member absent or at 0 is done), numbered from ``first``. ``default``
    rounds are one member each and may run at once (at most G together); the others run one after
    another. A runner re-plans from what is left after each round, so a member that stops early
    (early stopping) changes the rounds after it; ``after``, the round it ran last, is the flotilla
    that FLEET-L goes on with."""
    require(arm in ARMS, "arm", f"unknown arm {arm!r}", f"choose one of {', '.join(ARMS)}")
    left = {i: e for i, e in (left if left is not None else {i: m.epochs for i, m in enumerate(ens.members)}).items()
            if e > 0}
    order = list(range(len(ens.members)))
    random.Random(ens.seed).shuffle(order)
    order = [i for i in order if i in left]
    if arm == "default":
        return [Round(first + k, (i,), (1,), (left[i],), _predicted(ens, (i,), (1,), (left[i],), num_images))
                for k, i in enumerate(order)]
    if arm == "homogeneous":
        out = []
        for k in range(0, len(order), ens.accelerators):
            idx = tuple(sorted(order[k:k + ens.accelerators]))
            epochs = tuple(left[i] for i in idx)
            out.append(Round(first + len(out), idx, (1,) * len(idx), epochs,
                             _predicted(ens, idx, (1,) * len(idx), epochs, num_images)))
        return out
    if arm == "fleet_local":
        return _local_rounds(ens, left, num_images, first, after)
    out = []
    stop_below = math.ceil(ens.replan_below * ens.accelerators - 1e-9)  # ranks: fewer busy than 0.8 G
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
        out.append(Round(first + len(out), f.members, f.accelerators, trained,
                         _predicted(ens, f.members, f.accelerators, trained, num_images), placement,
                         stop_below=min(stop_below, sum(f.accelerators))))
        for i, e in zip(f.members, trained):
            left[i] -= e
            if left[i] == 0:
                del left[i]
    return out


def _local_rounds(ens: Ensemble, left: dict[int, int], num_images: int, first: int,
                  after: Round | None = None) -> list[Round]:
    """FLEET-L's rounds (see the module): a flotilla's members train together until the first of
    them is done; its accelerators go to the others (``give_spare``), and so on to the last.
    ``after``: the round that ran last, whose members still left go on as the flotilla."""
    out, left = [], dict(left)
    members = ens.allocation_members(left, num_images)
    ongoing = {} if after is None else {i: g for i, g in zip(after.members, after.widths) if i in left}
    if ongoing:  # the accelerators of its members that are done go to its others
        give_spare(members, ongoing, sum(after.widths) - sum(ongoing.values()))
    while left:
        members = ens.allocation_members(left, num_images)
        if ongoing:
            widths, ongoing = ongoing, {}
        else:
            f = create_flotilla(members, sorted(left), ens.accelerators, ens.tolerance)
            widths = dict(zip(f.members, f.accelerators))
        while widths:
            idx = tuple(sorted(widths))
            stop = min(left[i] for i in idx)  # epochs until the first of them is done
            acc = tuple(widths[i] for i in idx)
            trained = (stop,) * len(idx)
            out.append(Round(first + len(out), idx, acc, trained, _predicted(ens, idx, acc, trained, num_images),
                             assign_accelerators(acc, ens.per_node or ens.accelerators, idx)))
            freed = 0
            for i in idx:
                left[i] -= stop
                if left[i] == 0:
                    del left[i]
                    freed += widths.pop(i)
            give_spare(members, widths, freed)  # by the members' profiles, which their work does not change
    return out


def converged(losses: list[float], patience: int, min_delta: float = 0.0) -> bool:
    """Early stopping (as Keras's ``EarlyStopping``): the validation loss of the last ``patience``
    epochs never came ``min_delta`` below the best before them. ``patience`` 0: never (the member
    trains its epochs' bound). A non-finite loss never counts as an improvement."""
    if patience <= 0 or len(losses) <= patience:
        return False
    finite = [x for x in losses[:-patience] if math.isfinite(x)]
    best = min(finite) if finite else math.inf
    return not any(math.isfinite(x) and x < best - min_delta for x in losses[-patience:])


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


@dataclass(frozen=True)
class ArmTimes:
    """What the time model says of an arm's rounds: its makespan, each accelerator's mean wait
    (the makespan less the seconds it trained: lockstep waits for a flotilla's slowest, rounds'
    costs, accelerators left idle) and each member's run length (from its first round's start to
    its finish in its last), in member order."""

    makespan: float
    wait_per_accelerator: float
    run_lengths: tuple[float, ...]


def model_times(ens: Ensemble, arm: str, rounds: list[Round], num_images: int, round_seconds: float = 0.0) -> ArmTimes:
    """The rounds timed by the lockstep model, each costing ``round_seconds`` before it trains
    (its members' checkpoints restored and its job or communicators set up); rounds run one after
    another, or (default) list-scheduled on G accelerators (:func:`arm_slots`)."""
    slots, start, end, busy = [0.0] * arm_slots(ens, arm), {}, {}, 0.0
    for r in rounds:
        slots.sort()
        t0 = slots[0] + round_seconds
        work = [e * num_images for e in r.epochs]
        rates = [ens.profile(i).rate(g) for i, g in zip(r.members, r.widths)]
        finishes = lockstep_finishes(work, rates)
        slots[0] = t0 + max(finishes)
        for i, g, w, rate, f in zip(r.members, r.widths, work, rates, finishes):
            start.setdefault(i, t0)
            end[i] = t0 + f
            busy += g * w / rate  # its accelerators train; in lockstep a faster member waits the rest
    makespan = max(slots)
    return ArmTimes(makespan, makespan - busy / ens.accelerators, tuple(end[i] - start[i] for i in sorted(end)))
