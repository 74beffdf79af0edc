"""The sharing schemes, registered once: who preprocesses which share of each global batch, and
which group collectives assemble the batch on every member.

A :class:`Scheme` is data, not code: :mod:`enspipe.exchange.engine` executes its steps. Each kind
of scheme is one :class:`SchemeKind` in :data:`SCHEME_KINDS`, which everything else reads (the
command line's choices, the run config, the workflow's schema and wildcards, the grid, the
tables, the benchmarks). A kind's ``plan`` sees the node layout (which ranks share a node), so a
scheme that works per node is a plan like any other.

* ``baseline``: n duplicated pipelines; every member preprocesses whole batches of its own stream.
* ``all_shared``: every member preprocesses 1/n of each batch; all-gather(v) over all n.
* ``single_broadcast``: members 0..p-1 preprocess 1/p and all-gather among themselves; the leader
  p-1 broadcasts the batch to the group {p-1, ..., n-1}.
* ``multi_broadcast``: each preprocessor i < p broadcasts its block to all n members, the p
  broadcasts in flight at once.
* ``hierarchical``: every member preprocesses 1/n; all-gather within each node, all-gather of the
  nodes' parts among one leader per node, then each leader broadcasts the batch within its node.
* ``tfdata_service``: not enspipe's: TensorFlow's tf.data service, measured in the same cells as a
  peer. Members 0..p-1 host its workers (member 0 its dispatcher too), each preprocessing the whole
  stream; every member reads the shared job through the cross-trainer cache (at most once per
  member, not exactly once). :mod:`enspipe.run.service` runs it; it has no collective steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from enspipe.plan.errors import ConfigError

Nodes = tuple[tuple[int, ...], ...]  # the ranks of each node, each ascending, nodes by lowest rank
DEFAULT_BLOCK_IMAGES = 32  # --block-images: a member's share of a unit holds at least this many images
MAX_UNIT_BATCHES = 8  # a unit's batches all sit in the exchange's slots at once: bounds their memory


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
    service: bool = False  # the tf.data service delivers the batches, not enspipe's exchange

    @property
    def exactly_once(self) -> bool:
        """Whether every member must see each sample exactly once per epoch (the cell fails
        otherwise): enspipe's schemes; the tf.data service promises at most once."""
        return not self.service

    def share(self, rank: int, batch: int) -> tuple[int, int]:
        """The ``[lo, hi)`` offsets within each global batch that ``rank`` preprocesses."""
        if rank not in self.preprocessors:
            return (0, 0)
        if not self.shared or self.service:  # a service worker makes whole batches of its own stream
            return (0, batch)
        i, p = self.preprocessors.index(rank), len(self.preprocessors)
        lo = i * (batch // p) + min(i, batch % p)
        return lo, lo + batch // p + (1 if i < batch % p else 0)

    def unit_batches(self, batch: int, block_images: int, steps: int | None = None) -> int:
        """How many consecutive global batches a member reads, preprocesses and exchanges at a time:
        enough that the smallest preprocessor's share of them holds ``block_images`` images, at
        most :data:`MAX_UNIT_BATCHES`. A tf.data call and a collective each cost about as much
        whatever they carry (~2 ms per slice to preprocess, a barrier per exchange), so a member
        with 1/n of each batch pays n times the baseline's per image unless it works on n batches'
        shares at once. The same on every rank (it depends on the scheme only).

        With ``steps``, the measured window's length, the unit is the largest not above that which
        divides it: the window is then whole units, so its two edges fall at the same point of the
        producers' cycle and its CPU counts the work of the batches it delivered (a window of 30
        steps in units of 4 counted 7-13% less preprocessing than it delivered)."""
        shares = [hi - lo for lo, hi in (self.share(r, batch) for r in self.preprocessors)]
        smallest = min((s for s in shares if s > 0), default=batch)
        unit = max(1, min(MAX_UNIT_BATCHES, -(-block_images // smallest)))
        return unit if not steps else max(k for k in range(1, unit + 1) if steps % k == 0)

    def role(self, rank: int) -> str:
        if self.service:
            return "dispatcher+worker" if rank == 0 else ("worker" if rank in self.preprocessors else "trainer")
        if any(isinstance(s, Broadcast) and s.root == rank for s in self.steps):
            return "leader"
        return "preprocessor" if rank in self.preprocessors else "compute-only"

    def groups(self) -> list[tuple[int, ...]]:
        """Distinct communicator groups, in a fixed order (every rank builds them alike)."""
        return list(self.uses())

    def uses(self) -> dict[tuple[int, ...], int]:
        """How many steps each distinct group takes part in, groups in order of first use."""
        uses: dict[tuple[int, ...], int] = {}
        for s in self.steps:
            uses[s.group] = uses.get(s.group, 0) + 1
        return uses

    def block_counts(self, batch: int) -> list[list[int] | int]:
        """Per step, when every preprocessor contributes its whole share: the samples each member
        of a gather's or block broadcasts' group contributes (what it holds by then), or a
        broadcast's batch size (what its root holds)."""
        held = {r: ((r,) if r in self.preprocessors else ()) for r in range(self.n)}

        def size(ranks) -> int:
            return sum(hi - lo for lo, hi in (self.share(r, batch) for r in ranks))

        out: list[list[int] | int] = []
        for s in self.steps:
            if isinstance(s, Broadcast):
                out.append(size(held[s.root]))
                whole = held[s.root]
            else:
                givers = s.group if isinstance(s, Gather) else s.roots
                out.append([size(held[r]) if r in givers else 0 for r in s.group])
                whole = tuple(r for g in givers for r in held[g])
            for r in s.group:
                held[r] = whole
        return out


def one_node(n: int) -> Nodes:
    """The layout when nothing says otherwise: all members on one node."""
    return (tuple(range(n)),)


def node_groups(node_of: list[int]) -> Nodes:
    """The layout from each rank's node id (e.g. its shared-memory domain's lowest world rank)."""
    groups: dict[int, list[int]] = {}
    for rank, node in enumerate(node_of):
        groups.setdefault(node, []).append(rank)
    return tuple(sorted(tuple(g) for g in groups.values()))


Plan = tuple[tuple[int, ...], tuple["Step", ...]]  # (preprocessors, steps)


def _baseline(n: int, p: int, nodes: Nodes) -> Plan:
    return tuple(range(n)), ()


def _all_shared(n: int, p: int, nodes: Nodes) -> Plan:
    return tuple(range(n)), (Gather(tuple(range(n))),)


def _single_broadcast(n: int, p: int, nodes: Nodes) -> Plan:
    pre = tuple(range(p))
    return pre, (Gather(pre), Broadcast(tuple(range(p - 1, n)), p - 1))


def _multi_broadcast(n: int, p: int, nodes: Nodes) -> Plan:
    pre = tuple(range(p))
    return pre, (BlockBroadcasts(tuple(range(n)), pre),)


def _hierarchical(n: int, p: int, nodes: Nodes) -> Plan:
    # Shares go node by node, so each node's part of the batch is one range and the leaders'
    # all-gather assembles the batch in order (the same batch as All-Shared's).
    pre = tuple(r for node in nodes for r in node)
    if len(nodes) == 1:  # one node: the node's all-gather is the whole exchange
        return pre, (Gather(pre),)
    leaders = tuple(node[0] for node in nodes)
    return pre, (*(Gather(node) for node in nodes), Gather(leaders),
                 *(Broadcast(node, node[0]) for node in nodes))


def _tfdata_service(n: int, p: int, nodes: Nodes) -> Plan:
    return tuple(range(p)), ()  # the workers' hosts; no collectives: the service moves the batches


@dataclass(frozen=True)
class SchemeKind:
    """One registered scheme.

    Attributes:
      name: its name on the command line, in configs and in results.
      summary: one line saying what it does.
      plan: ``(n, p, nodes) -> (preprocessors, steps)``; steps within a group of one are dropped.
      shared: whether members consume the same batches (everything but the baseline).
      p_max: the largest P for n members (``None``: every member preprocesses, P = N, not chosen).
      service: whether TensorFlow's tf.data service delivers the batches (a peer system run in
        the same cells, :mod:`enspipe.run.service`) rather than enspipe's exchange.
    """

    name: str
    summary: str
    plan: Callable[[int, int, Nodes], Plan]
    shared: bool = True
    p_max: Callable[[int], int] | None = None
    service: bool = False

    @property
    def takes_p(self) -> bool:
        return self.p_max is not None

    @property
    def p_rule(self) -> str:
        """The rule P obeys, as error messages state it."""
        return "1 <= P < N" if self.p_max is not None and self.p_max(2) < 2 else "1 <= P <= N"


SCHEME_KINDS: dict[str, SchemeKind] = {k.name: k for k in (
    SchemeKind("baseline", "n duplicated pipelines: each member reads and preprocesses its own stream",
               _baseline, shared=False),
    SchemeKind("all_shared", "each member preprocesses 1/n of every batch; all-gather among all n", _all_shared),
    SchemeKind("single_broadcast", "P members preprocess and all-gather; one broadcasts to the rest",
               _single_broadcast, p_max=lambda n: n - 1),
    SchemeKind("multi_broadcast", "P members preprocess; each broadcasts its block to all n at once",
               _multi_broadcast, p_max=lambda n: n),
    SchemeKind("hierarchical", "each member preprocesses 1/n; all-gather per node, across node leaders, "
               "then a broadcast within each node", _hierarchical),
    SchemeKind("tfdata_service", "the peer: TensorFlow's tf.data service, P workers (member 0 also the dispatcher) "
               "preprocessing the whole stream each, every member a trainer on the cross-trainer cache (at most once)",
               _tfdata_service, p_max=lambda n: n, service=True),
)}


def make_scheme(name: str, n: int, p: int | None, batch: int, nodes: Nodes | None = None) -> Scheme:
    """Resolve and validate a scheme for ``n`` members on ``nodes`` (default: one node); raises
    :class:`ConfigError` naming the fix."""
    if n < 1:
        raise ConfigError("n", f"an ensemble needs at least one member, got {n}", "launch with mpiexec -n N, N >= 1")
    if name not in SCHEME_KINDS:
        raise ConfigError("scheme", f"unknown scheme {name!r}", f"choose one of {', '.join(SCHEME_KINDS)}")
    kind = SCHEME_KINDS[name]
    nodes = nodes or one_node(n)
    if sorted(r for node in nodes for r in node) != list(range(n)):
        raise ValueError(f"a node layout must hold each of the {n} ranks once, got {nodes}")
    if not kind.takes_p:
        if p is not None and p != n:
            raise ConfigError("preprocessors", f"{name} uses every member as a preprocessor (P = N = {n}), got P = {p}",
                              "leave --preprocessors out for this scheme")
        p = n
    else:
        rule = kind.p_rule
        if p is None:
            raise ConfigError("preprocessors", f"{name} needs the number of preprocessors P ({rule})",
                              f"pass --preprocessors P with {rule} = {n}")
        if not 1 <= p <= kind.p_max(n):
            same = " (P = N is All-Shared)" if p == n and kind.p_max(n) < n else ""
            raise ConfigError("preprocessors", f"{name} needs {rule} = {n}, got P = {p}{same}",
                              f"pass --preprocessors between 1 and {kind.p_max(n)}"
                              + (", or use --scheme all_shared" if same else ""))
    if kind.shared:
        _check_batch(batch, p)
    pre, steps = kind.plan(n, p, nodes)
    return Scheme(name, n, p, pre, _nontrivial(*steps), shared=kind.shared, service=kind.service)


def _nontrivial(*steps: Step) -> tuple[Step, ...]:
    """A collective within a group of one moves nothing: leave it out."""
    return tuple(s for s in steps if len(s.group) > 1)


def _check_batch(batch: int, p: int) -> None:
    if batch < p:
        raise ConfigError("batch_size", f"a batch of {batch} cannot be split among {p} preprocessors "
                                        "(needs batch >= P)", f"use --batch-size >= {p} or fewer preprocessors")


# Not a scheme: ``--scheme auto`` (and ``auto`` in a config's experiment) runs the cost model's
# first choice of scheme and P for the cell's own members, placement and calibration
# (``enspipe.plan.planner.choose``), made when the cell starts; its results are labelled planned.
AUTO = "auto"
