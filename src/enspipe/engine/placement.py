"""Where the members of a cell run: physical hosts, their cores, and whether members share cores.

MPI's shared-memory domains (``COMM_TYPE_SHARED``) are not hosts: ``mpiexec -launcher fork
-hosts a:2,b:2`` makes two domains on one machine, both with the same hostname. A physical host is
identified by its kernel's boot id (``/proc/sys/kernel/random/boot_id``: one per booted machine,
shared by every container on it, since they share its CPUs) with the hostname. Per host there is
one CPU/power monitor (its lowest rank), one core assignment, and one verdict on oversubscription:
members on fewer cores than members x cores-per-member. Per-host files are named by the host's
``label``: the hostname, with the boot id's first 8 characters added when two hosts of a job share
a hostname.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

from enspipe.common.host import boot_id
from enspipe.engine.affinity import assign_cores, available_cores


def host_key(hostname: str | None = None) -> tuple[str, str]:
    """``(hostname, boot id)`` of this process's physical host."""
    return hostname or socket.gethostname(), boot_id()


def labels(keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A file-name-safe label per distinct host key: the hostname, unless two hosts share it."""
    names = [k[0] for k in dict.fromkeys(keys)]
    return {k: k[0] if names.count(k[0]) == 1 else f"{k[0]}-{k[1][:8] or 'noboot'}" for k in dict.fromkeys(keys)}


@dataclass(frozen=True)
class Placement:
    """This rank's place: its host (label), its rank among the host's members, its cores."""

    host: str                 # the physical host's label (per-host files are named by it)
    host_rank: int            # 0 runs the host's monitor
    host_members: int         # members (ranks) of the cell on this host
    host_cpus: int            # cores the host's members may use together
    mpi_node: int             # the shared-memory domain (its lowest world rank)
    cores: list[int]          # this member's cores
    sharing_cores: bool       # members of this host share cores (oversubscribed)
    hosts: dict               # label -> {"members", "cpus", "mpi_nodes"}, the same on every rank

    @property
    def threads(self) -> int:
        """Threads for this member's pools: its cores, or, where the host's members share cores, its
        fair share of them (at least one). Members that each size their pools to every core they
        may use run n times as many threads as the host has cores, and fight over them."""
        if not self.sharing_cores:
            return len(self.cores)
        return max(1, min(len(self.cores), self.host_cpus // self.host_members))

    @property
    def oversubscribed(self) -> bool:
        return any(h["oversubscribed"] for h in self.hosts.values())

    def as_dict(self) -> dict:
        return {"hosts": self.hosts, "oversubscribed": self.oversubscribed,
                "members_per_host": max(h["members"] for h in self.hosts.values()),
                "host_cpus": min(h["cpus"] for h in self.hosts.values())}


def place(comm, MPI, cores_per_member: int | None) -> Placement:
    """Every rank's placement (collective over ``comm``). Ranks of a host that may use the same
    cores split them (distinct cores while there are enough, round-robin when not); ranks that
    each have their own cpuset (say, ``srun --cpu-bind``) keep to it."""
    rank = comm.Get_rank()
    key = host_key(MPI.Get_processor_name())
    keys = comm.allgather(key)
    label = labels(keys)[key]
    host_comm = comm.Split(list(dict.fromkeys(keys)).index(key), key=rank)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    mpi_node = node.allreduce(rank, op=MPI.MIN)
    node.Free()
    available = available_cores()
    same = host_comm.allgather(tuple(available))
    peers = [i for i, a in enumerate(same) if a == tuple(available)]
    if rank == 0 and cores_per_member:
        warn_oversubscribed("--cores", cores_per_member, len(available))
    cores, sharing = assign_cores(available, cores_per_member, peers.index(host_comm.Get_rank()), len(peers))
    host_cpus = len(set().union(*map(set, same)))
    host_rank, members = host_comm.Get_rank(), host_comm.Get_size()
    any_sharing = host_comm.allreduce(sharing, op=MPI.LOR)
    nodes = len(set(host_comm.allgather(mpi_node)))
    host_comm.Free()
    info = {label: {"members": members, "cpus": host_cpus, "mpi_nodes": nodes, "oversubscribed": any_sharing,
                    "kernel": key[1][:8]}}
    hosts: dict = {}
    for d in comm.allgather(info if host_rank == 0 else {}):
        hosts.update(d)
    _machine_oversubscription(hosts, cores_per_member)
    return Placement(label, host_rank, members, host_cpus, mpi_node, cores, sharing, hosts)


def warn_oversubscribed(option: str, asked: int, usable: int | None = None) -> bool:
    """One line on stderr where a member asks for more cores (``option``: ``--cores``,
    ``--workers`` or ``threads=``) than its process may use (``usable``; None: its affinity's);
    whether it did."""
    usable = len(available_cores()) if usable is None else usable
    if asked <= usable:
        return False
    import sys

    print(f"enspipe: warning: {option}{'' if option.endswith('=') else ' '}{asked} is more than the {usable} cores "
          f"this process may use: its {asked} preprocessing workers share them (oversubscribed)", file=sys.stderr,
          flush=True)
    return True


def _machine_oversubscription(hosts: dict, cores_per_member: int | None) -> None:
    """Hosts on one kernel (namespaced nodes, containers) share that machine's cores: where their
    members together want more cores than it has, every one of them is oversubscribed."""
    by_kernel: dict[str, list[dict]] = {}
    for h in hosts.values():
        by_kernel.setdefault(h["kernel"], []).append(h)
    for group in by_kernel.values():
        wanted = sum(h["members"] for h in group) * (cores_per_member or 1)
        if len(group) > 1 and wanted > max(h["cpus"] for h in group):
            for h in group:
                h["oversubscribed"] = True
