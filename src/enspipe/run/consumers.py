"""What consumes the compute queue: real training, an emulated accelerator, or nothing (peak).

``train``: SGD steps of the network with the member's learning rate and initialisation seed, on
a GPU when TensorFlow sees one, else on the CPU. ``emulated``: a stand-in for an accelerator on
machines without one; it waits batch/rate seconds per step without using CPU, and every output
of such a run says ``emulated``. ``peak``: dequeues as fast as possible (the paper's peak(n)).
"""
from __future__ import annotations

import time

import numpy as np


class PeakConsumer:
    kind = "peak"
    emulated = False

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        return {}


class EmulatedConsumer:
    """An accelerator stand-in that trains at ``rate`` images/s and leaves the CPU idle."""

    kind = "emulated"
    emulated = True

    def __init__(self, rate: float):
        self.rate = rate

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        time.sleep(len(images) / self.rate)
        return {}


class TrainConsumer:
    """Real training steps: softmax cross-entropy and plain SGD at the member's learning rate."""

    kind = "train"
    emulated = False

    def __init__(self, network: str, num_classes: int, image_size: int, lr: float, seed: int,
                 dequantize=None):
        import keras
        import tensorflow as tf

        from enspipe.models.networks import NETWORKS

        self.device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
        self.model = NETWORKS[network].build(num_classes, image_size, seed)
        self.optimizer = keras.optimizers.SGD(learning_rate=lr)
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        self.num_classes = num_classes
        self.dequantize = dequantize

        @tf.function(jit_compile=False, reduce_retracing=True)
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = self.loss_fn(y, self.model(x, training=True))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
            return loss

        self._step = train_step

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        if self.dequantize is not None:
            images = self.dequantize(images)
        loss = float(self._step(images, labels.astype(np.int32)))
        if not np.isfinite(loss):
            raise FloatingPointError(f"training loss is {loss}; lower --lr")
        return {"loss": loss}


def make_consumer(cfg, num_classes: int, member: int, dequantize=None):
    if cfg.consumer == "peak":
        return PeakConsumer()
    if cfg.consumer == "emulated":  # --slow-member RANK:FACTOR slows one member's accelerator
        slow = cfg.slow_member is not None and cfg.slow_member[0] == member
        return EmulatedConsumer(cfg.rate / cfg.slow_member[1] if slow else cfg.rate)
    return TrainConsumer(cfg.network, num_classes, cfg.image_size, cfg.lr_for(member),
                         seed=cfg.seed * 1000 + member, dequantize=dequantize)
