"""Worker processes that preprocess images into shared memory: how a CPU backend uses every core
it is given, past the GIL.

A member given k cores runs k workers (``python -m enspipe.engine.worker``), one process and one
thread each, as PyTorch's ``DataLoader`` workers are, but nothing is pickled: the member writes
each slice's encoded images into an input region of shared memory, sends each worker chunks of
``(slot, position, sample, epoch, offset, length)`` rows over its socket, and the worker
decodes and augments each image straight into its slot of an output region, answering one
status per image. The stage then copies the slice's images out, one ``memcpy`` each. Both
regions are ``memfd``\\ s passed over the sockets: nothing in ``/dev/shm``, and the memory goes
with the last process that maps it, however the member ends.

* **Cores and CPU.** Workers start on the member's cores (they inherit its affinity), and their
  CPU is the member's: :func:`enspipe.measure.threadcpu.adopt` adds it to the member's process
  clocks and thread groups (``enspipe-worker``).
* **Lifetimes.** A worker exits when its socket closes, which the member's end closes however it
  ends, and ``PR_SET_PDEATHSIG`` kills one that is busy then.
* **Failures.** A worker that dies fails the member at once, naming it, how it died and the
  images it held. With ``skip`` (``--on-corrupt skip``), a fresh worker takes its place and the
  images it held are retried one at a time; one that kills its worker alone is skipped and
  counted as the decoder's crash.
"""
from __future__ import annotations

import json
import mmap
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter, deque

import numpy as np

from enspipe.engine.memory import in_force
from enspipe.measure import threadcpu

CHUNK = 8          # images per message at most
IN_FLIGHT = 2      # chunks a worker holds at once: the next one waits in its socket
LANES = 2          # slices in flight at once (WorkerPool.submit)


class WorkerDied(RuntimeError):
    """A preprocessing worker ended while it held images."""


class FunctionFailed(RuntimeError):
    """The per-image function raised (not an undecodable image): ``args`` the image's index in the
    slice and what it raised."""


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class _Worker:
    def __init__(self, init: bytes):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, max(len(init) * 2, 1 << 16))  # (a user's pickle)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "enspipe.engine.worker", str(child.fileno()),
                                      str(os.getpid())], pass_fds=(child.fileno(),), env=env,
                                     stdin=subprocess.DEVNULL)
        child.close()
        self.sock, self.held = parent, deque()
        self.sock.send(init)
        threadcpu.adopt(self.proc.pid, "enspipe-worker")

    def close(self, wait: float = 5.0) -> None:
        """Close its socket (the worker exits) and reap it, killed after ``wait`` seconds; its
        CPU stays the member's."""
        self.sock.close()
        end = time.monotonic() + wait
        while not self._ended(block=False) and time.monotonic() < end:
            time.sleep(0.005)
        if not self._ended(block=False):
            self.proc.kill()
            self._ended(block=True)
        threadcpu.release(self.proc.pid)
        self.proc.wait()

    def _ended(self, block: bool) -> bool:
        """Whether the worker has ended (not reaped yet, so its times can still be read)."""
        try:
            got = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG))
        except ChildProcessError:  # reaped already
            return True
        return got is not None


class _Region:
    """A memfd of ``size`` bytes, mapped read-write here."""

    def __init__(self, name: str, size: int):
        self.size = -(-max(int(size), 1) // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages: what mmap maps
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view still held: the mapping goes with it
            pass
        os.close(self.fd)


class _Job:
    """One slice in flight: its lane of both regions, how many of its chunks are still out, what
    failed (index in the slice -> why), and the caller's ``tag`` (named by a worker's death)."""

    __slots__ = ("lane", "n", "left", "failed", "tag", "images")

    def __init__(self, lane: int, n: int, tag):
        self.lane, self.n, self.left, self.failed, self.tag, self.images = lane, n, 0, {}, tag, None


class WorkerPool:
    """``n`` workers running ``function`` (``"module:factory"``; the factory, called with
    ``kwargs`` in each worker, returns the per-image function ``f(encoded, position, sample,
    epoch) -> image`` and the exceptions that mean an undecodable image) into images of
    ``shape`` and ``dtype``.

    Up to :data:`LANES` slices are in flight at once (:meth:`submit`, then :meth:`result` in the
    same order), each in a lane of both regions of its own: the workers go on to the next slice's
    images while the member copies the last one's out, as a ``DataLoader``'s prefetch does."""

    def __init__(self, n: int, function: str, kwargs: dict, shape: tuple, dtype, skip: bool):
        self.shape, self.dtype, self.skip = tuple(shape), np.dtype(dtype), skip
        self.image_bytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self._init = json.dumps({"function": function, "kwargs": kwargs, "shape": list(self.shape),
                                 "dtype": self.dtype.str, "malloc": in_force()}).encode()
        self.workers = [_Worker(self._init) for _ in range(n)]
        self.inp = self.out = None
        self.lane_bytes = self.lane_slots = 0
        self.jobs: deque[_Job] = deque()   # in flight, in the order submitted
        self.todo: deque = deque()         # (job, chunk of rows) not yet sent
        self.whole_decodes: Counter = Counter()  # images the workers decoded whole, by reason (data.decoding)
        self.sel = selectors.DefaultSelector()
        for w in self.workers:
            self.sel.register(w.sock, selectors.EVENT_READ, w)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def map(self, encoded, position, sample, epoch) -> tuple[np.ndarray, dict[int, str]]:
        """Each image preprocessed: ``(images, failed)``, ``failed`` the index and reason of each
        image that could not be decoded (its row of ``images`` undefined). Raises
        :class:`WorkerDied` where a worker died (in skip mode: where one died with no image to blame)."""
        return self.result(self.submit(encoded, position, sample, epoch))

    def submit(self, encoded, position, sample, epoch, tag=None) -> _Job:
        """Hand a slice's images to the workers and return at once (see :meth:`result`)."""
        n = len(encoded)
        lengths = np.fromiter((len(e) for e in encoded), np.int64, n)
        self._room(int(lengths.sum()), n)
        busy = {j.lane for j in self.jobs}
        job = _Job(next(i for i in range(LANES) if i not in busy), n, tag)
        offsets = job.lane * self.lane_bytes + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        view = memoryview(self.inp.map)
        for e, o, ln in zip(encoded, offsets.tolist(), lengths.tolist()):
            view[o:o + ln] = e
        del view
        slots = self._first_slot(job) + np.arange(n)
        rows = np.stack([slots, position, sample, epoch, offsets, lengths], axis=1).astype(np.int64)
        size = max(1, min(CHUNK, -(-n // (IN_FLIGHT * len(self.workers)))))
        chunks = np.array_split(rows, -(-n // size)) if n else []
        job.left = len(chunks)
        self.todo.extend((job, c) for c in chunks)
        self.jobs.append(job)
        self._dispatch()
        return job

    def result(self, job: _Job) -> tuple[np.ndarray, dict[int, str]]:
        """The images of ``job`` (the oldest in flight), copied out of its lane, and what failed."""
        assert self.jobs and self.jobs[0] is job, "results are taken in the order submitted"
        while job.left:
            self._step()
        self.jobs.popleft()
        broken = {i: why for i, why in job.failed.items() if isinstance(why, tuple)}
        if broken and not self.skip:
            i = min(broken)
            raise FunctionFailed(i, broken[i][1])
        failed = {i: (f"the preprocessing raised {why[1]}" if isinstance(why, tuple) else why)
                  for i, why in job.failed.items()}
        return (job.images if job.images is not None else self._copy_out(job)), failed

    def _first_slot(self, job: _Job) -> int:
        """The output region's slot of ``job``'s first image (its lane's first)."""
        return job.lane * self.lane_slots

    def _copy_out(self, job: _Job) -> np.ndarray:
        per = int(np.prod(self.shape))
        start = self._first_slot(job) * per
        return np.frombuffer(self.out.map, self.dtype, job.n * per, start * self.dtype.itemsize).reshape(
            (job.n, *self.shape)).copy()

    def _room(self, inp: int, slots: int) -> None:
        """Lanes that hold ``inp`` encoded bytes and ``slots`` images, sent to every worker if new;
        slices still in flight finish first, their images copied out of the old regions."""
        if self.inp is not None and self.lane_bytes >= inp and self.lane_slots >= slots:
            lanes = [j for j in self.jobs if j.lane >= 0]
            if len(lanes) >= LANES:  # every lane taken: the oldest slice's images wait, copied out
                self._park(lanes[0])
            return
        for job in self.jobs:
            self._park(job)
        old = (self.inp, self.out)
        self.lane_bytes = -(-max(2 * inp, 1 << 23) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.lane_slots = max(2 * slots, 32)
        self.inp = _Region("enspipe-encoded", LANES * self.lane_bytes)
        self.out = _Region("enspipe-slots", LANES * self.lane_slots * self.image_bytes)
        for w in self.workers:
            self._send_regions(w)
        for r in old:
            if r is not None:
                r.close()

    def _park(self, job: _Job) -> None:
        """Finish ``job`` now and keep its images, out of its lane."""
        while job.left:
            self._step()
        if job.images is None:
            job.images = self._copy_out(job)
            job.lane = -1  # its lane is free

    def _send_regions(self, w: _Worker) -> None:
        msg = b"R" + json.dumps({"input": self.inp.size, "output": self.out.size}).encode()
        socket.send_fds(w.sock, [msg], [self.inp.fd, self.out.fd])

    def _dispatch(self) -> None:
        """Chunks handed out one per worker in turn, each worker holding up to :data:`IN_FLIGHT`."""
        for depth in range(IN_FLIGHT):
            for i in range(len(self.workers)):  # by index: a worker that died is replaced in place
                if self.todo and len(self.workers[i].held) <= depth:
                    self._send(self.workers[i])

    def _step(self) -> None:
        """Wait for the workers' next answers and take them."""
        self._dispatch()
        for key, _ in self.sel.select(timeout=1.0):
            w = key.data
            try:
                reply = w.sock.recv(1 << 20)
            except ConnectionResetError:
                reply = b""
            if reply:
                self._done(*w.held.popleft(), reply)
            else:
                self._died(w)
        self._dispatch()

    def _send(self, w: _Worker) -> None:
        job, chunk = self.todo.popleft()
        try:
            w.sock.send(chunk.tobytes())
        except OSError:  # it died since its last answer: the chunk it never had goes back
            self.todo.appendleft((job, chunk))
            self._died(w)
            return
        w.held.append((job, chunk))

    def _done(self, job: _Job, chunk: np.ndarray, reply: bytes) -> None:
        """A chunk's answer: its rows, the length of its reasons, a status byte per row, the reasons
        of those that failed, and the images the worker decoded whole since its last answer
        (JSON, by reason)."""
        m, n = struct.unpack_from("<qq", reply)
        status = reply[16:16 + m]
        why = iter(reply[16 + m:16 + m + n].decode().split("\0"))
        self.whole_decodes.update(json.loads(reply[16 + m + n:]))
        base = self._first_slot(job)
        for row, bad in zip(chunk, status):
            if bad:  # 2: the function's own exception, not an undecodable image
                job.failed[int(row[0]) - base] = next(why) if bad == 1 else ("raised", next(why))
        job.left -= 1

    def _died(self, w: _Worker) -> None:
        """Worker ``w`` ended: fail (naming it and what it held), or, in skip mode, replace it
        and retry what it was working on one image at a time; an image alone when its worker
        died is the culprit."""
        self.sel.unregister(w.sock)
        w.close()
        how, pid = describe_exit(w.proc.returncode), w.proc.pid
        working, waiting = (w.held[0] if w.held else None), list(w.held)[1:]
        w.held.clear()
        self._replace(w)
        if not self.skip or working is None:
            job, chunk = working if working is not None else (None, ())
            base = self._first_slot(job) if job is not None else 0
            raise WorkerDied(f"preprocessing worker {pid} {how}", [int(r[0]) - base for r in chunk],
                             job.tag if job is not None else None)
        self.todo.extendleft(reversed(waiting))
        job, chunk = working
        if len(chunk) == 1:
            job.failed[int(chunk[0, 0]) - self._first_slot(job)] = f"the decoder crashed its worker ({how})"
            job.left -= 1
        else:
            job.left += len(chunk) - 1
            self.todo.extendleft(reversed([(job, chunk[i:i + 1]) for i in range(len(chunk))]))

    def _replace(self, w: _Worker) -> None:
        fresh = _Worker(self._init)
        self.workers[self.workers.index(w)] = fresh
        self.sel.register(fresh.sock, selectors.EVENT_READ, fresh)
        if self.inp is not None:
            self._send_regions(fresh)

    def close(self) -> None:
        for w in self.workers:
            try:
                self.sel.unregister(w.sock)
            except (KeyError, ValueError):
                pass
            w.close()
        self.workers = []
        self.jobs.clear()
        self.todo.clear()
        self.sel.close()
        for r in (self.inp, self.out):
            if r is not None:
                r.close()
        self.inp = self.out = None
