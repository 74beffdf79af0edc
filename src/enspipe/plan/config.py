"""The per-cell run configuration: small frozen configs, one per concern, composed by :class:`RunConfig`.

Each concern (the stream, the training, the members' lives, the measurement, the energy, the
faults, the tf.data service peer) validates its own values when it is made; :class:`RunConfig`
checks them against one another; :meth:`RunConfig.check` then looks at the files and the machine,
one explicit step before MPI starts. A bad value fails before any MPI or TensorFlow work, with a
:class:`ConfigError` that names the field (as its command-line option) and the fix.

Every option field is declared once, with its default, help and parser (:func:`option`);
:func:`add_options` builds ``enspipe run``'s command line from them, one group per concern.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field

from enspipe.plan.errors import ConfigError, require as _require
from enspipe.plan.options import (MAX_SAMPLE_INTERVAL, check_choices, choices_of, counts, names, network_problem,
                                  numbers, option, positive_int, rank_factor, size_bytes, unwritable)
from enspipe.plan.gradients import EXCHANGES
from enspipe.plan.schemes import AUTO, DEFAULT_BLOCK_IMAGES, SCHEME_KINDS
from enspipe.plan.stream import BACKENDS, IMPLEMENTATIONS, decode_cache_problem, tensorflow_installed

CONSUMERS = ("train", "emulated", "peak")
TRAINERS = ("auto", "keras", "torch")
SCHEMES = tuple(SCHEME_KINDS) + (AUTO,)  # the scheme registry's names, in its order, and the planner's choice
WIRE_DTYPES = ("float32", "uint8")
TRANSPORTS = ("mpi4py", "horovod")
CPU_MONITORS = ("auto", "mpstat", "psutil", "none")
POWER_SOURCES = ("auto", "rapl", "nvml", "slurm", "external", "modelled")
ON_CORRUPT = ("fail", "skip")
MALLOC_POLICIES = ("keep", "system")  # enspipe.run.memory.set_malloc's
TFDATA_COMPRESSIONS = ("none", "AUTO")  # the tf.data service's register_dataset compression


def _service(scheme: str) -> bool:
    """Whether ``scheme`` is the tf.data service peer (``auto`` never is)."""
    return scheme in SCHEME_KINDS and SCHEME_KINDS[scheme].service


@dataclass(frozen=True)
class StreamOptions:
    """The stream: what the members read, how they preprocess it and how they share the work."""

    scheme: str = option("baseline", "how members share preprocessing (the README's scheme table); auto: the cost "
                         "model's choice of scheme and P (needs --rate-from)", choices=SCHEMES)
    preprocessors: int | None = option(None, "P, the preprocessing members, for " + " / ".join(
        k for k, kind in SCHEME_KINDS.items() if kind.takes_p) + " (P = N for the others)", parse=positive_int)
    batch_size: int | None = option(None, "global batch; None: the network's, as in the paper", parse=positive_int)
    image_size: int = option(224, "side in px of the square preprocessed image (224 in the paper)",
                             parse=positive_int)
    seed: int = option(0, "base seed: data order, preprocessing and initialisation derive from it", parse=int)
    shuffle_buffer: int = option(1024, "records in the seeded shuffle buffer (0 = canonical order); at most a "
                                 "quarter of a TFRecord dataset is used", parse=positive_int)
    queue_depth: int = option(4, "capacity of each bounded stage queue, in batches", parse=positive_int)
    block_images: int = option(DEFAULT_BLOCK_IMAGES, "images a member preprocesses and exchanges at a time, at "
                               "least (up to 8 batches together; 1: one batch at a time); the batches are the same "
                               "either way", parse=positive_int)
    wire_dtype: str = option("float32", "element type of preprocessed images on the wire; uint8 quantises after "
                             "preprocessing: 4x less traffic, lossy by 1/255 of the range", choices=WIRE_DTYPES)
    transport: str = option("mpi4py", "collective library: mpi4py communicators, or Horovod process sets "
                            "(the build of `make horovod`)", choices=TRANSPORTS)
    node_shm: bool = option(True, "exchange through MPI collectives only, not node-shared memory (one copy per "
                            "block within a node); for comparison, mpi4py transport only", flag="--no-node-shm")
    malloc: str = option("keep", "keep: malloc reuses freed images' pages instead of faulting fresh ones in; "
                         "system: malloc as the environment set it", choices=MALLOC_POLICIES)
    plan_comm: str | None = option(None, "--scheme auto and --gradient-exchange prophet: enspipe calibrate-comm's "
                                   "comm.json, the collective costs the plan uses (default: assumed ones, labelled "
                                   "so)")

    def __post_init__(self) -> None:
        check_choices(self)
        _require(self.batch_size is None or self.batch_size >= 1, "batch_size",
                 f"must be >= 1, got {self.batch_size}", "pass a positive batch size")
        _require(32 <= self.image_size <= 1024, "image_size", f"must be in [32, 1024], got {self.image_size}",
                 "224 is the paper's size; tests may use 32..128")
        _require(self.preprocessors is None or self.preprocessors >= 1, "preprocessors",
                 f"must be >= 1, got {self.preprocessors}", "pass P >= 1")
        _require(self.shuffle_buffer >= 0, "shuffle_buffer", f"must be >= 0, got {self.shuffle_buffer}",
                 "use 0 for canonical order")
        _require(self.block_images >= 1, "block_images", f"must be >= 1, got {self.block_images}",
                 "pass images, e.g. 32 (1: one batch at a time)")
        _require(self.queue_depth >= 1, "queue_depth", f"must be >= 1, got {self.queue_depth}",
                 "use a small positive number of batches, e.g. 4")
        if self.scheme == AUTO:
            _require(self.preprocessors is None, "preprocessors", "--scheme auto chooses P itself",
                     "leave --preprocessors out, or name the scheme")


@dataclass(frozen=True)
class PreprocessOptions:
    """The preprocessing: which backend and implementation turn each encoded image into pixels."""

    backend: str = option("auto", "preprocessing backend: tf (tf.data and Slim's TensorFlow ops) or pillow (Pillow "
                          "and numpy, no TensorFlow); auto: tf where TensorFlow is installed",
                          choices=("auto", *BACKENDS))
    fast_mode: bool = option(False, "TF-Slim's inception fast_mode (off in the paper)")
    preprocess_impl: str = option("crop-first", "the built-in preprocessing: crop-first (inception's crop window "
                                  "alone decoded, bit for bit Slim's values, less CPU), reference (Slim's functions "
                                  "as written; tf backend), or fused-colour (crop-first with the colour distortion "
                                  "as one affine map in YIQ: an APPROXIMATION, its error in the summary)",
                                  choices=IMPLEMENTATIONS)
    decode_cache: int = option(0, "node-shared memory that keeps decoded images (e.g. 8GB; 0: off): a sample "
                               "preprocessed again on the node (a later epoch) skips its decode; what fits is kept",
                               parse=size_bytes, metavar="SIZE")

    def __post_init__(self) -> None:
        check_choices(self)


@dataclass(frozen=True)
class TrainingOptions:
    """The training: what consumes the batches, the accelerators and the members on them."""

    network: str = option("alexnet_v2", "the network each member trains: a registered one (alexnet_v2, "
                          "inception_v1, vgg_a, resnet_50, mobilenet_v2, tiny) or your factory as "
                          "package.module:function, fn(num_classes, image_size, seed) -> keras.Model")
    consumer: str = option("peak", "train: real SGD steps; emulated: an accelerator stand-in that waits "
                           "batch/--rate seconds without using CPU; peak: dequeue as fast as possible",
                           choices=CONSUMERS)
    trainer: str = option("auto", "the train consumer's framework: keras (TensorFlow) or torch (PyTorch, the "
                          "paper's networks in torch.nn, or your factory returning a torch.nn.Module); auto: keras "
                          "where TensorFlow is installed, else torch", choices=TRAINERS)
    rate: float | None = option(None, "the emulated accelerator's rate rc in images/s (emulated only)", parse=float)
    lrs: tuple[float, ...] = option((0.01,), "learning rates; member m uses the (m mod k)-th (members differ in "
                                    "learning rate and initialisation seed, as in the paper)",
                                    parse=numbers, flag="--lr", metavar="LR[,LR...]")
    data_parallel: tuple[int, ...] = option(
        (1,), "ranks per member (G, or G1,G2,... one per member): a member's ranks split each batch and "
        "all-reduce gradients; the job's ranks are their sum", parse=counts, metavar="G[,G...]")
    members_per_rank: int = option(
        1, "ensemble members each rank hosts (Crossbow's several models per accelerator): K models in one process "
        "trained on every delivered batch, no exchange between them; the ensemble has ranks x K members",
        parse=positive_int, metavar="K")
    member_rates: tuple[float, ...] | None = option(
        None, "emulated only, a heterogeneous ensemble: each member's one-accelerator rate rc (R1,R2,...) "
        "instead of --rate", parse=numbers, metavar="R[,R...]")
    member_networks: tuple[str, ...] | None = option(
        None, "train only, a heterogeneous ensemble: each member's network (N1,N2,...); every member reads the one "
        "shared stream, preprocessed as --network's", parse=names, metavar="NET[,NET...]")
    member_batch_multipliers: tuple[int, ...] | None = option(
        None, "train only: member m updates its weights every K_m shared batches, on their mean gradient (its "
        "batch is K_m x the global batch; K1,K2,... or one K for all); with --member-epochs K_m must divide an "
        "epoch's batches", parse=counts, metavar="K[,K...]")
    scaling_efficiency: float = option(
        1.0, "emulated data-parallel members: the share of the linear speed-up kept per doubling of "
        "accelerators (a member on g runs at rc x g x e^log2(g))", parse=float)
    slow_member: tuple[int, float] | None = option(
        None, "RANK:FACTOR: member RANK's emulated accelerators are FACTOR times slower than the others' "
        "(emulated only): enspipe's members keep lockstep at its pace, the tf.data service lets the others "
        "run ahead and it skip", parse=rank_factor, metavar="RANK:FACTOR")
    def __post_init__(self) -> None:
        check_choices(self)
        from enspipe.models.networks import name_problem

        for field_name, nets in (("network", [self.network]), ("member_networks", self.member_networks or [])):
            for x in nets:
                problem = name_problem(x)
                _require(problem is None, field_name, *((problem.problem, problem.fix) if problem else ("", "")))
        _require(len(self.lrs) >= 1 and all(math.isfinite(lr) and lr > 0 for lr in self.lrs), "lr",
                 f"learning rates must be finite and positive, got {list(self.lrs)}", "pass e.g. --lr 0.01,0.02")
        self._check_rates()
        _require(len(self.data_parallel) >= 1 and min(self.data_parallel) >= 1, "data_parallel",
                 f"every member needs >= 1 accelerator, got {list(self.data_parallel)}",
                 "pass e.g. --data-parallel 2 or 1,2,1")
        _require(max(self.data_parallel) == 1 or self.consumer in ("train", "emulated"), "data_parallel",
                 f"splits a batch between the accelerators of a member; the {self.consumer} consumer has none",
                 "pass --consumer train or emulated, or leave --data-parallel out")
        _require(self.members_per_rank >= 1, "members_per_rank", f"must be >= 1, got {self.members_per_rank}",
                 "pass K >= 1 members per rank")
        for name in ("member_batch_multipliers", "member_networks"):
            _require(getattr(self, name) is None or self.consumer == "train", name, f"is for trained members; the "
                     f"consumer is {self.consumer}", f"pass --consumer train, or leave --{name.replace('_', '-')} out")
        _require(self.member_batch_multipliers is None or min(self.member_batch_multipliers) >= 1,
                 "member_batch_multipliers", f"every multiplier must be >= 1, got "
                 f"{list(self.member_batch_multipliers or ())}", "pass e.g. 1,2,4")
        _require(math.isfinite(self.scaling_efficiency) and 0 < self.scaling_efficiency <= 1, "scaling_efficiency",
                 f"must be in (0, 1], got {self.scaling_efficiency}", "pass e.g. 0.9 (1.0: linear)")

    def _check_rates(self) -> None:
        """The emulated accelerators' rates: ``--rate``, ``--member-rates`` and ``--slow-member``."""
        _require(self.rate is None or math.isfinite(self.rate), "rate", f"must be a finite number, got {self.rate}",
                 "pass a finite value")
        if self.consumer == "emulated" and self.member_rates is None:
            _require(self.rate is not None and self.rate > 0, "rate",
                     "the emulated consumer needs the accelerator rate rc > 0 in images/s",
                     "pass --rate R (e.g. the paper's K20X rate for the network)")
        else:
            _require(self.rate is None or self.rate > 0, "rate", f"must be > 0, got {self.rate}",
                     "pass a positive rate or leave it out")
        if self.member_rates is not None:
            _require(self.consumer == "emulated", "member_rates", f"sets emulated accelerators' rates; the "
                     f"consumer is {self.consumer}", "pass --consumer emulated, or leave --member-rates out")
            _require(all(math.isfinite(r) and r > 0 for r in self.member_rates), "member_rates",
                     f"every rate must be finite and > 0, got {list(self.member_rates)}", "pass e.g. 40,120,400")
        if self.slow_member is not None:
            rank, factor = self.slow_member
            _require(self.consumer == "emulated", "slow_member", f"slows an emulated accelerator; the consumer is "
                     f"{self.consumer}", "pass --consumer emulated --rate R, or leave --slow-member out")
            _require(rank >= 0 and math.isfinite(factor) and factor >= 1, "slow_member",
                     f"needs RANK >= 0 and FACTOR >= 1, got {rank}:{factor}", "pass e.g. --slow-member 1:3")


@dataclass(frozen=True)
class GradientOptions:
    """How a trained data-parallel member's ranks sum their gradients (checked against the training
    by :meth:`RunConfig._check_exchange`)."""

    gradient_exchange: str = option(
        "whole", "how a data-parallel member's ranks sum gradients: whole (one all-reduce after backpropagation), "
        "blocks (blocks of layers all-reduced while it goes on), prophet (Prophet's blocks and order from "
        "--gradient-profile; the next forward starts on the first layers' sums), ako (Ako's partial exchange: "
        "the replicas differ, off by default)", choices=EXCHANGES)
    gradient_block_mb: float = option(4.0, "blocks: a block's size in MB", parse=float, metavar="MB")
    gradient_profile: str | None = option(
        None, "prophet: `enspipe profile`'s JSON of the member's network (its layers' gradient sizes and times)")
    ako_partitions: int | None = option(
        None, "ako: the gradient's partitions, one sent a step (a multiple of each data-parallel member's ranks)",
        parse=positive_int, metavar="P")


    def __post_init__(self) -> None:
        check_choices(self)
        _require(math.isfinite(self.gradient_block_mb) and self.gradient_block_mb > 0, "gradient_block_mb",
                 f"must be a finite size > 0, got {self.gradient_block_mb}", "pass e.g. 4")
        for name, mode in (("gradient_profile", "prophet"), ("ako_partitions", "ako")):
            _require(getattr(self, name) is None or self.gradient_exchange == mode, name, f"is for "
                     f"--gradient-exchange {mode}, not {self.gradient_exchange}",
                     f"leave --{name.replace('_', '-')} out, or pass --gradient-exchange {mode}")


@dataclass(frozen=True)
class MemberLives:
    """The members' lives: their epochs, names, checkpoints, validation, early stopping and re-planning."""

    member_epochs: tuple[int, ...] | None = option(
        None, "each member's epochs to train (E1,E2,...; one value: every member's): a member that has trained "
        "its epochs leaves its accelerators idle while the others go on, as in a FLEET flotilla; the dataset "
        "must be a whole number of batches", parse=counts, metavar="E[,E...]")
    member_names: tuple[str, ...] | None = option(
        None, "each member's name (A,B,...; default m0,m1,...): its directory under --checkpoint-dir",
        parse=names, metavar="NAME[,NAME...]")
    checkpoint_dir: str | None = option(
        None, "each member saves its state at its epoch ends under DIR/<name> and, started again, resumes from "
        "it; needs --member-epochs")
    validation_data: str | None = option(
        None, "a dataset (enspipe make-dataset) each training member evaluates its loss on at each epoch end "
        "(Slim's evaluation preprocessing, in order)")
    member_patience: tuple[int, ...] | None = option(
        None, "early stopping (train only): a member has converged when its validation loss has not improved by "
        "--min-delta for PATIENCE epochs (P1,P2,...; 0: no early stopping); --member-epochs bounds it; needs "
        "--validation-data", parse=counts, metavar="P[,P...]")
    min_delta: float = option(0.0, "early stopping: the least drop of the validation loss that counts as "
                              "improving", parse=float)
    stop_below: int | None = option(
        None, "end the run at the first epoch end at which fewer than K ranks still train (FLEET re-plans there: "
        "K = 0.8 G; 1: when every member is done); needs --member-epochs", parse=positive_int, metavar="K")

    def __post_init__(self) -> None:
        _require(self.member_epochs is None or min(self.member_epochs) >= 1, "member_epochs",
                 f"every member trains >= 1 epoch, got {list(self.member_epochs or ())}", "pass e.g. 2,6,3")
        epochs_needed = [n for n in ("checkpoint_dir", "stop_below", "member_patience") if getattr(self, n) is not None]
        _require(self.member_epochs is not None or not epochs_needed, epochs_needed[0] if epochs_needed else "",
                 "acts at a member's epoch ends, and the members' epochs are not bounded",
                 "pass --member-epochs (the most epochs each member trains in this run)")
        _require(not self.early_stopping or self.validation_data is not None, "validation_data",
                 "early stopping needs a validation loss", "pass --validation-data DIR (enspipe make-dataset with "
                 "another seed)")
        _require(math.isfinite(self.min_delta) and self.min_delta >= 0, "min_delta",
                 f"must be a finite number >= 0, got {self.min_delta}", "pass e.g. 0.001")
        _require(self.stop_below is None or self.stop_below >= 1, "stop_below", f"must be >= 1 rank, got "
                 f"{self.stop_below}", "pass e.g. 1 (stop when every member is done)")

    @property
    def early_stopping(self) -> bool:
        return self.member_patience is not None and max(self.member_patience) > 0

    def solo(self) -> list[str]:
        """The options that give each member a life of its own (its epochs, checkpoints, early stopping)."""
        return [n for n in ("member_epochs", "checkpoint_dir", "stop_below", "member_patience")
                if getattr(self, n) is not None]


@dataclass(frozen=True)
class MeasureOptions:
    """The measurement: the window, the cores it runs on and the monitors."""

    steps: int = option(100, "measured steps per member", parse=positive_int)
    warmup: int = option(10, "unmeasured steps before them (0 is valid)", parse=positive_int)
    cores: int | None = option(None, "CPU cores per member, enforced by affinity and thread pools; "
                               "None: all the cores this process may use", parse=positive_int)
    sample_interval: float = option(0.1, "seconds between queue-occupancy samples", parse=float)
    batch_checksums: bool = option(False, "log a checksum of every delivered batch's pixels and metadata in the step "
                                   "events, to compare transports bit for bit (costs a hash per batch)")
    cpu_monitor: str = option("auto", "per-node CPU monitor: mpstat (sysstat), psutil, auto (mpstat where "
                              "installed, else psutil) or none", choices=CPU_MONITORS)
    monitor_interval: int = option(1, "seconds between CPU samples (whole seconds: mpstat's unit)",
                                   parse=positive_int)

    def __post_init__(self) -> None:
        check_choices(self)
        _require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}", "measure at least one step")
        _require(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}", "use 0 for no warm-up")
        _require(self.cores is None or self.cores >= 1, "cores", f"must be >= 1, got {self.cores}",
                 "pass the number of cores per member, or leave it out for all cores")
        _require(math.isfinite(self.sample_interval) and 0 < self.sample_interval <= MAX_SAMPLE_INTERVAL,
                 "sample_interval", f"must be in (0, {MAX_SAMPLE_INTERVAL:g}] seconds, got {self.sample_interval}",
                 "pass seconds, e.g. 0.1")
        _require(self.monitor_interval >= 1, "monitor_interval", f"must be >= 1 s, got {self.monitor_interval}",
                 "mpstat samples in whole seconds: pass 1 or more")

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps


@dataclass(frozen=True)
class PowerOptions:
    """The energy: where the joules come from, and the power model's parameters."""

    power: tuple[str, ...] = option(("auto",), "energy sources by preference for the headline figure: auto "
                                    "(external > slurm > rapl+nvml > modelled, whatever is available) or a comma "
                                    "list of rapl, nvml, slurm (sstat of the job step), external (a meter CSV), "
                                    "modelled", parse=names, metavar="SOURCE[,SOURCE...]")
    power_csv: str | None = option(None, "an external meter's (timestamp, watts) CSV covering the cell")
    idle_power: str | None = option(None, "the idle-power file of `enspipe idle-power`; without it the idle figure "
                                    "is the model's --idle-watts (and says so)")
    idle_watts: float = option(50.0, "power model: idle watts per node (idle + per-core watts x busy cores; its "
                               "results are labelled modelled)", parse=float)
    watts_per_core: float = option(10.0, "power model: watts per fully busy core", parse=float)

    def __post_init__(self) -> None:
        bad = [p for p in self.power if p not in POWER_SOURCES]
        _require(bool(self.power) and not bad, "power", f"unknown power source(s) {bad or '(none)'}",
                 f"pass a comma list of {', '.join(POWER_SOURCES)}")
        _require("auto" not in self.power or len(self.power) == 1, "power",
                 "auto cannot be combined with other sources", "pass auto alone, or list the sources")
        _require("external" not in self.power or self.power_csv is not None, "power_csv",
                 "the external power source needs the meter's CSV", "pass --power-csv FILE")
        for name in ("idle_watts", "watts_per_core"):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, name, f"must be a finite number of watts >= 0, got {value}",
                     "pass watts >= 0")


@dataclass(frozen=True)
class FaultOptions:
    """The faults: corrupt records, and members that go unheard."""

    on_corrupt: str = option("fail", "an undecodable image or a corrupt record: fail naming it, or skip it and "
                             "count it", choices=ON_CORRUPT)
    peer_timeout: float = option(10.0, "seconds a member may go unheard (the heartbeat ring) before the job "
                                 "counts it lost and aborts", parse=float)

    def __post_init__(self) -> None:
        check_choices(self)
        _require(math.isfinite(self.peer_timeout) and self.peer_timeout >= 2, "peer_timeout",
                 f"must be at least 2 s, got {self.peer_timeout}", "pass seconds, e.g. 10 (the heartbeat beats "
                 "twice a second)")

    @property
    def skip_corrupt(self) -> bool:
        return self.on_corrupt == "skip"


@dataclass(frozen=True)
class ServiceOptions:
    """The tf.data service peer's own options (``--scheme tfdata_service`` only)."""

    tfdata_compression: str = option("none", "tfdata_service only: the service's compression of the "
                                     "elements it sends (AUTO: TensorFlow's choice, to compare)",
                                     choices=TFDATA_COMPRESSIONS)
    tfdata_cache_mb: int = option(1024, "tfdata_service only: each worker's cross-trainer cache in MiB; a "
                                  "member that falls further behind than it holds skips elements",
                                  parse=positive_int)

    def __post_init__(self) -> None:
        check_choices(self)
        _require(self.tfdata_cache_mb >= 1, "tfdata_cache_mb", f"must be >= 1 MiB, got {self.tfdata_cache_mb}",
                 "pass MiB, e.g. 1024")

    def changed(self) -> list[str]:
        """The options set away from their defaults."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) != f.default]


# The concerns, in the order ``enspipe run -h`` shows them: RunConfig's field name -> its config.
CONCERNS = {"stream": StreamOptions, "preprocess": PreprocessOptions, "training": TrainingOptions,
            "gradients": GradientOptions, "lives": MemberLives,
            "measure": MeasureOptions, "energy": PowerOptions, "faults": FaultOptions, "service": ServiceOptions}


@dataclass(frozen=True)
class RunConfig:
    """Everything one cell (one MPI job) needs: its data, its output and its concerns' configs.

    Example::

        cfg = RunConfig.of(data="data/train", out="runs/x", scheme="all_shared", steps=50)
        cfg.measure.steps, cfg.stream.scheme      # 50, 'all_shared'
        cfg.check()                               # the files and the machine, before MPI starts

    :meth:`of` takes the options by their flat names (as the command line does) and hands each to
    its concern; :meth:`to_dict` gives them back flat (the summary's ``config``). ``rate_source``
    says where the rate came from (a calibration file, or the command line).
    """

    data: str = option(None, "a dataset directory: TF-Slim ImageNet TFRecord shards (with or without the "
                       "manifest.json that `enspipe make-dataset` writes) or JPEG folders, one per class")
    out: str = option(None, "output directory for the event logs; summary.json appears there last and atomically")
    rep: int = option(0, "which repeat of its cell this run is: recorded in the summary's cell identity, it changes "
                      "nothing else (the grid varies --seed per repeat)", parse=positive_int)
    stream: StreamOptions = field(default_factory=StreamOptions)
    preprocess: PreprocessOptions = field(default_factory=PreprocessOptions)
    training: TrainingOptions = field(default_factory=TrainingOptions)
    gradients: GradientOptions = field(default_factory=GradientOptions)
    lives: MemberLives = field(default_factory=MemberLives)
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    energy: PowerOptions = field(default_factory=PowerOptions)
    faults: FaultOptions = field(default_factory=FaultOptions)
    service: ServiceOptions = field(default_factory=ServiceOptions)
    rate_source: str | None = None
    calibration: str | None = None  # the calibration file (--rate-from): rc, and the rp that --scheme auto plans from
    planned: dict | None = None     # --scheme auto: what the planner chose and predicted (set when the cell starts)
    extra: dict = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, **values) -> "RunConfig":
        """The config of flat option values (``steps=50``, ``scheme="all_shared"``, ...), each handed to its concern."""
        top, parts = {}, {name: {} for name in CONCERNS}
        for key, value in values.items():
            owner = _OWNER.get(key)
            if owner is None and key not in _TOP:
                raise TypeError(f"RunConfig has no option {key!r}")
            (parts[owner] if owner else top)[key] = value
        return cls(**top, **{name: CONCERNS[name](**kw) for name, kw in parts.items()})

    def replaced(self, **values) -> "RunConfig":
        """This config with the flat options ``values`` changed (validated again)."""
        changes: dict = {}
        for key, value in values.items():
            owner = _OWNER.get(key)
            if owner is None:
                changes[key] = value
            else:
                changes[owner] = dataclasses.replace(changes.get(owner, getattr(self, owner)), **{key: value})
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        """The concerns against one another (each checked its own values when it was made; no file or
        machine is looked at: that is :meth:`check`)."""
        _require(bool(self.data), "data", "no dataset given", "pass --data DIR (see `enspipe make-dataset`)")
        _require(bool(self.out), "out", "no output directory given", "pass --out DIR")
        s, t, lives, x = self.stream, self.training, self.lives, self.gradients.gradient_exchange
        # (an auto cell's config after the plan chose its scheme keeps the file it planned with)
        _require(s.scheme == AUTO or s.plan_comm is None or self.planned is not None or
                 x == "prophet", "plan_comm", f"is for --scheme auto or --gradient-exchange "
                 f"prophet, not {s.scheme} with {x}", "leave --plan-comm out")
        _require(x == "whole" or s.transport == "mpi4py", "gradient_exchange",
                 f"{x} runs on the member's MPI communicator; Horovod's process set sums the whole "
                 "gradient", "leave --gradient-exchange out with --transport horovod")
        self._check_exchange()
        if max(t.data_parallel) > 1:
            _require(not _service(s.scheme), "data_parallel", "the tf.data service gives each rank its own stream, "
                     "so a member's ranks would not split one batch",
                     "use an enspipe scheme, or leave --data-parallel out")
            _require(s.batch_size is None or s.batch_size >= max(t.data_parallel), "data_parallel",
                     f"each of a member's {max(t.data_parallel)} ranks needs at least one image of the batch "
                     f"of {s.batch_size}", "raise --batch-size or lower --data-parallel")
        if t.members_per_rank > 1:
            self._check_members_per_rank()
        _require(lives.member_epochs is None or not self.faults.skip_corrupt, "member_epochs", "an epoch with "
                 "skipped records ends inside a batch", "leave --on-corrupt skip or --member-epochs out")
        _require(not lives.early_stopping or t.consumer == "train", "member_patience", f"stops a member on its "
                 f"validation loss; the {t.consumer} consumer has none", "pass --consumer train, or leave "
                 "--member-patience out")
        _require("modelled" not in self.energy.power or self.measure.cpu_monitor != "none", "power",
                 "the modelled power needs the CPU monitor", "drop --cpu-monitor none")
        self._check_service()

    def _check_members_per_rank(self) -> None:
        """K members on a rank step together on one batch."""
        solo = self.lives.solo() + [n for n in ("member_batch_multipliers", "slow_member")
                                    if getattr(self.training, n) is not None]
        named = f" ({', '.join('--' + x.replace('_', '-') for x in solo)})" if solo else ""
        _require(max(self.training.data_parallel) == 1 and not solo, "members_per_rank", "a rank's members step "
                 "together on one batch, so they cannot spread over ranks (--data-parallel), train their own epochs "
                 f"or lag one another{named}", "leave those options out, or run one member per rank")
        _require(not _service(self.stream.scheme), "members_per_rank", "the tf.data service's trainers are processes",
                 "use an enspipe scheme")

    def _check_service(self) -> None:
        """The tf.data service peer against the rest."""
        scheme = self.stream.scheme
        for name in self.service.changed():
            _require(_service(scheme), name, f"is for --scheme tfdata_service, not {scheme}",
                     f"leave --{name.replace('_', '-')} out, or pass --scheme tfdata_service")
        if _service(scheme):
            _require(self.stream.transport == "mpi4py", "transport", "the tf.data service moves its own batches "
                     "(gRPC)", "leave --transport out for --scheme tfdata_service")
            _require(not self.faults.skip_corrupt, "on_corrupt", "the tf.data service's workers cannot skip and "
                     "count a corrupt record (its graph runs on the workers)", "leave --on-corrupt out for "
                     "tfdata_service")

    def check(self) -> None:
        """The checks against the files and the machine, one explicit step before MPI starts
        (:func:`from_options` makes it): the dataset, the output directory, the networks' factories,
        the calibration and the files options name, Horovod and mpstat where asked for. Raises
        :class:`ConfigError` naming the option."""
        t = self.training
        for name, nets in (("network", [t.network]), ("member_networks", t.member_networks or ())):
            for x in nets:
                problem = network_problem(x)
                _require(problem is None, name, *(problem or ("", "")))
        if self.stream.scheme == AUTO:
            _require(self.calibration is not None and os.path.isfile(self.calibration), "rate_from",
                     f"--scheme auto plans from the calibration, and {self.calibration!r} is not a file",
                     "pass --rate-from RATES.json (the workflow's calibration)")
        for name, path in (("plan_comm", self.stream.plan_comm), ("power_csv", self.energy.power_csv),
                           ("idle_power", self.energy.idle_power)):
            _require(path is None or os.path.isfile(path), name, f"{path!r} is not a file",
                     "write it first (plan_comm: enspipe calibrate-comm; power_csv: the meter's (timestamp, watts) "
                     "log; idle_power: enspipe idle-power --out FILE)")
        for name, path in (("data", self.data), ("validation_data", self.lives.validation_data)):
            if path is not None:
                _require(os.path.exists(path), name, f"{path!r} does not exist",
                         "create it with `enspipe make-dataset --out DIR --num-images M --seed S`")
                _check_dataset(name, path)
        if t.consumer == "train":
            self._probe_networks()
        if self.gradients.gradient_profile is not None:
            self._check_gradient_profile()
        for name, path in (("checkpoint_dir", self.lives.checkpoint_dir), ("out", self.out)):
            problem = unwritable(path) if path is not None else None
            _require(problem is None, name, str(problem), "pass a directory you may write, or a new one under it")
        self._check_machine()

    def _probe_networks(self) -> None:
        """Each user's network that a member trains, built once before MPI starts (registered ones are known)."""
        from enspipe.data.build import load_manifest
        from enspipe.models.networks import NetworkError, network_spec

        num_classes = load_manifest(self.data).num_classes
        t = self.training
        for name, nets in (("network", [t.network] if not t.member_networks else []),
                           ("member_networks", sorted(set(t.member_networks or ())))):
            for x in nets:
                try:
                    network_spec(x).probe(num_classes, self.stream.image_size)
                except NetworkError as e:
                    raise ConfigError(name, e.problem, e.fix) from None

    def _check_gradient_profile(self) -> None:
        """Prophet's profile: ``enspipe profile``'s JSON, with layers, of the network the members train."""
        import json

        path, t = self.gradients.gradient_profile, self.training
        fix = f"measure it: enspipe profile --network {t.network} --data DIR --image-size {self.stream.image_size}"
        try:
            with open(path) as f:
                record = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigError("gradient_profile", f"{path!r} cannot be read as a profile ({e})", fix) from None
        nets = set(t.member_networks or (t.network,))
        _require(isinstance(record, dict) and bool(record.get("layers")), "gradient_profile",
                 f"{path!r} has no layers (a profile from before they were measured, or not a profile)", fix)
        _require(nets == {record.get("network")}, "gradient_profile", f"{path!r} is {record.get('network')!r}'s, "
                 f"and the members train {sorted(nets)}", fix)
        _require(record.get("image_size") == self.stream.image_size, "gradient_profile", f"{path!r} was measured at "
                 f"{record.get('image_size')} px, and the members train at {self.stream.image_size}", fix)

    def _check_machine(self) -> None:
        """TensorFlow, Horovod and mpstat, where the options ask for them."""
        if not tensorflow_installed():
            needs = [(name, what) for name, what, yes in (
                ("backend", "--backend tf", self.preprocess.backend == "tf"),
                ("trainer", "the Keras train consumer", self.trainer == "keras"),
                ("scheme", "the tf.data service", _service(self.stream.scheme)),
                ("transport", "Horovod", self.stream.transport == "horovod")) if yes]
            _require(not needs, needs[0][0] if needs else "backend", f"{needs[0][1] if needs else ''} needs "
                     "TensorFlow, which is not installed here", "pip install 'enspipe[tf]', or run --backend pillow "
                     "with --consumer peak or emulated")
        if self.trainer == "torch":
            self._check_torch_training()
        problem = decode_cache_problem(self.preprocess.decode_cache)
        _require(problem is None, "decode_cache", f"{problem}", "pass a smaller --decode-cache, or leave it out")
        _require(not (self.preprocess.decode_cache and _service(self.stream.scheme)), "decode_cache", "the tf.data "
                 "service's workers decode in their own graph, without enspipe's cache", "leave --decode-cache out "
                 "for --scheme tfdata_service")
        _require(self.preprocess.preprocess_impl != "reference" or self.backend == "tf", "preprocess_impl", "reference is "
                 "Slim's TensorFlow functions as written; the pillow backend has one implementation",
                 "leave --preprocess-impl out, or run --backend tf")
        _require(not (_service(self.stream.scheme) and self.backend == "pillow"), "backend", "the tf.data service "
                 "runs TensorFlow's preprocessing graph in its workers", "leave --backend out (tf) for "
                 "--scheme tfdata_service")
        if self.stream.transport == "horovod":
            import importlib.util

            _require(importlib.util.find_spec("horovod") is not None, "transport", "Horovod is not installed here",
                     "build it with `make horovod` and run from .venv-horovod, or use --transport mpi4py")
        if self.measure.cpu_monitor == "mpstat":
            import shutil

            _require(shutil.which("mpstat") is not None, "cpu_monitor", "mpstat is not installed",
                     "install sysstat (apt-get install sysstat), or pass --cpu-monitor auto or psutil")

    def _check_exchange(self) -> None:
        """``--gradient-exchange`` against the training: for trained members on several ranks."""
        g, t = self.gradients, self.training
        x = g.gradient_exchange
        if x == "whole":
            return
        _require(t.consumer == "train", "gradient_exchange", f"{x} exchanges gradients; the {t.consumer} "
                 "consumer has none", "pass --consumer train, or leave --gradient-exchange out")
        _require(max(t.data_parallel) > 1, "gradient_exchange", f"{x} exchanges a member's gradients among its "
                 "ranks, and every member is on one rank", "pass --data-parallel 2 (or more), or leave "
                 "--gradient-exchange out")
        _require(t.member_batch_multipliers is None or max(t.member_batch_multipliers) == 1,
                 "gradient_exchange", f"{x} applies each batch's gradient as it is summed, and a batch multiplier "
                 "accumulates several", "leave --member-batch-multipliers out, or use --gradient-exchange whole")
        _require(x != "prophet" or g.gradient_profile is not None, "gradient_profile", "prophet plans its blocks "
                 "from the network's layers' gradient sizes and times", "pass --gradient-profile FILE (enspipe "
                 "profile --network N ... writes it)")
        if x == "ako":
            widths = sorted({w for w in t.data_parallel if w > 1})
            p = g.ako_partitions
            _require(p is not None, "ako_partitions", "ako sends one of P partitions of the gradient a step",
                     f"pass --ako-partitions P, a multiple of {math.lcm(*widths)} (e.g. {2 * math.lcm(*widths)})")
            _require(all(p % w == 0 for w in widths), "ako_partitions",
                     f"{p} partitions do not fit a member of {widths} ranks (each rank sends its own partition "
                     "a step, the ranks evenly apart)", f"pass a multiple of {math.lcm(*widths)}, e.g. "
                     f"--ako-partitions {2 * math.lcm(*widths)}")

    def _check_torch_training(self) -> None:
        """The torch train consumer: PyTorch importable, one rank per member, what it supports."""
        import importlib.util

        from enspipe.models.torch_architectures import TORCH_NETWORKS

        t, fix = self.training, "use --trainer keras (TensorFlow) for it"
        _require(importlib.util.find_spec("torch") is not None, "trainer", "PyTorch is not installed here" + (
                 "" if tensorflow_installed() else ", nor TensorFlow (--trainer keras)"), "pip install 'enspipe[torch]'"
                 + ("" if tensorflow_installed() else " or 'enspipe[tf]'") + ", or run --consumer peak or emulated")
        for net in t.member_networks or (t.network,):
            _require(net in TORCH_NETWORKS or ":" in net, "network", f"{net!r} has no torch definition (torch "
                     f"has {', '.join(TORCH_NETWORKS)})", "name one of those, or your factory as "
                     "package.module:function returning a torch.nn.Module")
        _require(max(t.data_parallel) == 1, "data_parallel", "the torch trainer trains one rank per member", fix)
        _require(t.members_per_rank == 1 and not t.member_batch_multipliers, "members_per_rank", "the torch "
                 "trainer takes one member per rank and one batch per update", fix)
        _require(self.lives.checkpoint_dir is None, "checkpoint_dir", "the torch trainer does not checkpoint "
                 "its members", fix)

    @property
    def gradient_spec(self):
        """The data-parallel members' gradient exchange (:class:`enspipe.plan.gradients.ExchangeSpec`)."""
        from enspipe.plan.gradients import ExchangeSpec

        g = self.gradients
        return ExchangeSpec(g.gradient_exchange, g.gradient_block_mb * 2**20, g.gradient_profile,
                            self.stream.plan_comm, g.ako_partitions)

    @property
    def backend(self) -> str:
        """The preprocessing backend the cell runs (``auto`` resolved here)."""
        if self.preprocess.backend != "auto":
            return self.preprocess.backend
        return "tf" if tensorflow_installed() else "pillow"

    @property
    def trainer(self) -> str | None:
        """The train consumer's framework (``auto`` resolved here); None for the other consumers."""
        if self.training.consumer != "train":
            return None
        if self.training.trainer != "auto":
            return self.training.trainer
        return "keras" if tensorflow_installed() else "torch"

    @property
    def needs_tensorflow(self) -> bool:
        """Whether a rank of this cell runs TensorFlow (its backend, Keras training, the service, Horovod)."""
        return (self.backend == "tf" or self.trainer == "keras" or _service(self.stream.scheme)
                or self.stream.transport == "horovod")

    @property
    def global_batch(self) -> int:
        from enspipe.models.networks import network_spec

        b = self.stream.batch_size
        return b if b is not None else network_spec(self.training.network).batch_size

    def stream_config(self):
        """The stream part of this cell's options, as the library takes them (:class:`StreamConfig`)."""
        from enspipe.plan.stream import StreamConfig

        s, p = self.stream, self.preprocess
        return StreamConfig(data=self.data, batch_size=self.global_batch, scheme=s.scheme,
                            preprocessors=s.preprocessors, image_size=s.image_size, seed=s.seed,
                            shuffle_buffer=s.shuffle_buffer, queue_depth=s.queue_depth,
                            block_images=s.block_images, node_shm=s.node_shm, transport=s.transport,
                            wire_dtype=s.wire_dtype, fast_mode=p.fast_mode, preprocess_impl=p.preprocess_impl,
                            decode_cache=p.decode_cache,
                            skip_corrupt=self.faults.skip_corrupt,
                            sample_interval=self.measure.sample_interval, backend=self.backend)

    def member_ranks(self, n: int) -> list[range]:
        """Each member's ranks among ``n`` (consecutive; ``data_parallel`` per member); raises
        :class:`ConfigError` when they do not add up to ``n``."""
        widths = self.training.data_parallel
        if len(widths) == 1:
            if n % widths[0]:
                raise ConfigError("data_parallel", f"{n} ranks do not make whole members of {widths[0]} ranks each",
                                  f"launch a multiple of {widths[0]} ranks (members x --data-parallel)")
            widths = (widths[0],) * (n // widths[0])
        elif sum(widths) != n:
            raise ConfigError("data_parallel", f"the members' {'+'.join(map(str, widths))} = {sum(widths)} ranks are "
                              f"not the job's {n}", f"launch {sum(widths)} ranks")
        starts = [sum(widths[:m]) for m in range(len(widths))]
        return [range(a, a + w) for a, w in zip(starts, widths)]

    def members(self, n: int) -> int:
        """The ensemble's members on ``n`` ranks: its data-parallel groups, times ``members_per_rank``."""
        return len(self.member_ranks(n)) * self.training.members_per_rank

    def rank_members(self, rank: int) -> list[int]:
        """The members a rank hosts (several with ``members_per_rank``; a data-parallel member's one)."""
        first = self.member_of(rank)
        return list(range(first, first + self.training.members_per_rank))

    def member_of(self, rank: int) -> int:
        """The ensemble member a rank trains (its data-parallel group of consecutive ranks); with
        ``members_per_rank`` K, the first of its K members."""
        t = self.training
        if t.members_per_rank > 1:
            return rank * t.members_per_rank
        if len(t.data_parallel) == 1:
            return rank // t.data_parallel[0]
        at = 0
        for m, w in enumerate(t.data_parallel):
            at += w
            if rank < at:
                return m
        raise IndexError(f"rank {rank} is beyond the members' {at} ranks")

    def accelerator_rate(self, member: int, width: int) -> float:
        """One of an emulated member's accelerators' rate on its part of a batch: its rc (``--rate``
        or its ``--member-rates`` entry, ``--slow-member`` slowed) x the scaling efficiency at ``width``."""
        t = self.training
        rc = t.member_rates[member] if t.member_rates else t.rate
        if t.slow_member is not None and t.slow_member[0] == member:
            rc /= t.slow_member[1]
        return rc * t.scaling_efficiency ** math.log2(width)

    def epochs_for(self, member: int) -> int | None:
        return _per_member(self.lives.member_epochs, member, None)

    def lr_for(self, member: int) -> float:
        return self.training.lrs[member % len(self.training.lrs)]

    def network_for(self, member: int) -> str:
        t = self.training
        return t.member_networks[member] if t.member_networks else t.network

    def name_of(self, member: int) -> str:
        return self.lives.member_names[member] if self.lives.member_names else f"m{member}"

    def batch_multiplier_for(self, member: int) -> int:
        return _per_member(self.training.member_batch_multipliers, member, 1)

    def patience_for(self, member: int) -> int:
        return _per_member(self.lives.member_patience, member, 0)

    def to_dict(self) -> dict:
        """Every option by its flat name (tuples as lists), and the resolved batch size: the summary's ``config``."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in CONCERNS}
        for name in CONCERNS:
            d.update(dataclasses.asdict(getattr(self, name)))
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
        d["batch_size"] = self.global_batch
        return d


_OWNER = {f.name: name for name, concern in CONCERNS.items() for f in dataclasses.fields(concern)}
_TOP = {f.name for f in dataclasses.fields(RunConfig)} - set(CONCERNS)


def _check_dataset(name: str, path: str) -> None:
    """A dataset's manifest and shards, and its records' format (its parse function)."""
    from enspipe.data.manifest import check
    from enspipe.data.parse import format_problem
    from enspipe.data.build import load_manifest

    problem = check(path)
    _require(problem is None, name, str(problem), f"point --{name.replace('_', '-')} at a dataset "
             "(see `enspipe make-dataset`)")
    problem = format_problem(load_manifest(path))
    _require(problem is None, name, str(problem), "fix the parse function, or re-index with `enspipe index --parse`")


def _per_member(values: tuple | None, member: int, default):
    """A per-member option's value for ``member``: one value for every member, or one each."""
    if not values:
        return default
    return values[0] if len(values) == 1 else values[member]


REQUIRED = ("data", "out")


def option_fields(only: tuple[str, ...] | None = None) -> list[dataclasses.Field]:
    """Every option field, RunConfig's own first, then each concern's in :data:`CONCERNS` order (or those of
    the concerns named in ``only``)."""
    groups = [RunConfig, *CONCERNS.values()] if only is None else [CONCERNS[c] for c in only]
    return [f for g in groups for f in dataclasses.fields(g) if "option" in f.metadata]


def default(name: str):
    """A run option's default, for whoever must spell it out (the grid's arguments, the schema test)."""
    return next(f.default for f in option_fields() if f.name == name)


def add_options(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Declare :class:`RunConfig`'s options on ``parser`` (or only those of the concerns named in
    ``only``), one argument group per concern; each lands on the namespace under its field's name."""
    groups = [(None, RunConfig)] * (only is None) + [(c, CONCERNS[c]) for c in (only or CONCERNS)]
    for name, config in groups:
        doc = (config.__doc__ or "").strip().split("\n")[0]
        target = parser if name is None else parser.add_argument_group(name, doc)
        for f in dataclasses.fields(config):
            if "option" in f.metadata:
                _add_option(target, f)


def _add_option(parser, f: dataclasses.Field) -> None:
    o = f.metadata["option"]
    flag = o["flag"] or "--" + f.name.replace("_", "-")
    kw = {"dest": f.name, "help": o["help"]}
    if isinstance(f.default, bool):
        kw["action"] = "store_false" if f.default else "store_true"
    else:
        choices = choices_of(f)
        kw.update(default=f.default, type=o["parse"], choices=list(choices) if choices else None,
                  metavar=o["metavar"], required=f.name in REQUIRED)
    parser.add_argument(flag, **kw)


def from_options(namespace, **overrides) -> RunConfig:
    """The validated and checked config of a parsed command line (``overrides`` win: e.g. a rate read
    from a file)."""
    values = {f.name: getattr(namespace, f.name) for f in option_fields() if hasattr(namespace, f.name)}
    cfg = RunConfig.of(**{**values, **overrides})
    cfg.check()
    return cfg


def parse_run_args(argv: list[str]) -> RunConfig:
    """The validated config of ``enspipe run``'s options (``argv`` without the ``run`` itself), for
    a caller that starts a cell inside its own job (``enspipe ensemble --in-job``); raises
    :class:`ConfigError`, and on an argument that does not parse, :class:`ConfigError` too."""
    from enspipe.plan.errors import ConfigError

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise ConfigError("run", message, "fix the round's enspipe run options")

    parser = Parser(prog="enspipe run", add_help=False)
    add_options(parser)
    return from_options(parser.parse_args(argv))
