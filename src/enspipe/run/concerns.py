"""The per-cell run configuration's concerns: small frozen configs, one per concern (the stream,
the preprocessing, the training, the gradient exchange, the members' lives, the measurement, the
energy, the faults, the tf.data service peer), each validating its own values when it is made.
:data:`CONCERNS` is their registry, in the order ``enspipe run -h`` shows them;
:class:`enspipe.run.config.RunConfig` composes them and checks them against one another.

Example::

    MeasureOptions(steps=50, warmup=5).total_steps     # 55
    MeasureOptions(steps=0)                            # ConfigError: --steps ...
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from enspipe.plan.errors import require as _require
from enspipe.plan.options import (MAX_SAMPLE_INTERVAL, check_choices, counts, names, numbers, option, positive_int,
                                  rank_factor, size_bytes)
from enspipe.plan.gradients import EXCHANGES
from enspipe.plan.schemes import AUTO, DEFAULT_BLOCK_IMAGES, SCHEME_KINDS
from enspipe.engine.backends import AUTO as AUTO_BACKEND, BACKENDS, IMPLEMENTATIONS
from enspipe.engine.config import BUILTIN_PREPROCESSING, MALLOC_POLICIES, WIRE_DTYPES
from enspipe.exchange.transports import DEFAULT as DEFAULT_TRANSPORT, TRANSPORTS

CONSUMERS = ("train", "emulated", "peak")
TRAINERS = ("auto", "keras", "torch")
SCHEMES = tuple(SCHEME_KINDS) + (AUTO,)  # the scheme registry's names, in its order, and the planner's choice
CPU_MONITORS = ("auto", "mpstat", "psutil", "none")
POWER_SOURCES = ("auto", "rapl", "nvml", "slurm", "external", "modelled")
ON_CORRUPT = ("fail", "skip")
TFDATA_COMPRESSIONS = ("none", "AUTO")  # the tf.data service's register_dataset compression


def service_scheme(scheme: str) -> bool:
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
    transport: str = option(DEFAULT_TRANSPORT, "collective library: mpi4py communicators, Horovod process sets "
                            "(the build of `make horovod`), or torch.distributed process groups (gloo)",
                            choices=TRANSPORTS)
    node_shm: bool = option(True, "exchange through MPI collectives only, not node-shared memory (one copy per "
                            "block within a node); for comparison (mpi4py and torch transports)", flag="--no-node-shm")
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
                          choices=(AUTO_BACKEND, *BACKENDS))
    preprocess: str = option("network", "the training preprocessing: network (the network's own, Slim's inception "
                             "or vgg, as in the paper), inception, vgg, standard (torchvision's RandomResizedCrop, "
                             "flip and Normalize) or standard-jitter (standard with ColorJitter(0.4, 0.4, 0.4))",
                             choices=("network", *BUILTIN_PREPROCESSING))
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
