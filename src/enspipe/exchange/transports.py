"""The members' collectives, by name: one table, :data:`TRANSPORTS`, a :class:`TransportKind`
row each, read by the stream's and the cell's checks and by :func:`make_transport`, the one place
a transport is built.

* ``mpi4py``: MPI communicators, through node-shared memory within a node
  (:class:`enspipe.exchange.engine.Mpi4pyTransport`);
* ``horovod``: Horovod's process sets, its TensorFlow build (:mod:`enspipe.exchange.horovod`);
* ``torch``: torch.distributed's process groups (gloo; NCCL on a GPU), through a ring of shared
  slots within a host (:mod:`enspipe.exchange.torchdist`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

DEFAULT = "mpi4py"


@dataclass(frozen=True)
class TransportKind:
    """One transport: what it needs here and what it can carry, for the checks before any work."""

    name: str
    package: str                 # the module that must import here
    install: str                 # how to get it where it does not
    needs_tensorflow: bool       # its build is TensorFlow's (Horovod's)
    node_shm_optional: bool      # node_shm=False (collectives only, no node-shared memory) runs on it
    devices: bool                # it exchanges on a torch device (device="cuda" or "cpu")
    communicator: bool           # its members' groups are MPI communicators (Ako's and blocked gradient exchanges)
    process_sets: bool           # it sums a data-parallel member's gradients itself (Horovod's process sets)
    mpi_world: bool              # its members are the ranks of an MPI world (mpiexec, srun); else torchrun's too
    make: Callable               # (comm, groups, shape, dtype, stream, **context) -> the transport


def _mpi4py(comm, groups, shape, dtype, stream, *, events, uses, unit, device, reduce_groups):
    from enspipe.exchange.engine import Mpi4pyTransport

    return Mpi4pyTransport(comm, groups, shape, dtype, max_batch=stream.batch_size, queue_depth=stream.queue_depth,
                           node_shm=stream.node_shm, events=events, uses=uses, unit=unit)


def _horovod(comm, groups, shape, dtype, stream, *, events, uses, unit, device, reduce_groups):
    from enspipe.exchange.horovod import HorovodTransport

    return HorovodTransport(comm, groups, shape, dtype, events=events, reduce_groups=list(reduce_groups))


def _torch(comm, groups, shape, dtype, stream, *, events, uses, unit, device, reduce_groups):
    from enspipe.exchange.torchdist import TorchTransport

    return TorchTransport(comm, groups, shape, dtype, max_batch=stream.batch_size, queue_depth=stream.queue_depth,
                          events=events, uses=uses, unit=unit, device=device, node_shm=stream.node_shm)


TRANSPORTS = {t.name: t for t in (
    TransportKind("mpi4py", "mpi4py", "pip install mpi4py mpich", needs_tensorflow=False, node_shm_optional=True,
                  devices=False, communicator=True, process_sets=False, mpi_world=True, make=_mpi4py),
    TransportKind("horovod", "horovod", "build it with `make horovod` and run from .venv-horovod",
                  needs_tensorflow=True, node_shm_optional=False, devices=False, communicator=False,
                  process_sets=True, mpi_world=True, make=_horovod),
    TransportKind("torch", "torch", "pip install 'enspipe[torch]'", needs_tensorflow=False, node_shm_optional=True,
                  devices=True, communicator=False, process_sets=False, mpi_world=False, make=_torch),
)}
WITHOUT_MPI = next(name for name, t in TRANSPORTS.items() if not t.mpi_world)  # torchrun's members' transport


def installed_problem(name: str) -> str | None:
    """Why the transport ``name`` cannot run here (its package does not import), or None."""
    import importlib.util

    kind = TRANSPORTS[name]
    return None if importlib.util.find_spec(kind.package) is not None else f"{kind.package} is not installed here"


def make_transport(stream, comm, groups, shape, dtype, **context):
    """The transport ``stream.transport`` names (``stream``: the member's
    :class:`~enspipe.engine.config.StreamConfig`), over ``comm``'s ``groups``, for images of
    ``shape`` and ``dtype``; ``context``: ``events``, ``uses``, ``unit``, ``device`` and
    ``reduce_groups``."""
    return TRANSPORTS[stream.transport].make(comm, groups, shape, dtype, stream, **context)
