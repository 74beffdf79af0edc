"""Fail fast when a member is lost, instead of finishing a cell that lost one.

To MPICH a failed node looks like its ``hydra_pmi_proxy`` dying. Without help, the ranks that
proxy launched run on as orphans and the others wait in collectives until the launcher's own
clean-up, tens of seconds later, or finish the cell as if nothing had happened. Two guards:

* :func:`die_with_launcher`: every rank asks the kernel to kill it when its parent (the proxy, or
  ``slurmstepd``) dies (``PR_SET_PDEATHSIG``), so the lost node's members really are gone;
* :class:`Heartbeat`: a ring on a communicator of its own. Every ``interval`` seconds each rank
  sends a beat to its successor and checks that one came from its predecessor; a rank that hears
  nothing for ``timeout`` seconds declares the predecessor lost and calls ``on_loss`` (which
  records why and aborts the job). A lost member is noticed within ``timeout`` seconds wherever
  the others are blocked. Where the lost predecessor runs on the same host, the job's abort
  first ends it with SIGKILL (:meth:`Heartbeat.end_lost`, once ``on_loss`` has said why): a
  stopped process takes no SIGTERM, so a launcher that ends its job with SIGTERM (``torchrun``'s
  agent) would wait out its own grace (30 s) for that one.

The ring ends without ``MPI_Cancel``: each rank sends its successor a last beat (:data:`BYE`) and
takes its predecessor's beats until that one's arrives, so every send and receive completes.
:meth:`Heartbeat.finish` bounds the end: the job's last barrier and the ring's end within the peer
timeout plus :data:`END_GRACE`, else every thread's stack goes to the log and the job ends. (A cell
over MPICH's libfabric TCP module once stopped there for good, all its ranks done and alive, until
Slurm's time limit; the ring's end then cancelled a receive, and cancelled receives have stalled
``MPI_Wait`` in libfabric modules before.)

The beat is a Python thread, so a rank whose other threads hold the GIL for ``timeout`` seconds
looks lost too: nothing on a member's path may block that long inside a call that keeps the GIL
(tf.data's autotuner made an iterator's destructor do so for up to 10 s; it is off, see
``Pipeline._options``).
"""
from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np

from enspipe.common.host import end_process, process_identity

PR_SET_PDEATHSIG = 1
TAG = 7_001
BYE = -1  # a rank's last beat
END_GRACE = 30.0  # s: how much longer than the peer timeout a job's last barrier and the ring's end may take


def die_with_launcher() -> bool:
    """Have the kernel kill this process when its parent dies; False where that cannot be set
    (not Linux) or the parent is already gone (then this process exits at once)."""
    parent = os.getppid()
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    return True


class Heartbeat:
    """The heartbeat ring of one job (see the module's docstring). ``start()`` after MPI is up,
    ``stop()`` once every rank has passed the job's last barrier."""

    def __init__(self, comm, on_loss, on_stall, interval: float = 0.5, timeout: float = 10.0):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.processes = self.comm.allgather(process_identity())  # each rank's, to end a lost one on this host
        self.on_loss, self.interval, self.timeout = on_loss, interval, timeout
        self.on_stall = on_stall  # (seconds): the end took longer than it may (see finish)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="enspipe-heartbt", daemon=True)
        self.heard = time.monotonic()
        self.lost: int | None = None  # the predecessor found lost
        self.ended = True  # every request of the ring completed (False: a BYE never came)

    def start(self) -> "Heartbeat":
        if self.size > 1:
            self._thread.start()
        return self

    def _run(self) -> None:
        succ, pred = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        inbox = np.zeros(1, np.int64)
        recv = self.comm.Irecv(inbox, source=pred, tag=TAG)
        sending: list = []
        beat = 0
        while not self._stop.wait(self.interval):
            sending = [(r, b) for r, b in sending if not r.Test()] + [self._send(beat, succ)]
            beat += 1
            while recv is not None and recv.Test():
                self.heard = time.monotonic()
                recv = self._next(inbox, pred)
            silent = time.monotonic() - self.heard
            if recv is not None and silent > self.timeout and not self._stop.is_set():
                self.lost = pred
                self.on_loss(pred, silent)
                return
        self.ended = self._end(recv, inbox, pred, [*sending, self._send(BYE, succ)])

    def end_lost(self) -> None:
        """SIGKILL the predecessor found lost where it runs on this host (alive but stopped or
        stuck, it would hold up the job's end), saying so; nothing where none was lost. The job's
        abort calls it (:func:`enspipe.engine.member.fail_job`), after saying why: a launcher may
        end the whole job as soon as one of its processes dies."""
        if self.lost is None:
            return
        process = self.processes[self.lost]
        if end_process(process):
            print(f"enspipe: rank {self.lost} (pid {process['pid']}, on this host) silent for over "
                  f"{self.timeout:.0f} s: ended with SIGKILL before the job is aborted", file=sys.stderr, flush=True)

    def _next(self, inbox, pred: int):
        """The receive for the predecessor's next beat, once one arrived; None after its BYE (it
        sends no more: a predecessor may end before this rank does)."""
        return self.comm.Irecv(inbox, source=pred, tag=TAG) if inbox[0] != BYE else None

    def _send(self, value: int, to: int) -> tuple:
        out = np.array([value], np.int64)
        return self.comm.Isend(out, to, TAG), out

    def _end(self, recv, inbox, pred: int, sending: list) -> bool:
        """Take the predecessor's beats up to its :data:`BYE` and complete this rank's sends; False
        where its BYE did not come within ``timeout`` (the requests are then left as they are)."""
        end = time.monotonic() + self.timeout
        while recv is not None and time.monotonic() < end:
            if not recv.Test():
                time.sleep(1e-3)
            else:
                recv = self._next(inbox, pred)
        while not all(r.Test() for r, _ in sending) and time.monotonic() < end:
            time.sleep(1e-3)  # the successor takes every beat up to this rank's BYE
        return recv is None and all(r.Test() for r, _ in sending)

    def finish(self, barrier) -> None:
        """Pass the job's last barrier (``barrier()``, on every rank) and end the ring. Where that
        takes over ``timeout`` + :data:`END_GRACE` seconds, every thread's stack goes to stderr and
        ``on_stall(seconds)`` ends the job: stuck with every peer alive, which the beats cannot see."""
        with deadline(self.timeout + END_GRACE, self.on_stall):
            barrier()
            self.stop()

    def stop(self) -> None:
        """End the ring; every rank calls it, after a barrier they all passed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.ended:
            self.comm.Free()


@contextmanager
def deadline(seconds: float, on_stall):
    """Where the block has not finished within ``seconds``, write every thread's stack to stderr
    and call ``on_stall(seconds)`` from a timer thread (it should end the job: the block is stuck
    with every peer alive, which the heartbeat cannot see).

    >>> with deadline(40, lambda s: comm.Abort(1)):
    ...     comm.Barrier()
    """
    def stalled() -> None:
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        on_stall(seconds)

    timer = threading.Timer(seconds, stalled)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
