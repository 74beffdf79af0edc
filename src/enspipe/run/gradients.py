"""The training side of a data-parallel member's gradient exchange (``--gradient-exchange``): its
step as one TensorFlow graph that hands each block of gradients to the exchange
(:mod:`enspipe.exchange.gradients`) the moment backpropagation has made it, and takes the sums
back.

* ``blocks`` and ``prophet``: a hook on each block's gradients (a stateless ``numpy_function``,
  so TensorFlow runs it as soon as its inputs exist rather than in program order) copies them to
  the exchange, which all-reduces them while backpropagation goes on; the member's loss is a
  block of its own, handed over first. ``blocks`` takes every sum back at the step's end and
  applies them (plain SGD, as the whole exchange's). ``prophet`` defers that to the next step's
  start, block by block in priority order (the first layers' first): each variable's update is
  ordered before its read in the next forward pass, so the forward starts on the first layers
  while later blocks are still on the wire (Prophet's point), and the arithmetic is the
  synchronous step's. A flush (:meth:`BlockStep.flush`) applies what is pending before weights are
  read or saved.
* ``ako``: the rank's own gradient, then :class:`~enspipe.exchange.gradients.AkoExchange` for the
  partitions its peers send; its replica differs from theirs by what they have not sent yet.
"""
from __future__ import annotations

import numpy as np

from enspipe.exchange.gradients import AkoExchange, BlockExchange


def _sgd(optimizer, variables, grads) -> None:
    """Plain SGD, as ``keras.optimizers.SGD`` without momentum applies it: ``v -= g x lr``."""
    import tensorflow as tf

    for v, g in zip(variables, grads):
        v.assign_sub(g * tf.cast(optimizer.learning_rate, v.dtype))


def _split(flat, variables):
    """A flat tensor cut into the variables' shapes, in order."""
    import tensorflow as tf

    out, at = [], 0
    for v in variables:
        size = int(np.prod(v.shape))
        out.append(tf.reshape(flat[at:at + size], v.shape))
        at += size
    return out


class BlockStep:
    """A member rank's training step with its gradients in blocks (see the module). ``blocks``:
    variable indices per block, in posting order; ``deferred``: take the sums back at the next
    step (prophet) instead of this one's end (blocks)."""

    def __init__(self, model, loss_fn, optimizer, group, blocks: list[list[int]], deferred: bool, kind: str):
        import tensorflow as tf

        variables = model.trainable_variables
        self.blocks, self.deferred, self.optimizer = blocks, deferred, optimizer
        sizes = [1] + [sum(int(np.prod(variables[i].shape)) for i in b) for b in blocks]
        self.exchange = BlockExchange(group, sizes, kind)  # block 0: the loss
        apply_order = sorted(range(len(blocks)), key=lambda k: min(blocks[k]))  # priority: first layers first
        ex = self.exchange

        def handed(k):
            @tf.autograph.experimental.do_not_convert
            def hand(*parts):
                ex.ready(k, list(parts))
                return np.int32(k)
            return hand

        def taken(k, n):
            @tf.autograph.experimental.do_not_convert
            def take(*_):
                return ex.wait(k)
            return lambda *deps: tf.ensure_shape(tf.numpy_function(take, list(deps), tf.float32), [n])

        def apply(k, deps=()):
            block = [variables[i] for i in blocks[k]]
            _sgd(optimizer, block, _split(taken(k + 1, sizes[k + 1])(*deps), block))

        @tf.function(jit_compile=False, reduce_retracing=True)
        def step(x, y, weight):
            if deferred:  # the previous step's sums, first layers first: each gates its layers' forward
                for k in apply_order:
                    apply(k)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            tokens = [tf.numpy_function(handed(0), [tf.reshape(loss * weight, [1])], tf.int32, stateful=False)]
            grads = tape.gradient(loss, variables)
            for k, b in enumerate(blocks):
                tokens.append(tf.numpy_function(handed(k + 1), [grads[i] * weight for i in b], tf.int32,
                                                stateful=False))
            if not deferred:
                for k in apply_order:
                    apply(k, tokens)
            optimizer.iterations.assign_add(1)
            return taken(0, 1)(*tokens)[0], tokens

        self._step = step

        @tf.function(jit_compile=False)
        def flush():
            for k in apply_order:
                apply(k)

        self._flush = flush

    def __call__(self, x, y, weight) -> float:
        loss, _ = self._step(x, y, weight)
        return float(loss)

    def flush(self) -> None:
        """Apply the sums still pending (deferred), before the weights are read or saved."""
        if self.exchange.pending:
            self._flush()

    def record(self) -> dict:
        return {"kind": self.exchange.kind, "bytes_per_step": self.exchange.bytes_per_step,
                **self.exchange.step_record()}

    def close(self) -> None:
        self.flush()
        self.exchange.close()


class AkoStep:
    """A member rank's training step with Ako's partial exchange (see the module)."""

    def __init__(self, model, loss_fn, optimizer, group, partitions: int):
        import tensorflow as tf

        variables = model.trainable_variables
        self.exchange = AkoExchange(group, sum(int(np.prod(v.shape)) for v in variables), partitions)
        self.optimizer = optimizer

        @tf.function(jit_compile=False, reduce_retracing=True)
        def gradients(x, y, weight):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, variables)
            return tf.concat([tf.reshape(g * weight, [-1]) for g in grads], 0), loss * weight

        @tf.function(jit_compile=False, reduce_retracing=True)
        def apply(flat):
            _sgd(optimizer, variables, _split(flat, variables))
            optimizer.iterations.assign_add(1)

        self._gradients, self._apply = gradients, apply

    def __call__(self, x, y, weight) -> float:
        flat, loss = self._gradients(x, y, weight)
        update, member_loss = self.exchange.exchange(flat.numpy(), float(loss))
        self._apply(update)
        return member_loss  # each part's loss on its rank's replica, weighted and summed

    def flush(self) -> None:
        pass

    def record(self) -> dict:
        x = self.exchange
        return {"kind": "ako", "bytes_per_step": x.bytes_per_step, "partitions": x.p,
                "sent_partition": x.partition(x.rank, x.step - 1)}

    def close(self) -> None:
        self.exchange.close()
