"""The per-cell run configuration: one frozen, validated dataclass.

Every field is checked on construction, so a bad value fails before any MPI or TensorFlow work
starts, with a :class:`ConfigError` that names the field (as its command-line option) and the fix.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from dataclasses import dataclass, field

from enspipe.plan.errors import require as _require
from enspipe.plan.schemes import AUTO, DEFAULT_BLOCK_IMAGES, SCHEME_KINDS

CONSUMERS = ("train", "emulated", "peak")
SCHEMES = tuple(SCHEME_KINDS) + (AUTO,)  # the scheme registry's names, in its order, and the planner's choice
WIRE_DTYPES = ("float32", "uint8")
TRANSPORTS = ("mpi4py", "horovod")
PREPROCESSINGS = ("inception", "vgg")
CPU_MONITORS = ("auto", "mpstat", "psutil", "none")
POWER_SOURCES = ("auto", "rapl", "nvml", "slurm", "external", "modelled")
ON_CORRUPT = ("fail", "skip")
MALLOC_POLICIES = ("keep", "system")  # enspipe.run.memory.set_malloc's
TFDATA_COMPRESSIONS = ("none", "AUTO")  # the tf.data service's register_dataset compression
SERVICE_OPTIONS = ("tfdata_compression", "tfdata_cache_mb")  # only the tf.data service arm reads these


def rank_factor(s: str) -> tuple[int, float]:
    """``RANK:FACTOR``: member RANK's emulated accelerator runs FACTOR times slower."""
    try:
        rank, factor = s.split(":")
        return int(rank), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:FACTOR (e.g. 1:3), got {s!r}") from None
MAX_SAMPLE_INTERVAL = 60.0  # seconds


def positive_int(s: str) -> int:
    """An option's integer >= 0 (the config's checks set each one's own lower bound)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v}")
    return v


def numbers(s: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def counts(s: str) -> tuple[int, ...]:
    """Comma-separated integers >= 0 (``2`` or ``1,2,1``; the config's checks set the bound)."""
    return tuple(positive_int(x) for x in s.split(","))


def names(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def option(default, help: str, *, parse=None, choices=None, flag: str | None = None, metavar: str | None = None):
    """A :class:`RunConfig` field that is also an ``enspipe run`` option: its default, its help,
    how the command line's text becomes its value (``parse``; booleans are switches) and its
    choices (a tuple, or a function returning one, read when the parser is built). ``flag``
    overrides ``--field-name`` (``--no-node-shm`` turns ``node_shm`` off)."""
    meta = {"help": help, "parse": parse, "choices": choices, "flag": flag, "metavar": metavar}
    return field(default=default, metadata={"option": meta})


def _network_problem(name: str) -> tuple[str, str] | None:
    """Why ``name`` is neither a registered network nor an importable ``package.module:function``
    factory (``(problem, fix)``), or None."""
    from enspipe.models.networks import NetworkError, network_spec

    try:
        network_spec(name)
    except NetworkError as e:
        return e.problem, e.fix
    return None


def network_name(s: str) -> str:
    """An argparse type: a registered network or an importable factory (exit 2 naming why not)."""
    problem = _network_problem(s)
    if problem:
        raise argparse.ArgumentTypeError("; ".join(problem))
    return s


@dataclass(frozen=True)
class RunConfig:
    """Everything one cell (one MPI job) needs.

    Every field but ``rate_source`` and ``extra`` is an ``enspipe run`` option, declared here once
    with its default, help and parser (:func:`option`); :func:`add_options` builds the command
    line from them and :meth:`__post_init__` validates every value, naming the option and the fix.
    ``rate_source`` says where ``rate`` came from (a calibration file, or the command line).
    """

    data: str = option(None, "a dataset directory: TF-Slim ImageNet TFRecord shards (with or without the "
                       "manifest.json that `enspipe make-dataset` writes) or JPEG folders, one per class")
    out: str = option(None, "output directory for the event logs; summary.json appears there last and atomically")
    network: str = option("alexnet_v2", "the network each member trains: a registered one (alexnet_v2, "
                          "inception_v1, vgg_a, resnet_50, mobilenet_v2, tiny) or your factory as "
                          "package.module:function, fn(num_classes, image_size, seed) -> keras.Model")
    consumer: str = option("peak", "train: real SGD steps; emulated: an accelerator stand-in that waits "
                           "batch/--rate seconds without using CPU; peak: dequeue as fast as possible",
                           choices=CONSUMERS)
    batch_size: int | None = option(None, "global batch; None: the network's, as in the paper", parse=positive_int)
    steps: int = option(100, "measured steps per member", parse=positive_int)
    warmup: int = option(10, "unmeasured steps before them (0 is valid)", parse=positive_int)
    cores: int | None = option(None, "CPU cores per member, enforced by affinity and thread pools; "
                               "None: all the cores this process may use", parse=positive_int)
    image_size: int = option(224, "side in px of the square preprocessed image (224 in the paper)",
                             parse=positive_int)
    scheme: str = option("baseline", "how members share preprocessing: " + "; ".join(
        f"{k}: {kind.summary}" for k, kind in SCHEME_KINDS.items()) + f"; {AUTO}: the cost model's choice of scheme "
        "and P for these members (enspipe plan; needs --rate-from, the calibration)", choices=SCHEMES)
    preprocessors: int | None = option(None, "P, the preprocessing members, for " + " / ".join(
        k for k, kind in SCHEME_KINDS.items() if kind.takes_p) + " (P = N for the others)", parse=positive_int)
    rate: float | None = option(None, "the emulated accelerator's rate rc in images/s (emulated only)", parse=float)
    rate_source: str | None = None
    seed: int = option(0, "base seed: data order, preprocessing and initialisation derive from it", parse=int)
    rep: int = option(0, "which repeat of its cell this run is: recorded in the summary's cell identity, it changes "
                      "nothing else (the grid varies --seed per repeat)", parse=positive_int)
    lrs: tuple[float, ...] = option((0.01,), "learning rates; member m uses the (m mod k)-th (members differ in "
                                    "learning rate and initialisation seed, as in the paper)",
                                    parse=numbers, flag="--lr", metavar="LR[,LR...]")
    shuffle_buffer: int = option(1024, "records in the seeded shuffle buffer (0 = canonical order); at most a "
                                 "quarter of a TFRecord dataset is used", parse=positive_int)
    queue_depth: int = option(4, "capacity of each bounded stage queue, in batches", parse=positive_int)
    on_corrupt: str = option("fail", "an undecodable image or a corrupt record: fail naming it, or skip it and "
                             "count it (only it: the rest of its shard is still read); either way an epoch short "
                             "of the manifest's, beyond what was skipped, fails naming the shards",
                             choices=ON_CORRUPT)
    peer_timeout: float = option(10.0, "seconds a member may go unheard (the heartbeat ring) before the job "
                                 "counts it lost and aborts", parse=float)
    fast_mode: bool = option(False, "TF-Slim's inception fast_mode (off in the paper)")
    wire_dtype: str = option("float32", "element type of preprocessed images on the wire; uint8 quantises after "
                             "preprocessing: 4x less traffic, lossy by 1/255 of the range", choices=WIRE_DTYPES)
    transport: str = option("mpi4py", "collective library: mpi4py communicators, or Horovod process sets "
                            "(the build of `make horovod`)", choices=TRANSPORTS)
    sample_interval: float = option(0.1, "seconds between queue-occupancy samples", parse=float)
    node_shm: bool = option(True, "exchange through MPI collectives only, not node-shared memory (one copy per "
                            "block within a node); for comparison, mpi4py transport only", flag="--no-node-shm")
    block_images: int = option(DEFAULT_BLOCK_IMAGES, "images a member preprocesses and exchanges at a time, at "
                               "least: it takes ceil(this / its share) consecutive global batches together (at "
                               "most 8), so a small share of each batch pays tf.data's and the collective's fixed "
                               "costs as rarely as the baseline's whole batch does; 1: one batch at a time. The unit "
                               "is then cut to the largest that divides --steps, so the measured window is whole "
                               "units. The batches are the same either way; --on-corrupt skip takes one at a time",
                               parse=positive_int)
    malloc: str = option("keep", "keep: the members' malloc reuses freed images' pages instead of mapping and "
                         "faulting them in afresh (each 224 px image is 588 KiB; on a VM the faults were half "
                         "the CPU per image); system: malloc as the environment set it "
                         "(enspipe.run.memory)", choices=MALLOC_POLICIES)
    batch_checksums: bool = option(False, "log a checksum of every delivered batch's pixels and metadata in the step "
                                   "events, to compare transports bit for bit (costs a hash per batch)")
    cpu_monitor: str = option("auto", "per-node CPU monitor: mpstat (sysstat), psutil, auto (mpstat where "
                              "installed, else psutil) or none", choices=CPU_MONITORS)
    monitor_interval: int = option(1, "seconds between CPU samples (whole seconds: mpstat's unit)",
                                   parse=positive_int)
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
    data_parallel: tuple[int, ...] = option(
        (1,), "accelerators (ranks) per member, G for every member or G1,G2,... one per member: a member is "
        "consecutive ranks that split each delivered batch and all-reduce gradients (FLEET's data-parallel "
        "members; train or emulated consumers); the job's ranks are their sum", parse=counts, metavar="G[,G...]")
    members_per_rank: int = option(
        1, "ensemble members each rank hosts (Crossbow's several models per accelerator): K models in one process "
        "trained on every delivered batch, no exchange between them; the ensemble has ranks x K members",
        parse=positive_int, metavar="K")
    member_rates: tuple[float, ...] | None = option(
        None, "emulated only, a heterogeneous ensemble: each member's one-accelerator rate rc (R1,R2,...) "
        "instead of --rate", parse=numbers, metavar="R[,R...]")
    member_epochs: tuple[int, ...] | None = option(
        None, "each member's epochs to train (E1,E2,...; one value: every member's): a member that has trained "
        "its epochs leaves its accelerators idle while the others go on, as in a FLEET flotilla; the dataset "
        "must be a whole number of batches", parse=counts, metavar="E[,E...]")
    member_networks: tuple[str, ...] | None = option(
        None, "train only, a heterogeneous ensemble: each member's network (N1,N2,...); every member reads the one "
        "shared stream, preprocessed as --network's", parse=names, metavar="NET[,NET...]")
    member_batch_multipliers: tuple[int, ...] | None = option(
        None, "train only: member m updates its weights every K_m shared batches, on their mean gradient (its "
        "batch is K_m x the global batch; K1,K2,... or one K for all); with --member-epochs K_m must divide an "
        "epoch's batches", parse=counts, metavar="K[,K...]")
    member_names: tuple[str, ...] | None = option(
        None, "each member's name (A,B,...; default m0,m1,...): its directory under --checkpoint-dir",
        parse=names, metavar="NAME[,NAME...]")
    checkpoint_dir: str | None = option(
        None, "each member saves its state at each of its epoch ends under DIR/<name> (a TensorFlow checkpoint of "
        "its weights and optimizer when it trains, and state.json: epochs, images, validation history) and, "
        "started again, resumes from it; needs --member-epochs (the epochs to train in this run)")
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
    scaling_efficiency: float = option(
        1.0, "emulated data-parallel members: the share of the linear speed-up kept per doubling of "
        "accelerators (a member on g runs at rc x g x e^log2(g))", parse=float)
    slow_member: tuple[int, float] | None = option(
        None, "RANK:FACTOR: member RANK's emulated accelerators are FACTOR times slower than the others' "
        "(emulated only): enspipe's members keep lockstep at its pace, the tf.data service lets the others "
        "run ahead and it skip", parse=rank_factor, metavar="RANK:FACTOR")
    tfdata_compression: str = option("none", "tfdata_service only: the service's compression of the "
                                     "elements it sends (AUTO: TensorFlow's choice, to compare)",
                                     choices=TFDATA_COMPRESSIONS)
    tfdata_cache_mb: int = option(1024, "tfdata_service only: each worker's cross-trainer cache in MiB; a "
                                  "member that falls further behind than it holds skips elements",
                                  parse=positive_int)
    plan_comm: str | None = option(None, "--scheme auto only: enspipe calibrate-comm's comm.json, the collective "
                                   "costs the plan uses (default: assumed ones, labelled so)")
    calibration: str | None = None  # the calibration file (--rate-from): rc, and the rp that --scheme auto plans from
    planned: dict | None = None     # --scheme auto: what the planner chose and predicted (set when the cell starts)
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        """Every value on its own and against the others (no file or machine is looked at: that is :meth:`check`), by concern."""
        _require(bool(self.data), "data", "no dataset given", "pass --data DIR (see `enspipe make-dataset`)")
        _require(bool(self.out), "out", "no output directory given", "pass --out DIR")
        for f in option_fields():  # every option with choices: one check, one message
            choices, value = _choices(f), getattr(self, f.name)
            _require(choices is None or value in choices, f.name, f"unknown {f.name.replace('_', ' ')} {value!r}",
                     f"choose one of {', '.join(choices or ())}")
        for concern in (self._check_stream, self._check_consumer, self._check_measurement,
                        self._check_power, self._check_service):
            concern()

    def _check_stream(self) -> None:
        """What the members read and how they share it."""
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
        else:
            # (an auto cell's config after the plan chose its scheme keeps the file it planned with)
            _require(self.plan_comm is None or self.planned is not None, "plan_comm",
                     f"is for --scheme auto, not {self.scheme}",
                     "leave --plan-comm out, or pass --scheme auto")

    def _check_consumer(self) -> None:
        """What consumes the batches: the accelerators and the members on them."""
        from enspipe.models.networks import name_problem

        for field_name, names in (("network", [self.network]), ("member_networks", self.member_networks or [])):
            for x in names:
                problem = name_problem(x)
                _require(problem is None, field_name, *((problem.problem, problem.fix) if problem else ("", "")))
        _require(all(math.isfinite(lr) for lr in self.lrs), "lr", f"learning rates must be finite, got {list(self.lrs)}",
                 "pass e.g. --lr 0.01,0.02")
        if self.consumer == "emulated" and self.member_rates is None:
            _require(self.rate is not None and self.rate > 0, "rate",
                     "the emulated consumer needs the accelerator rate rc > 0 in images/s",
                     "pass --rate R (e.g. the paper's K20X rate for the network)")
        else:
            _require(self.rate is None or self.rate > 0, "rate", f"must be > 0, got {self.rate}",
                     "pass a positive rate or leave it out")
        _require(len(self.lrs) >= 1 and all(lr > 0 for lr in self.lrs), "lr",
                 f"learning rates must be positive, got {list(self.lrs)}", "pass e.g. --lr 0.01,0.02")
        _require(len(self.data_parallel) >= 1 and min(self.data_parallel) >= 1, "data_parallel",
                 f"every member needs >= 1 accelerator, got {list(self.data_parallel)}",
                 "pass e.g. --data-parallel 2 or 1,2,1")
        if max(self.data_parallel) > 1:
            _require(self.consumer in ("train", "emulated"), "data_parallel", f"splits a batch between the "
                     f"accelerators of a member; the {self.consumer} consumer has none",
                     "pass --consumer train or emulated, or leave --data-parallel out")
            _require(self.scheme not in SCHEME_KINDS or not SCHEME_KINDS[self.scheme].service, "data_parallel",
                     "the tf.data service gives each rank its own stream, so a member's ranks would not split "
                     "one batch", "use an enspipe scheme, or leave --data-parallel out")
            _require(self.batch_size is None or self.batch_size >= max(self.data_parallel), "data_parallel",
                     f"each of a member's {max(self.data_parallel)} ranks needs at least one image of the batch "
                     f"of {self.batch_size}", "raise --batch-size or lower --data-parallel")
        _require(self.members_per_rank >= 1, "members_per_rank", f"must be >= 1, got {self.members_per_rank}",
                 "pass K >= 1 members per rank")
        if self.members_per_rank > 1:
            solo = [n for n in ("member_epochs", "checkpoint_dir", "stop_below", "member_patience",
                                "member_batch_multipliers", "slow_member") if getattr(self, n) is not None]
            _require(max(self.data_parallel) == 1 and not solo, "members_per_rank", "a rank's members step together "
                     "on one batch, so they cannot spread over ranks (--data-parallel), train their own epochs or "
                     f"lag one another{' (' + ', '.join('--' + x.replace('_', '-') for x in solo) + ')' if solo else ''}",
                     "leave those options out, or run one member per rank")
            _require(self.scheme not in SCHEME_KINDS or not SCHEME_KINDS[self.scheme].service, "members_per_rank",
                     "the tf.data service's trainers are processes", "use an enspipe scheme")
        if self.member_rates is not None:
            _require(self.consumer == "emulated", "member_rates", f"sets emulated accelerators' rates; the "
                     f"consumer is {self.consumer}", "pass --consumer emulated, or leave --member-rates out")
            _require(all(math.isfinite(r) and r > 0 for r in self.member_rates), "member_rates",
                     f"every rate must be finite and > 0, got {list(self.member_rates)}", "pass e.g. 40,120,400")
        _require(math.isfinite(self.scaling_efficiency) and 0 < self.scaling_efficiency <= 1, "scaling_efficiency",
                 f"must be in (0, 1], got {self.scaling_efficiency}", "pass e.g. 0.9 (1.0: linear)")
        if self.slow_member is not None:
            rank, factor = self.slow_member
            _require(self.consumer == "emulated", "slow_member", f"slows an emulated accelerator; the consumer is "
                     f"{self.consumer}", "pass --consumer emulated --rate R, or leave --slow-member out")
            _require(rank >= 0 and math.isfinite(factor) and factor >= 1, "slow_member",
                     f"needs RANK >= 0 and FACTOR >= 1, got {rank}:{factor}", "pass e.g. --slow-member 1:3")
        self._check_member_lives()

    def _check_member_lives(self) -> None:
        """The members' epochs, networks, updates, early stopping and re-planning."""
        _require(self.member_epochs is None or not self.skip_corrupt, "member_epochs", "an epoch with skipped "
                 "records ends inside a batch", "leave --on-corrupt skip or --member-epochs out")
        _require(self.member_epochs is None or min(self.member_epochs) >= 1, "member_epochs",
                 f"every member trains >= 1 epoch, got {list(self.member_epochs or ())}", "pass e.g. 2,6,3")
        epochs_needed = [n for n in ("checkpoint_dir", "stop_below", "member_patience") if getattr(self, n) is not None]
        _require(self.member_epochs is not None or not epochs_needed, epochs_needed[0] if epochs_needed else "",
                 "acts at a member's epoch ends, and the members' epochs are not bounded",
                 "pass --member-epochs (the most epochs each member trains in this run)")
        if self.member_batch_multipliers is not None:
            _require(self.consumer == "train", "member_batch_multipliers", f"sets how many batches a trained member's "
                     f"update spans; the consumer is {self.consumer}", "pass --consumer train, or leave it out")
            _require(min(self.member_batch_multipliers) >= 1, "member_batch_multipliers",
                     f"every multiplier must be >= 1, got {list(self.member_batch_multipliers)}", "pass e.g. 1,2,4")
        if self.member_patience is not None and max(self.member_patience) > 0:
            _require(self.consumer == "train", "member_patience", f"stops a member on its validation loss; the "
                     f"{self.consumer} consumer has none", "pass --consumer train, or leave --member-patience out")
            _require(self.validation_data is not None, "validation_data", "early stopping needs a validation loss",
                     "pass --validation-data DIR (enspipe make-dataset with another seed)")
        _require(math.isfinite(self.min_delta) and self.min_delta >= 0, "min_delta",
                 f"must be a finite number >= 0, got {self.min_delta}", "pass e.g. 0.001")
        _require(self.stop_below is None or self.stop_below >= 1, "stop_below", f"must be >= 1 rank, got "
                 f"{self.stop_below}", "pass e.g. 1 (stop when every member is done)")
        if self.member_networks is not None:
            _require(self.consumer == "train", "member_networks", f"sets the networks members train; the consumer "
                     f"is {self.consumer}", "pass --consumer train, or leave --member-networks out")

    def _check_measurement(self) -> None:
        """The window, the monitors and the heartbeat."""
        for name in ("rate", "sample_interval", "idle_watts", "watts_per_core", "peer_timeout"):
            value = getattr(self, name)
            _require(value is None or math.isfinite(value), name, f"must be a finite number, got {value}",
                     "pass a finite value")
        _require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}", "measure at least one step")
        _require(self.warmup >= 0, "warmup", f"must be >= 0, got {self.warmup}", "use 0 for no warm-up")
        _require(self.cores is None or self.cores >= 1, "cores", f"must be >= 1, got {self.cores}",
                 "pass the number of cores per member, or leave it out for all cores")
        _require(0 < self.sample_interval <= MAX_SAMPLE_INTERVAL, "sample_interval",
                 f"must be in (0, {MAX_SAMPLE_INTERVAL:g}] seconds, got {self.sample_interval}", "pass seconds, e.g. 0.1")
        _require(self.peer_timeout >= 2, "peer_timeout", f"must be at least 2 s, got {self.peer_timeout}",
                 "pass seconds, e.g. 10 (the heartbeat beats twice a second)")
        _require(self.monitor_interval >= 1, "monitor_interval", f"must be >= 1 s, got {self.monitor_interval}",
                 "mpstat samples in whole seconds: pass 1 or more")

    def _check_power(self) -> None:
        """The energy sources."""
        bad = [p for p in self.power if p not in POWER_SOURCES]
        _require(bool(self.power) and not bad, "power", f"unknown power source(s) {bad or '(none)'}",
                 f"pass a comma list of {', '.join(POWER_SOURCES)}")
        _require("auto" not in self.power or len(self.power) == 1, "power", "auto cannot be combined with other sources",
                 "pass auto alone, or list the sources")
        _require("external" not in self.power or self.power_csv is not None, "power_csv",
                 "the external power source needs the meter's CSV", "pass --power-csv FILE")
        _require("modelled" not in self.power or self.cpu_monitor != "none", "power",
                 "the modelled power needs the CPU monitor", "drop --cpu-monitor none")
        _require(self.idle_watts >= 0 and self.watts_per_core >= 0, "idle_watts",
                 f"model parameters must be >= 0, got {self.idle_watts}, {self.watts_per_core}",
                 "pass watts >= 0 for --idle-watts and --watts-per-core")

    def _check_service(self) -> None:
        """The tf.data service peer's own options."""
        service = self.scheme != AUTO and SCHEME_KINDS[self.scheme].service  # a known scheme: checked above
        for name in SERVICE_OPTIONS:
            _require(service or getattr(self, name) == default(name), name, f"is for --scheme tfdata_service, "
                     f"not {self.scheme}", f"leave --{name.replace('_', '-')} out, or pass --scheme tfdata_service")
        _require(self.tfdata_cache_mb >= 1, "tfdata_cache_mb", f"must be >= 1 MiB, got {self.tfdata_cache_mb}",
                 "pass MiB, e.g. 1024")
        if service:
            _require(self.transport == "mpi4py", "transport", "the tf.data service moves its own batches (gRPC)",
                     "leave --transport out for --scheme tfdata_service")
            _require(not self.skip_corrupt, "on_corrupt", "the tf.data service's workers cannot skip and count "
                     "a corrupt record (its graph runs on the workers)", "leave --on-corrupt out for tfdata_service")

    def check(self) -> None:
        """The checks against the files and the machine, one explicit step before MPI starts (:func:`from_options` makes it): the dataset, the output directory, the networks' factories, the calibration and the files options name, Horovod and mpstat where asked for. Raises :class:`ConfigError` naming the option."""
        problem = _network_problem(self.network)
        _require(problem is None, "network", *(problem or ("", "")))
        for x in self.member_networks or ():
            problem = _network_problem(x)
            _require(problem is None, "member_networks", *(problem or ("", "")))
        if self.scheme == AUTO:
            _require(self.calibration is not None and os.path.isfile(self.calibration), "rate_from",
                     f"--scheme auto plans from the calibration, and {self.calibration!r} is not a file",
                     "pass --rate-from results/calibration/rates.json")
            _require(self.plan_comm is None or os.path.isfile(self.plan_comm), "plan_comm",
                     f"{self.plan_comm!r} is not a file", "write it with enspipe calibrate-comm, or leave it out")
        if self.validation_data is not None:
            from enspipe.data.manifest import check as check_data

            problem = check_data(self.validation_data) if os.path.exists(self.validation_data) else \
                f"{self.validation_data!r} does not exist"
            _require(problem is None, "validation_data", str(problem),
                     "create it with `enspipe make-dataset --out DIR --num-images M --seed S`")
        if self.checkpoint_dir is not None:
            problem = unwritable(self.checkpoint_dir)
            _require(problem is None, "checkpoint_dir", str(problem), "pass a directory you may write")
        if self.transport == "horovod":
            import importlib.util

            _require(importlib.util.find_spec("horovod") is not None, "transport", "Horovod is not installed here",
                     "build it with `make horovod` and run from .venv-horovod, or use --transport mpi4py")
        if self.cpu_monitor == "mpstat":
            import shutil

            _require(shutil.which("mpstat") is not None, "cpu_monitor", "mpstat is not installed",
                     "install sysstat (apt-get install sysstat), or pass --cpu-monitor auto or psutil")
        _require(self.power_csv is None or os.path.isfile(self.power_csv), "power_csv",
                 f"{self.power_csv!r} is not a file", "start the meter log first and pass its (timestamp, watts) CSV")
        _require(self.idle_power is None or os.path.isfile(self.idle_power), "idle_power",
                 f"{self.idle_power!r} is not a file", "write it with `enspipe idle-power --out FILE`")
        _require(os.path.exists(self.data), "data", f"{self.data!r} does not exist",
                 "create it with `enspipe make-dataset --out DIR --num-images M --seed S`")
        from enspipe.data.manifest import check

        problem = check(self.data)
        _require(problem is None, "data", str(problem), "point --data at a dataset (see `enspipe make-dataset`)")
        from enspipe.data.parse import format_problem
        from enspipe.data.shards import load_manifest

        problem = format_problem(load_manifest(self.data))
        _require(problem is None, "data", str(problem), "fix the parse function, or re-index with `enspipe index --parse`")
        problem = unwritable(self.out)
        _require(problem is None, "out", str(problem), "pass a directory you may write, or a new one under it")


    @property
    def skip_corrupt(self) -> bool:
        return self.on_corrupt == "skip"

    @property
    def global_batch(self) -> int:
        from enspipe.models.networks import network_spec

        return self.batch_size if self.batch_size is not None else network_spec(self.network).batch_size

    def stream(self):
        """The stream/scheme part of this cell's options, as the library takes them."""
        from enspipe.plan.stream import StreamConfig

        return StreamConfig(data=self.data, batch_size=self.global_batch, scheme=self.scheme,
                            preprocessors=self.preprocessors, image_size=self.image_size, seed=self.seed,
                            shuffle_buffer=self.shuffle_buffer, queue_depth=self.queue_depth,
                            block_images=self.block_images, node_shm=self.node_shm, transport=self.transport,
                            wire_dtype=self.wire_dtype, fast_mode=self.fast_mode, skip_corrupt=self.skip_corrupt,
                            sample_interval=self.sample_interval)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    def member_ranks(self, n: int) -> list[range]:
        """Each member's ranks among ``n`` (consecutive; ``data_parallel`` per member); raises
        :class:`ConfigError` when they do not add up to ``n``."""
        from enspipe.plan.errors import ConfigError

        widths = self.data_parallel
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
        return len(self.member_ranks(n)) * self.members_per_rank

    def rank_members(self, rank: int) -> list[int]:
        """The members a rank hosts (several with ``members_per_rank``; a data-parallel member's one)."""
        first = self.member_of(rank)
        return list(range(first, first + self.members_per_rank))

    def member_of(self, rank: int) -> int:
        """The ensemble member a rank trains (its data-parallel group of consecutive ranks); with
        ``members_per_rank`` K, the first of its K members."""
        if self.members_per_rank > 1:
            return rank * self.members_per_rank
        if len(self.data_parallel) == 1:
            return rank // self.data_parallel[0]
        at = 0
        for m, w in enumerate(self.data_parallel):
            at += w
            if rank < at:
                return m
        raise IndexError(f"rank {rank} is beyond the members' {at} ranks")

    def accelerator_rate(self, member: int, width: int) -> float:
        """One of an emulated member's accelerators' rate on its part of a batch: its rc (``--rate``
        or its ``--member-rates`` entry, ``--slow-member`` slowed) x the scaling efficiency at ``width``."""
        rc = self.member_rates[member] if self.member_rates else self.rate
        if self.slow_member is not None and self.slow_member[0] == member:
            rc /= self.slow_member[1]
        return rc * self.scaling_efficiency ** math.log2(width)

    def epochs_for(self, member: int) -> int | None:
        return _per_member(self.member_epochs, member, None)

    def lr_for(self, member: int) -> float:
        return self.lrs[member % len(self.lrs)]

    def network_for(self, member: int) -> str:
        return self.member_networks[member] if self.member_networks else self.network

    def name_of(self, member: int) -> str:
        return self.member_names[member] if self.member_names else f"m{member}"

    def batch_multiplier_for(self, member: int) -> int:
        return _per_member(self.member_batch_multipliers, member, 1)

    def patience_for(self, member: int) -> int:
        return _per_member(self.member_patience, member, 0)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["lrs"] = list(self.lrs)
        d["power"] = list(self.power)
        d["slow_member"] = list(self.slow_member) if self.slow_member else None
        for k in ("data_parallel", "member_rates", "member_epochs", "member_networks", "member_names",
                  "member_patience", "member_batch_multipliers"):
            d[k] = None if d[k] is None else list(d[k])
        d["batch_size"] = self.global_batch
        return d


def _per_member(values: tuple | None, member: int, default):
    """A per-member option's value for ``member``: one value for every member, or one each."""
    if not values:
        return default
    return values[0] if len(values) == 1 else values[member]


def plain_name(name: str) -> bool:
    """Whether ``name`` may name a member's directory: letters, digits, '-', '_' and '.' only."""
    return name.replace("-", "").replace("_", "").replace(".", "").isalnum()


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


POWER_OPTIONS = ("power", "power_csv", "idle_watts", "watts_per_core")  # also `enspipe idle-power`'s
REQUIRED = ("data", "out")


def option_fields(only: tuple[str, ...] | None = None) -> list[dataclasses.Field]:
    """The :class:`RunConfig` fields that are options, in declaration order (or those named)."""
    fs = [f for f in dataclasses.fields(RunConfig) if "option" in f.metadata]
    return [f for f in fs if only is None or f.name in only]


def _choices(f: dataclasses.Field) -> tuple | None:
    choices = f.metadata["option"]["choices"]
    return tuple(choices() if callable(choices) else choices) if choices else None


def default(name: str):
    """A run option's default, for whoever must spell it out (the grid's arguments, the schema test)."""
    return next(f.default for f in option_fields() if f.name == name)


def add_options(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Declare :class:`RunConfig`'s options (or those named) on ``parser``; each lands on the
    namespace under its field's name."""
    for f in option_fields(only):
        o = f.metadata["option"]
        flag = o["flag"] or "--" + f.name.replace("_", "-")
        kw = {"dest": f.name, "help": o["help"]}
        if isinstance(f.default, bool):
            kw["action"] = "store_false" if f.default else "store_true"
        else:
            choices = _choices(f)
            kw.update(default=f.default, type=o["parse"], choices=list(choices) if choices else None,
                      metavar=o["metavar"], required=f.name in REQUIRED)
        parser.add_argument(flag, **kw)


def from_options(namespace, **overrides) -> RunConfig:
    """The validated and checked config of a parsed command line (``overrides`` win: e.g. a rate read
    from a file)."""
    values = {f.name: getattr(namespace, f.name) for f in option_fields() if hasattr(namespace, f.name)}
    cfg = RunConfig(**{**values, **overrides})
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
