"""The exchange's group collectives on Horovod process sets (``--transport horovod``).

The same three collectives as :class:`enspipe.exchange.engine.Mpi4pyTransport`, for the same scheme
descriptions: one :class:`hvd.ProcessSet` per distinct group of the scheme (the group of every
rank is Horovod's global set), ``hvd.allgather`` for a gather (variable first dimension: the
all-gather-v), ``hvd.broadcast`` from a global root rank. Each collective's two tensors (images
and meta) run in one ``tf.function`` so Horovod negotiates and fuses them together; the
Multi-Broadcast step puts all P broadcasts in one function, in flight at once (the original
needed a Horovod background thread per broadcast).

The collectives' work happens in Horovod's background thread, named ``enspipe-horovod`` here so
each rank's ``thread_cpu_seconds`` shows it (the exchange thread itself mostly waits for it).

Needs Horovod >= 0.23 built with MPI and TensorFlow (``make horovod`` builds ``.venv-horovod``);
Horovod is initialised on the run's MPI communicator, so mpi4py and Horovod share one MPI.
"""
from __future__ import annotations

import numpy as np

from enspipe.measure import threadcpu
from enspipe.exchange.base import Batch, TransportStats, wait_quietly
from enspipe.common import keys

THREAD_NAME = "enspipe-horovod"  # Horovod's background thread, where its collectives do their work

INSTALL_HINT = "build the Horovod environment with `make horovod` and run from .venv-horovod (see README, Horovod)"


def available() -> tuple[bool, str]:
    """Whether ``horovod.tensorflow`` imports here with MPI built in, and why not."""
    try:
        import horovod.tensorflow as hvd
    except Exception as e:  # ImportError, or a TensorFlow ABI mismatch raised by the extension
        return False, f"horovod.tensorflow does not import here ({type(e).__name__}: {e}); {INSTALL_HINT}"
    if not hvd.mpi_built():
        return False, f"this Horovod was built without MPI; {INSTALL_HINT}"
    return True, ""


class HorovodTransport:
    """Group collectives on Horovod process sets; byte counts as in the mpi4py transport."""

    name = "horovod"

    def __init__(self, comm, groups: list[tuple[int, ...]], image_shape: tuple[int, ...], dtype, events=None,
                 reduce_groups: list[tuple[int, ...]] = ()):
        """``groups``: the scheme's exchange groups; ``reduce_groups``: data-parallel members' ranks,
        whose gradients :meth:`allreduce_sum` sums (their process sets are registered too)."""
        import horovod.tensorflow as hvd
        import tensorflow as tf

        self.hvd, self.tf, self.comm = hvd, tf, comm
        self.rank, size = comm.Get_rank(), comm.Get_size()
        self.image_shape, self.dtype = tuple(image_shape), np.dtype(dtype)
        self.stats = TransportStats()
        everyone = tuple(range(size))
        sets = {g: hvd.ProcessSet(list(g)) for g in dict.fromkeys([*groups, *reduce_groups]) if g != everyone}
        before = set(threadcpu.snapshot())
        hvd.init(comm=comm, process_sets=list(sets.values()))  # every rank registers the same sets
        threadcpu.name_threads(set(threadcpu.snapshot()) - before, THREAD_NAME)  # its background thread
        if hvd.rank() != self.rank or hvd.size() != size:
            raise RuntimeError(f"Horovod ranks {hvd.rank()}/{hvd.size()} differ from MPI's {self.rank}/{size}")
        self.sets = {g: sets.get(g, hvd.global_process_set) for g in [*groups, *reduce_groups]}
        self.paths = {g: "horovod" for g in groups if self.rank in g}
        if events is not None:
            for g in self.paths:
                events.log(keys.EXCHANGE_PATH, group=list(g), path="horovod", process_set=self.sets[g].process_set_id)
        self._fns: dict = {}

    # -- tf.functions, one per (kind, group, roots): traced once, reused every step ------------
    def _fn(self, key, build):
        if key not in self._fns:
            self._fns[key] = self.tf.function(build, reduce_retracing=True)
        return self._fns[key]

    def _tensors(self, batch: Batch):
        return self.tf.constant(batch.images), self.tf.constant(batch.meta)

    def _empty(self, n: int) -> Batch:
        return Batch(np.zeros((n, *self.image_shape), self.dtype), np.zeros((n, 4), np.int64))

    def _counts(self, ps, mine: int, known) -> np.ndarray:
        if known is not None:
            return np.asarray(known, np.int64)
        return self.hvd.allgather(self.tf.constant([mine], self.tf.int64), process_set=ps).numpy()

    # -- the three collectives, on a unit of batches (one at a time: Horovod fuses within one) ----
    def allgatherv(self, group: tuple[int, ...], mine: list[Batch], counts: list[int] | None = None) -> list[Batch]:
        return [self._allgatherv(group, b) for b in mine]

    def broadcast(self, group: tuple[int, ...], root: int, batches: list[Batch | None],
                  count: int | None = None) -> list[Batch]:
        return [self._broadcast(group, root, b, count) for b in batches]

    def block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: list[Batch | None],
                         counts: list[int] | None = None) -> list[Batch]:
        return [self._block_broadcasts(group, roots, b, counts) for b in mine]

    def _allgatherv(self, group: tuple[int, ...], mine: Batch) -> Batch:
        ps, hvd = self.sets[group], self.hvd  # Horovod's allgather takes blocks of any length: no counts
        fn = self._fn(("gather", group), lambda im, me: (hvd.allgather(im, process_set=ps),
                                                         hvd.allgather(me, process_set=ps)))
        images, meta = fn(*self._tensors(mine))
        out = Batch(images.numpy(), meta.numpy())
        self.stats.add(mine, out)
        return out

    def _broadcast(self, group: tuple[int, ...], root: int, batch: Batch | None, count: int | None) -> Batch:
        ps, hvd = self.sets[group], self.hvd
        if count is None:
            n = self.tf.constant([len(batch) if self.rank == root else 0], self.tf.int64)
            count = int(hvd.broadcast(n, root_rank=root, process_set=ps).numpy()[0])
        send = batch if self.rank == root else self._empty(count)
        fn = self._fn(("bcast", group, root), lambda im, me: (hvd.broadcast(im, root_rank=root, process_set=ps),
                                                              hvd.broadcast(me, root_rank=root, process_set=ps)))
        images, meta = fn(*self._tensors(send))
        out = batch if self.rank == root else Batch(images.numpy(), meta.numpy())
        self.stats.add(out if self.rank == root else None, out)
        return out

    def _block_broadcasts(self, group: tuple[int, ...], roots: tuple[int, ...], mine: Batch | None,
                          counts: list[int] | None) -> Batch:
        ps, hvd = self.sets[group], self.hvd
        counts = self._counts(ps, len(mine) if mine is not None else 0, counts)
        local = [int(counts[group.index(r)]) for r in roots]
        blocks = [mine if r == self.rank else self._empty(c) for r, c in zip(roots, local)]

        def build(*tensors):
            out = []
            for i, r in enumerate(roots):  # P broadcasts in one graph: in flight together
                out += [hvd.broadcast(tensors[2 * i], root_rank=r, process_set=ps),
                        hvd.broadcast(tensors[2 * i + 1], root_rank=r, process_set=ps)]
            return out

        fn = self._fn(("blocks", group, roots), build)
        res = fn(*[t for b in blocks for t in self._tensors(b)])
        out = Batch(np.concatenate([r.numpy() for r in res[0::2]]), np.concatenate([r.numpy() for r in res[1::2]]))
        self.stats.add(mine, out)
        return out

    def allreduce_sum(self, group: tuple[int, ...], values: np.ndarray) -> np.ndarray:
        """The element-wise sum of ``values`` over ``group``'s ranks (a data-parallel member's
        gradients), on its Horovod process set."""
        hvd, ps = self.hvd, self.sets[group]
        fn = self._fn(("allreduce", group), lambda x: hvd.allreduce(x, op=hvd.Sum, process_set=ps))
        return fn(self.tf.constant(values)).numpy()

    def close(self) -> None:
        """Shut Horovod down once every rank is done with it. The shutdown is global: a rank whose
        process sets finished first (Single-Broadcast's rank 0, say) would otherwise end the
        collectives still to come on the sets of the others."""
        wait_quietly([self.comm.Ibarrier()])
        self.hvd.shutdown()
        self._fns = {}
