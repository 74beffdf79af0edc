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
from collections import deque

import numpy as np

from enspipe.engine.memory import in_force
from enspipe.measure import threadcpu

CHUNK = 8          # images per message at most
IN_FLIGHT = 2      # chunks a worker holds at once: the next one waits in its socket


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


class WorkerPool:
    """``n`` workers running ``function`` (``"module:factory"``; the factory, called with
    ``kwargs`` in each worker, returns the per-image function ``f(encoded, position, sample,
    epoch) -> image`` and the exceptions that mean an undecodable image) into images of
    ``shape`` and ``dtype``."""

    def __init__(self, n: int, function: str, kwargs: dict, shape: tuple, dtype, skip: bool):
        self.shape, self.dtype, self.skip = tuple(shape), np.dtype(dtype), skip
        self.image_bytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self._init = json.dumps({"function": function, "kwargs": kwargs, "shape": list(self.shape),
                                 "dtype": self.dtype.str, "malloc": in_force()}).encode()
        self.workers = [_Worker(self._init) for _ in range(n)]
        self.inp = self.out = None
        self.sel = selectors.DefaultSelector()
        for w in self.workers:
            self.sel.register(w.sock, selectors.EVENT_READ, w)

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self.workers]

    def _regions(self, inp: int, slots: int) -> None:
        """Regions that hold ``inp`` encoded bytes and ``slots`` images, sent to every worker if new."""
        if self.inp is not None and self.inp.size >= inp and self.out.size >= slots * self.image_bytes:
            return
        old = (self.inp, self.out)
        self.inp = _Region("enspipe-encoded", max(2 * inp, 1 << 24))
        self.out = _Region("enspipe-slots", max(2 * slots, 64) * self.image_bytes)
        for w in self.workers:
            self._send_regions(w)
        for r in old:
            if r is not None:
                r.close()

    def _send_regions(self, w: _Worker) -> None:
        msg = b"R" + json.dumps({"input": self.inp.size, "output": self.out.size}).encode()
        socket.send_fds(w.sock, [msg], [self.inp.fd, self.out.fd])

    def map(self, encoded, position, sample, epoch) -> tuple[np.ndarray, dict[int, str]]:
        """Each image preprocessed: ``(images, failed)``, ``failed`` the index and reason of each
        image that could not be decoded (its row of ``images`` undefined). Raises
        :class:`WorkerDied` where a worker died (in skip mode: where one died with no image to blame)."""
        n = len(encoded)
        lengths = np.fromiter((len(e) for e in encoded), np.int64, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self._regions(int(lengths.sum()), n)
        view = memoryview(self.inp.map)
        for e, o, ln in zip(encoded, offsets.tolist(), lengths.tolist()):
            view[o:o + ln] = e
        del view
        rows = np.stack([np.arange(n), position, sample, epoch, offsets, lengths], axis=1).astype(np.int64)
        failed = self._run(rows)
        broken = {i: why for i, why in failed.items() if isinstance(why, tuple)}
        if broken and not self.skip:
            i = min(broken)
            raise FunctionFailed(i, broken[i][1])
        failed = {i: (f"the preprocessing raised {why[1]}" if isinstance(why, tuple) else why)
                  for i, why in failed.items()}
        images = np.frombuffer(self.out.map, self.dtype, n * int(np.prod(self.shape))).reshape((n, *self.shape))
        return images.copy(), failed

    def _run(self, rows: np.ndarray) -> dict[int, str]:
        """The rows' images made, in chunks small enough that every worker gets some (at most
        :data:`CHUNK` images), handed out one per worker in turn, each holding up to
        :data:`IN_FLIGHT`; returns the failed images' reasons."""
        size = max(1, min(CHUNK, -(-len(rows) // (IN_FLIGHT * len(self.workers)))))
        todo = deque(np.array_split(rows, -(-len(rows) // size))) if len(rows) else deque()
        failed: dict[int, str] = {}
        while todo or any(w.held for w in self.workers):
            for depth in range(IN_FLIGHT):
                for i in range(len(self.workers)):  # by index: a worker that died is replaced in place
                    if todo and len(self.workers[i].held) <= depth:
                        self._send(self.workers[i], todo, failed)
            for key, _ in self.sel.select(timeout=1.0):
                w = key.data
                try:
                    reply = w.sock.recv(1 << 20)
                except ConnectionResetError:
                    reply = b""
                if reply:
                    self._done(w.held.popleft(), reply, failed)
                else:
                    self._died(w, todo, failed)
        return failed

    def _send(self, w: _Worker, todo: deque, failed: dict[int, str]) -> None:
        chunk = todo.popleft()
        try:
            w.sock.send(chunk.tobytes())
        except OSError:  # it died since its last answer: the chunk it never had goes back
            todo.appendleft(chunk)
            self._died(w, todo, failed)
            return
        w.held.append(chunk)

    @staticmethod
    def _done(chunk: np.ndarray, reply: bytes, failed: dict[int, str]) -> None:
        (m,) = struct.unpack_from("<q", reply)
        status = reply[8:8 + m]
        why = iter(reply[8 + m:].decode().split("\0"))
        for row, bad in zip(chunk, status):
            if bad:  # 2: the function's own exception, not an undecodable image
                failed[int(row[0])] = next(why) if bad == 1 else ("raised", next(why))

    def _died(self, w: _Worker, todo: deque, failed: dict[int, str]) -> None:
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
            slots = [int(r[0]) for c in ([working] if working is not None else []) for r in c]
            raise WorkerDied(f"preprocessing worker {pid} {how}", slots)
        todo.extendleft(reversed(waiting))
        if len(working) == 1:
            failed[int(working[0, 0])] = f"the decoder crashed its worker ({how})"
        else:
            todo.extendleft(reversed([working[i:i + 1] for i in range(len(working))]))

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
        self.sel.close()
        for r in (self.inp, self.out):
            if r is not None:
                r.close()
        self.inp = self.out = None
