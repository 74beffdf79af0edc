"""The four pipelines as small declarative descriptions: who preprocesses which share of each
global batch, and which group collectives assemble the batch on every member.

A :class:`Scheme` is data, not code: :mod:`enspipe.exchange.engine` executes its steps.

* ``baseline``: n duplicated pipelines; every member preprocesses whole batches of its own stream.
* ``all_shared``: every member preprocesses 1/n of each batch; all-gather(v) over all n.
* ``single_broadcast``: members 0..p-1 preprocess 1/p and all-gather among themselves; the leader
  p-1 broadcasts the batch to the group {p-1, ..., n-1}.
* ``multi_broadcast``: each preprocessor i < p broadcasts its block to all n members, the p
  broadcasts in flight at once.
"""
from __future__ import annotations

from dataclasses import dataclass

from enspipe.plan.config import ConfigError


@dataclass(frozen=True)
class Gather:
    """All-gather(v): every member of ``group`` contributes its block; all end with the batch."""

    group: tuple[int, ...]


@dataclass(frozen=True)
class Broadcast:
    """``root`` (a global rank, member of ``group``) sends its whole batch to ``group``."""

    group: tuple[int, ...]
    root: int


@dataclass(frozen=True)
class BlockBroadcasts:
    """Every root sends its own block to ``group``, all broadcasts in flight at once."""

    group: tuple[int, ...]
    roots: tuple[int, ...]


Step = Gather | Broadcast | BlockBroadcasts


@dataclass(frozen=True)
class Scheme:
    name: str
    n: int
    p: int
    preprocessors: tuple[int, ...]
    steps: tuple[Step, ...]
    shared: bool  # members consume the same batches (one stream) vs. own streams (baseline)

    def share(self, rank: int, batch: int) -> tuple[int, int]:
        """The ``[lo, hi)`` offsets within each global batch that ``rank`` preprocesses."""
        if rank not in self.preprocessors:
            return (0, 0)
        if not self.shared:
            return (0, batch)
        i, p = self.preprocessors.index(rank), len(self.preprocessors)
        lo = i * (batch // p) + min(i, batch % p)
        return lo, lo + batch // p + (1 if i < batch % p else 0)

    def role(self, rank: int) -> str:
        if any(isinstance(s, Broadcast) and s.root == rank for s in self.steps):
            return "leader"
        return "preprocessor" if rank in self.preprocessors else "compute-only"

    def groups(self) -> list[tuple[int, ...]]:
        """Distinct communicator groups, in a fixed order (every rank builds them alike)."""
        seen: list[tuple[int, ...]] = []
        for s in self.steps:
            if s.group not in seen:
                seen.append(s.group)
        return seen


def make_scheme(name: str, n: int, p: int | None, batch: int) -> Scheme:
    """Resolve and validate a scheme for ``n`` members; raises :class:`ConfigError` naming the fix."""
    if n < 1:
        raise ConfigError("n", f"an ensemble needs at least one member, got {n}", "launch with mpiexec -n N, N >= 1")
    if name not in ("baseline", "all_shared", "single_broadcast", "multi_broadcast"):
        raise ConfigError("scheme", f"unknown scheme {name!r}",
                          "choose baseline, all_shared, single_broadcast or multi_broadcast")
    everyone = tuple(range(n))
    if name in ("baseline", "all_shared"):
        if p is not None and p != n:
            raise ConfigError("preprocessors", f"{name} uses every member as a preprocessor (P = N = {n}), got P = {p}",
                              "leave --preprocessors out for this scheme")
        if name == "baseline":
            return Scheme(name, n, n, everyone, (), shared=False)
        _check_batch(batch, n)
        return Scheme(name, n, n, everyone, _nontrivial(Gather(everyone)), shared=True)
    rule = "1 <= P < N" if name == "single_broadcast" else "1 <= P <= N"
    if p is None:
        raise ConfigError("preprocessors", f"{name} needs the number of preprocessors P ({rule})",
                          f"pass --preprocessors P with {rule} = {n}")
    if not 1 <= p <= n or (name == "single_broadcast" and p == n):
        same = " (P = N is All-Shared)" if name == "single_broadcast" and p == n else ""
        raise ConfigError("preprocessors", f"{name} needs {rule} = {n}, got P = {p}{same}",
                          f"pass --preprocessors between 1 and {n - 1 if name == 'single_broadcast' else n}"
                          + (", or use --scheme all_shared" if same else ""))
    _check_batch(batch, p)
    pre = tuple(range(p))
    if name == "single_broadcast":
        steps: tuple[Step, ...] = (Gather(pre),) if p > 1 else ()
        return Scheme(name, n, p, pre, steps + (Broadcast(tuple(range(p - 1, n)), p - 1),), shared=True)
    return Scheme(name, n, p, pre, _nontrivial(BlockBroadcasts(everyone, pre)), shared=True)


def _nontrivial(*steps: Step) -> tuple[Step, ...]:
    """A collective within a group of one moves nothing: leave it out."""
    return tuple(s for s in steps if len(s.group) > 1)


def _check_batch(batch: int, p: int) -> None:
    if batch < p:
        raise ConfigError("batch_size", f"a batch of {batch} cannot be split among {p} preprocessors "
                                        "(needs batch >= P)", f"use --batch-size >= {p} or fewer preprocessors")
