"""The ranks of an MPI attach server (``mpiexec -n P enspipe serve ...``, a rank per node, each
with its own socket, pool and consumers) sharing the preprocessing as All-Shared does.

They work in rounds. In each, every rank says which samples its consumers lack (what its scheduler
planned since the last round, at most a few batches' worth); the union is made once, split evenly
over the ranks (sample ``i`` of the union by rank ``i mod P``), and every rank gets every copy
(``Allgatherv``). A rank writes into its pool the copies it asked for, and adopts the others that a
consumer of its own needs and has none coming of, while its pool has room to spare
(:meth:`enspipe.serve.schedule.Scheduler.adopt`): consumers on different nodes that need the same
samples at about the same time share one preprocessing.

The rounds are collective: a rank that is asked to stop (SIGTERM, Ctrl-C) says so in the next
round and every rank stops after it; ``--idle-exit`` stops the job once every rank has been idle
that long. A rank that fails ends the job (``MPI_Abort``), and every consumer's iteration raises
:class:`~enspipe.ServerGone`. A copy's random draws depend on its place in the job's stream (the
union's order), so the job's copies never depend on which rank made them.
"""
from __future__ import annotations

import threading
import time

import numpy as np


IDLE_WAIT_S = 0.01   # a round with nothing asked waits this long for a consumer's request, doubling
MAX_IDLE_WAIT_S = 0.1  # up to this while the rounds stay empty (an idle job costs about 1 % of a core)
POLL_S = 0.0005      # ranks meet at a non-blocking barrier, polled: a rank that waits sleeps, not spins
MAX_POLL_S = 0.004   # the poll's pause doubles from POLL_S up to this while the others are busy


class Mesh:
    """One rank's part in the rounds; :meth:`queue` is called under the server's lock."""

    def __init__(self, server, comm):
        self.server, self.comm = server, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.limit = server.opts.batch_size * (1 + server.opts.ahead)  # samples asked per round
        self.asked: list[tuple[int, int]] = []  # (sample, slot) planned here, not yet in a round
        self.wake = threading.Event()
        self.idle = False                       # this rank has had no consumer for --idle-exit
        self.position = 0                       # stream positions the job's copies used so far
        self.idle_wait = IDLE_WAIT_S
        self.counts = {"preprocessed_here": 0, "received": 0, "adopted": 0, "passed": 0, "rounds": 0}
        self.job = {"preprocessed": 0, "delivered": 0}
        self.thread = threading.Thread(target=self._run, name="enspipe-serve-mesh", daemon=True)

    def queue(self, jobs: list) -> None:
        self.asked.extend(jobs)
        if jobs:
            self.wake.set()

    def _run(self) -> None:
        try:
            while self._round():
                pass
        except BaseException as e:  # noqa: BLE001 - the other ranks wait in a collective: end the job
            self.server.say(f"error: rank {self.rank} of the server failed: {type(e).__name__}: {e}; ending the job")
            self.comm.Abort(1)

    def _round(self) -> bool:
        """One round; False once every rank is to stop."""
        s = self.server
        if not self.asked and not s.stopping.is_set():
            self.wake.wait(self.idle_wait)
        self.wake.clear()
        with s.cond:
            mine, self.asked = self.asked[:self.limit], self.asked[self.limit:]
            note = {"asked": [sample for sample, _ in mine], "stop": s.stopping.is_set(), "idle": self.idle,
                    "delivered": s.sched.given, "preprocessed": self.counts["preprocessed_here"]}
        notes = self._allgather(note)
        union = list(dict.fromkeys(sample for n in notes for sample in n["asked"]))  # first asker's order
        if union:
            self._share(union, mine)
        self.idle_wait = min(2 * self.idle_wait, MAX_IDLE_WAIT_S) if not union else IDLE_WAIT_S
        self.counts["rounds"] += 1
        stop = any(n["stop"] for n in notes) or all(n["idle"] for n in notes)
        if stop:  # the last round's totals, with what it made
            with s.cond:
                last = {"delivered": s.sched.given, "preprocessed": self.counts["preprocessed_here"]}
            notes = self._allgather(last)
        self.job = {"preprocessed": sum(n["preprocessed"] for n in notes),
                    "delivered": sum(n["delivered"] for n in notes)}
        if stop:
            s.stopping.set()
            with s.cond:
                s._wake_all()
        return not stop

    def _share(self, union: list, mine: list) -> None:
        """Make this rank's share of the union, gather every rank's copies, keep what is needed here."""
        base, self.position = self.position, self.position + len(union)
        with self.server.cond:
            slots_of = self._claim(union, mine)
        share = list(range(self.rank, len(union), self.size))
        images, rows = self._make([union[i] for i in share], [base + i for i in share])
        self.counts["preprocessed_here"] += len(share)
        made = {sample: row for part in self._allgather(rows) for sample, row in part.items()}
        blocks = [len(range(r, len(union), self.size)) for r in range(self.size)]  # each rank's share's size
        copies = self._allgatherv(images, blocks)
        starts = [sum(blocks[:r]) for r in range(self.size)]  # each rank's block in the gathered copies
        where = [starts[i % self.size] + i // self.size for i in range(len(union))]  # union sample i in copies
        self._fill(union, slots_of, made, copies, where)

    def _make(self, samples: list, positions: list) -> tuple[np.ndarray, dict]:
        """This rank's copies (in the order given) and, per sample, ``(id, label, problem)``: made
        in chunks on the server's threads, each with its worker process."""
        pool, maker, chunk = self.server.pool, self.server.maker, self.server.chunk
        images = np.zeros((len(samples), *pool.shape), pool.dtype)
        spans = [range(i, min(i + chunk, len(samples))) for i in range(0, len(samples), chunk)]
        futures = [self.server.workers.submit(maker.make, [samples[j] for j in r], [positions[j] for j in r])
                   for r in spans]
        rows = {}
        for r, future in zip(spans, futures):
            made, got = future.result()
            images[r.start:r.stop] = made.cpu().numpy() if hasattr(made, "cpu") else made  # MPI's are host copies
            for j, (sid, label, problem) in zip(r, got):
                rows[samples[j]] = (sid, label, None) if problem is None else (-1, -1, problem)
        return images, rows

    def _claim(self, union: list, mine: list) -> dict:
        """The slots here for each sample of the round: those asked for in it, those planned here
        since (they are taken out of the next round's asks), and a slot adopted for a sample that a
        consumer here needs and has none coming of. Each is then being made, so what is planned
        here while the round runs leaves them out."""
        s = self.server
        slots_of: dict[int, list] = {}
        for sample, slot in mine:
            slots_of.setdefault(sample, []).append(slot)
        later = {sample for sample, _ in self.asked}.intersection(union)
        if later:
            for sample, slot in self.asked:
                if sample in later:
                    slots_of.setdefault(sample, []).append(slot)
            self.asked = [(sample, slot) for sample, slot in self.asked if sample not in later]
        reserve = s.opts.batch_size * (1 + s.opts.ahead) * max(1, len(s.sched.consumers))
        for sample in union:
            if sample not in slots_of:
                slot = s.sched.adopt(sample, reserve)
                self.counts["adopted" if slot is not None else "passed"] += 1
                if slot is not None:
                    slots_of[sample] = [slot]
        return slots_of

    def _fill(self, union: list, slots_of: dict, made: dict, copies: np.ndarray, where: list) -> None:
        """Every copy this rank keeps (union sample ``i`` is ``copies[where[i]]``) written into its
        slots, and ready for the consumers waiting."""
        s = self.server
        failed, woken, filled, rows, meta = [], set(), [], [], []
        with s.cond:
            for i, sample in enumerate(union):
                sid, label, problem = made[sample]
                slots = slots_of.get(sample, [])
                if problem is not None:
                    for slot in slots:
                        s.sched.failed_one(slot)
                    if not slots:
                        s.sched.drop(sample)
                    failed.append(problem)
                    continue
                self.counts["received"] += len(slots) * (i % self.size != self.rank)
                filled += slots
                rows += [where[i]] * len(slots)
                meta += [(sid, label)] * len(slots)
            s.pool.put(filled, copies[rows], meta)
            for slot in filled:
                woken |= s.sched.made_one(slot)
            for problem in failed:
                s.status.failed(problem)
            if failed:
                s._wake_all()
            else:
                s._wake(woken)
        for problem in failed:
            s.say(f"left out of every epoch: {problem}")

    # -- the collectives ------------------------------------------------------------------------
    def _meet(self) -> None:
        """Wait, sleeping, until every rank is here: the blocking collective after it does not spin."""
        request, pause = self.comm.Ibarrier(), POLL_S
        while not request.Test():
            time.sleep(pause)
            pause = min(2 * pause, MAX_POLL_S)

    def _allgather(self, obj):
        self._meet()
        return self.comm.allgather(obj)

    def _allgatherv(self, images: np.ndarray, counts: list) -> np.ndarray:
        from mpi4py import MPI

        per = int(np.prod(images.shape[1:])) * images.dtype.itemsize
        out = np.empty((sum(counts), *images.shape[1:]), images.dtype)
        sizes = [c * per for c in counts]
        displs = [sum(sizes[:r]) for r in range(len(sizes))]
        self._meet()
        self.comm.Allgatherv(images.reshape(-1).view(np.uint8),
                             [out.reshape(-1).view(np.uint8), sizes, displs, MPI.BYTE])
        return out

    def status(self) -> dict:
        """This rank's part and the job's totals, for the server's status."""
        job = {**self.job, "sharing_factor": round(self.job["delivered"] / self.job["preprocessed"], 4)
               if self.job["preprocessed"] else None}
        return {"rank": self.rank, "ranks": self.size, **self.counts,
                "job": job, "note": "preprocessed and delivered in this file's window and total count this "
                "node's pool: copies made here or by another rank; job: every rank's, as of the last round"}
