"""What consumes the compute queue: real training, an emulated accelerator, or nothing (peak).

``train``: SGD steps of the network with the member's learning rate and initialisation seed, on
a GPU when TensorFlow sees one, else on the CPU (Keras; ``--trainer torch``: PyTorch,
:mod:`enspipe.run.torch_train`). ``emulated``: a stand-in for an accelerator on
machines without one; it waits batch/rate seconds per step without using CPU, and every output
of such a run says ``emulated``. ``peak``: dequeues as fast as possible (the paper's peak(n)).

**Data-parallel members** (``--data-parallel g``, FLEET's members on several accelerators): a
member is g consecutive ranks, each given the whole delivered batch by the scheme; rank j of the
member trains on its contiguous part (:func:`batch_slice`) and the member's ranks all-reduce
gradients (an mpi4py group communicator, or with ``--transport horovod`` the member's Horovod
process set), each weighted by its part's share of the batch, so the
update is the full batch's mean gradient: the same model as one accelerator on the whole batch,
up to floating-point summation order. An emulated accelerator waits for its part at its rate
(rc x the scaling efficiency at g, so the member runs at rc x g x efficiency(g)) and then joins
its member's all-reduce (the synchronisation is real; an all-reduce's transfer time on
a real interconnect is not modelled).

``--gradient-exchange`` picks how a trained data-parallel member's ranks sum (``whole``, ``blocks``,
``prophet``: the same update as ``whole``; ``ako``: a partial exchange, the replicas differ): see
:mod:`enspipe.run.gradients`.
"""
from __future__ import annotations

import time

import numpy as np

from enspipe.exchange.base import wait_quietly
from enspipe.models.networks import network_spec
from enspipe.plan.gradients import blocks_for
from enspipe.run.gradients import AkoStep, BlockStep


class PeakConsumer:
    kind = "peak"
    emulated = False

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        return {}


def batch_slice(size: int, g: int, j: int) -> slice:
    """Rank ``j``'s part of a batch of ``size`` split among ``g`` ranks: contiguous, in order, the
    parts' sizes differing by at most one."""
    q, r = divmod(size, g)
    lo = j * q + min(j, r)
    return slice(lo, lo + q + (j < r))


class EmulatedConsumer:
    """An accelerator stand-in that trains at ``rate`` images/s and leaves the CPU idle; in a
    data-parallel member (``group`` of g ranks) it waits for its part, then joins the all-reduce.
    It has no weights to checkpoint and no validation loss."""

    kind = "emulated"
    emulated = True

    def trackable(self):
        return None

    def __init__(self, rate: float, group=None):
        self.rate = rate
        self.group = group if group is not None and group.Get_size() > 1 else None

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        if self.group is None:
            time.sleep(len(images) / self.rate)
            return {}

        part = batch_slice(len(images), self.group.Get_size(), self.group.Get_rank())
        time.sleep((part.stop - part.start) / self.rate)
        # the member's ranks step together, as their gradient all-reduce makes them; a rank with a
        # smaller part waits for the others asleep (MPICH's blocking collectives spin a core)
        wait_quietly([self.group.Ibarrier()])
        return {}


class TrainConsumer:
    """Real training steps: softmax cross-entropy and plain SGD at the member's learning rate."""

    kind = "train"
    emulated = False

    def __init__(self, network: str, num_classes: int, image_size: int, lr: float, seed: int,
                 dequantize=None, group=None, batches_per_update: int = 1, gradient_sum=None, exchange=None):
        import keras
        import tensorflow as tf

        self.device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
        self.model = network_spec(network).build(num_classes, image_size, seed)
        self.optimizer = keras.optimizers.SGD(learning_rate=lr)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.num_classes = num_classes
        self.dequantize = dequantize
        self.group = group if group is not None and group.Get_size() > 1 else None
        self.batches_per_update = batches_per_update  # FLEET's batch-size multiplier: K batches, one update
        self.gradient_sum = gradient_sum  # --transport horovod: the member's process set sums its gradients
        self._pending, self._count = None, 0
        variables = self.model.trainable_variables

        @tf.function(jit_compile=False, reduce_retracing=True)
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, self.model(x, training=True))
            grads = tape.gradient(loss, variables)
            self.optimizer.apply_gradients(zip(grads, variables))
            return loss

        @tf.function(jit_compile=False, reduce_retracing=True)
        def part_gradients(x, y, weight):  # this rank's part, weighted by its share of the batch
            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, self.model(x, training=True))
            grads = tape.gradient(loss, variables)
            return tf.concat([tf.reshape(g * weight, [-1]) for g in grads] + [tf.reshape(loss * weight, [1])], 0)

        @tf.function(jit_compile=False, reduce_retracing=True)
        def apply(flat):
            grads, at = [], 0
            for v in variables:
                size = int(np.prod(v.shape))
                grads.append(tf.reshape(flat[at:at + size], v.shape))
                at += size
            self.optimizer.apply_gradients(zip(grads, variables))

        @tf.function(jit_compile=False, reduce_retracing=True)
        def loss_sum(x, y):
            return tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, self.model(x, training=False),
                                                                              from_logits=True))

        self._step, self._part_gradients, self._apply, self._loss_sum = train_step, part_gradients, apply, loss_sum
        self.optimizer.build(variables)  # its variables exist before a checkpoint is restored into them
        self._blocks = None if self.group is None or exchange is None or exchange.kind == "whole" else \
            _member_exchange(exchange, self.model, self.loss_fn, self.optimizer, self.group)
        if self.group is not None:
            from enspipe.exchange.gradients import WholeExchange

            self._whole = WholeExchange(self.group)

    def trackable(self):
        """What a checkpoint holds: the model and its optimizer (plain SGD: its step counter)."""
        import tensorflow as tf

        self._flush()
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)

    def _flush(self) -> None:
        if self._blocks is not None:
            self._blocks.flush()  # a deferred exchange's last sums, before the weights are read

    def close(self) -> None:
        """Apply what a deferred exchange still holds and stop its thread."""
        if self._blocks is not None:
            self._blocks.close()
            self._blocks = None

    def evaluate(self, images: np.ndarray, labels: np.ndarray, batch: int = 64) -> float:
        """The mean loss over a validation set (inference mode); a data-parallel member's first
        rank computes it and the others receive it, so all decide alike."""
        self._flush()
        loss = None
        if self.group is None or self.group.Get_rank() == 0:
            total = sum(float(self._loss_sum(images[i:i + batch], labels[i:i + batch]))
                        for i in range(0, len(images), batch))
            loss = total / len(images)
        return loss if self.group is None else self.group.bcast(loss, root=0)

    def _mean_gradient(self, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
        """The batch's mean gradient, flat, and its loss last: on g ranks, the weighted gradients of
        this rank's part summed over the member's ranks (= the whole batch's mean gradient)."""
        if self.group is None:
            return self._part_gradients(images, labels, np.float32(1.0)).numpy()

        part = batch_slice(len(images), self.group.Get_size(), self.group.Get_rank())
        weight = np.float32((part.stop - part.start) / len(images))
        flat = self._part_gradients(images[part], labels[part], weight).numpy()
        if self.gradient_sum is not None:
            return self.gradient_sum(flat)
        return self._whole.sum(flat)

    def _accumulated_step(self, images: np.ndarray, labels: np.ndarray) -> float:
        """Add this batch's mean gradient; every ``batches_per_update`` batches apply their mean
        (the same update as one step on their concatenation, the batches being equal in size)."""
        flat = self._mean_gradient(images, labels)
        self._pending = flat if self._pending is None else self._pending + flat
        self._count += 1
        if self._count == self.batches_per_update:
            self._apply(self._pending[:-1] / np.float32(self._count))
            self._pending, self._count = None, 0
        return float(flat[-1])

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        if self.dequantize is not None:
            images = self.dequantize(images)
        labels = labels.astype(np.int32)
        out = {}
        if self._blocks is not None:  # --gradient-exchange blocks, prophet or ako
            part = batch_slice(len(images), self.group.Get_size(), self.group.Get_rank())
            loss = self._blocks(images[part], labels[part], np.float32((part.stop - part.start) / len(images)))
            out["exchange"] = self._blocks.record()
        elif self.group is None and self.batches_per_update == 1:
            loss = float(self._step(images, labels))  # the fused step: one rank, one batch per update
        else:
            loss = self._accumulated_step(images, labels)
            if self.group is not None and self.gradient_sum is None:
                out["exchange"] = {"kind": "whole", "bytes_per_step": self._whole.bytes_per_step}
        if not np.isfinite(loss):
            raise FloatingPointError(f"training loss is {loss}; lower --lr")
        return {"loss": loss, **out}


def _member_exchange(spec, model, loss_fn, optimizer, group):
    """A data-parallel member rank's step for ``spec`` (an :class:`~enspipe.plan.gradients.ExchangeSpec`
    other than whole): its blocks planned from its variables (and, prophet, its profile and the
    collectives' costs)."""
    if spec.kind == "ako":
        return AkoStep(model, loss_fn, optimizer, group, spec.partitions)
    sizes = tuple(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.trainable_variables)
    profile, costs = None, None
    if spec.kind == "prophet":
        import json

        from enspipe.plan.planner import comm_costs
        from enspipe.run.profile import layers_for

        with open(spec.profile) as f:
            profile = layers_for(json.load(f), group.Get_size())
        costs = comm_costs(spec.comm)
    blocks = blocks_for(spec, sizes, group.Get_size(), profile, *((costs.bandwidth, costs.alpha) if costs else ()))
    return BlockStep(model, loss_fn, optimizer, group, blocks, spec.deferred, spec.kind)


class MultiConsumer:
    """Several members in one process (``--members-per-rank``, Crossbow's several models per
    accelerator): each delivered batch feeds every member's consumer in turn, with no exchange
    between them; an emulated accelerator serves them one after another. Its ``loss`` is their
    mean, ``losses`` each member's."""

    def __init__(self, consumers: list):
        self.consumers = consumers
        self.kind, self.emulated = consumers[0].kind, consumers[0].emulated
        self.device = getattr(consumers[0], "device", None)

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        outs = [c.step(images, labels) for c in self.consumers]
        losses = [o["loss"] for o in outs if "loss" in o]
        return {"loss": float(np.mean(losses)), "losses": losses} if losses else {}

    def trackable(self):
        return None


def make_consumers(cfg, num_classes: int, members: list[int], dequantize=None, group=None, gradient_sum=None):
    """The consumer of a rank's ``members``: one member's (:func:`make_consumer`), or a
    :class:`MultiConsumer` of several."""
    if len(members) == 1:
        return make_consumer(cfg, num_classes, members[0], dequantize, group, gradient_sum)
    return MultiConsumer([make_consumer(cfg, num_classes, m, dequantize) for m in members])


def make_consumer(cfg, num_classes: int, member: int, dequantize=None, group=None, gradient_sum=None):
    """The consumer of ensemble member ``member``; ``group``: its ranks' communicator when it is
    data-parallel (``cfg.training.data_parallel`` > 1; every rank of a member builds the same model);
    ``gradient_sum``: what sums its gradients instead of ``group`` (Horovod's process set)."""
    if cfg.training.consumer == "peak":
        return PeakConsumer()
    if cfg.training.consumer == "emulated":  # its rc, --slow-member's slowdown, the efficiency at its width
        return EmulatedConsumer(cfg.accelerator_rate(member, 1 if group is None else group.Get_size()), group)
    if cfg.trainer == "torch":  # one rank per member (the config refuses the rest)
        from enspipe.run.torch_train import TorchTrainConsumer

        wire = (cfg.preprocessing, cfg.stream.wire_dtype)  # the stream's
        return TorchTrainConsumer(cfg.network_for(member), num_classes, cfg.stream.image_size, cfg.lr_for(member),
                                  seed=cfg.stream.seed * 1000 + member, wire=wire)
    return TrainConsumer(cfg.network_for(member), num_classes, cfg.stream.image_size, cfg.lr_for(member),
                         seed=cfg.stream.seed * 1000 + member, dequantize=dequantize, group=group,
                         batches_per_update=cfg.batch_multiplier_for(member), gradient_sum=gradient_sum,
                         exchange=cfg.gradient_spec)
