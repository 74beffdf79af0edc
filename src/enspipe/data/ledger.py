"""Exactly-once accounting: per-epoch sample counts and order-independent digests."""
from __future__ import annotations

import numpy as np

from enspipe.data.shards import add_digests, digest_of


class EpochLedger:
    """Counts what a member consumed, per epoch, from the ``(ids, epochs)`` of each batch.

    The stream is epoch-ordered, so an epoch is complete once a later epoch has been seen, or
    when its count reaches the dataset size.
    """

    def __init__(self, num_images: int):
        self.num_images = num_images
        self._counts: dict[int, int] = {}
        self._digests: dict[int, str] = {}
        self._ids: dict[int, list[np.ndarray]] = {}

    def add(self, ids: np.ndarray, epochs: np.ndarray) -> None:
        for e in np.unique(epochs):
            sel = ids[epochs == e]
            e = int(e)
            self._counts[e] = self._counts.get(e, 0) + len(sel)
            self._ids.setdefault(e, []).append(sel.astype(np.int64))
            self._digests[e] = add_digests(self._digests.get(e, digest_of([])), digest_of(sel.astype(np.uint64)))

    def completed(self) -> list[dict]:
        last = max(self._counts, default=-1)
        return [{"epoch": e, "count": self._counts[e], "digest": self._digests[e],
                 "missing": self.num_images - self._counts[e]}
                for e in sorted(self._counts) if e < last or self._counts[e] >= self.num_images]

    def partial(self) -> dict | None:
        done = {c["epoch"] for c in self.completed()}
        rest = [e for e in self._counts if e not in done]
        return {"epoch": rest[0], "count": self._counts[rest[0]]} if rest else None

    def short(self) -> list[int]:
        """The completed epochs with fewer samples than the dataset."""
        return [e["epoch"] for e in self.completed() if e["missing"] > 0]

    def lacking(self, epoch: int, expected: dict[int, str]) -> list[str]:
        """The keys of ``expected`` (id -> key of every sample) that ``epoch`` never delivered."""
        seen = set(np.concatenate(self._ids[epoch]).tolist())
        return sorted(k for i, k in expected.items() if i not in seen)
