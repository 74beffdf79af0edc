"""Members launched by PyTorch's launchers: who launched this process, torch.distributed started on
the job's ranks, and the members' control messages over it.

* :func:`torch_launched`: ``torchrun`` (or a launcher that sets torch's ``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR`` and ``MASTER_PORT`` without MPI's variables) started this process, so there is no
  MPI world to join.
* :func:`init_torch`: the default process group, started once: from torch's env:// variables
  where the launcher set them, else from an MPI communicator (its rank 0 names a free port on its
  host and every rank meets there), or the one a script started itself, checked against the
  members.
* :class:`TorchComm`: the part of an mpi4py communicator enspipe's members use to agree, place
  themselves, beat their heartbeat and end together (``allgather``, ``bcast``, ``allreduce``,
  ``Split``, ``Ibarrier``, ``Isend``/``Irecv``, ``Abort``...), on a gloo group of its own, and
  :data:`MPI` the constants and functions of mpi4py's module it is used with. A member launched by
  ``torchrun`` runs :class:`enspipe.SharedStream` on it unchanged; its batches go over the torch
  transport (:mod:`enspipe.exchange.torchdist`).
"""
from __future__ import annotations

import datetime
import os
import queue
import socket
import sys
import threading
from types import SimpleNamespace

import numpy as np

from enspipe.common.host import host_id
from enspipe.plan.errors import ConfigError

TORCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")
TIMEOUT = datetime.timedelta(minutes=30)  # gloo's own bound on a collective; members' heartbeats fail faster


def torch_launched() -> bool:
    """Whether torch's launcher started this process (and MPI's did not)."""
    env = os.environ
    if any(k in env for k in MPI_ENV):
        return False
    return "TORCHELASTIC_RUN_ID" in env or all(k in env for k in TORCH_ENV)


def available() -> tuple[bool, str]:
    """Whether torch.distributed with gloo imports here, and why not."""
    try:
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken build
        return False, f"torch does not import here ({type(e).__name__}: {e}); install it (pip install torch)"
    if not dist.is_available() or not dist.is_gloo_available():
        return False, "this torch build has no torch.distributed with gloo"
    return True, ""


def init_torch(comm=None) -> None:
    """Start torch.distributed's default process group for this job's members, once.

    Already started (by the script, Lightning, ``torchrun``'s user): checked against ``comm``.
    Else from torch's env:// variables where the launcher set them all, else (``comm``, an MPI
    communicator) at a free port of its rank 0's host, which every rank learns by a broadcast.
    Raises :class:`enspipe.ConfigError` where its ranks are not the members'."""
    import torch.distributed as dist

    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (None, None)
    from_env = all(k in os.environ for k in TORCH_ENV)
    if not dist.is_initialized() and from_env and comm is not None and os.environ["WORLD_SIZE"] != str(size):
        raise ConfigError("transport", f"torch's WORLD_SIZE={os.environ['WORLD_SIZE']} is not the {size} members "
                          "MPI launched", f"launch {os.environ['WORLD_SIZE']} members, or unset "
                          f"{', '.join(TORCH_ENV)} (the members then meet at a port rank 0 names over MPI)")
    if not dist.is_initialized():
        if from_env:
            dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
        elif comm is not None:
            where = comm.bcast(_free_port() if rank == 0 else None, root=0)
            dist.init_process_group("gloo", init_method=f"tcp://{where[0]}:{where[1]}", rank=rank,
                                    world_size=size, timeout=TIMEOUT)
        else:
            raise ConfigError("transport", "torch.distributed has no rendezvous: none of MPI, torchrun or "
                              f"torch's {'/'.join(TORCH_ENV)} variables launched this member",
                              "launch the members with torchrun, mpiexec or srun")
    if comm is not None and (dist.get_rank(), dist.get_world_size()) != (rank, size):
        raise ConfigError("transport", f"torch.distributed's world (rank {dist.get_rank()} of "
                          f"{dist.get_world_size()}) is not the members' (rank {rank} of {size})",
                          "start the process group with the members' ranks, or leave it to enspipe")


def _free_port() -> tuple[str, int]:
    """This host's name and a TCP port free on it now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return socket.gethostname(), s.getsockname()[1]


class TorchRequest:
    """A non-blocking operation's handle, as mpi4py's ``Request``: ``Test()`` is whether it has
    completed (then ``done`` runs once: a result copied out); a collective that failed (its peer
    gone) raises from ``Test``. ``waited``: an event a :class:`_Waiter` sets once the work is done
    (gloo's point-to-point works complete only inside ``wait()``)."""

    def __init__(self, work, done=None, waited: "threading.Event | None" = None):
        self.work, self.done, self.waited = work, done, waited

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        if self.work is None:
            return True
        if self.waited is not None:
            if not self.waited.is_set():
                return False
        elif not self.work.is_completed():
            return False
        else:
            self.work.wait()
        self.work = None
        if self.done is not None:
            self.done()
        return True

    @staticmethod
    def Testall(requests) -> bool:  # noqa: N802
        return all([r.Test() for r in requests])


class _Waiter:
    """A thread that waits for point-to-point works in the order they were posted and marks each
    request done: gloo completes a send or a receive only inside its ``wait()``, which blocks. A
    work that fails (its peer gone) is never marked: to its poller it stays silent, as a lost
    peer is (the heartbeat then says so), and the error is kept in ``failed``."""

    def __init__(self, name: str):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.failed: list[str] = []
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def post(self, work) -> threading.Event:
        event = threading.Event()
        self.queue.put((work, event))
        return event

    def _run(self) -> None:
        while True:
            work, event = self.queue.get()
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - a peer gone: the request never completes
                self.failed.append(f"{type(e).__name__}: {e}")
                continue
            event.set()


_REDUCE = {"min": min, "max": max, "sum": sum, "lor": any, "land": all}


class TorchComm:
    """An mpi4py-like communicator over a gloo process group of its own (see the module's
    docstring). ``ranks``: its members' global ranks, in order; ``group``: their gloo group.
    ``Split`` and ``Dup`` are collective over the whole world (torch makes every rank create
    every group), which is how enspipe calls them: on a communicator of every member."""

    def __init__(self, ranks: list[int], group):
        import torch.distributed as dist

        self.dist, self.ranks, self.group = dist, list(ranks), group
        self.rank = self.ranks.index(dist.get_rank())
        self._waiters: dict[str, _Waiter] = {}

    @classmethod
    def world(cls) -> "TorchComm":
        """Every member, after :func:`init_torch` (collective)."""
        import torch.distributed as dist

        init_torch()
        size = dist.get_world_size()
        return cls(list(range(size)), dist.new_group(list(range(size)), backend="gloo", timeout=TIMEOUT))

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return len(self.ranks)

    def allgather(self, obj) -> list:
        out = [None] * len(self.ranks)
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def bcast(self, obj, root: int = 0):
        box = [obj]
        self.dist.broadcast_object_list(box, src=self.ranks[root], group=self.group)
        return box[0]

    def allreduce(self, obj, op="sum"):
        return _REDUCE[op](self.allgather(obj))

    def Barrier(self) -> None:  # noqa: N802
        self.dist.barrier(group=self.group)

    def Ibarrier(self) -> TorchRequest:  # noqa: N802
        return TorchRequest(self.dist.barrier(group=self.group, async_op=True))

    def Iallreduce(self, send: np.ndarray, recv: np.ndarray, op="sum") -> TorchRequest:  # noqa: N802
        import torch

        ops = {"min": self.dist.ReduceOp.MIN, "max": self.dist.ReduceOp.MAX, "sum": self.dist.ReduceOp.SUM}
        t = torch.from_numpy(np.array(send, copy=True))
        work = self.dist.all_reduce(t, op=ops[op], group=self.group, async_op=True)
        return TorchRequest(work, lambda: recv.__setitem__(Ellipsis, t.numpy()))

    def Isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> TorchRequest:  # noqa: N802
        import torch

        return self._waited("send", self.dist.isend(torch.from_numpy(buf), dst=self.ranks[dest], group=self.group,
                                                    tag=tag))

    def Irecv(self, buf: np.ndarray, source: int, tag: int = 0) -> TorchRequest:  # noqa: N802
        import torch

        return self._waited("recv", self.dist.irecv(torch.from_numpy(buf), src=self.ranks[source], group=self.group,
                                                    tag=tag))

    def _waited(self, kind: str, work) -> TorchRequest:
        """A point-to-point request, waited for by this communicator's ``kind`` thread (sends in
        the order posted, receives likewise: each kind completes in order on gloo's pairs)."""
        if kind not in self._waiters:
            self._waiters[kind] = _Waiter(f"enspipe-p2p-{kind}")
        return TorchRequest(work, waited=self._waiters[kind].post(work))

    def Split(self, color, key: int = 0) -> "TorchComm | None":  # noqa: N802
        """The members of the same ``color`` ordered by ``key`` (None for :data:`UNDEFINED`); every
        member of the world calls it."""
        mine = None
        for c, ranks in _colours(self.allgather((color, key, self.ranks[self.rank]))):
            group = self.dist.new_group(ranks, backend="gloo", timeout=TIMEOUT)  # every rank, every group
            if c == color:
                mine = TorchComm(ranks, group)
        return mine

    def Split_type(self, kind, key: int = 0) -> "TorchComm":  # noqa: N802
        """The members on this host (``kind``: :data:`MPI`'s ``COMM_TYPE_SHARED``)."""
        return self.Split(host_id(), key)

    def Dup(self) -> "TorchComm":  # noqa: N802
        return self.Split(0, self.rank)

    def Free(self) -> None:  # noqa: N802
        """Nothing to free: torch's groups live as long as the default group."""

    def Abort(self, code: int = 1) -> None:  # noqa: N802
        """End this process at once: the launcher (``torchrun``'s agent) ends the others."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _colours(keyed: list) -> list[tuple[object, list[int]]]:
    """``[(color, key, rank)]`` to each defined colour's ranks ordered by key, colours in order."""
    colours = sorted({c for c, _, _ in keyed if c != UNDEFINED}, key=repr)
    return [(c, [r for _, r in sorted((k, r) for col, k, r in keyed if col == c)]) for c in colours]


UNDEFINED = "enspipe:undefined-colour"  # MPI.UNDEFINED: a colour that joins no communicator

# mpi4py's module, as far as a TorchComm's users need it (``place``, ``allreduce_quietly``)
MPI = SimpleNamespace(MIN="min", MAX="max", SUM="sum", LOR="lor", LAND="land", UNDEFINED=UNDEFINED,
                      COMM_NULL=None, COMM_TYPE_SHARED="shared", Request=TorchRequest,
                      Get_processor_name=socket.gethostname)
