"""One member set up as every path that runs one sets it up: a cell's rank (:mod:`enspipe.run.job`)
and a library member (:class:`enspipe.SharedStream`).

In order, :class:`MemberBuilder` gives a member

1. its malloc policy (:mod:`enspipe.engine.memory`), before anything allocates images;
2. its place on its host and its cores (:func:`enspipe.engine.placement.place`, collective), and
   the process pinned to them, so that its worker processes start there and stay: members of a
   host that ask for k cores each get distinct ones while the host has enough;
3. the heartbeat that fails the job when a peer goes silent (:mod:`enspipe.common.liveness`);
4. its pipeline over the scheme and the ledger of its epochs;

and, when it fails, the error file beside its logs and the end of the whole job
(:func:`fail_job`), so that no member waits for this one.
"""
from __future__ import annotations

import os
import sys
import time

from enspipe.common.atomic import write_json_atomic
from enspipe.common.liveness import Heartbeat
from enspipe.data.ledger import EpochLedger
from enspipe.engine.affinity import pin_process
from enspipe.engine.memory import set_malloc
from enspipe.engine.placement import Placement, place, warn_oversubscribed

ABORT_GRACE_S = 2.0  # seconds between saying why a member ends the job and ending it


class MemberBuilder:
    """One member's set-up, step by step (each a method, called in this order by both paths; a
    path does its own work between them, such as the cell's node monitor before pinning)."""

    def __init__(self, comm, MPI, *, cores: int | None, malloc: str):
        """Set malloc and place the member (collective over ``comm``); ``cores``: the cores it asks
        for (None: every core this process may use, shared with the host's other members)."""
        self.comm = comm
        self.malloc = set_malloc(malloc)
        self.where: Placement = place(comm, MPI, cores)
        self.affinity: list[int] | None = None

    def threads(self, asked: int | None, option: str) -> int:
        """The member's preprocessing threads: ``asked`` (``option`` names it in the warning when it
        is more than this process's cores), or its placement's fair share."""
        if asked is None:
            return self.where.threads
        if self.comm.Get_rank() == 0:
            warn_oversubscribed(option, asked)
        return asked

    def pin(self) -> list[int]:
        """Pin every thread of this process to the member's cores; returns the affinity in force."""
        self.affinity = pin_process(self.where.cores)
        return self.affinity

    def heartbeat(self, timeout: float, on_loss, on_stall) -> Heartbeat:
        """The heartbeat, started: ``on_loss(peer, silent_seconds)`` when a peer goes silent for
        ``timeout`` seconds, ``on_stall(seconds)`` when the end takes that long with all alive."""
        return Heartbeat(self.comm, on_loss=on_loss, on_stall=on_stall, timeout=timeout).start()

    def pipeline(self, scheme, manifest, preprocessing, stream, threads: int, events, *, drop_last: bool = False,
                 **options) -> tuple:
        """``(transport, pipeline, ledger)``: the scheme's transport and the member's staged pipeline
        (:func:`enspipe.engine.pipeline.build_pipeline`, ``options`` passed on), and the ledger of
        its epochs (``drop_last``: an epoch's short tail is dropped and recorded)."""
        from enspipe.engine.pipeline import build_pipeline  # the exchange's transports load with it

        transport, pipeline = build_pipeline(self.comm, scheme, manifest, preprocessing, stream, threads, events,
                                             **options)
        return transport, pipeline, EpochLedger(manifest.num_images, drops=drop_last)


def leave_error(directory: str | None, rank: int, said: str, tb: str = "", record: dict | None = None) -> None:
    """``error.rankNNNN.txt`` (what was said, and the traceback) in ``directory``, and with
    ``record`` ``failed.rankNNNN.json`` (where the member got to); nothing where there is no
    directory or it cannot be written (the message is on stderr already)."""
    if directory is None:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"error.rank{rank:04d}.txt"), "w") as f:
            f.write(said + "\n\n" + tb)
        if record is not None:
            write_json_atomic(os.path.join(directory, f"failed.rank{rank:04d}.json"), record)
    except OSError:
        pass


def fail_job(comm, said: str, *, directory: str | None, rank: int, tb: str = "", record: dict | None = None,
             echo_tb: bool = False, heartbeat: Heartbeat | None = None) -> None:
    """Say why on stderr (``echo_tb``: the traceback too), leave the error file, and end the whole
    job (``MPI_Abort``, or the torch transport's own abort) after :data:`ABORT_GRACE_S`: the
    launcher needs that long to pass on what was just said (without it the message was lost behind
    the job's end on a loaded CI machine). A peer the ``heartbeat`` found lost on this host is
    ended just before (:meth:`~enspipe.common.liveness.Heartbeat.end_lost`)."""
    print(said + ("\n" + tb if echo_tb and tb else ""), file=sys.stderr, flush=True)
    leave_error(directory, rank, said, tb, record)
    time.sleep(ABORT_GRACE_S)
    if heartbeat is not None:
        heartbeat.end_lost()
    comm.Abort(1)
