"""A shared stream's batches as a ``DataLoader`` has them: one pass is one epoch.

Underneath, the schemes exchange fixed-size global batches of the endless sample stream (global
batch ``k`` is stream positions ``[kB, (k+1)B)``, so where ``B`` does not divide the dataset an
epoch's last batch runs into the next epoch). :class:`EpochBatches` regroups them at the epoch
boundaries: an epoch of ``N`` samples is ``ceil(N / B)`` batches, the last one ``N mod B`` samples
short (or left out with ``drop_last``; the ledger records the tail dropped). The samples, their
order and their values are the stream's, unchanged.

Cost: a batch that lies whole inside one global batch is that batch (copied out of node-shared
memory, as every kept batch is); one that straddles two global batches is assembled by one copy
of each of its samples, into a receive buffer of the stream's ring.
"""
from __future__ import annotations

import numpy as np

EPOCH = 1  # the meta rows' columns: id, epoch, position, label


class EpochBatches:
    """``fetch()`` (the next global batch: ``(images, meta, volatile)``, ``volatile`` where it is
    valid only until the next fetch) regrouped into epochs of ``num_images`` samples (fewer where
    records were skipped: ``counted=False``, the epoch then ends at the first sample of the next)."""

    def __init__(self, fetch, batch_size: int, num_images: int, ring, ledger, drop_last: bool = False,
                 counted: bool = True):
        self.fetch, self.B, self.N, self.ring, self.ledger = fetch, batch_size, num_images, ring, ledger
        self.drop_last, self.counted = drop_last, counted
        self.epoch: int | None = None  # the epoch being delivered
        self.given = 0                  # its samples delivered (or dropped) so far
        self.rest = None                # what is left of the last global batch: (images, meta, volatile)

    def steps(self) -> int:
        """Batches in one epoch."""
        return self.N // self.B if self.drop_last else -(-self.N // self.B)

    def next(self, keep: bool = True) -> tuple:
        """The next batch ``(images, meta, last)``, ``last`` where it ends its epoch; ``keep``: valid
        for as long as it is held (else a global batch in node-shared memory may be returned in
        place, valid until the next call). Where records were skipped, an epoch's end may be seen
        only after its last batch was returned: the next call then returns a batch of no samples
        with ``last``; so does a tail that ``drop_last`` drops."""
        images, meta, last = self._assemble(keep)
        ended = self.epoch
        if last:
            if self.drop_last and 0 < len(meta) < self.B:
                self.ledger.add(meta[:, 0], meta[:, EPOCH], dropped=True)
                images, meta = images[:0], meta[:0]
            self.epoch, self.given = None, 0
        if len(meta):
            self.ledger.add(meta[:, 0], meta[:, EPOCH])
        if last and ended is not None:
            self.ledger.end(ended)
        return images, meta, last

    def _current(self):
        if self.rest is None:
            self.rest = self.fetch()
        return self.rest

    def _assemble(self, keep: bool) -> tuple:
        """Up to ``B`` samples of the current epoch, and whether the epoch ends with them."""
        out, n = None, 0
        while True:
            images, meta, volatile = self._current()
            if not len(meta):
                self.rest = None
                continue
            if self.epoch is None:
                self.epoch = int(meta[0, EPOCH])
            same = len(meta) if meta[-1, EPOCH] == self.epoch else int(np.argmax(meta[:, EPOCH] != self.epoch))
            if same == 0:  # the epoch ended before this global batch: what was assembled is its last
                return self._done(images, out, n, last=True)
            want = self.B - n
            if self.counted:
                want = min(want, self.N - self.given - n)
            k = min(same, want)
            if out is None and k == len(meta) == want:  # the global batch is the batch: no assembly
                self.rest = None
                self.given += k
                return (*self._own(images, meta, volatile and keep), self.counted and self.given == self.N)
            if out is None:
                out = self._buffer(images)
            out[0][n:n + k] = images[:k]
            out[1][n:n + k] = meta[:k]
            n += k
            self.rest = None if k == len(meta) else (images[k:], meta[k:], volatile)
            ends = self.counted and self.given + n == self.N
            if n == self.B or ends:
                return self._done(images, out, n, last=ends)

    def _done(self, like, out, n: int, last: bool) -> tuple:
        self.given += n
        if out is None:
            return like[:0], np.zeros((0, 4), np.int64), last
        return out[0][:n], out[1][:n], last

    def _buffer(self, like):
        """A receive buffer of ``B`` samples: the ring's (host memory), or a tensor on ``like``'s device."""
        if isinstance(like, np.ndarray):
            b = self.ring.take(self.B)
            return b.images, b.meta
        import torch

        return torch.empty((self.B, *like.shape[1:]), dtype=like.dtype, device=like.device), \
            np.empty((self.B, 4), np.int64)

    def _own(self, images, meta, volatile: bool) -> tuple:
        """A whole global batch, valid for as long as it is held: a node-shared slot copied out."""
        if not volatile:
            return images, meta
        if not isinstance(images, np.ndarray):
            return images.clone(), meta.copy()
        b = self.ring.take(len(meta))
        b.images[...] = images
        b.meta[...] = meta
        return b.images, b.meta
