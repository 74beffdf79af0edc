"""What the samples are (:class:`SampleConfig`), and the shared stream's configuration built on it
(:class:`StreamConfig`): what the members read, how they preprocess it and how they share the
work. Frozen records, validated when made; the checks against the files and the machine are a
separate, explicit step (:meth:`StreamConfig.check`), made before any collective. The attach
server's options (:class:`enspipe.serve.wire.ServeOptions`) are a :class:`SampleConfig` too.
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
from dataclasses import KW_ONLY, dataclass
from typing import Callable

from enspipe.engine.backends import AUTO as AUTO_BACKEND, BACKENDS, IMPLEMENTATIONS, resolve
from enspipe.exchange.transports import DEFAULT as DEFAULT_TRANSPORT, TRANSPORTS, installed_problem
from enspipe.common.spelling import option
from enspipe.plan.errors import ConfigError, require
from enspipe.plan.options import parse_size
from enspipe.plan.schemes import AUTO, SCHEME_KINDS

# enspipe.data.preprocessing.PREPROCESSING's names, and enspipe.data.pixels.PREPROCESSING's
BUILTIN_PREPROCESSING = ("inception", "vgg", "standard", "standard-jitter")
WIRE_DTYPES = ("float32", "uint8")
APPROXIMATIONS = ("fused-colour",)
MALLOC_POLICIES = ("keep", "system")
LIBRARY_SCHEMES = (*(k for k, kind in SCHEME_KINDS.items() if not kind.service), AUTO)


@dataclass(frozen=True)
class SampleConfig:
    """What each sample is and how a batch of them is made, wherever it is made: the fields that
    :class:`StreamConfig` (members sharing a stream) and the attach server's options
    (:class:`enspipe.serve.wire.ServeOptions`) both hold, with one set of defaults and checks.

    ``data``: the dataset directory; ``batch_size``: samples per batch; ``preprocess``: a built-in's
    name (:data:`BUILTIN_PREPROCESSING`) or the user's own (each path says which forms it takes);
    ``image_size``: the output's side in pixels; ``seed``: the order's and the augmentation's;
    ``wire_dtype``: ``float32`` (the preprocessing's values, the default) or ``uint8`` (a built-in's
    values quantised over its output range: a quarter of the bytes and memory); ``fast_mode``:
    Slim's fast mode; ``backend``: a row of :data:`enspipe.engine.backends.BACKENDS`, or ``auto``
    (each path resolves it: :class:`StreamConfig` to ``tf`` where TensorFlow is installed, else
    ``pillow``; the server to the first backend that serves).
    """

    data: str
    batch_size: int
    _: KW_ONLY
    preprocess: str | Callable = "inception"
    image_size: int = 224
    seed: int = 0
    wire_dtype: str = "float32"
    fast_mode: bool = False
    backend: str = AUTO_BACKEND

    def __post_init__(self) -> None:
        self._check_samples()

    def _check_samples(self) -> None:
        """The checks every path makes of these fields, before its own."""
        require(isinstance(self.data, (str, os.PathLike)) and bool(str(self.data)), "data", "no dataset given",
                "pass data=DIR: TFRecord shards or image class folders with a manifest (enspipe make-dataset or "
                "enspipe index makes one)")
        for name in ("batch_size", "image_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1, name,
                    f"must be a positive integer, got {value!r}", f"pass {name}=N with N >= 1")
        require(isinstance(self.seed, int) and not isinstance(self.seed, bool), "seed",
                f"must be an integer, got {self.seed!r}", "pass seed=N")
        require(self.wire_dtype in WIRE_DTYPES, "wire_dtype", f"unknown wire dtype {self.wire_dtype!r}",
                f"choose one of {', '.join(WIRE_DTYPES)}")
        require(isinstance(self.fast_mode, bool), "fast_mode", f"must be True or False, got {self.fast_mode!r}",
                "pass fast_mode=True for Slim's fast mode")
        names = self.backend_names()
        require(self.backend in (AUTO_BACKEND, *names), "backend", f"unknown backend {self.backend!r}",
                f"choose one of {AUTO_BACKEND}, {', '.join(names)}")

    @classmethod
    def backend_names(cls) -> tuple[str, ...]:
        """The backends this path makes samples with: every row of the table."""
        return tuple(BACKENDS)

    @property
    def backend_row(self):
        """The backend's row of :data:`enspipe.engine.backends.BACKENDS` (``auto`` resolved)."""
        return BACKENDS[self.backend]


@dataclass(frozen=True)
class StreamConfig(SampleConfig):
    """How every member's stream is made and shared: its samples (the :class:`SampleConfig`
    fields, keywords after ``data`` and ``batch_size``) and how the members share their making.

    Example::

        cfg = StreamConfig(data="data/train", batch_size=64, scheme="all_shared")
        cfg.check()   # the dataset and the preprocessing, before any collective

    ``preprocess`` is a built-in's name (Slim's ``inception`` or ``vgg`` training preprocessing,
    or ``standard``: torchvision's RandomResizedCrop, flip and Normalize; ``standard-jitter``: with
    ColorJitter(0.4, 0.4, 0.4))
    or your own: on the tf backend a function ``fn(image, seed) -> tensor`` of TensorFlow tensors (see
    :class:`enspipe.data.preprocessing.UserPreprocess`); on the pillow backend a torchvision
    ``transforms.v2`` pipeline, a kornia one or any callable on one decoded image, seeded per sample
    (see :mod:`enspipe.data.transforms`).

    ``backend``: ``tf`` (tf.data and TensorFlow's image ops: Slim's preprocessing, exactly) or
    ``pillow`` (Pillow and numpy, no TensorFlow: :mod:`enspipe.data.pixels`); ``auto`` (the
    default) is ``tf`` where TensorFlow is installed, else ``pillow``. Every member must use the
    same one (a shuffled stream's order differs between them).

    ``preprocess_impl`` (the tf backend's built-ins): ``crop-first`` (the default: inception's
    crop window alone is decoded, where Slim decodes the whole JPEG and converts it to float before
    cropping) or ``reference`` (Slim's functions as written); the two give the same values, bit
    for bit, and crop-first costs less. ``fused-colour`` (both backends): crop-first with the
    colour distortion as one affine map in YIQ, as DALI's ``Hsv`` does hue and saturation: an
    approximation (its error is measured and reported in the summary), and the cheapest.

    ``decode_cache``: a budget (bytes, or a size such as ``"8GB"``; 0: off) of node-shared memory
    that keeps decoded images (:mod:`enspipe.engine.decode_cache`): from the second time a sample is
    preprocessed on a node, its pixels come from there instead of a decode. The augmentation runs
    as before, on the tf backend with the same values; the pillow backend then decodes whole
    images (no DCT-scaled decode), which changes its values slightly.

    ``scheme="auto"``: the cost model chooses the scheme and P for these members on their
    placement (``enspipe plan``), from ``calibration`` (the workflow's ``rates.json``: one
    member's preprocessing rate by cores) for ``network``'s preprocessing, the accelerator's
    ``accelerator_rate`` in images/s per member (None: as fast as the batches come) and, where
    given, ``plan_comm`` (``enspipe calibrate-comm``'s collective costs).

    ``device`` (the torch transport): where the exchanged batches live. None (the default): host
    memory, numpy arrays. ``"cuda"`` (the member's GPU by its rank on its node) or ``"cuda:K"``:
    each member's block goes to its GPU and the images are exchanged there by NCCL, never through
    host memory; NCCL needs one GPU per member. ``"cpu"``: the same path as torch CPU tensors
    over gloo.
    """

    scheme: str = "all_shared"
    preprocessors: int | None = None
    shuffle_buffer: int = 1024
    queue_depth: int = 4
    block_images: int = 32
    node_shm: bool = True
    transport: str = DEFAULT_TRANSPORT
    skip_corrupt: bool = False
    sample_interval: float = 0.1
    calibration: str | None = None
    network: str | None = None
    accelerator_rate: float | None = None
    plan_comm: str | None = None
    preprocess_impl: str = "crop-first"
    decode_cache: int | str = 0
    device: str | None = None

    def __post_init__(self) -> None:
        self._check_samples()
        self._check_backend()
        self._check_device()
        self._check_decode_cache()
        for name in ("queue_depth", "block_images"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, name, f"must be a positive integer, got {value!r}",
                    f"pass {name}=N with N >= 1")
        require(isinstance(self.shuffle_buffer, int) and self.shuffle_buffer >= 0, "shuffle_buffer",
                f"must be >= 0, got {self.shuffle_buffer!r}", "pass 0 for the canonical order")
        require(self.scheme in LIBRARY_SCHEMES, "scheme", f"unknown scheme {self.scheme!r}",
                f"choose one of {', '.join(LIBRARY_SCHEMES)}")
        require(self.preprocessors is None or (isinstance(self.preprocessors, int) and self.preprocessors >= 1),
                "preprocessors", f"must be >= 1, got {self.preprocessors!r}", "pass P >= 1, or leave it out")
        require(self.transport in TRANSPORTS, "transport", f"unknown transport {self.transport!r}",
                f"choose one of {', '.join(TRANSPORTS)}")
        kind = TRANSPORTS[self.transport]
        others = " or ".join(repr(name) for name, t in TRANSPORTS.items() if t.node_shm_optional)
        require(kind.node_shm_optional or self.node_shm, "node_shm", f"the {self.transport} transport has no "
                "node-shared memory path to turn off", f"leave node_shm on, or use transport={others}")
        problem = installed_problem(self.transport)
        require(problem is None, "transport", f"{problem}",
                f"{kind.install}, or use {option('transport', DEFAULT_TRANSPORT)}")
        require(isinstance(self.sample_interval, (int, float)) and math.isfinite(self.sample_interval)
                and self.sample_interval > 0, "sample_interval", f"must be a positive number, got "
                f"{self.sample_interval!r}", "pass e.g. 0.1")
        if self.scheme == AUTO:
            require(self.calibration is not None and self.network is not None, "calibration", "scheme auto plans "
                    "from a calibration of a network's preprocessing",
                    f"pass {option('calibration', 'rates.json')} and "
                    f"{option('network', 'alexnet_v2')} (the network whose preprocessing rate it gives)")
            require(self.preprocessors is None, "preprocessors", "scheme auto chooses P itself",
                    "leave preprocessors out, or name the scheme")
            require(self.accelerator_rate is None or (isinstance(self.accelerator_rate, (int, float)) and
                    math.isfinite(self.accelerator_rate) and self.accelerator_rate > 0), "accelerator_rate",
                    f"must be a positive number of images/s, got {self.accelerator_rate!r}",
                    "pass the rate one member trains at, or leave it out")
        else:
            require(self.calibration is None and self.plan_comm is None, "calibration",
                    f"plans scheme auto; the scheme is {self.scheme}",
                    f"leave it out, or pass {option('scheme', 'auto')}")
        if callable(self.preprocess):
            require(self.wire_dtype == "float32", "wire_dtype", "uint8 quantising needs a built-in's output range",
                    "return uint8 from your preprocess function instead, and leave wire_dtype at float32")
        else:
            require(self.preprocess in BUILTIN_PREPROCESSING, "preprocess", f"unknown preprocessing "
                    f"{self.preprocess!r}", f"name a built-in ({', '.join(BUILTIN_PREPROCESSING)}) or pass a function "
                    "fn(image, seed) -> tensor")

    def _check_backend(self) -> None:
        """Resolve ``auto`` and check that the backend can run here with these options."""
        has_tf = tensorflow_installed()
        if self.backend == AUTO_BACKEND:  # (a torch module, torchvision's or kornia's pipeline, runs on decoded arrays)
            from enspipe.data.transforms import is_torch_pipeline

            object.__setattr__(self, "backend", resolve(AUTO_BACKEND, has_tf, is_torch_pipeline(self.preprocess)).name)
        spec = self.backend_row
        require(not spec.needs_tensorflow or has_tf, "backend", "TensorFlow is not installed here",
                f"pip install tensorflow-cpu, or pass {option('backend', resolve(AUTO_BACKEND, False).name)} "
                "(no TensorFlow)")
        require(self.preprocess_impl in IMPLEMENTATIONS, "preprocess_impl", f"unknown preprocessing implementation "
                f"{self.preprocess_impl!r}", f"choose one of {', '.join(IMPLEMENTATIONS)}")
        if self.preprocess_impl == "reference":
            require(self.preprocess_impl in spec.implementations and not callable(self.preprocess), "preprocess_impl",
                    "reference is Slim's TensorFlow functions as written, for the tf backend's built-ins", "leave "
                    "preprocess_impl at crop-first (a user's function and the pillow backend have one implementation)")
        require(self.preprocess_impl not in APPROXIMATIONS or not callable(self.preprocess), "preprocess_impl",
                f"{self.preprocess_impl} approximates a built-in's colour distortion; a preprocess function has its "
                "own", "leave preprocess_impl at crop-first with a preprocess function")
        kind = TRANSPORTS.get(self.transport)
        require(spec.horovod or kind is None or not kind.needs_tensorflow, "transport", f"the {self.transport} "
                "transport is TensorFlow's build",
                f"use {option('transport', DEFAULT_TRANSPORT)} with the {self.backend} backend")
        arrays = resolve(AUTO_BACKEND, False).name  # (a GPU backend's own refusal names its CUDA and nvJPEG)
        require(spec.on_gpu or spec.user_functions != "none" or not callable(self.preprocess), "preprocess",
                f"the {self.backend} backend runs its own preprocessings, not a function", f"pass a built-in's name, "
                f"or {option('backend', arrays)} for your function")

    def _check_decode_cache(self) -> None:
        """``decode_cache`` as bytes, and a backend and preprocessing that can read from it."""
        try:
            object.__setattr__(self, "decode_cache", parse_size(self.decode_cache))
        except ValueError as e:
            raise ConfigError("decode_cache", str(e),
                              f"pass {option('decode_cache', '8GB')} or another size, or 0 (off)") from None
        if self.backend_row.on_gpu:
            self._check_gpu_backend()
        require(not (self.decode_cache and callable(self.preprocess) and self.backend_row.runs_user_arrays),
                "decode_cache",
                "a preprocess function on the pillow backend gets each image decoded in its worker, not from the cache",
                "leave decode_cache out with your own preprocess function")

    def _check_gpu_backend(self) -> None:
        require(not self.decode_cache, "decode_cache", "the gpu backend decodes on the GPU, not from the cache",
                "leave decode_cache out")
        check_gpu_backend(self.preprocess)

    def _check_device(self) -> None:
        """``device`` names a torch device the torch transport can exchange on, here."""
        if self.device is None:
            return
        fix = "leave device out (the batches are exchanged in host memory), or pass 'cpu', 'cuda' or 'cuda:K'"
        require(isinstance(self.device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", self.device) is not None, "device",
                f"{self.device!r} is not a device the batches can be exchanged on", fix)
        on_devices = next(name for name, t in TRANSPORTS.items() if t.devices)
        require(TRANSPORTS[self.transport].devices, "device", f"the {self.transport} transport exchanges batches in "
                "host memory (MPICH from PyPI is not CUDA-aware)",
                f"pass {option('transport', on_devices)} with a device, or "
                "leave it out")
        if self.device.startswith("cuda"):
            import torch
            import torch.distributed as dist

            require(torch.cuda.is_available(), "device", f"CUDA is not available here (torch {torch.__version__}, "
                    f"{torch.cuda.device_count()} GPUs visible), so NCCL has no GPU to exchange on", fix)
            require(dist.is_nccl_available(), "device", f"this torch ({torch.__version__}) was built without NCCL",
                    "install a CUDA build of torch, or leave device out")
            index = int(self.device.partition(":")[2] or 0)
            require(index < torch.cuda.device_count(), "device", f"{self.device}: this process sees "
                    f"{torch.cuda.device_count()} GPUs", "pass 'cuda' (the member's own, by its rank on the node)")

    @property
    def user_preprocess(self) -> bool:
        return callable(self.preprocess)

    def check(self):
        """The checks against the files: the dataset's manifest and shards, and a user's
        preprocessing run on the dataset's first samples. Returns ``(manifest, preprocessing)``,
        the latter a built-in's name or a :class:`~enspipe.data.preprocessing.UserPreprocess`;
        raises :class:`ConfigError` naming the culprit. Collective-free: every rank reaches the
        same verdict."""
        if not os.path.isdir(self.data):
            raise ConfigError("data", f"{self.data}: no such directory", "pass a dataset directory")
        for name in ("calibration", "plan_comm"):
            path = getattr(self, name)
            require(path is None or os.path.isfile(path), name, f"{path!r} is not a file",
                    "pass the workflow's rates.json (calibration) or enspipe calibrate-comm's comm.json (plan_comm)")
        manifest = checked_manifest(str(self.data))
        problem = decode_cache_problem(self.decode_cache)
        require(problem is None, "decode_cache", f"{problem}", "pass a smaller budget, or 0 (off)")
        if not self.user_preprocess:
            return manifest, self.preprocess
        from enspipe.data.transforms import PreprocessError

        if self.backend_row.runs_user_arrays:
            from enspipe.data.transforms import probe as probe_preprocess
        else:
            from enspipe.data.probe import probe_preprocess
        try:
            return manifest, probe_preprocess(self.preprocess, manifest, self.seed)
        except PreprocessError as e:
            raise ConfigError("preprocess", e.problem, e.fix) from None


def check_gpu_backend(preprocess, fix: str | None = None) -> None:
    """The gpu backend needs CUDA and torchvision's nvJPEG decoder here, and makes the built-in
    preprocessings (enspipe.data.tensor_pixels), not a user's function: else a ConfigError. ``fix``:
    the way out (default: the CPU backend, as the caller spells it)."""
    fix = fix or f"pass {option('backend', resolve(AUTO_BACKEND, False).name)} (the CPU)"
    require(not callable(preprocess) and preprocess in BUILTIN_PREPROCESSING, "preprocess", "the gpu backend runs its "
            "own preprocessings on the GPU, not a function",
            f"pass {option('preprocess', 'standard')}, or {fix} for your function")
    require(importlib.util.find_spec("torch") is not None, "backend", "the gpu backend needs torch", fix)
    import torch

    require(torch.cuda.is_available(), "backend", f"the gpu backend decodes on a GPU, and CUDA is not available "
            f"here (torch {torch.__version__}, {torch.cuda.device_count()} GPUs visible)", fix)
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception as e:  # noqa: BLE001 - not installed, or a build that does not match torch's
        raise ConfigError("backend", f"the gpu backend decodes with torchvision's nvJPEG, and torchvision does not "
                          f"import here ({type(e).__name__}: {e})", f"pip install the torchvision of torch "
                          f"{torch.__version__}, or {fix}") from None


def checked_manifest(data: str):
    """The manifest of the dataset directory ``data``, checked against its files (the digest) and
    its record format's parse function; a problem raises :class:`ConfigError` naming the fix."""
    from enspipe.data.build import load_manifest
    from enspipe.data.manifest import DataError, verify_digest
    from enspipe.data.parse import format_problem

    try:
        manifest = load_manifest(data)
        problem = verify_digest(manifest)
    except DataError as e:
        raise ConfigError("data", str(e), "re-create the dataset, or re-index it with `enspipe index`") from None
    if problem:
        raise ConfigError("data", problem, "re-create the dataset, or re-index it with `enspipe index`")
    problem = format_problem(manifest)
    if problem:
        raise ConfigError("data", problem, "fix the parse function, or re-index with `enspipe index --parse`")
    return manifest


def decode_cache_problem(budget: int) -> str | None:
    """Why a decode cache of ``budget`` bytes does not fit on this node (None when it does, or is
    off): more than its available memory, or than /dev/shm's free space."""
    import psutil

    if not budget:
        return None
    if budget < 2**20:
        return f"{budget} bytes is too small to hold a decoded image (at least 1MB)"
    available = psutil.virtual_memory().available
    if budget > available:
        return f"{budget / 1e9:.2f} GB is more than this node's available memory ({available / 1e9:.2f} GB)"
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    if budget > st.f_bavail * st.f_frsize:
        return f"{budget / 1e9:.2f} GB is more than /dev/shm's free space ({st.f_bavail * st.f_frsize / 1e9:.2f} GB)"
    return None


def tensorflow_installed() -> bool:
    """Whether TensorFlow can be imported here (looked up, not imported)."""
    import importlib.util

    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules: hidden on purpose
        return False
