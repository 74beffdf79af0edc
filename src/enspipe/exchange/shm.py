"""Batches assembled in node-shared memory: one copy per contributed block, zero copies to read.

Every scheme step is, seen from one group, the same operation: some members contribute blocks at
known offsets of the batch (All-Shared: every member its share; a broadcast: the root the whole
batch; Multi-Broadcast: each preprocessor its block) and every member ends with the whole batch.
Within a node, an MPI-3 shared-memory window (``MPI_Win_allocate_shared``) holds a ring of batch
slots: a member writes its block straight into the slot and, after a node barrier, every member
of the node reads the whole batch in place. Across nodes, one leader per node exchanges the
node's contiguous part of the batch with the other leaders (an in-place all-gather-v into the
window), and a second node barrier publishes it.

MPI collectives through shared memory instead copy every byte in and out of the library's own
buffers, on every member: at 4 members and float32 224 px images that is ~45 MB of memcpy per
member per batch of 32, a third of the preprocessing CPU it was meant to save.

Members exchange a unit of k consecutive batches at a time (their blocks written into k slots,
one barrier for all), so a barrier's cost is paid once per k batches. The node barrier is a
:class:`SleepingBarrier` in the window itself where the C library has process-shared POSIX
semaphores (glibc): a member that arrives early sleeps in the kernel until the last one wakes it,
where MPI's barrier, polled with back-off, woke it dozens of times per wait.

Slot reuse: a member writes unit u's k slots after every node member entered unit u-1's barrier,
i.e. after each had queued every batch of unit u-2. Alive on each member are then at most unit
u-1's k batches (being queued), ``depth`` more in its compute queue and the one its consumer
holds; with the k being written, ``R = depth + 1 + 2k`` slots (``depth + 3`` one batch at a time)
never overwrite a batch still in use.
"""
from __future__ import annotations

import functools
import os
import time

import numpy as np

from enspipe.exchange.base import Batch, touch_pages

ALIGN = 64


def slots_for(queue_depth: int, unit: int = 1) -> int:
    """Slots of a ring that exchanges ``unit`` batches at a time (see the module's note)."""
    return queue_depth + 1 + 2 * unit


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


SEGMENT_PREFIX = "mpich_shm_"  # MPICH's node-shared segments (its own and MPI_Win_allocate_shared's)


def reap_orphans(path: str = "/dev/shm", prefix: str = SEGMENT_PREFIX, min_age_s: float = 5.0) -> tuple[int, int]:
    """Delete this user's MPICH shared-memory segments that no process maps or holds open: what a
    job killed with SIGKILL leaves behind (MPICH unlinks them only at MPI_Finalize), which would
    otherwise fill /dev/shm run after run until MPI_Init or the batch window no longer fits.
    A segment younger than ``min_age_s`` is left alone (a job starting beside this one may not have
    mapped it yet). Returns how many were deleted and their bytes."""
    try:
        names = [n for n in os.listdir(path) if n.startswith(prefix)]
    except OSError:
        return 0, 0
    if not names:
        return 0, 0
    uid, now = os.getuid(), time.time()
    candidates = {}
    for n in names:
        try:
            st = os.stat(os.path.join(path, n))
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_mtime >= min_age_s:
            candidates[os.path.join(path, n)] = st.st_size
    for pid in (p for p in os.listdir("/proc") if p.isdigit()) if candidates else ():
        for used in _files_of(pid):
            candidates.pop(used, None)
    count = reaped = 0
    for f, size in candidates.items():
        try:
            os.remove(f)
        except OSError:  # another member reaped it first, or it is not ours to delete
            continue
        count, reaped = count + 1, reaped + size
    return count, reaped


def _files_of(pid: str) -> set[str]:
    """The files a process maps or holds open (those of another user's processes are unreadable:
    theirs are not this user's to delete anyway)."""
    used = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find("/")
                if i >= 0:
                    used.add(line[i:].rstrip("\n").removesuffix(" (deleted)"))
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                used.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
    except OSError:
        pass
    return used


class SleepingBarrier:
    """A reusable barrier of the ``n`` processes that map ``buf`` (``BYTES`` of shared memory): a
    count and three process-shared POSIX semaphores (a mutex and two turnstiles, the two-phase
    barrier of Downey's *Little Book of Semaphores*). Waiting is ``sem_wait``, a futex: the
    process sleeps until the last arrival posts, with no polls; ctypes releases the GIL around it,
    so the member's other threads (its heartbeat included) run on. A member lost while others
    wait is handled as everywhere else: the heartbeat notices and aborts the job."""

    SEM = 64  # bytes per semaphore slot (glibc's sem_t is 32), one cache line each
    BYTES = 4 * SEM  # the count, then the three semaphores

    def __init__(self, buf: np.ndarray, n: int, init: bool):
        import ctypes

        self.libc = _semaphores()
        if self.libc is None:
            raise OSError("no process-shared POSIX semaphores in this C library")
        self.n, self._errno = n, ctypes.get_errno
        self.count = buf[:8].view(np.int64)
        base = buf.ctypes.data
        self.mutex, self.arrived, self.left = (ctypes.c_void_p(base + self.SEM * (i + 1)) for i in range(3))
        if init:  # by one process, before any other uses it (the caller's MPI barrier orders that)
            self.count[0] = 0
            for sem, value in ((self.mutex, 1), (self.arrived, 0), (self.left, 0)):
                if self.libc.sem_init(sem, 1, value) != 0:
                    raise OSError(ctypes.get_errno(), "sem_init failed")

    def _down(self, sem) -> None:
        import errno

        while self.libc.sem_wait(sem) != 0:
            if self._errno() != errno.EINTR:  # a signal handler ran: wait on
                raise OSError(self._errno(), "sem_wait failed")

    def _up(self, sem, times: int = 1) -> None:
        for _ in range(times):
            self.libc.sem_post(sem)

    def wait(self) -> None:
        """Return once all ``n`` processes have called it (the same number of times each)."""
        self._down(self.mutex)
        self.count[0] += 1
        if self.count[0] == self.n:  # the last to arrive lets everyone through the first turnstile
            self._up(self.arrived, self.n)
        self._up(self.mutex)
        self._down(self.arrived)
        self._down(self.mutex)  # and no one re-enters before everyone has left
        self.count[0] -= 1
        if self.count[0] == 0:
            self._up(self.left, self.n)
        self._up(self.mutex)
        self._down(self.left)


@functools.lru_cache(maxsize=None)
def _semaphores():
    """The C library, where it has ``sem_init`` (Linux's glibc and musl); None elsewhere."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name in ("sem_init", "sem_wait", "sem_post"):
            getattr(libc, name).argtypes = [ctypes.c_void_p] + ([ctypes.c_int, ctypes.c_uint] if name == "sem_init" else [])
            getattr(libc, name).restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


class NodeBatchWindow:
    """The shared ring of batch slots of one group on this node, and the step that fills one."""

    def __init__(self, MPI, group_comm, layout: "NodeLayout", slots: int, max_batch: int,
                 image_shape: tuple[int, ...], dtype, wait, stats):
        from mpi4py.util.dtlib import from_numpy_dtype

        self.MPI, self.wait, self.stats = MPI, wait, stats  # stats: a TransportStats (times the copy in)
        self.group, self.node, self.node_of = group_comm, layout.node, layout.node_of
        self.is_leader = self.node.Get_rank() == 0
        self.nodes = list(dict.fromkeys(self.node_of))
        self.multi_node = len(self.nodes) > 1
        self.leaders = group_comm.Split(0 if self.is_leader else MPI.UNDEFINED, key=group_comm.Get_rank())
        self.image_shape, self.dtype = tuple(image_shape), np.dtype(dtype)
        self.mpi_image_type, self.mpi_meta_type = from_numpy_dtype(self.dtype), from_numpy_dtype(np.int64)
        self.image_elems = int(np.prod(image_shape))
        img_bytes, ctrl, size = _sizes(slots, max_batch, image_shape, self.dtype)
        self.win = MPI.Win.Allocate_shared(size if self.is_leader else 0, 1, comm=self.node)
        buf, _ = self.win.Shared_query(0)
        raw = np.frombuffer(buf, np.uint8, count=size)
        self.images = raw[:img_bytes].view(self.dtype)[: slots * max_batch * self.image_elems].reshape(
            slots, max_batch, *image_shape)
        self.meta = raw[img_bytes:ctrl].view(np.int64)[: slots * max_batch * 4].reshape(slots, max_batch, 4)
        touch_pages(raw)  # every page of the window mapped into this process now, not in the first copies
        self.sleeping = None  # the node barrier: a SleepingBarrier, or MPI's (polled) where there is none
        if self.node.Get_size() > 1 and self.node.allreduce(_semaphores() is not None, op=MPI.LAND):
            self.sleeping = SleepingBarrier(raw[ctrl:ctrl + SleepingBarrier.BYTES], self.node.Get_size(),
                                            init=self.is_leader)
        self.node.Barrier()  # no member writes a batch (or waits) before every member has mapped the window
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.next = 0
        self.slots, self.max_batch = slots, max_batch

    def assemble(self, mine: list, counts: list[np.ndarray]) -> list:
        """Contribute each of ``mine`` (per batch of the unit: None or a Batch of ``counts[i][my
        rank]`` samples) at its offset of its own slot; return the unit's whole batches as views of
        their slots. One node barrier (two across nodes) publishes the whole unit."""
        me = self.group.Get_rank()
        filled = []  # (slot, total, counts, offsets) per batch
        for block, n in zip(mine, counts):
            total = int(n.sum())
            if total > self.max_batch:
                raise ValueError(f"a batch of {total} exceeds the shared slots' {self.max_batch}")
            offsets = np.concatenate([[0], np.cumsum(n)[:-1]]).astype(np.int64)
            s, self.next = self.next, (self.next + 1) % self.slots
            if n[me]:
                lo = int(offsets[me])
                self.stats.copy(self.images[s][lo:lo + n[me]], block.images)
                self.stats.copy(self.meta[s][lo:lo + n[me]], block.meta)
            filled.append((s, total, n, offsets))
        self.win.Sync()
        self._node_barrier()
        if self.multi_node:
            if self.is_leader:
                requests = []
                for s, _, n, offsets in filled:
                    node_counts, node_offsets = self._node_parts(n, offsets)
                    requests += [self.leaders.Iallgatherv(self.MPI.IN_PLACE, [
                                     self.meta[s], (node_counts * 4).tolist(), (node_offsets * 4).tolist(),
                                     self.mpi_meta_type]),
                                 self.leaders.Iallgatherv(self.MPI.IN_PLACE, [
                                     self.images[s], (node_counts * self.image_elems).tolist(),
                                     (node_offsets * self.image_elems).tolist(), self.mpi_image_type])]
                self.wait(requests, self.leaders)
                self.win.Sync()
            self._node_barrier()
        self.win.Sync()
        return [Batch(self.images[s][:total], self.meta[s][:total], volatile=True) for s, total, _, _ in filled]

    def _node_barrier(self) -> None:
        if self.sleeping is not None:
            self.sleeping.wait()
        else:
            self.wait([self.node.Ibarrier()])

    def _node_parts(self, counts: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        node_counts = np.array([sum(int(c) for c, n in zip(counts, self.node_of) if n == node) for node in self.nodes])
        node_offsets = np.array([int(offsets[self.node_of.index(node)]) for node in self.nodes])
        return node_counts, node_offsets

    def free(self) -> None:
        """Free the window and the communicators it took over (its layout's node communicator)."""
        self.win.Unlock_all()
        self.win.Free()
        if self.leaders != self.MPI.COMM_NULL:
            self.leaders.Free()
        self.node.Free()


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class NodeLayout:
    """Which node each member of a group is on (node id: the lowest world rank there)."""

    def __init__(self, MPI, group_comm):
        self.node = group_comm.Split_type(MPI.COMM_TYPE_SHARED, key=group_comm.Get_rank())
        node_id = self.node.allreduce(MPI.COMM_WORLD.Get_rank(), op=MPI.MIN)
        self.node_of: list[int] = group_comm.allgather(node_id)

    @property
    def contiguous(self) -> bool:
        """Whether each node's members are consecutive in group order (its part of the batch is
        then one range, as the leaders' all-gather-v needs)."""
        seen, prev = set(), None
        for n in self.node_of:
            if n != prev and n in seen:
                return False
            seen.add(n)
            prev = n
        return True

    def free(self) -> None:
        self.node.Free()


def _sizes(slots: int, max_batch: int, image_shape: tuple[int, ...], dtype) -> tuple[int, int, int]:
    """The window's layout: where its int64 meta rows start (after the images, aligned), where the
    node barrier's bytes start (after the meta rows, aligned), and its bytes in all."""
    img_bytes = _aligned(slots * max_batch * int(np.prod(image_shape)) * np.dtype(dtype).itemsize)
    ctrl = _aligned(img_bytes + slots * max_batch * 4 * 8)
    return img_bytes, ctrl, ctrl + SleepingBarrier.BYTES


def window_bytes(slots: int, max_batch: int, image_shape: tuple[int, ...], dtype) -> int:
    return _sizes(slots, max_batch, image_shape, dtype)[2]
