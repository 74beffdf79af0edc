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
  the others are blocked.

The beat is a Python thread, so a rank whose other threads hold the GIL for ``timeout`` seconds
looks lost too: nothing on a member's path may block that long inside a call that keeps the GIL
(tf.data's autotuner made an iterator's destructor do so for up to 10 s; it is off, see
``Pipeline._options``).
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

import numpy as np

PR_SET_PDEATHSIG = 1
TAG = 7_001


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

    def __init__(self, comm, on_loss, interval: float = 0.5, timeout: float = 10.0):
        self.comm = comm.Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.on_loss, self.interval, self.timeout = on_loss, interval, timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="enspipe-heartbt", daemon=True)
        self.heard = time.monotonic()

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
            out = np.array([beat], np.int64)
            sending = [(r, b) for r, b in sending if not r.Test()] + [(self.comm.Isend(out, succ, TAG), out)]
            beat += 1
            while recv.Test():
                self.heard = time.monotonic()
                recv = self.comm.Irecv(inbox, source=pred, tag=TAG)
            silent = time.monotonic() - self.heard
            if silent > self.timeout and not self._stop.is_set():
                self.on_loss(pred, silent)
                return
        recv.Cancel()
        recv.Wait()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.comm.Free()
