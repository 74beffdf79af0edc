"""The ``gpu`` backend: JPEGs decoded on the member's GPU and augmented there.

- Decode: nvJPEG through ``torchvision.io.decode_jpeg(..., device="cuda")``, a slice at a time.
- Augmentation: every built-in preprocessing as torch ops (:mod:`enspipe.data.tensor_pixels`):
  the crop is cut from the decoded image first, then resized, flipped, colour-distorted and
  scaled to the wire's range.
- CPU fallback: an image nvJPEG cannot take (PNG, CMYK, some progressive JPEGs) is decoded on
  the CPU by the pillow backend's decoder, copied to the GPU, and counted (``decodes``). It is
  never dropped. One the CPU cannot decode either is undecodable, as on every backend.
- Output: the slice as one tensor on the GPU. Where the member exchanges on that GPU
  (``transport="torch", device="cuda"``), the pipeline hands the tensor to the exchange as it
  is; otherwise it is copied to host memory for MPI.

The member's GPU is the exchange's device, or ``cuda:L`` for the member's rank ``L`` among its
node's processes (``LOCAL_RANK``, ``MPI_LOCALRANKID``, ``SLURM_LOCALID``), taken round the GPUs
it sees; members on one GPU each decode their own share there.

:class:`TensorEngine` runs the same steps on any device with any decoder. With the CPU decoder on
CPU tensors, it is how the backend's values are tested on machines without a GPU.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from enspipe.engine.backends.base import PrepSpec, kept, meta_rows
from enspipe.engine.backends.pillow import slices  # noqa: F401 - the backend's API: read as the pillow backend reads
from enspipe.exchange.torchdist import member_device

LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def local_rank() -> int:
    """This process's rank among its node's, as its launcher set it (0 where none did)."""
    for name in LOCAL_RANK_VARIABLES:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def member_gpu(device=None):
    """The GPU this member decodes on: ``device`` (the exchange's), else its local rank's, round
    the GPUs it sees."""
    import torch

    return torch.device(device) if device is not None else member_device("cuda", local_rank())


def engine(spec: PrepSpec) -> "TensorEngine":
    return tensor_engine(spec.preprocessing, spec.size, spec.wire_dtype, spec.prep_seed, spec.skip_corrupt,
                         spec.device, spec.fast_mode, spec.impl == "fused-colour")


def maker(spec: PrepSpec) -> "TensorMaker":
    return TensorMaker(spec)


class TensorMaker:
    """The attach server's: a chunk's JPEGs decoded together by nvJPEG on the server's GPU and
    augmented there, so its images are one tensor on that GPU (``device="cpu"``: the same ops on
    CPU tensors). A sample nvJPEG refuses is decoded on the CPU and counted (:attr:`decodes`)."""

    def __init__(self, spec: PrepSpec):
        self.engine = tensor_engine(spec.preprocessing, spec.size, spec.wire_dtype, spec.prep_seed, True, spec.device,
                                    spec.fast_mode, spec.impl == "fused-colour")
        self.device = self.engine.device
        self._lock = threading.Lock()  # one chunk on the device at a time: the decoder's handle is shared

    @property
    def decodes(self) -> dict:
        return self.engine.decodes

    def make(self, encoded: list, positions: list, samples: list) -> tuple:
        """As the pillow backend's: the images one tensor on the device (zeros where one failed)."""
        with self._lock:
            kept_images, failed = self.engine.augment(encoded, positions)
            images = kept_images.new_zeros((len(encoded), *kept_images.shape[1:]))
            images[[i for i in range(len(encoded)) if i not in failed]] = kept_images
        return images, failed

    def close(self) -> None:
        self.engine.close()


def tensor_engine(preprocessing: str, size: int, wire_dtype: str, prep_seed: int, skip_corrupt: bool, device=None,
                  fast_mode: bool = False, fused: bool = False) -> "TensorEngine":
    """The engine on the member's GPU (:func:`member_gpu`) with nvJPEG, or on ``device="cpu"``
    with the CPU decoder (the same ops on CPU tensors)."""
    import torch

    where = torch.device(device) if device is not None and torch.device(device).type == "cpu" else member_gpu(device)
    decoder = CpuDecoder(where) if where.type == "cpu" else NvJpeg(where)
    return TensorEngine(preprocessing, size, wire_dtype, prep_seed, skip_corrupt, where, decoder, fast_mode=fast_mode,
                        fused=fused)


class CpuDecoder:
    """Each image decoded on the CPU (:func:`enspipe.data.decoding.decode`), then copied to ``device``."""

    def __init__(self, device):
        self.device = device

    def __call__(self, encoded: list[bytes]) -> list:
        """Per image a ``(3, H, W)`` uint8 tensor on the device, or why it is undecodable (a str)."""
        import torch

        from enspipe.data.decoding import Undecodable, decode

        out = []
        for e in encoded:
            try:
                out.append(torch.from_numpy(np.array(decode(e))).permute(2, 0, 1).to(self.device))  # (a writable copy)
            except Undecodable as why:
                out.append(f"{type(why).__name__}: {why}")
        return out


class NvJpeg:
    """A slice's JPEGs decoded together by nvJPEG on ``device``; the images it refuses go to a
    :class:`CpuDecoder` (``cpu_decoded`` counts them)."""

    def __init__(self, device):
        from torchvision.io import ImageReadMode, decode_jpeg

        self.device, self.decode_jpeg, self.rgb = device, decode_jpeg, ImageReadMode.RGB
        self.cpu = CpuDecoder(device)
        self.cpu_decoded = 0

    def _one(self, data):
        try:
            return self.decode_jpeg(data, mode=self.rgb, device=self.device)
        except RuntimeError:
            return None

    def __call__(self, encoded: list[bytes]) -> list:
        import torch

        jpeg = [e[:2] == b"\xff\xd8" for e in encoded]  # nvJPEG takes JPEGs only: the rest go to the CPU at once
        datas = [torch.frombuffer(bytearray(e), dtype=torch.uint8) for e, j in zip(encoded, jpeg) if j]
        try:
            decoded = self.decode_jpeg(datas, mode=self.rgb, device=self.device) if datas else []
        except RuntimeError:  # one image it cannot take fails the batch: each alone, to find which
            decoded = [self._one(d) for d in datas]
        it = iter(decoded)
        out = [next(it) if j else None for j in jpeg]
        refused = [i for i, x in enumerate(out) if x is None]
        for i, x in zip(refused, self.cpu([encoded[i] for i in refused])):
            out[i] = x
        self.cpu_decoded += len(refused)
        return out


class TensorEngine:
    """Each slice decoded by ``decode`` and augmented by torch ops on ``device``; yields its images
    as one ``(n, S, S, 3)`` tensor there. ``decodes``: images decoded on the device and on the CPU."""

    def __init__(self, preprocessing: str, size: int, wire_dtype: str, prep_seed: int, skip_corrupt: bool, device,
                 decode, fast_mode: bool = False, fused: bool = False):
        import torch

        from enspipe.data.tensor_pixels import TENSOR_PREPROCESSING, train

        if preprocessing not in TENSOR_PREPROCESSING:  # (StreamConfig refuses it first, saying what to do)
            raise ValueError(f"the gpu backend makes {', '.join(TENSOR_PREPROCESSING)}, not {preprocessing!r}")
        self.torch, self.device, self.decode = torch, torch.device(device), decode
        self.preprocessing, self.size, self.wire_dtype = preprocessing, size, wire_dtype
        self.train = train(preprocessing, fast_mode, fused)
        self.prep_seed, self.skip_corrupt = prep_seed, skip_corrupt
        self.images = 0

    @property
    def decodes(self) -> dict:
        on_cpu = getattr(self.decode, "cpu_decoded", self.images if isinstance(self.decode, CpuDecoder) else 0)
        return {"device": str(self.device), "on_device": self.images - on_cpu, "on_cpu": on_cpu}

    def augment(self, encoded: list, positions: list) -> tuple:
        """Images decoded and preprocessed with the draws of their stream positions: the kept ones
        as one ``(k, S, S, 3)`` tensor as it travels, and ``{index: why}`` for those that could
        not be decoded."""
        from enspipe.data.pixels import generator
        from enspipe.data.tensor_pixels import to_wire

        decoded = self.decode(list(encoded))
        out, failed = [], {}
        for i, (image, position) in enumerate(zip(decoded, positions)):
            if isinstance(image, str):
                failed[i] = image
                continue
            out.append(self.train(image, self.size, generator(self.prep_seed, position)))
        self.images += len(decoded) - len(failed)
        if out:
            return to_wire(self.preprocessing, self.torch.stack(out), self.wire_dtype), failed
        dtype = self.torch.float32 if self.wire_dtype == "float32" else self.torch.uint8
        return self.torch.zeros((0, self.size, self.size, 3), dtype=dtype, device=self.device), failed

    def run(self, take):
        torch = self.torch
        while True:
            item = take()
            t = time.perf_counter()
            images, failed = self.augment(item["encoded"], item["position"].tolist())
            ok = kept(item, failed, self.skip_corrupt)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()  # the seconds count the GPU's work
            yield item, images, meta_rows(item)[ok], time.perf_counter() - t

    def close(self) -> None:
        """Nothing to free: the images are the caching allocator's, released as they are dropped."""
