"""Exactly-once accounting: per-epoch sample counts and order-independent digests."""
from __future__ import annotations

import numpy as np

from enspipe.data.keys import add_digests, digest_of


class EpochLedger:
    """Counts what a member consumed, per epoch, from the ``(ids, epochs)`` of each batch.

    The stream is epoch-ordered, so an epoch is complete once a later epoch has been seen, or
    when its count reaches the dataset size.
    """

    def __init__(self, num_images: int, drops: bool = False):
        self.num_images = num_images
        self._counts: dict[int, int] = {}
        self._digests: dict[int, str] = {}
        self._ids: dict[int, list[np.ndarray]] = {}
        self._dropped: dict[int, int] | None = {} if drops else None  # drop_last's tails, per epoch
        self._ended: set[int] = set()  # epochs whose end was seen (the stream's next sample is a later epoch's)

    def add(self, ids: np.ndarray, epochs: np.ndarray, dropped: bool = False) -> None:
        """Samples that reached the member; ``dropped``: not given to its loop (``drop_last``'s tail)."""
        for e in np.unique(epochs):
            sel = ids[epochs == e]
            e = int(e)
            self._counts[e] = self._counts.get(e, 0) + len(sel)
            self._ids.setdefault(e, []).append(sel.astype(np.int64))
            self._digests[e] = add_digests(self._digests.get(e, digest_of([])), digest_of(sel.astype(np.uint64)))
            if dropped:
                self._dropped[e] = self._dropped.get(e, 0) + len(sel)

    def end(self, epoch: int) -> None:
        """Epoch ``epoch`` is over (its end seen without a later epoch's sample counted yet)."""
        self._ended.add(int(epoch))

    def completed(self) -> list[dict]:
        """Per completed epoch: the ``count`` of samples that reached the member, their ``digest``,
        how many are ``missing``, and (``drops``) how many of them were ``dropped`` as the tail."""
        last = max(self._counts, default=-1)
        extra = (lambda e: {"dropped": self._dropped.get(e, 0)}) if self._dropped is not None else (lambda e: {})
        return [{"epoch": e, "count": self._counts[e], "digest": self._digests[e],
                 "missing": self.num_images - self._counts[e], **extra(e)}
                for e in sorted(self._counts) if e < last or e in self._ended or self._counts[e] >= self.num_images]

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


class DeliveryCounter:
    """What a member saw, judged the same way for every arm: over windows of ``num_images``
    consecutive deliveries (an epoch's length, from the member's first sample), how many distinct
    samples each held; and how many samples of a producer's stream it never received (``skipped``:
    gaps in the stream positions of the batches it got from one producer, i.e. elements the
    tf.data service's cross-trainer cache dropped for it while it lagged).

    For enspipe's schemes every full window holds ``num_images`` distinct samples and nothing is
    skipped (the exactly-once ledger, :class:`EpochLedger`, checks the same by epoch); the tf.data
    service promises at most once per trainer, and with P workers every worker streams the whole
    dataset in its own order, so a window may miss samples (each one missed there is one seen twice).
    """

    def __init__(self, num_images: int):
        self.num_images = num_images
        self._window: set[int] = set()
        self._in_window = 0
        self.windows: list[int] = []  # distinct samples of each full window
        self._last: dict[int, int] = {}  # per producer stream: the last position received
        self.skipped = 0
        self.delivered = 0

    def add(self, ids: np.ndarray, positions: np.ndarray, stream: int = 0) -> None:
        """One delivered batch: its samples' ids and stream positions (ascending), from ``stream``."""
        if len(positions):
            last = self._last.get(stream)
            first = int(positions[0])
            if last is not None and first > last + 1:
                self.skipped += first - last - 1
            self.skipped += int(positions[-1]) - first + 1 - len(positions)  # holes within the batch
            self._last[stream] = int(positions[-1])
        for i in ids.tolist():
            self._window.add(i)
            self._in_window += 1
            self.delivered += 1
            if self._in_window == self.num_images:
                self.windows.append(len(self._window))
                self._window, self._in_window = set(), 0

    def summary(self) -> dict:
        w = self.windows
        return {"window_samples": self.num_images, "full_windows": len(w),
                "distinct_min": min(w) if w else None, "distinct_mean": float(np.mean(w)) if w else None,
                "missed_mean": float(self.num_images - np.mean(w)) if w else None,
                "skipped_samples": self.skipped, "delivered": self.delivered, "streams": len(self._last)}
