"""``enspipe serve``: one node's preprocessing, served to every process that attaches.

The server owns the pool (node-shared memory, within its budget) and a thread per attached
consumer; a pool of ``workers`` threads preprocesses what the scheduler
(:mod:`enspipe.serve.schedule`) picks; with several MPI ranks, the ranks share that work
(:mod:`enspipe.serve.mesh`). A consumer's messages are small: a batch is a list of slots, which the
consumer copies out of the pool into its own arrays and releases with its next request, so a batch
it keeps never changes. A consumer waiting for a batch is woken once that batch is ready.

A consumer that goes away (``close()``, its process exiting or killed) closes its socket: the
server sees it at once and lets go of everything that consumer needed or held. The server writes
its status (consumers, their epochs and positions, the window's and the total's rates and sharing)
to ``SOCKET.status.json`` every ``status_interval`` seconds and when it stops.
"""
from __future__ import annotations

import itertools
import os
import select
import signal
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from enspipe.common.atomic import write_json_atomic
from enspipe.data.transforms import layout_of
from enspipe.engine.memory import set_malloc
from enspipe.serve import wire
from enspipe.serve.samples import Pool, SampleMaker, SampleSource
from enspipe.serve.schedule import Scheduler
from enspipe.serve.status import Status

HELLO_TIMEOUT_S = 10.0
# tests only: "STEP:N", the step of a consumer's life at which the server waits until the consumer is
# gone (its socket hung up) before going on, as if it died there, for the first N connections that reach
# it: "hello" (before its hello is read), "welcome" (admitted, before the welcome is sent), "request"
# (before its first request is read), "batch" (a batch made, before it is sent)
HOLD_KEY = "ENSPIPE_FAULT_SERVE_HOLD"


def status_path(sock: str) -> str:
    return sock + ".status.json"


class Server:
    """The server for ``opts`` over ``manifest`` (checked beforehand: :func:`enspipe.serve.checks.prepare`)."""

    def __init__(self, opts: wire.ServeOptions, manifest, say=print, idle_exit: float = 0.0, comm=None):
        """``comm``: the MPI communicator of a server of several ranks (one per node), which share
        the preprocessing (:mod:`enspipe.serve.mesh`); None for one process."""
        from enspipe.data.pixels import output_spec

        self.opts, self.m, self.say, self.idle_exit = opts, manifest, say, idle_exit
        self.malloc = set_malloc(opts.malloc)  # before the maker starts its workers, which take it
        shape, dtype = output_spec(opts.preprocessing, opts.image_size, opts.wire_dtype)
        self.source = SampleSource(manifest)
        self.maker = SampleMaker(self.source, opts)  # the backend's maker: on the CPU, a worker process per thread
        device = self.maker.device if opts.on_gpu else None
        self.pool = Pool.create(opts.slots, shape, dtype, mode=opts.file_mode, gid=opts.gid, say=say, device=device)
        self.sched = Scheduler(manifest.num_images, opts.slots, opts.batch_size, opts.seed)
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)  # the lock; notified where every waiter should look
        self.wakers: dict[int, threading.Condition] = {}  # a consumer's own, on the same lock
        # the samples per task and the threads, as the backend's row has them: on the GPU a batch's chunk in one
        # call, two in flight; on the CPU a few samples per task on every core
        self.chunk = opts.backend_row.serve_chunk or opts.batch_size
        threads = opts.workers or opts.backend_row.serve_threads or len(os.sched_getaffinity(0))
        self.workers = ThreadPoolExecutor(threads, thread_name_prefix="enspipe-serve")
        self.positions = itertools.count()
        self.ids = itertools.count()
        self.stopping = threading.Event()
        self.status = Status(self.sched, opts, self.pool.bytes)
        if self.maker.decodes is not None:
            self.status.decodes = lambda: self.maker.decodes
        if opts.backend_row.on_gpu:
            self.status.pool_device = str(device) if device is not None else "host"
        self.info = {**opts.hello(), "data": str(opts.data), "digest": manifest.digest}
        step, _, count = os.environ.get(HOLD_KEY, "").partition(":")
        self.hold = {step: int(count or 0)} if step else {}
        self.mesh = None
        if comm is not None:
            from enspipe.serve.mesh import Mesh

            self.mesh = Mesh(self, comm)
            self.status.extra = self.mesh.status

    # -- the main loop ----------------------------------------------------------------------------
    def serve(self) -> None:
        """Listen on the socket until SIGTERM or SIGINT (or, with ``idle_exit``, until no consumer
        has been attached for that long); then end every consumer's iteration and clean up."""
        # the status exists before the socket answers: whoever sees a live server can read it
        self._write_status("serving")
        listener = self._listen()
        listener.settimeout(0.2)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        self.reporter = threading.Thread(target=self._report, name="enspipe-serve-status", daemon=True)
        self.reporter.start()
        if self.mesh:
            self.mesh.thread.start()
        self.say(f"serving {self.opts.data} ({self.m.num_images} samples, batch {self.opts.batch_size}, "
                 f"{self.opts.image_size} px {self.opts.preprocess}) on {self.opts.socket}; {self.opts.sizing()}")
        idle_since = time.monotonic()
        try:
            while not self.stopping.is_set():
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    if self.sched.consumers or self.status.connections:
                        idle_since = time.monotonic()
                    if self._idle_long(idle_since):
                        break
                    continue
                with self.cond:
                    self.status.accepted += 1
                threading.Thread(target=self._consumer, args=(conn,), daemon=True, name="enspipe-consumer").start()
        finally:
            self._stop(listener)

    def _listen(self) -> socket.socket:
        """The socket, its mode exact from its creation on whatever the umask (no thread that
        creates files runs yet), then given to ``--group`` where there is one."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        umask = os.umask(0o177)
        try:
            listener.bind(self.opts.socket)
        finally:
            os.umask(umask)
        if self.opts.gid is not None:
            os.chown(self.opts.socket, -1, self.opts.gid)
        os.chmod(self.opts.socket, self.opts.socket_mode)
        listener.listen(64)
        return listener

    def _write_status(self, state: str) -> None:
        with self.cond:
            snap = self.status.snapshot(state=state)
        write_json_atomic(status_path(self.opts.socket), snap, mode=self.opts.file_mode, gid=self.opts.gid)

    def _idle_long(self, idle_since: float) -> bool:
        """Whether to stop for ``idle_exit``; a rank of several says so in the next round instead,
        and the job stops once every rank has been idle that long."""
        idle = bool(self.idle_exit) and time.monotonic() - idle_since > self.idle_exit
        if self.mesh:
            self.mesh.idle = idle
            return False
        if idle:
            self.say(f"no consumer for {self.idle_exit:g} s: stopping")
        return idle

    def _stop(self, listener: socket.socket) -> None:
        self.stopping.set()
        listener.close()
        try:
            os.remove(self.opts.socket)
        except FileNotFoundError:
            pass
        with self.cond:
            self._wake_all()
        self.status.close_connections()
        if self.mesh:  # the other ranks learn of the stop in its last round
            self.mesh.wake.set()
            self.mesh.thread.join()
        self.workers.shutdown(wait=True, cancel_futures=True)
        self.maker.close()
        self.reporter.join()  # its last write done: the final status is the last word
        self._write_status("stopped")
        self.pool.close(unlink=True)
        self.say("stopped; " + self.status.totals_line())

    def _report(self) -> None:
        while not self.stopping.wait(self.opts.status_interval):
            self._write_status("serving")

    # -- one consumer -----------------------------------------------------------------------------
    def _consumer(self, conn: socket.socket) -> None:
        """One connection's life: a hello (within ``HELLO_TIMEOUT_S``), then requests until it
        leaves. Anything but the protocol closes it with one line in the log, never a traceback."""
        cid, why = None, "closed"
        try:
            conn.settimeout(HELLO_TIMEOUT_S)
            self._hold(conn, "hello")
            first = wire.recv(conn)  # read before any answer: a refused peer reads why, not a closed socket
            denied = self._denied(conn)
            if denied:
                why = denied
                wire.send(conn, {"error": denied, "reason": "permission"})
                return
            cid = self._admit(conn, wire.check_hello(first))
            if cid is None:
                return
            self._hold(conn, "welcome")
            wire.send(conn, self._welcome(cid))  # a consumer gone by now is let go as any other: cid is known
            conn.settimeout(None)  # a consumer may train as slowly as it likes
            self._hold(conn, "request")
            while not self.stopping.is_set():
                op, release = wire.check_request(wire.recv(conn), self.pool.slots)
                if op == "bye":
                    break
                batch = self._next(cid, release)  # with the slots of the batch before, copied out
                self._hold(conn, "batch")
                wire.send(conn, batch)
        except wire.Malformed as e:
            why = f"malformed: {e}"
            self._tell(conn, {"error": f"closed: {e}", "reason": "protocol"})
        except socket.timeout:
            why = f"no hello in {HELLO_TIMEOUT_S:g} s"
        except (EOFError, OSError) as e:  # gone
            why = "gone" if cid is not None else f"no hello ({type(e).__name__})"
        except Exception as e:  # noqa: BLE001 - a bug: this connection ends, the server and the others go on
            why = f"error: {type(e).__name__}: {e}"
        finally:
            self._leave(conn, cid, why)

    def _denied(self, conn: socket.socket) -> str | None:
        """Why the peer may not attach, or None: without ``--group``, only the server's own user
        (the socket's mode says so too; this holds where someone loosened it)."""
        pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if self.opts.group is None and uid != os.geteuid():
            return (f"permission: this server admits only its own user's (uid {os.geteuid()}) consumers, not uid "
                    f"{uid} (pid {pid}); its user may start it with --group GROUP to let a group in")
        return None

    @staticmethod
    def _tell(conn: socket.socket, message: dict) -> None:
        """A last word to a connection being closed, where it still listens."""
        try:
            conn.settimeout(1.0)
            wire.send(conn, message)
        except OSError:
            pass

    def _hold(self, conn: socket.socket, step: str) -> None:
        """Where :data:`HOLD_KEY` names ``step``, wait (at most 30 s) until the consumer has hung up."""
        if step not in self.hold:  # every batch passes here: no lock unless the hook is set
            return
        with self.cond:
            if self.hold[step] <= 0:
                return
            self.hold[step] -= 1
        poller = select.poll()
        poller.register(conn, select.POLLHUP)
        poller.poll(30_000)

    def _admit(self, conn: socket.socket, hello: dict) -> int | None:
        """The new consumer's id, registered, after its hello matches this server; else it is told
        why. The caller sends the welcome: whatever happens from here, it lets the id go."""
        problems = wire.differences(self.info, hello)
        with self.cond:
            if not problems and len(self.sched.consumers) >= self.capacity:
                problems = [self._full()]
            if problems:
                wire.send(conn, {"error": "; ".join(problems)})
                return None
            cid = next(self.ids)
            self.sched.attach(cid)
            self.wakers[cid] = threading.Condition(self.lock)
            self.status.attached(cid, conn, hello)
        return cid

    def _welcome(self, cid: int) -> dict:
        """What an admitted consumer is told: its id, the pool and the stream."""
        return {"consumer": cid, "pool": self.pool.path, "slots": self.pool.slots, "images": self.pool.handle(),
                "shape": list(self.pool.shape), "dtype": self.pool.dtype.str,
                "num_images": self.m.num_images, "num_classes": self.m.num_classes,
                "layout": layout_of(self.opts.preprocessing), "pid": os.getpid(), **self.info}

    def _full(self) -> str:
        """Why one more consumer does not fit, naming the limit that applies and its fix."""
        per = self.opts.per_consumer
        by_memory = max(1, self.opts.slots // per)
        attached = len(self.sched.consumers)
        if self.opts.max_consumers <= by_memory:
            return (f"consumers: {attached} are attached, the server's --max-consumers {self.opts.max_consumers}; "
                    "start it with a larger --max-consumers (its memory budget holds "
                    f"{by_memory}), or attach once one has left")
        return (f"consumers: {attached} are attached, as many as the server's memory budget holds "
                f"({self.opts.pool_bytes} bytes, {self.opts.slots} samples; each consumer needs batch_size x (2 + ahead) = {per}); start it "
                "with a larger --memory or a smaller --ahead, or attach once one has left")

    @property
    def capacity(self) -> int:
        """Consumers the pool holds (:attr:`~enspipe.serve.wire.ServeOptions.capacity`)."""
        return self.opts.capacity

    def _leave(self, conn: socket.socket, cid: int | None, why: str) -> None:
        with self.cond:
            who = self.status.consumers.get(cid, {}) if cid is not None else {}
            if cid is not None:
                self.sched.detach(cid)
                self.status.detached(cid, why)
                self.wakers.pop(cid, None)
            self.status.closed += 1
            self._wake_all()
        if why.startswith(("malformed", "permission", "error")):
            peer = f"consumer {cid} ({who.get('name')}, pid {who.get('pid')})" if cid is not None else "a connection"
            self.say(f"closed {peer}: {why}")
        try:
            conn.close()
        except OSError:
            pass

    def _next(self, cid: int, release) -> dict:
        """The consumer's next batch, waiting (on its own condition) until it is made; and, after
        an epoch's last batch, one batch of its next epoch made ahead (the rest when it asks: a
        consumer that leaves costs one batch, not ``ahead + 1``)."""
        with self.cond:
            if release:
                if not self.sched.holds(cid, release):
                    raise wire.Malformed(f"release names slots this consumer does not hold: {release!r:.60}")
                self.sched.release(cid, release)
                if self.sched.short:  # a plan found every slot in use: the waiting may find one now
                    self._wake_all()
            while (taken := self.sched.take(cid)) is None:
                self._make_for(cid)
                self.wakers[cid].wait(0.5)
                if self.stopping.is_set():
                    return {"error": "the server is stopping"}
            self._make_for(cid, ahead=0 if taken.end else self.opts.ahead)
            self.status.gave(cid, len(taken.samples))
        return {"slots": taken.slots, "epoch": taken.epoch, "end": taken.end}

    def _wake(self, cids) -> None:
        """Wake the consumers among ``cids`` whose next batch is ready (under the lock)."""
        for cid in cids:
            waker = self.wakers.get(cid)
            if waker is not None and self.sched.ready(cid):
                waker.notify()

    def _wake_all(self) -> None:
        self.sched.short = False
        for waker in self.wakers.values():
            waker.notify()
        self.cond.notify_all()

    # -- making ---------------------------------------------------------------------------------
    def _make_for(self, cid: int, ahead: int | None = None) -> None:
        """Queue what the consumer lacks (under the lock), in chunks: one lock per chunk, not per
        sample, and a consumer woken only once its batch is ready."""
        jobs = self.sched.plan(cid, self.sched.wanted(cid, self.opts.ahead if ahead is None else ahead))
        if self.mesh:
            self.mesh.queue(jobs)
            return
        for i in range(0, len(jobs), self.chunk):
            self.workers.submit(self._make, [(s, slot, next(self.positions)) for s, slot in jobs[i:i + self.chunk]])

    def _make(self, chunk: list) -> None:
        if self.stopping.is_set():
            return
        try:
            images, rows = self.maker.make([s for s, _, _ in chunk], [position for _, _, position in chunk])
            done, failed = self._put(chunk, images, rows)
        except BaseException as e:  # noqa: BLE001 - a bug: say it and stop serving rather than hang everyone
            self.say(f"error: preprocessing samples {[s for s, _, _ in chunk]} failed: {type(e).__name__}: {e}; "
                     "stopping")
            self.stopping.set()
            with self.cond:
                self._wake_all()
            return
        with self.cond:
            woken = set()
            for slot in done:
                woken |= self.sched.made_one(slot)
            for slot, problem in failed:
                self.sched.failed_one(slot)
                self.status.failed(problem)
            if failed:
                self._wake_all()
            else:
                self._wake(woken)
        for _, problem in failed:
            self.say(f"left out of every epoch: {problem}")

    def _put(self, chunk: list, images, rows: list) -> tuple[list, list]:
        """The chunk's samples that were made, written into their slots: ``(their slots, [(slot,
        problem)] of those that failed)``."""
        done, failed, keep, meta = [], [], [], []
        for i, ((_, slot, _), (sid, label, problem)) in enumerate(zip(chunk, rows)):
            if problem is not None:
                failed.append((slot, problem))
                continue
            done.append(slot)
            keep.append(i)
            meta.append((sid, label))
        self.pool.put(done, images if len(keep) == len(chunk) else images[keep], meta)  # no copy when all made
        return done, failed
