"""Decoded images kept in node-shared memory: a member that preprocesses a sample a second time
(a later epoch; another member of the node) takes its decoded uint8 pixels from the cache instead
of decoding the JPEG again, and augments them as before. CoorDL's MinIO cache: what fits in the
budget is kept, nothing is evicted.

The cache is an MPI-3 shared-memory window on each node (``MPI_Win_allocate_shared``), so MPI
frees it when the job ends and the killed-job reaper (:func:`enspipe.exchange.shm.reap_orphans`)
deletes what a killed job left. Each member of the node owns an equal part of the budget: a hash
table of sample ids (open addressing, never deleted from) and an arena of pixels it appends to; it
alone writes them, every member reads them. An entry is published by writing its height last (a
height of 0: an empty slot, where a lookup ends); x86's stores are seen in order, so a reader that
sees the height sees the rest. Two members may store one sample when they decode it at once (it
then takes room twice); the budget still bounds it.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

_SLOT = 4  # int64 per slot of a part's table: sample id, offset, height, width
_HEADER = 8  # int64: bytes used, images held, and room to grow
_MIN_IMAGE = 4096  # bytes: a part's table has a slot per this much of its arena (load at most a half)


class DecodeCache:
    """The node's cache of decoded images, as one member sees it (collective to make and free over
    ``comm``'s members on this node).

    Example (every member of the job)::

        cache = DecodeCache(MPI, comm, budget=8 * 10**9, num_images=manifest.num_images)  # ids: int64
        pixels = cache.get(sample_id, epoch)     # uint8 H x W x 3, or None
        if pixels is None:
            pixels = decode(jpeg)
            cache.put(sample_id, pixels)
        ...
        cache.free()
    """

    def __init__(self, MPI, comm, budget: int, num_images: int):
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        self.members, self.budget = self.node.Get_size(), budget
        part = budget // self.members
        held = max(1, min(num_images, part // _MIN_IMAGE))  # the most images a part can hold, near enough
        self.slots = 1 << (2 * held - 1).bit_length()  # a power of two, at least twice that
        self.table_bytes = 8 * (_HEADER + _SLOT * self.slots)
        if part <= self.table_bytes:
            raise ValueError(f"a decode cache of {budget} bytes leaves no room for pixels beside its table of "
                             f"{self.table_bytes} bytes per member")
        self.win = MPI.Win.Allocate_shared(part, 1, comm=self.node)
        self.parts = [self._part(r) for r in range(self.members)]
        self.mine = self.parts[self.node.Get_rank()]
        self.lock = threading.Lock()  # the member's preprocessing threads append to its arena
        self.counts: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])  # epoch -> [hits, misses]
        self.stored = self.full = self.refused = 0
        self.decode_seconds, self.decodes = 0.0, 0
        self._final: dict | None = None
        header, table, _ = self.mine
        header[:], table[:] = 0, 0  # (a window of one member is private memory, not zeroed pages)
        self.node.Barrier()  # every part mapped and emptied before any get

    def _part(self, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        buf, _ = self.win.Shared_query(rank)
        raw = np.frombuffer(buf, np.uint8)
        header = raw[:8 * _HEADER].view(np.int64)
        table = raw[8 * _HEADER:self.table_bytes].view(np.int64).reshape(self.slots, _SLOT)
        return header, table, raw[self.table_bytes:]

    def _find(self, table: np.ndarray, sample: int) -> tuple[int, bool]:
        """The slot of ``sample`` in ``table`` and whether it is there (else the empty slot where
        it would go)."""
        slot = sample & (self.slots - 1)
        while table[slot, 2]:
            if table[slot, 0] == sample:
                return slot, True
            slot = (slot + 1) & (self.slots - 1)
        return slot, False

    def get(self, sample: int, epoch: int) -> np.ndarray | None:
        """A copy of the sample's decoded pixels, or None (counted as a hit or a miss of ``epoch``)."""
        for _, table, arena in self.parts:
            slot, found = self._find(table, sample)
            if found:
                offset, h, w = (int(v) for v in table[slot, 1:])
                self.counts[int(epoch)][0] += 1
                return arena[offset:offset + h * w * 3].reshape(h, w, 3).copy()
        self.counts[int(epoch)][1] += 1
        return None

    def put(self, sample: int, pixels: np.ndarray) -> bool:
        """Keep the sample's decoded pixels if they fit in this member's part; whether they were kept."""
        header, table, arena = self.mine
        if pixels.ndim != 3 or pixels.shape[2] != 3 or not pixels.size:
            return False
        if any(self._find(t, sample)[1] for _, t, _ in self.parts):  # another member kept it meanwhile
            self.refused += 1
            return False
        with self.lock:
            slot, found = self._find(table, sample)
            used = int(header[0])
            if found:  # another of this member's threads kept it meanwhile
                self.refused += 1
                return False
            if used + pixels.size > len(arena) or 2 * (int(header[1]) + 1) > self.slots:
                self.full += 1
                return False
            arena[used:used + pixels.size] = pixels.reshape(-1)
            header[0], header[1] = used + pixels.size, header[1] + 1
            table[slot, 0], table[slot, 1], table[slot, 3] = sample, used, pixels.shape[1]
            table[slot, 2] = pixels.shape[0]  # last: publishes the entry
            self.stored += 1
        return True

    def decoded(self, sample: int, epoch: int, decode) -> np.ndarray:
        """The sample's pixels from the cache, else ``decode()``'s (timed on this thread's CPU
        clock), kept if they fit."""
        pixels = self.get(sample, epoch)
        if pixels is None:
            t = time.thread_time()
            pixels = decode()
            self.decode_seconds += time.thread_time() - t
            self.decodes += 1
            self.put(sample, pixels)
        return pixels

    def report(self) -> dict:
        """This member's view for the summary: hits and misses per epoch, what it stored and what
        it did not (kept meanwhile by another decode of the sample; no room), the node's bytes,
        images and distinct samples held (every member's part), and its timed decodes."""
        if self._final is not None:
            return self._final
        held = [t[t[:, 2] != 0, 0] for _, t, _ in self.parts]
        return {"budget_bytes": self.budget, "node_members": self.members,
                "epochs": {str(e): {"hits": h, "misses": m} for e, (h, m) in sorted(self.counts.items())},
                "stored": self.stored, "not_stored_kept_meanwhile": self.refused, "not_stored_full": self.full,
                "node_bytes_held": int(sum(int(p[0][0]) for p in self.parts)),
                "node_images_held": int(sum(int(p[0][1]) for p in self.parts)),
                "node_distinct_images_held": len(set(np.concatenate(held).tolist())),
                "decodes_timed": self.decodes, "decode_cpu_seconds": self.decode_seconds}

    def free(self) -> None:
        """Collective over the node's members: the window freed (the report kept)."""
        if self._final is not None:
            return
        self._final = self.report()
        self.parts = self.mine = None
        self.win.Free()
        self.node.Free()


def cache_summary(reports: list[dict]) -> dict | None:
    """The cell's decode cache from its ranks' reports: per epoch the lookups and their hit rate
    (all members'), the bytes and images held (per node, each node counted once), and the CPU saved,
    estimated as the hits times the decode CPU per image that the members timed (labelled so).
    ``decoded_twice`` counts the decodes of a sample that another decode, on this member or another
    of its node, was making at the same moment (each one's put found the other's, or both were
    kept)."""
    mine = [(r["host"], r["decode_cache"]) for r in reports if r.get("decode_cache")]
    if not mine:
        return None
    epochs: dict[str, list[int]] = {}
    for _, c in mine:
        for e, v in c["epochs"].items():
            epochs.setdefault(e, [0, 0])
            epochs[e][0] += v["hits"]
            epochs[e][1] += v["misses"]
    nodes = {host: c for host, c in mine}
    hits = sum(h for h, _ in epochs.values())
    timed = sum(c["decodes_timed"] for _, c in mine)
    per_image = sum(c["decode_cpu_seconds"] for _, c in mine) / timed if timed else None
    return {
        "budget_bytes_per_node": mine[0][1]["budget_bytes"],
        "epochs": [{"epoch": int(e), "lookups": h + m, "hit_rate": h / (h + m) if h + m else None}
                   for e, (h, m) in sorted(epochs.items(), key=lambda x: int(x[0]))],
        "hits": hits, "misses": sum(m for _, m in epochs.values()),
        "bytes_held": sum(c["node_bytes_held"] for c in nodes.values()),
        "images_held": sum(c["node_images_held"] for c in nodes.values()),
        "distinct_images_held": sum(c["node_distinct_images_held"] for c in nodes.values()),
        "decoded_twice": sum(c["node_images_held"] - c["node_distinct_images_held"] for c in nodes.values())
        + sum(c["not_stored_kept_meanwhile"] for _, c in mine),
        "not_stored_full": sum(c["not_stored_full"] for _, c in mine),
        "decode_cpu_seconds_per_image": per_image, "decodes_timed": timed,
        "cpu_saved_seconds": hits * per_image if per_image is not None else None,
        "cpu_saved_basis": "estimated: hits x the decode CPU per image timed on the members' threads "
                           "(their misses' decodes, or a few decodes at the start on the tf backend)",
    }
