"""How a data-parallel member's gradients are grouped into blocks, and what each exchange costs a
step (pure: no MPI, nothing run).

A :class:`LayerProfile` (``enspipe profile``) lists a network's trainable variables in forward
order with each one's gradient size and when backpropagation makes it (seconds after it starts,
at a rank's share of the batch), and the forward pass's time.

* :func:`fixed_blocks` (``--gradient-exchange blocks``): in reverse layer order, consecutive
  variables filled into blocks of about ``block_bytes`` (PyTorch DDP's buckets, Horovod's fusion).
* :func:`prophet_blocks` (``prophet``; Zhang et al., ICPP 2021): gradients come in bursts
  (stages) separated by long computations; a stage starts where the gap to the gradient before it
  is more than :data:`STAGE_GAP` times the mean gap. Where they come steadily instead (no such gap:
  TensorFlow on CPUs makes them one by one), a stage closes once it has lasted that long, the same
  time scale. At each stage the block sent is the
  highest-priority (lowest-index, the next forward pass needs it first) gradients ready and not
  yet sent, as many as the collective can move before the next stage begins; the rest wait and
  yield to higher-priority ones from later stages. After the last stage what is left goes in
  priority order, in blocks large enough that latency is at most a tenth of each.
* :func:`simulate_step`: one steady-state step of each option on a profile, for a network of a
  given bandwidth and latency: blocks move one at a time in posting order; the next forward pass
  starts when every sum is in, or (prophet) layer by layer as its block's sum arrives.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from enspipe.plan.errors import require

EXCHANGES = ("whole", "blocks", "prophet", "ako")  # --gradient-exchange: how a data-parallel member's ranks sum
HOOKED = ("blocks", "prophet")  # blocks handed to the exchange by hooks as backpropagation makes them
DEFERRED = ("prophet",)  # the sums are applied at the next step's start, gating its forward pass
STAGE_GAP = 20.0  # Prophet's stage boundary: a gap this many times the mean gap between gradients
LATENCY_SHARE = 0.1  # the final stage's blocks: latency at most this share of a block's time
PROPHET_GAIN = "up to 1.40x over priority-based scheduling (P3, ByteScheduler) on EC2 (ICPP'21)"


@dataclass(frozen=True)
class LayerProfile:
    """A network's gradients as one rank makes them (``enspipe profile``'s ``layers``).

    Attributes:
      names, sizes: the trainable variables in forward order and their gradients' bytes.
      ready: when each gradient exists, seconds after backpropagation starts (the loss is known).
      forward: the forward pass's seconds (from the step's start to the loss).
      batch: the rank's share of the batch it was measured at.
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    ready: tuple[float, ...]
    forward: float
    batch: int

    def __post_init__(self) -> None:
        require(len(self.names) == len(self.sizes) == len(self.ready) >= 1, "gradient_profile",
                f"{len(self.names)} names, {len(self.sizes)} sizes and {len(self.ready)} times do not pair up",
                "measure it again with enspipe profile")
        require(all(s > 0 for s in self.sizes) and all(math.isfinite(t) and t >= 0 for t in self.ready)
                and self.forward >= 0, "gradient_profile", "sizes must be > 0 and times finite and >= 0",
                "measure it again with enspipe profile")

    @classmethod
    def from_dict(cls, d: dict) -> "LayerProfile":
        return cls(tuple(d["names"]), tuple(int(x) for x in d["bytes"]), tuple(float(x) for x in d["ready_s"]),
                   float(d["forward_s"]), int(d["batch"]))

    def as_dict(self) -> dict:
        return {"names": list(self.names), "bytes": list(self.sizes), "ready_s": list(self.ready),
                "forward_s": self.forward, "batch": self.batch}

    @property
    def backward(self) -> float:
        return max(self.ready)

    def compute_times(self) -> tuple[list[float], list[float]]:
        """Each variable's share of the backward pass (the time since the gradient made before it)
        and of the forward pass (the forward's time split in the same proportions)."""
        order = sorted(range(len(self.ready)), key=lambda i: self.ready[i])
        back, last = [0.0] * len(order), 0.0
        for i in order:
            back[i], last = self.ready[i] - last, self.ready[i]
        total = sum(back) or 1.0
        return back, [self.forward * b / total for b in back]


def allreduce_seconds(nbytes: float, ranks: int, bandwidth: float, latency: float) -> float:
    """A ring all-reduce of ``nbytes`` among ``ranks``: 2 (g-1) steps of latency, and each rank
    sends and receives 2 (g-1)/g of the payload at ``bandwidth`` bytes/s."""
    if ranks <= 1:
        return 0.0
    return 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * nbytes / bandwidth


def fixed_blocks(sizes: tuple[int, ...], block_bytes: float) -> list[list[int]]:
    """Variable indices in blocks of about ``block_bytes``, last layers first (posting order)."""
    require(block_bytes > 0 and math.isfinite(block_bytes), "gradient_block_mb",
            f"must be a finite size > 0, got {block_bytes / 2**20:g} MB", "pass e.g. 4")
    blocks, block, filled = [], [], 0
    for i in reversed(range(len(sizes))):
        if block and filled + sizes[i] > block_bytes:
            blocks.append(block)
            block, filled = [], 0
        block.append(i)
        filled += sizes[i]
    return blocks + [block]


def stages(p: LayerProfile) -> list[list[int]]:
    """The gradients in the order they are made, cut where a gap exceeds :data:`STAGE_GAP` times
    the mean gap (Prophet's stepwise pattern), or where a stage has lasted that long."""
    order = sorted(range(len(p.ready)), key=lambda i: (p.ready[i], -i))
    gaps = [p.ready[b] - p.ready[a] for a, b in zip(order, order[1:])]
    cut = STAGE_GAP * (sum(gaps) / len(gaps)) if gaps else math.inf
    out, began = [[order[0]]], p.ready[order[0]]
    for i, gap in zip(order[1:], gaps):
        if gap > cut or p.ready[i] - began > cut:
            out.append([])
            began = p.ready[i]
        out[-1].append(i)
    return out


def prophet_blocks(p: LayerProfile, ranks: int, bandwidth: float, latency: float) -> list[list[int]]:
    """Prophet's blocks in posting order (see the module), for an all-reduce among ``ranks`` at
    ``bandwidth`` bytes/s and ``latency`` s a step."""
    require(ranks >= 2, "gradient_exchange", "prophet plans a member's exchange among its ranks",
            "use it for a data-parallel member (--data-parallel >= 2)")
    parts = stages(p)
    ends = [max(p.ready[i] for i in s) for s in parts]
    blocks, pending = [], []
    for s, stage in enumerate(parts[:-1]):
        pending = sorted(pending + stage)
        window = ends[s + 1] - ends[s]  # until the next stage is ready
        block, t = [], 0.0
        for i in pending:  # highest priority first; the first that does not fit waits, and all after it
            t_i = allreduce_seconds(sum(p.sizes[j] for j in block) + p.sizes[i], ranks, bandwidth, latency)
            if t_i > window:
                break
            block, t = block + [i], t_i
        if block:
            blocks.append(block)
            pending = [i for i in pending if i not in block]
    pending = sorted(pending + parts[-1])
    least = ranks * latency * bandwidth / LATENCY_SHARE  # 2 (g-1) latency <= LATENCY_SHARE of the block's time
    block, filled = [], 0
    for i in pending:
        block.append(i)
        filled += p.sizes[i]
        if filled >= least:
            blocks.append(block)
            block, filled = [], 0
    return blocks + ([block] if block else [])


def simulate_step(p: LayerProfile, blocks: list[list[int]], deferred: bool, ranks: int, bandwidth: float,
                  latency: float) -> float:
    """One steady-state step's seconds (see the module): the forward pass, backpropagation with the
    blocks posted as they become ready and sent one at a time, and the next forward pass's start."""
    _, fwd = p.compute_times()
    free, done = 0.0, {}
    for k, b in enumerate(blocks):
        start = max(p.forward + max(p.ready[i] for i in b), free)
        free = start + allreduce_seconds(sum(p.sizes[i] for i in b), ranks, bandwidth, latency)
        for i in b:
            done[i] = free
    compute_end = p.forward + p.backward
    if not deferred:
        return max(compute_end, free)
    t = compute_end  # the next forward pass, layer by layer, each once its sum is in
    for i in range(len(p.sizes)):
        t = max(t, done[i]) + fwd[i]
    return t - p.forward


@dataclass(frozen=True)
class ExchangeSpec:
    """A data-parallel member's gradient exchange, as the run's options give it (``--gradient-*``,
    ``--ako-partitions``; ``comm``: ``--plan-comm``'s collective costs, None: assumed)."""

    kind: str = "whole"
    block_bytes: float = 4 * 2**20
    profile: str | None = None
    comm: str | None = None
    partitions: int | None = None

    @property
    def deferred(self) -> bool:
        return self.kind in DEFERRED

    @property
    def waiting_threads(self) -> int:
        """TensorFlow inter-op threads beyond the computation's that the exchange needs: one for the
        hooks that hand blocks over (with one thread they run only once backpropagation ends), one
        more for a deferred apply, which sleeps until its sums arrive."""
        return int(self.kind in HOOKED) + int(self.deferred)

    def label(self) -> str:
        """What every output of a run with it says."""
        if self.kind == "ako":
            return (f"ako ({self.partitions} partitions, one sent a step): partial exchange, the member's replicas "
                    "differ; not an equivalent of the whole all-reduce")
        return {"whole": "whole: one all-reduce after backpropagation",
                "blocks": f"blocks of {self.block_bytes / 2**20:g} MB all-reduced during backpropagation",
                "prophet": "prophet: Prophet's blocks and order, applied as the next forward pass needs them"}[self.kind]


def blocks_for(spec: ExchangeSpec, sizes: tuple[int, ...], ranks: int, profile: LayerProfile | None = None,
               bandwidth: float = 4e9, latency: float = 20e-6) -> list[list[int]]:
    """The member's blocks in posting order: ``blocks``' fixed sizes, or Prophet's from its profile
    (whose variables must be the member's)."""
    if spec.kind == "blocks":
        return fixed_blocks(sizes, spec.block_bytes)
    require(profile is not None and tuple(profile.sizes) == tuple(sizes), "gradient_profile",
            f"the profile's {0 if profile is None else len(profile.sizes)} gradients are not the network's "
            f"{len(sizes)} of these sizes", "profile the network at this image size (enspipe profile --force)")
    return prophet_blocks(profile, ranks, bandwidth, latency)


def whole_block(p: LayerProfile) -> list[list[int]]:
    """The whole gradient as one block, sent once backpropagation ends."""
    return [list(range(len(p.sizes)))]
