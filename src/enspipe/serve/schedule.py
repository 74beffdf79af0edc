"""Which sample the server preprocesses next, and which consumer takes which: the attach server's
bookkeeping, free of sockets, threads and pixels (so every rule is tested on its own).

Each attached consumer has its own epochs. In an epoch it needs every sample of the dataset once
(``need``); a sample it needs is *covered* when one of the pool's slots holds (or is making) a
preprocessed copy of it that this consumer will take. A slot's copy goes to each consumer at most
once ever (``served``), so a consumer never sees the same augmented copy in two epochs.

* **What to make** (:meth:`Scheduler.plan`), after Joader's dependent sampling: for a consumer that
  lacks ready samples, the samples it needs and has no copy coming of, ranked by how many
  consumers are in that state for each (``count``), ties broken at random. A new copy covers every
  consumer that needs the sample and has none coming. With one consumer every candidate ties, so
  each epoch is a uniform random permutation.
* **What to give** (:meth:`Scheduler.take`): a consumer's ready copies in the order they were made
  (those it found in the pool when its epoch began, in random order, first), ``batch`` at a time;
  an epoch's last batch has what is left. A consumer takes a sample at most once per epoch (its
  ``need`` bit is cleared) and at least once (an epoch ends only when no bit is left).
* **Keeping** (memory is the pool): a copy every consumer has taken stays in the pool, *cached*,
  for consumers that attach or begin an epoch later, until its slot is needed.
* **Eviction**: where no slot is free, the least recently cached copy goes; where none is cached,
  the copy the fewest consumers wait for, never one a consumer is copying out, one being made, one
  the asking consumer waits for, or one in the next batch of any consumer. Those that waited for
  it still need it: the copy made again for them is counted as re-preprocessed, reason
  ``evicted`` (they lagged while the budget was full).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

REASONS = ("evicted",)  # why a sample was preprocessed again for a consumer that still needed it


@dataclass
class Consumer:
    """One attached consumer's place: its epoch, what it still needs, what is ready for it."""

    cid: int
    need: np.ndarray
    covered: np.ndarray           # needed, with a copy in the pool (or being made) for it
    epoch: int = -1
    left: int = 0                 # samples it still needs this epoch
    delivered: int = 0            # samples taken, over all its epochs
    ready: collections.deque = field(default_factory=collections.deque)  # slots, in the order made
    evicted: set = field(default_factory=set)  # samples evicted while it waited for them
    holding: collections.Counter = field(default_factory=collections.Counter)  # slots it is copying out
    rollover: bool = True         # its next take starts a new epoch


@dataclass(frozen=True)
class Taken:
    """One batch given to a consumer: its slots and samples, its epoch, and whether it ends the epoch."""

    slots: list
    samples: list
    epoch: int
    end: bool


class Scheduler:
    """The pool's and the consumers' state; every method runs under the server's one lock."""

    def __init__(self, num_images: int, slots: int, batch: int, seed: int = 0):
        self.n, self.slots, self.batch = int(num_images), int(slots), int(batch)
        self.rng = np.random.default_rng(seed)
        self.count = np.zeros(self.n, np.int32)   # consumers that need each sample and have no copy coming
        self.dropped = np.zeros(self.n, bool)      # could not be preprocessed: out of every epoch
        self.sample_in = np.full(self.slots, -1, np.int64)
        self.pending: list[set] = [set() for _ in range(self.slots)]  # consumers that will take the copy
        self.served: list[set] = [set() for _ in range(self.slots)]   # consumers that took it
        self.held = np.zeros(self.slots, np.int32)  # consumers copying the slot out
        self.making: set[int] = set()
        self.cached: collections.OrderedDict = collections.OrderedDict()  # slots nobody waits for, oldest first
        self.free: list[int] = list(range(self.slots - 1, -1, -1))
        self.consumers: dict[int, Consumer] = {}
        self.made = 0
        self.again = {r: 0 for r in REASONS}
        self.evictions = 0
        self.given = 0  # samples taken, by every consumer that ever attached
        self.short = False  # a plan found no slot (every one in use): a release may help

    # -- consumers come and go ----------------------------------------------------------------
    def attach(self, cid: int) -> Consumer:
        c = Consumer(cid, np.zeros(self.n, bool), np.zeros(self.n, bool))
        self.consumers[cid] = c
        return c

    def detach(self, cid: int) -> None:
        """A consumer gone (closed, exited or killed): what it needed and held is let go."""
        c = self.consumers.pop(cid, None)
        if c is None:
            return
        self.count[c.need & ~c.covered] -= 1
        for slot, k in c.holding.items():
            self.held[slot] -= k
        for slot in range(self.slots):
            self.served[slot].discard(cid)  # it never comes back: a long search's ids do not pile up
            if cid in self.pending[slot]:
                self.pending[slot].discard(cid)
                self._maybe_cache(slot)

    def _new_epoch(self, c: Consumer) -> None:
        c.epoch += 1
        c.need[:] = ~self.dropped
        c.covered[:] = False
        c.left = int(c.need.sum())
        c.evicted.clear()
        c.ready.clear()
        self.count[c.need] += 1
        found = [slot for slot in np.flatnonzero(self.sample_in >= 0).tolist() if c.cid not in self.served[slot]]
        self.rng.shuffle(found)
        for slot in found:  # copies in the pool that it has not seen serve it too
            if not c.covered[self.sample_in[slot]]:
                self._cover(c, slot)
                if slot not in self.making:
                    c.ready.append(slot)
        c.rollover = False

    def _cover(self, c: Consumer, slot: int) -> None:
        s = self.sample_in[slot]
        self.pending[slot].add(c.cid)
        self.cached.pop(slot, None)
        c.covered[s] = True
        self.count[s] -= 1

    # -- giving ---------------------------------------------------------------------------------
    def take(self, cid: int) -> Taken | None:
        """The consumer's next batch, or None while fewer than a batch of its samples are ready
        (fewer than that only where the epoch has fewer left)."""
        c = self.consumers[cid]
        if c.rollover:
            self._new_epoch(c)
        want = min(self.batch, c.left)
        if len(c.ready) < want:
            return None
        slots = [c.ready.popleft() for _ in range(want)]
        samples = self.sample_in[slots].tolist()
        for slot, s in zip(slots, samples):
            self.pending[slot].discard(cid)
            self.served[slot].add(cid)
            self.held[slot] += 1
            c.holding[slot] += 1
            c.need[s] = c.covered[s] = False
            self._maybe_cache(slot)
        c.left -= want
        c.delivered += want
        self.given += want
        c.rollover = c.left == 0
        return Taken(slots, samples, c.epoch, c.rollover)

    def holds(self, cid: int, slots) -> bool:
        """Whether the consumer holds every one of these slots (as often as listed)."""
        c = self.consumers.get(cid)
        return c is not None and not collections.Counter(slots) - c.holding

    def release(self, cid: int, slots) -> None:
        """The consumer has copied these slots out."""
        c = self.consumers.get(cid)
        for slot in slots:
            if c is not None and c.holding[slot] > 0:
                c.holding[slot] -= 1
                if not c.holding[slot]:
                    del c.holding[slot]
                self.held[slot] -= 1

    # -- making ---------------------------------------------------------------------------------
    def wanted(self, cid: int, ahead: int) -> int:
        """How many more samples to make for the consumer: enough for its next batch and ``ahead``
        batches more, counting what is ready or being made for it."""
        c = self.consumers[cid]
        if c.rollover:
            self._new_epoch(c)
        coming = len(c.ready) + sum(1 for slot in self.making if cid in self.pending[slot])
        return max(0, min(c.left, self.batch * (1 + ahead)) - coming)

    def plan(self, cid: int, k: int) -> list[tuple[int, int]]:
        """Up to ``k`` ``(sample, slot)`` to make for the consumer (fewer where the pool is full of
        what others are copying or about to take); each slot is then being made."""
        c = self.consumers[cid]
        candidates = np.flatnonzero(c.need & ~c.covered)
        if k <= 0 or not len(candidates):
            return []
        if len(candidates) > k:
            candidates = self._most_needed(candidates, k)
        else:
            self.rng.shuffle(candidates)
        jobs = []
        for s in candidates.tolist():
            slot = self.free.pop() if self.free else self._evict(c)
            if slot is None:
                self.short = True
                break
            self._place(s, slot)
            jobs.append((s, slot))
        return jobs

    def _most_needed(self, candidates: np.ndarray, k: int) -> np.ndarray:
        """``k`` of the candidates, those the most consumers need first, ties at random (in random
        order). Where the most-needed alone are ``k`` or more, ``k`` of them are drawn without
        scoring every candidate (an ImageNet epoch has 1.28 M)."""
        count = self.count[candidates]
        best = np.flatnonzero(count == count.max())
        if len(best) >= k:
            return candidates[best[self.rng.choice(len(best), k, replace=False)]]
        score = count + self.rng.random(len(candidates))
        picked = candidates[np.argpartition(-score, k - 1)[:k]]
        self.rng.shuffle(picked)
        return picked

    def ready(self, cid: int) -> bool:
        """Whether the consumer's next batch can be taken now (or its epoch is over)."""
        c = self.consumers.get(cid)
        return c is not None and (c.rollover or len(c.ready) >= min(self.batch, c.left))

    def _place(self, s: int, slot: int) -> None:
        self.sample_in[slot] = s
        self.pending[slot], self.served[slot] = set(), set()
        self.making.add(slot)
        self.made += 1
        again = False
        for d in self.consumers.values():
            if d.need[s] and not d.covered[s]:
                self._cover(d, slot)
                again |= s in d.evicted
                d.evicted.discard(s)
        self.again["evicted"] += again

    def made_one(self, slot: int) -> set:
        """The slot's copy is preprocessed: ready for every consumer waiting for it (returned)."""
        self.making.discard(slot)
        for cid in self.pending[slot]:
            self.consumers[cid].ready.append(slot)
        self._maybe_cache(slot)
        return self.pending[slot]

    def failed_one(self, slot: int) -> int:
        """The slot's sample could not be preprocessed: it leaves every epoch (the server names it).
        Returns the sample."""
        s = int(self.sample_in[slot])
        self.making.discard(slot)
        self.pending[slot] = set()
        self.sample_in[slot] = -1
        self.free.append(slot)
        self.drop(s)
        return s

    def drop(self, s: int) -> None:
        """Sample ``s`` cannot be preprocessed (here or on another rank): out of every epoch."""
        self.dropped[s] = True
        for d in self.consumers.values():
            if d.need[s]:
                d.need[s] = d.covered[s] = False
                d.left -= 1
        self.count[s] = 0

    def adopt(self, s: int, reserve: int) -> int | None:
        """A slot for a copy of ``s`` made elsewhere (by another rank of an MPI server), or None.
        Where a consumer here needs ``s`` and has no copy coming: a free slot beyond ``reserve``,
        else a cached copy's. Where none does: a free slot beyond ``reserve`` only, and once made
        the copy is cached for the consumers' next epochs and for those that attach later, as a
        copy made here would be. The slot is then being made."""
        if self.dropped[s] or (self.count[s] <= 0 and any(d.covered[s] for d in self.consumers.values())):
            return None  # out of every epoch, or a copy is coming for everyone here who needs it
        if len(self.free) > reserve:
            slot = self.free.pop()
        elif self.count[s] > 0:
            slot = self._evict_cached()
        else:
            return None
        if slot is not None:
            self._place(s, slot)
        return slot

    def _evict(self, asking: Consumer) -> int | None:
        """A slot freed by evicting the least recently cached copy, else the copy the fewest
        consumers wait for; None where every slot is in use."""
        slot = self._evict_cached()
        if slot is not None:
            return slot
        protected = set()
        for d in self.consumers.values():
            protected.update(list(d.ready)[: self.batch])
        best, fewest = None, None
        for slot in range(self.slots):
            if slot in self.making or self.held[slot] or asking.cid in self.pending[slot] or slot in protected:
                continue
            if best is None or len(self.pending[slot]) < fewest:
                best, fewest = slot, len(self.pending[slot])
        if best is None:
            return None
        s = int(self.sample_in[best])
        for cid in self.pending[best]:
            d = self.consumers[cid]
            d.ready.remove(best)
            d.covered[s] = False
            self.count[s] += 1
            d.evicted.add(s)
        self.pending[best] = set()
        self.sample_in[best] = -1
        self.evictions += 1
        return best

    def _evict_cached(self) -> int | None:
        """The slot of the least recently cached copy no consumer is copying out, emptied; or None."""
        for slot in self.cached:
            if not self.held[slot]:
                del self.cached[slot]
                self.sample_in[slot] = -1
                return slot
        return None

    def _maybe_cache(self, slot: int) -> None:
        if self.sample_in[slot] >= 0 and slot not in self.making and not self.pending[slot]:
            self.cached[slot] = None
            self.cached.move_to_end(slot)

    # -- what the status shows ------------------------------------------------------------------
    def in_use(self) -> int:
        """Slots holding a copy that a consumer waits for, is copying out, or is being made."""
        return self.slots - len(self.free) - len(self.cached)

    def occupied(self) -> int:
        """Slots holding a copy (cached ones too)."""
        return self.slots - len(self.free)
