"""What one rank of a cell holds between its phases (:class:`Job`) and what a member carries
from epoch end to epoch end (:class:`Life`): plain records, below the code that fills them
(:mod:`enspipe.run.job`) and the phases that read them (steps, window, summary)."""
from __future__ import annotations

from dataclasses import dataclass

from enspipe.run.config import RunConfig


@dataclass
class Job:
    """What one rank's run holds between its phases."""

    cfg: RunConfig
    comm: object
    scheme: object
    progress: dict
    where: object           # enspipe.engine.placement.Placement
    affinity: list[int]
    monitor: object         # the node's CPU monitor, on each host's first rank
    heartbeat: object
    events: object
    manifest: object
    preprocessing: str
    transport: object
    pipeline: object
    consumer: object
    member: object          # enspipe.run.steps.Member
    slurm: object           # the job step's energy counter, on rank 0 inside Slurm
    started: float
    malloc: str             # the malloc policy in force (enspipe.engine.memory)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def n(self) -> int:
        return self.comm.Get_size()


@dataclass
class Life:
    """What a member carries from epoch end to epoch end (see :meth:`Member.epoch_end`)."""

    checkpoint_dir: str | None   # where this rank writes the member's checkpoints (its first rank only)
    state: object                # enspipe.run.checkpoint.MemberState: over every run so far
    validation: tuple | None     # (images, labels) of --validation-data
    patience: int
    min_delta: float
    epoch_images: int
