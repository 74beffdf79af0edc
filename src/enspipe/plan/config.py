"""The per-cell run configuration: one frozen, validated dataclass.

Every field is checked on construction, so a bad value fails before any MPI or TensorFlow work
starts, with a :class:`ConfigError` that names the field (as its command-line option) and the fix.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from enspipe.plan.errors import require as _require
from enspipe.plan.schemes import SCHEME_KINDS

CONSUMERS = ("train", "emulated", "peak")
SCHEMES = tuple(SCHEME_KINDS)  # the scheme registry's names, in its order
WIRE_DTYPES = ("float32", "uint8")
TRANSPORTS = ("mpi4py", "horovod")
PREPROCESSINGS = ("inception", "vgg")
CPU_MONITORS = ("auto", "mpstat", "psutil", "none")
POWER_SOURCES = ("auto", "rapl", "nvml", "slurm", "external", "modelled")
ON_CORRUPT = ("fail", "skip")
MAX_SAMPLE_INTERVAL = 60.0  # seconds


@dataclass(frozen=True)
class RunConfig:
    """Everything one cell (one MPI job) needs.

    Attributes:
      data: a dataset directory: TF-Slim ImageNet TFRecord shards (with or without the
        ``manifest.json`` that ``enspipe make-dataset`` writes) or JPEG folders, one per class.
      out: output directory; ``summary.json`` appears there last and atomically.
      network: one of :data:`enspipe.models.networks.NETWORKS`.
      consumer: ``train`` (real SGD steps), ``emulated`` (an accelerator stand-in that waits
        batch/rate seconds without using CPU) or ``peak`` (dequeue as fast as possible).
      batch_size: global batch size per member; ``None`` means the network's paper default.
      steps: measured steps per member. warmup: unmeasured steps before them (0 is valid).
      cores: CPU cores per member, enforced by affinity and thread pools; ``None`` = all
        cores this process may use.
      image_size: side of the square preprocessed image (224 in the paper).
      scheme: how members share preprocessing (``baseline`` shares nothing).
      preprocessors: P, the number of preprocessing members for the broadcast schemes.
      rate: the emulated accelerator's rate rc in images/s (``emulated`` only).
      rate_source: where ``rate`` came from (a calibration file, or the command line).
      seed: base seed; data order, preprocessing and initialisation derive from it.
      rep: which repeat of its cell this run is; recorded in the summary's cell identity, it
        changes nothing else (the grid varies ``seed`` per repeat).
      lrs: learning rates, member m uses ``lrs[m % len(lrs)]`` (ensemble members differ in
        learning rate and initialisation seed, as in the paper).
      shuffle_buffer: records in the seeded shuffle buffer (0 = canonical order); at most a quarter
        of a TFRecord dataset is used (:func:`enspipe.data.shards.effective_shuffle_buffer`).
      queue_depth: capacity, in batches, of each bounded stage queue.
      on_corrupt: ``fail`` (the default) stops the run at an undecodable image or a corrupt record,
        naming it; ``skip`` skips it and counts it (only it: the rest of its shard is still read).
        Either way a run that delivers an epoch short of what the manifest promises, beyond what it
        skipped, fails naming the shards.
      fast_mode: TF-Slim's inception ``fast_mode`` (off in the paper).
      wire_dtype: element type of preprocessed images on the wire; ``uint8`` is lossy (1/255).
      transport: collective library for the exchange: ``mpi4py`` (communicators) or ``horovod``
        (process sets; needs the Horovod build of ``make horovod``).
      sample_interval: seconds between queue-occupancy samples.
      peer_timeout: seconds a member may go unheard (the heartbeat ring of :mod:`enspipe.common.liveness`)
        before the job counts it lost and aborts.
      node_shm: assemble shared batches in node-shared memory (one copy per block within a
        node); off: the MPI collectives themselves on every link. mpi4py transport only.
      batch_checksums: log a checksum of each delivered batch's bytes (pixels and metadata) in
        the step events, to compare transports bit for bit.
      cpu_monitor: the per-node CPU monitor: ``mpstat`` (sysstat), ``psutil``, ``auto`` (mpstat
        where installed, else psutil) or ``none``.
      monitor_interval: seconds between CPU samples (whole seconds: mpstat's unit).
      power: energy sources, in order of preference for the headline figure: ``rapl``,
        ``nvml``, ``slurm`` (sstat of the job step), ``external`` (a meter CSV), ``modelled``;
        ``auto`` is external > slurm > rapl+nvml > modelled, whatever is available.
      power_csv: an external meter's (timestamp, watts) CSV covering the cell.
      idle_power: the idle-power file written by ``enspipe idle-power``; without it the idle
        figure is the model's ``idle_watts`` (and says so).
      idle_watts, watts_per_core: the power model: ``idle_watts + watts_per_core * busy cores``
        per node. Its results are labelled ``modelled``.
    """

    data: str
    out: str
    network: str = "alexnet_v2"
    consumer: str = "peak"
    batch_size: int | None = None
    steps: int = 100
    warmup: int = 10
    cores: int | None = None
    image_size: int = 224
    scheme: str = "baseline"
    preprocessors: int | None = None
    rate: float | None = None
    rate_source: str | None = None
    seed: int = 0
    rep: int = 0
    lrs: tuple[float, ...] = (0.01,)
    shuffle_buffer: int = 1024
    queue_depth: int = 4
    on_corrupt: str = "fail"
    peer_timeout: float = 10.0
    fast_mode: bool = False
    wire_dtype: str = "float32"
    transport: str = "mpi4py"
    sample_interval: float = 0.1
    node_shm: bool = True
    batch_checksums: bool = False
    cpu_monitor: str = "auto"
    monitor_interval: int = 1
    power: tuple[str, ...] = ("auto",)
    power_csv: str | None = None
    idle_power: str | None = None
    idle_watts: float = 50.0
    watts_per_core: float = 10.0
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        from enspipe.models.networks import NETWORKS

        _require(bool(self.data), "data", "no dataset given", "pass --data DIR (see `enspipe make-dataset`)")
        _require(bool(self.out), "out", "no output directory given", "pass --out DIR")
        for name in ("rate", "sample_interval", "idle_watts", "watts_per_core", "peer_timeout"):
            value = getattr(self, name)
            _require(value is None or math.isfinite(value), name, f"must be a finite number, got {value}",
                     "pass a finite value")
        _require(all(math.isfinite(lr) for lr in self.lrs), "lr", f"learning rates must be finite, got {list(self.lrs)}",
                 "pass e.g. --lr 0.01,0.02")
        _require(self.network in NETWORKS, "network", f"unknown network {self.network!r}",
                 f"choose one of {', '.join(NETWORKS)}")
        _require(self.consumer in CONSUMERS, "consumer", f"unknown consumer {self.consumer!r}",
                 f"choose one of {', '.join(CONSUMERS)}")
        _require(self.scheme in SCHEMES, "scheme", f"unknown scheme {self.scheme!r}",
                 f"choose one of {', '.join(SCHEMES)}")
        _require(self.batch_size is None or self.batch_size >= 1, "batch_size",
                 f"must be >= 1, got {self.batch_size}", "pass a positive batch size")
        _require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}", "measure at least one step")
        _require(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}", "use 0 for no warm-up")
        _require(self.cores is None or self.cores >= 1, "cores", f"must be >= 1, got {self.cores}",
                 "pass the number of cores per member, or leave it out for all cores")
        _require(32 <= self.image_size <= 1024, "image_size", f"must be in [32, 1024], got {self.image_size}",
                 "224 is the paper's size; tests may use 32..128")
        _require(self.preprocessors is None or self.preprocessors >= 1, "preprocessors",
                 f"must be >= 1, got {self.preprocessors}", "pass P >= 1")
        if self.consumer == "emulated":
            _require(self.rate is not None and self.rate > 0, "rate",
                     "the emulated consumer needs the accelerator rate rc > 0 in images/s",
                     "pass --rate R (e.g. the paper's K20X rate for the network)")
        else:
            _require(self.rate is None or self.rate > 0, "rate", f"must be > 0, got {self.rate}",
                     "pass a positive rate or leave it out")
        _require(len(self.lrs) >= 1 and all(lr > 0 for lr in self.lrs), "lr",
                 f"learning rates must be positive, got {list(self.lrs)}", "pass e.g. --lr 0.01,0.02")
        _require(self.shuffle_buffer >= 0, "shuffle_buffer", f"must be >= 0, got {self.shuffle_buffer}",
                 "use 0 for canonical order")
        _require(self.queue_depth >= 1, "queue_depth", f"must be >= 1, got {self.queue_depth}",
                 "use a small positive number of batches, e.g. 4")
        _require(self.wire_dtype in WIRE_DTYPES, "wire_dtype", f"unknown wire dtype {self.wire_dtype!r}",
                 f"choose one of {', '.join(WIRE_DTYPES)}")
        _require(self.transport in TRANSPORTS, "transport", f"unknown transport {self.transport!r}",
                 f"choose one of {', '.join(TRANSPORTS)}")
        if self.transport == "horovod":
            import importlib.util

            _require(importlib.util.find_spec("horovod") is not None, "transport", "Horovod is not installed here",
                     "build it with `make horovod` and run from .venv-horovod, or use --transport mpi4py")
        _require(0 < self.sample_interval <= MAX_SAMPLE_INTERVAL, "sample_interval",
                 f"must be in (0, {MAX_SAMPLE_INTERVAL:g}] seconds, got {self.sample_interval}", "pass seconds, e.g. 0.1")
        _require(self.peer_timeout >= 2, "peer_timeout", f"must be at least 2 s, got {self.peer_timeout}",
                 "pass seconds, e.g. 10 (the heartbeat beats twice a second)")
        _require(self.on_corrupt in ON_CORRUPT, "on_corrupt", f"unknown choice {self.on_corrupt!r}",
                 f"choose one of {', '.join(ON_CORRUPT)}")
        _require(self.cpu_monitor in CPU_MONITORS, "cpu_monitor", f"unknown CPU monitor {self.cpu_monitor!r}",
                 f"choose one of {', '.join(CPU_MONITORS)}")
        if self.cpu_monitor == "mpstat":
            import shutil

            _require(shutil.which("mpstat") is not None, "cpu_monitor", "mpstat is not installed",
                     "install sysstat (apt-get install sysstat), or pass --cpu-monitor auto or psutil")
        _require(self.monitor_interval >= 1, "monitor_interval", f"must be >= 1 s, got {self.monitor_interval}",
                 "mpstat samples in whole seconds: pass 1 or more")
        bad = [p for p in self.power if p not in POWER_SOURCES]
        _require(bool(self.power) and not bad, "power", f"unknown power source(s) {bad or '(none)'}",
                 f"pass a comma list of {', '.join(POWER_SOURCES)}")
        _require("auto" not in self.power or len(self.power) == 1, "power", "auto cannot be combined with other sources",
                 "pass auto alone, or list the sources")
        _require("external" not in self.power or self.power_csv is not None, "power_csv",
                 "the external power source needs the meter's CSV", "pass --power-csv FILE")
        _require(self.power_csv is None or os.path.isfile(self.power_csv), "power_csv",
                 f"{self.power_csv!r} is not a file", "start the meter log first and pass its (timestamp, watts) CSV")
        _require("modelled" not in self.power or self.cpu_monitor != "none", "power",
                 "the modelled power needs the CPU monitor", "drop --cpu-monitor none")
        _require(self.idle_power is None or os.path.isfile(self.idle_power), "idle_power",
                 f"{self.idle_power!r} is not a file", "write it with `enspipe idle-power --out FILE`")
        _require(self.idle_watts >= 0 and self.watts_per_core >= 0, "idle_watts",
                 f"model parameters must be >= 0, got {self.idle_watts}, {self.watts_per_core}",
                 "pass watts >= 0 for --idle-watts and --watts-per-core")
        _require(os.path.exists(self.data), "data", f"{self.data!r} does not exist",
                 "create it with `enspipe make-dataset --out DIR --num-images M --seed S`")
        from enspipe.data.manifest import check

        problem = check(self.data)
        _require(problem is None, "data", str(problem), "point --data at a dataset (see `enspipe make-dataset`)")
        problem = unwritable(self.out)
        _require(problem is None, "out", str(problem), "pass a directory you may write, or a new one under it")

    @property
    def skip_corrupt(self) -> bool:
        return self.on_corrupt == "skip"

    @property
    def global_batch(self) -> int:
        from enspipe.models.networks import NETWORKS

        return self.batch_size if self.batch_size is not None else NETWORKS[self.network].batch_size

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def lr_for(self, member: int) -> float:
        return self.lrs[member % len(self.lrs)]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["lrs"] = list(self.lrs)
        d["power"] = list(self.power)
        d["batch_size"] = self.global_batch
        return d


def unwritable(path: str) -> str | None:
    """Why the output directory ``path`` could not be created or written (None: it can), without
    creating anything: an existing directory must be writable, an existing file is refused, and a
    new directory's nearest existing ancestor must be a writable directory."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{path!r} exists and is not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path!r} is not writable"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent!r}, on the way to {path!r}, is not a directory"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"{path!r} cannot be created: {parent!r} is not writable"
