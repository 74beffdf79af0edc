"""The per-cell run configuration: :class:`RunConfig` composes the concerns' small frozen configs
(:mod:`enspipe.run.concerns`, each validating its own values when it is made) and checks them
against one another; :meth:`RunConfig.check` then looks at the files and the machine, one explicit
step before MPI starts. A bad value fails before any MPI or TensorFlow work, with a
:class:`ConfigError` that names the field (as its command-line option) and the fix.

Every option field is declared once, with its default, help and parser
(:func:`enspipe.plan.options.option`); :mod:`enspipe.run.run_options` builds ``enspipe run``'s
command line from them, one group per concern.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from enspipe.engine.backends import BACKENDS, resolve
from enspipe.engine.config import StreamConfig, decode_cache_problem, tensorflow_installed
from enspipe.exchange.transports import DEFAULT as DEFAULT_TRANSPORT
from enspipe.exchange.transports import TRANSPORTS, installed_problem
from enspipe.plan.errors import ConfigError
from enspipe.plan.errors import require as _require
from enspipe.plan.gradients import ExchangeSpec
from enspipe.plan.options import network_problem, option, positive_int, unwritable
from enspipe.plan.schemes import AUTO
from enspipe.run.concerns import (
    CONCERNS,
    FaultOptions,
    GradientOptions,
    MeasureOptions,
    MemberLives,
    PowerOptions,
    PreprocessOptions,
    ServiceOptions,
    StreamOptions,
    TrainingOptions,
    service_scheme,
)


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
        _require(x == "whole" or TRANSPORTS[s.transport].communicator, "gradient_exchange",
                 f"{x} runs on the member's MPI communicator, not the {s.transport} transport's groups",
                 f"leave --gradient-exchange out with --transport {s.transport}")
        self._check_exchange()
        if max(t.data_parallel) > 1:
            _require(not service_scheme(s.scheme), "data_parallel", "the tf.data service gives each rank its own stream, "
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
        _require(not service_scheme(self.stream.scheme), "members_per_rank", "the tf.data service's trainers are processes",
                 "use an enspipe scheme")

    def _check_service(self) -> None:
        """The tf.data service peer against the rest."""
        scheme = self.stream.scheme
        for name in self.service.changed():
            _require(service_scheme(scheme), name, f"is for --scheme tfdata_service, not {scheme}",
                     f"leave --{name.replace('_', '-')} out, or pass --scheme tfdata_service")
        if service_scheme(scheme):
            _require(self.stream.transport == DEFAULT_TRANSPORT, "transport",
                     "the tf.data service moves its own batches "
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
                ("backend", f"--backend {self.preprocess.backend}",
                 self.preprocess.backend in BACKENDS and BACKENDS[self.preprocess.backend].needs_tensorflow),
                ("trainer", "the Keras train consumer", self.trainer == "keras"),
                ("scheme", "the tf.data service", service_scheme(self.stream.scheme)),
                ("transport", f"the {self.stream.transport} transport",
                 TRANSPORTS[self.stream.transport].needs_tensorflow)) if yes]
            _require(not needs, needs[0][0] if needs else "backend", f"{needs[0][1] if needs else ''} needs "
                     "TensorFlow, which is not installed here", "pip install 'enspipe[tf]', or run --backend pillow "
                     "with --consumer peak or emulated")
        if self.trainer == "torch":
            self._check_torch_training()
        problem = decode_cache_problem(self.preprocess.decode_cache)
        _require(problem is None, "decode_cache", f"{problem}", "pass a smaller --decode-cache, or leave it out")
        _require(not (self.preprocess.decode_cache and service_scheme(self.stream.scheme)), "decode_cache", "the tf.data "
                 "service's workers decode in their own graph, without enspipe's cache", "leave --decode-cache out "
                 "for --scheme tfdata_service")
        spec = BACKENDS[self.backend]
        _require(self.preprocess.preprocess_impl in spec.implementations, "preprocess_impl", f"the {self.backend} "
                 f"backend runs {', '.join(spec.implementations)}, not {self.preprocess.preprocess_impl} (reference is "
                 "Slim's TensorFlow functions as written)", "leave --preprocess-impl out, or run --backend tf")
        _require(spec.tfdata_service or not service_scheme(self.stream.scheme), "backend", "the tf.data service runs "
                 "TensorFlow's preprocessing graph in its workers", "leave --backend out (tf) for --scheme "
                 "tfdata_service")
        if spec.on_gpu:  # CUDA, torchvision and the preprocessing, as the library checks them
            self.stream_config()
        problem = installed_problem(self.stream.transport)
        _require(problem is None, "transport", f"{problem}", f"{TRANSPORTS[self.stream.transport].install}, or use "
                 f"--transport {DEFAULT_TRANSPORT}")
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
        g = self.gradients
        return ExchangeSpec(g.gradient_exchange, g.gradient_block_mb * 2**20, g.gradient_profile,
                            self.stream.plan_comm, g.ako_partitions)

    @property
    def backend(self) -> str:
        """The preprocessing backend the cell runs (``auto`` resolved here)."""
        return resolve(self.preprocess.backend, tensorflow_installed()).name

    @property
    def preprocessing(self) -> str:
        """The built-in preprocessing the cell runs (``network``: its network's own, resolved here)."""
        from enspipe.models.networks import network_spec

        p = self.preprocess.preprocess
        return network_spec(self.training.network).preprocessing if p == "network" else p

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
        return (BACKENDS[self.backend].needs_tensorflow or self.trainer == "keras" or service_scheme(self.stream.scheme)
                or TRANSPORTS[self.stream.transport].needs_tensorflow)

    @property
    def global_batch(self) -> int:
        from enspipe.models.networks import network_spec

        b = self.stream.batch_size
        return b if b is not None else network_spec(self.training.network).batch_size

    def stream_config(self):
        """The stream part of this cell's options, as the library takes them (:class:`StreamConfig`)."""
        s, p = self.stream, self.preprocess
        return StreamConfig(data=self.data, batch_size=self.global_batch, scheme=s.scheme,
                            preprocessors=s.preprocessors, image_size=s.image_size, seed=s.seed,
                            shuffle_buffer=s.shuffle_buffer, queue_depth=s.queue_depth,
                            block_images=s.block_images, node_shm=s.node_shm, transport=s.transport,
                            wire_dtype=s.wire_dtype, fast_mode=p.fast_mode, preprocess_impl=p.preprocess_impl,
                            decode_cache=p.decode_cache,
                            skip_corrupt=self.faults.skip_corrupt,
                            sample_interval=self.measure.sample_interval, backend=self.backend,
                            preprocess=self.preprocessing)

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
    from enspipe.data.build import load_manifest
    from enspipe.data.manifest import check
    from enspipe.data.parse import format_problem

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
