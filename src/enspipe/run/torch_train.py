"""The train consumer in PyTorch (``--trainer torch``): SGD steps of a ``torch.nn.Module`` on the
GPU where PyTorch sees one, else on the CPU, on the batches a member's pipeline delivers.

The network is one of :data:`enspipe.models.torch_architectures.TORCH_NETWORKS` (the paper's, in
``torch.nn``) or a user's ``package.module:function`` called as ``fn(num_classes=, image_size=,
seed=)`` and returning a ``torch.nn.Module``. Batches go to the device through a pinned staging
buffer allocated once (a non-blocking copy), in channels-last memory; a uint8 wire is turned back
into the preprocessing's range on the device. One rank per member.
"""
from __future__ import annotations

import numpy as np

from enspipe.data.pixels import OUTPUT_RANGE
from enspipe.models.networks import NetworkError, network_spec
from enspipe.models.torch_architectures import TORCH_NETWORKS


def build_torch_model(network: str, num_classes: int, image_size: int, seed: int):
    """The member's ``torch.nn.Module``: a registered torch network or the user's factory."""
    import torch

    if network in TORCH_NETWORKS:
        return TORCH_NETWORKS[network](num_classes, image_size, seed)
    spec = network_spec(network)
    torch.manual_seed(seed)
    try:
        model = spec.factory(num_classes=num_classes, image_size=image_size, seed=seed)
    except Exception as e:  # noqa: BLE001 - the user's code, named
        raise NetworkError(f"network {network} raised {type(e).__name__}: {e}",
                           "fix the factory: it is called as fn(num_classes=, image_size=, seed=)") from e
    if not isinstance(model, torch.nn.Module):
        raise NetworkError(f"network {network} returned {type(model).__name__}, not a torch.nn.Module",
                           "return the model the member trains")
    return model


class TorchTrainConsumer:
    """Real training steps in PyTorch: softmax cross-entropy and plain SGD at the member's learning
    rate, its weights initialised from its seed."""

    kind = "train"
    emulated = False

    def __init__(self, network: str, num_classes: int, image_size: int, lr: float, seed: int,
                 wire: tuple[str, str] | None = None):
        import torch

        self.torch = torch
        self.device = "GPU" if torch.cuda.is_available() else "CPU"
        self._dev = torch.device("cuda" if self.device == "GPU" else "cpu")
        self.model = build_torch_model(network, num_classes, image_size, seed).to(
            self._dev, memory_format=torch.channels_last)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self._scale = None  # a uint8 wire's (scale, offset) back to the preprocessing's range
        if wire is not None and wire[1] == "uint8":
            lo, hi = OUTPUT_RANGE[wire[0]]
            self._scale = ((hi - lo) / 255.0, lo)
        self._pinned = None

    def trackable(self):
        return None  # checkpoints are Keras's (config refuses --checkpoint-dir with --trainer torch)

    def _on_device(self, images: np.ndarray, labels: np.ndarray):
        torch = self.torch
        x = torch.from_numpy(images if images.flags.writeable else images.copy())
        y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
        if self._dev.type == "cuda":
            if self._pinned is None or self._pinned.shape != x.shape or self._pinned.dtype != x.dtype:
                self._pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
            self._pinned.copy_(x)
            x = self._pinned.to(self._dev, non_blocking=True)  # ordered before the step's kernels on the stream
            y = y.to(self._dev)
        x = x.permute(0, 3, 1, 2)  # NCHW over NHWC memory: channels-last
        x = x.float() if self._scale is None else x.float() * self._scale[0] + self._scale[1]
        return x.contiguous(memory_format=torch.channels_last), y

    def step(self, images: np.ndarray, labels: np.ndarray) -> dict:
        self.model.train()
        x, y = self._on_device(images, labels)
        loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        value = loss.item()  # waits for the step: the accelerator's time is the step's
        if not np.isfinite(value):
            raise FloatingPointError(f"training loss is {value}; lower --lr")
        return {"loss": value}

    def evaluate(self, images: np.ndarray, labels: np.ndarray, batch: int = 64) -> float:
        """The mean loss over a validation set (inference mode). Its images are float32 in the
        preprocessing's range (the validation set is not quantised)."""
        torch, total = self.torch, 0.0
        self.model.eval()
        with torch.no_grad():
            for i in range(0, len(images), batch):
                x = torch.from_numpy(np.ascontiguousarray(images[i:i + batch])).to(self._dev).permute(0, 3, 1, 2)
                y = torch.from_numpy(np.asarray(labels[i:i + batch], np.int64)).to(self._dev)
                total += float(torch.nn.functional.cross_entropy(self.model(x), y, reduction="sum"))
        return total / len(images)

    def close(self) -> None:
        pass
