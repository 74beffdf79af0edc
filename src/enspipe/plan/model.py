"""The cost model: every scheme's delivered rate and CPU per image, predicted from measured costs.

One member's pipeline is a chain of overlapped stages (read and preprocess, exchange, consumer),
so in the steady state a member delivers batches at the pace of its slowest stage. Per global
batch of ``B`` images of ``m`` bytes in all (``B x size^2 x 3`` x 4 bytes on a float32 wire, x 1 on
uint8), with ``c`` cores per preprocessor. enspipe places ``k`` members on a node of ``C`` cores
(``enspipe.engine.affinity.assign_cores``, ``Placement.threads``): with a core limit ``L`` and
``k L <= C`` each member is pinned to ``L`` cores of its own and sizes its pools to them; otherwise
the members share cores and each sizes its pools to ``t = max(1, min(L or C, C // k))`` threads. A
preprocessor then runs on ``c = min(t, C / busy)`` cores, ``busy`` the node's members that
preprocess (a member that only consumes uses next to no CPU, so one preprocessor among idle
members gets its ``t`` threads' cores, not ``C``):

* **preprocessing**: a preprocessor with a share of ``b`` images needs ``b / rp(c)`` seconds,
  ``rp(c)`` one member's measured preprocessing rate (calibration; linear in the cores between and
  below the measured core counts, through the origin);
* **exchange** (the scheme's collective steps, one after the other in the exchange thread):

  - within one node, through node-shared memory (enspipe's default): each contributor copies its
    block once, ``T = alpha_node / k + (m / p) / copy_bw``; nothing is copied to read; ``k`` is
    the unit, the batches a member exchanges behind one barrier
    (:meth:`enspipe.plan.schemes.Scheme.unit_batches`, ``--block-images``);
  - an all-gather among ``p`` ranks over MPI (MPICH's ring for large messages):
    ``T = (p - 1) alpha + (p - 1) / p x m / bw``;
  - a broadcast of ``m`` bytes to ``p`` ranks, by MPICH's own choice of algorithm
    (``CommCosts.bcast = "mpich"``): a binomial tree below 12 KiB or 8 ranks,
    ``T = ceil(log2 p) (alpha + m / bw)``, else scatter + ring all-gather,
    ``T = (log2 p + p - 1) alpha + 2 (p - 1) / p x m / bw``; ``"binomial"`` or
    ``"scatter_allgather"`` force one (an MPI whose large broadcasts are trees, as the paper's
    falling Single- and Multi-Broadcast curves suggest of its stack, is ``"binomial"``);
  - concurrent block broadcasts (Multi-Broadcast): the ``P`` broadcasts of ``m / P`` bytes share
    the links, ``T = sum`` of the ``P`` broadcasts; across nodes, with every root on a node of its
    own and a transport that posts them at once (``CommCosts.serial_bcasts`` false), each root
    sends over its own link at once, and a node's link in carries every block but its own:
    ``T = max(the slowest broadcast, m / bw)`` (``(P - 1) / P x m / bw`` where every member is a
    root);

  ``bw`` is the inter-node bandwidth where a collective crosses nodes, else the measured
  intra-node MPI bandwidth (a unit's MPI collectives are in flight together, but each still
  pays its own latencies: the model charges them per batch); ``alpha``/``bw``/``copy_bw``
  come from ``enspipe calibrate-comm`` (:class:`CommCosts`);
* **accelerator**: ``B / rc`` (none for the peak consumer).

A member's CPU also runs its exchange's copies, so the preprocessing stage of a member that
exchanges competes with them: its time is ``b / rp(c) + cpu_x / c``. The delivered rate is
``B / max(t_prep, t_exchange, B / rc)``; ``rate <= min(rc, max over members of rp share)``
by construction. CPU per delivered image per member: the preprocessing CPU of one batch
(``B x cpu(c')``, ``cpu(c')`` one member's measured CPU-s per image on the ``c'`` cores its
process may use) shared by the ``n`` members
that consume it (the baseline: not shared), plus the mean exchange CPU per image (the copies:
bytes a member copies / ``copy_bw``). Sharing can therefore never predict below ``1/n`` of the
baseline's CPU per image. The tf.data service is not modelled (its gRPC path has not been
fitted): :func:`predict` says so rather than guess.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from enspipe.plan.errors import ConfigError, require
from enspipe.plan.schemes import DEFAULT_BLOCK_IMAGES, SCHEME_KINDS, BlockBroadcasts, Broadcast, Gather, make_scheme


BCAST_ALGORITHMS = ("mpich", "binomial", "scatter_allgather")
MPICH_BCAST_SHORT = 12288  # bytes: MPICH's binomial broadcast below this (MPIR_CVAR_BCAST_SHORT_MSG_SIZE)
MPICH_BCAST_MIN_PROCS = 8  # ranks: and below this (MPIR_CVAR_BCAST_MIN_PROCS)


@dataclass(frozen=True)
class CommCosts:
    """Fitted collective costs (``enspipe calibrate-comm``), all in seconds and bytes/s.

    Attributes:
      alpha: latency of one MPI message step between ranks (s).
      bandwidth: intra-node MPI bandwidth (bytes/s) of the collectives' payload.
      copy_bandwidth: one core's memory copy bandwidth (bytes/s): node-shared-memory blocks.
      alpha_node: a node-shared-memory exchange's synchronisation (s).
      inter_node_bandwidth: bytes/s between nodes (a parameter where only one node was measured).
      bcast: the broadcast algorithm: ``mpich`` (MPICH's choice by size and ranks), ``binomial``
        or ``scatter_allgather``.
      serial_bcasts: a step's block broadcasts run one after another (Horovod's one background
        thread, the paper's stack); enspipe's MPI transport posts them at once (False).
      source: where the numbers came from (a file, or ``assumed``).
    """

    alpha: float = 20e-6
    bandwidth: float = 4e9
    copy_bandwidth: float = 6e9
    alpha_node: float = 20e-6
    inter_node_bandwidth: float = 12.5e9  # 100 Gb/s (InfiniBand EDR), a parameter: one node cannot measure it
    bcast: str = "mpich"
    serial_bcasts: bool = False
    source: str = "assumed"

    def __post_init__(self) -> None:
        for name in ("alpha", "alpha_node"):
            require(getattr(self, name) >= 0 and math.isfinite(getattr(self, name)), name,
                    f"must be a finite latency >= 0 s, got {getattr(self, name)}", "refit with enspipe calibrate-comm")
        for name in ("bandwidth", "copy_bandwidth", "inter_node_bandwidth"):
            require(getattr(self, name) > 0 and math.isfinite(getattr(self, name)), name,
                    f"must be a finite bandwidth > 0 bytes/s, got {getattr(self, name)}",
                    "refit with enspipe calibrate-comm")
        require(self.bcast in BCAST_ALGORITHMS, "bcast", f"must be one of {', '.join(BCAST_ALGORITHMS)}, "
                f"got {self.bcast!r}", "pick MPICH's own choice (mpich) unless your MPI is known to differ")

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> "CommCosts":
        keys = ("alpha", "bandwidth", "copy_bandwidth", "alpha_node", "inter_node_bandwidth")
        return cls(**{k: float(d[k]) for k in keys if k in d}, bcast=str(d.get("bcast", "mpich")),
                   serial_bcasts=bool(d.get("serial_bcasts", False)), source=source or d.get("source", "file"))

    def as_dict(self) -> dict:
        return {"alpha": self.alpha, "bandwidth": self.bandwidth, "copy_bandwidth": self.copy_bandwidth,
                "alpha_node": self.alpha_node, "inter_node_bandwidth": self.inter_node_bandwidth,
                "bcast": self.bcast, "serial_bcasts": self.serial_bcasts, "source": self.source}


@dataclass(frozen=True)
class Machine:
    """The inputs of a prediction that describe the cluster and the ensemble's placement.

    Attributes:
      rp: one member's preprocessing images/s by cores (``{1: 90.0, 2: 170.0}``), measured.
      cpu_per_image: one member's CPU-s per preprocessed image by cores (None: ``cores / rp``).
      rc: the accelerator's images/s per member (None: no accelerator, the peak consumer).
      nodes: nodes the n members spread over, evenly (members ``[k*n/nodes, (k+1)*n/nodes)`` on node k).
      cores_per_node: cores of one node.
      core_limit: cores per member (None: the node's cores shared by its members).
      accelerators_per_node: members on a node beyond these share an accelerator (None: one each).
      comm: the collective costs.
    """

    rp: dict
    rc: float | None
    cores_per_node: int
    nodes: int = 1
    core_limit: float | None = None
    cpu_per_image: dict | None = None
    accelerators_per_node: int | None = None
    comm: CommCosts = field(default_factory=CommCosts)

    def __post_init__(self) -> None:
        require(bool(self.rp) and all(float(c) > 0 and v > 0 for c, v in self.rp.items()), "rp",
                f"needs one member's measured preprocessing rate at one or more core counts, got {self.rp}",
                "calibrate first (the workflow's calibration, rates.json) or pass --rp CORES:RATE")
        require(self.rc is None or (self.rc > 0 and math.isfinite(self.rc)), "rc", f"must be > 0, got {self.rc}",
                "pass the accelerator's images/s, or leave it out for peak throughput")
        require(self.cores_per_node >= 1, "cores_per_node", f"must be >= 1, got {self.cores_per_node}",
                "pass the cores of one node")
        require(self.nodes >= 1, "nodes", f"must be >= 1, got {self.nodes}", "pass the number of nodes")
        require(self.core_limit is None or self.core_limit > 0, "core_limit",
                f"must be > 0, got {self.core_limit}", "pass cores per member, or leave it out")
        require(self.accelerators_per_node is None or self.accelerators_per_node >= 1, "accelerators_per_node",
                f"must be >= 1, got {self.accelerators_per_node}", "pass the accelerators of one node")

    def rate_at(self, cores: float) -> float:
        """rp(cores): interpolated linearly between the measured core counts, through the origin
        below the fewest, flat beyond the most (more cores than were measured buy nothing known)."""
        pts = sorted((float(c), float(v)) for c, v in self.rp.items())
        if cores <= pts[0][0]:
            return pts[0][1] * cores / pts[0][0]
        for (c0, v0), (c1, v1) in zip(pts, pts[1:]):
            if cores <= c1:
                return v0 + (v1 - v0) * (cores - c0) / (c1 - c0)
        return pts[-1][1]

    def cpu_at(self, cores: float) -> float:
        """CPU-s per preprocessed image at ``cores``: measured (nearest measured core count), else cores / rp."""
        if self.cpu_per_image:
            c = min(self.cpu_per_image, key=lambda k: abs(float(k) - cores))
            return float(self.cpu_per_image[c])
        return min(cores, max(float(c) for c in self.rp)) / self.rate_at(cores)


@dataclass(frozen=True)
class Prediction:
    scheme: str
    p: int
    images_per_second: float        # per member
    cpu_seconds_per_image: float    # per delivered image per member (the members' processes)
    bound: str                      # preprocessing, exchange or accelerator
    bottleneck: str                 # in words
    stages: dict                    # seconds per batch: preprocess, exchange, accelerator
    cores_per_member: float
    oversubscribed: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _layout(n: int, nodes: int) -> tuple[tuple[int, ...], ...]:
    bounds = [k * n // nodes for k in range(nodes + 1)]
    return tuple(tuple(range(bounds[k], bounds[k + 1])) for k in range(nodes) if bounds[k + 1] > bounds[k])


def _spans_nodes(group, node_of) -> bool:
    return len({node_of[r] for r in group}) > 1


def _own_links(step, node_of) -> bool:
    """Block broadcasts whose roots are each on a node of their own: they send over separate links."""
    return isinstance(step, BlockBroadcasts) and len({node_of[r] for r in step.roots}) == len(step.roots) > 1


def _gather_time(p: int, m: float, comm: CommCosts, bw: float, shm: bool, unit: int = 1) -> float:
    if p <= 1:
        return 0.0
    if shm:
        return comm.alpha_node / unit + (m / p) / comm.copy_bandwidth
    return (p - 1) * comm.alpha + (p - 1) / p * m / bw


def _bcast_time(p: int, m: float, comm: CommCosts, bw: float, shm: bool, unit: int = 1) -> float:
    if p <= 1:
        return 0.0
    if shm:
        return comm.alpha_node / unit + m / comm.copy_bandwidth  # the root's one copy in
    a, b = bcast_terms(p, m, comm.bcast)
    return a * comm.alpha + b * m / bw


def bcast_terms(p: int, m: float, algorithm: str = "mpich") -> tuple[float, float]:
    """A broadcast's cost as ``a x alpha + b x m / bw``: (a, b) for ``p`` ranks and ``m`` bytes."""
    if algorithm == "mpich":
        short = m < MPICH_BCAST_SHORT or p < MPICH_BCAST_MIN_PROCS
        algorithm = "binomial" if short else "scatter_allgather"
    if algorithm == "binomial":
        hops = math.ceil(math.log2(p))
        return hops, hops
    return math.log2(p) + p - 1, 2 * (p - 1) / p


def member_cores(cores_per_node: int, members: int, limit: float | None, busy: int) -> tuple[float, float, bool]:
    """(cores one preprocessor's pools run on, cores its process may run on, whether the node's
    members share cores) under enspipe's placement (the module's rule): ``members`` on the node,
    ``busy`` of them preprocessing. The rate follows the first, the CPU per image the second (its
    reading and runtime threads spread over every core it may use)."""
    c = cores_per_node
    own = limit is not None and limit * members <= c
    threads = limit if own else max(1, min(limit or c, c // members))
    return min(threads, c / max(1, busy)), min(limit or c, c), (not own and members > 1) or members > c


@functools.lru_cache(maxsize=4096)
def _structure(scheme_name: str, n: int, p: int | None, batch: int, nodes: int):
    """What a prediction needs of a scheme's layout, whatever the costs: the scheme, members per
    node, preprocessors on the busiest node, each step with its blocks and whether it crosses
    nodes, and each member's share (cached: a sweep over costs reuses it)."""
    layout = _layout(n, nodes)
    scheme = make_scheme(scheme_name, n, p, batch, layout)
    node_of = {r: k for k, node in enumerate(layout) for r in node}
    pre = set(scheme.preprocessors)
    # a node's cores are shared by the members that preprocess on it (a consumer that only
    # waits for batches, or an emulated accelerator, uses next to none)
    busy = max(sum(1 for r in node if r in pre) for node in layout)
    steps = tuple((step, blocks, _spans_nodes(step.group, node_of), _own_links(step, node_of))
                  for step, blocks in zip(scheme.steps, scheme.block_counts(batch)))
    shares = {r: scheme.share(r, batch) for r in range(n)}
    return scheme, max(len(node) for node in layout), busy, steps, shares


def _exchange(steps, n: int, image_bytes: int, comm: CommCosts, node_shm: bool, unit: int):
    """The exchange's seconds per batch and the bytes each member copies: the scheme's steps in
    order, each over MPI across nodes or node-shared memory within one."""
    t_x, copied = 0.0, {r: 0.0 for r in range(n)}
    for step, blocks, across, own_links in steps:
        shm = node_shm and not across
        bw = comm.inter_node_bandwidth if across else comm.bandwidth
        size = len(step.group)
        if isinstance(step, Gather):
            t_x += _gather_time(size, sum(blocks) * image_bytes, comm, bw, shm, unit)
            for r, b in zip(step.group, blocks):
                copied[r] += b * image_bytes if shm else sum(blocks) * image_bytes
        elif isinstance(step, Broadcast):
            t_x += _bcast_time(size, blocks * image_bytes, comm, bw, shm, unit)
            for r in step.group:
                copied[r] += blocks * image_bytes if (r == step.root or not shm) else 0.0
        elif isinstance(step, BlockBroadcasts):
            times, sent = [], []
            for root in step.roots:
                b = blocks[step.group.index(root)] * image_bytes
                times.append(_bcast_time(size, b, comm, bw, shm, unit))
                sent.append(b)
                for r in step.group:
                    copied[r] += b if (r == root or not shm) else 0.0
            if across and own_links and not comm.serial_bcasts:  # a node's link in: every block but its own
                into = sum(sent) - (min(sent) if set(step.group) == set(step.roots) else 0.0)
                t_x += max(max(times), into / bw)
            else:
                t_x += sum(times)
    return t_x, copied


def predict(scheme_name: str, n: int, p: int | None, batch: int, image_size: int, machine: Machine,
            wire_dtype: str = "float32", node_shm: bool = True, block_images: int = DEFAULT_BLOCK_IMAGES) -> Prediction:
    """The predicted steady state of one cell (see the module's formulas); raises
    :class:`ConfigError` for a combination the scheme does not allow, or the tf.data service."""
    kind = SCHEME_KINDS.get(scheme_name)
    if kind is not None and kind.service:
        raise ConfigError("scheme", f"{scheme_name} is not modelled (its gRPC path has not been fitted)",
                          "choose one of enspipe's schemes")
    scheme, per_node, busy, steps, shares = _structure(scheme_name, n, p, batch, min(machine.nodes, n))
    cores, allowed, oversubscribed = member_cores(machine.cores_per_node, per_node, machine.core_limit, busy)
    image_bytes = image_size * image_size * 3 * (1 if wire_dtype == "uint8" else 4)
    m = batch * image_bytes
    comm = machine.comm
    unit = scheme.unit_batches(batch, block_images)  # batches behind one node barrier
    t_x, copied = _exchange(steps, n, image_bytes, comm, node_shm, unit)
    cpu_x = {r: copied[r] / comm.copy_bandwidth for r in range(n)}
    rp = machine.rate_at(cores)
    t_prep = max((hi - lo) / rp + cpu_x[r] / cores for r, (lo, hi) in shares.items() if hi > lo)
    rc = machine.rc
    if rc is not None and machine.accelerators_per_node is not None and per_node > machine.accelerators_per_node:
        rc = rc * machine.accelerators_per_node / per_node  # members share the node's accelerators
    t_acc = batch / rc if rc else 0.0
    stages = {"preprocess": t_prep, "exchange": t_x, "accelerator": t_acc}
    bound = max(stages, key=stages.get)
    rate = batch / stages[bound]
    cpu_img = machine.cpu_at(allowed)
    made = sum(hi - lo for lo, hi in shares.values())  # images preprocessed per batch, all members
    cpu = cpu_img * made / (batch * n) + sum(cpu_x.values()) / (batch * n)  # per image delivered to each of n
    why = {
        "preprocess": (f"preprocessing: {max(hi - lo for lo, hi in shares.values())} images per batch per "
                       f"preprocessor at {rp:.0f} images/s on {cores:.3g} cores"),
        "exchange": f"exchange: {t_x * 1e3:.1f} ms per batch of {m / 1e6:.1f} MB ({len(scheme.steps)} collective steps)",
        "accelerator": f"accelerator: {rc:.0f} images/s per member" if rc else "accelerator",
    }[bound]
    return Prediction(scheme.name, scheme.p, rate, cpu, {"preprocess": "preprocessing", "exchange": "exchange",
                                                         "accelerator": "accelerator"}[bound],
                      why, stages, cores, oversubscribed)


def plan(n: int, batch: int, image_size: int, machine: Machine, wire_dtype: str = "float32",
         schemes: tuple[str, ...] | None = None, node_shm: bool = True,
         block_images: int = DEFAULT_BLOCK_IMAGES) -> list[Prediction]:
    """Every allowed (scheme, P) for n members, ranked: fastest per member first, then the least
    CPU per image (the planner's choice is the first)."""
    out = []
    for name, kind in SCHEME_KINDS.items():
        if kind.service or (schemes and name not in schemes):
            continue
        ps = range(1, kind.p_max(n) + 1) if kind.takes_p else [None]
        for p in ps:
            try:
                out.append(predict(name, n, p, batch, image_size, machine, wire_dtype, node_shm, block_images))
            except ConfigError:
                continue
    return sorted(out, key=lambda x: (-round(x.images_per_second, 6), x.cpu_seconds_per_image))


def fit_comm(measured: dict, inter_node_bandwidth: float | None = None, source: str = "") -> CommCosts:
    """Latency and bandwidth from :func:`enspipe.exchange.calibrate.measure_collectives`' table:
    a least-squares fit of the module's all-gather and (MPICH-chosen) broadcast formulas together (one alpha, one
    bandwidth; the ranks' own, intra-node MPI), the barrier as the node-shared-memory
    synchronisation, and the copy's bandwidth. The inter-node bandwidth is fitted the same way from
    the ``inter_node`` table where the ranks spanned nodes; one node cannot measure it: then it is
    the parameter given (or the default's)."""
    p = int(measured["ranks"])
    if p < 2:
        raise ValueError("a fit needs timings from at least 2 ranks")
    alpha, bw = _fit_rows(p, measured["rows"])
    between = measured.get("inter_node")
    if between:  # measured between the nodes' first ranks: it wins over a given parameter
        inter_node_bandwidth = _fit_rows(int(between["ranks"]), between["rows"])[1]
    hosts = ", ".join(measured["hosts"])
    return CommCosts(alpha=alpha, bandwidth=bw, copy_bandwidth=measured["copy_bytes"] / measured["copy_s"],
                     alpha_node=float(measured["barrier_s"]),
                     inter_node_bandwidth=inter_node_bandwidth or CommCosts().inter_node_bandwidth,
                     source=source or (f"fitted on {hosts} ({p} ranks per node, inter-node measured between "
                                       f"{between['ranks']} nodes)" if between else f"fitted on {hosts} ({p} ranks)"))


def _fit_rows(p: int, table: list[dict]) -> tuple[float, float]:
    """(alpha, bandwidth) of one table of all-gather and broadcast timings on ``p`` ranks."""
    import numpy as np

    rows, times = [], []
    for r in table:
        m = float(r["bytes"])
        rows.append([p - 1, (p - 1) / p * m])
        times.append(r["allgather_s"])
        a, b = bcast_terms(p, m)  # MPICH's algorithm at this size and rank count
        rows.append([a, b * m])
        times.append(r["bcast_s"])
    (alpha, inv_bw), *_ = np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)
    if inv_bw <= 0:  # the payloads were too small to show a bandwidth: fit the largest alone
        big = max(table, key=lambda r: r["bytes"])
        inv_bw = big["allgather_s"] / ((p - 1) / p * big["bytes"])
        alpha = 0.0
    return max(0.0, float(alpha)), 1.0 / float(inv_bw)
