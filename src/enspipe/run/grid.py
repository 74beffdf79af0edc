"""The experiment grid: which cells a workflow config asks for, their names and their arguments.

A config (``config/*.yaml``, validated by ``workflow/schemas/config.schema.yaml``) names
experiments, each a product of networks x schemes x n x p x core limits for one consumer, run
``repeats`` times (the experiment's own, else the config's). :func:`expand` turns them into valid
:class:`Cell` s: P is the number of preprocessors where the scheme has one (its registry entry's
rule: single_broadcast 1 <= P < N, multi_broadcast 1 <= P <= N) and N for the others; a batch must
be at least P. Invalid combinations are left out and reported; an experiment with no valid cell is an
error naming it and the rule.
"""
from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

from enspipe.plan.errors import ConfigError
from enspipe.plan.schemes import AUTO, SCHEME_KINDS, make_scheme
from enspipe.run.run_options import default

CELL_NAME = "{network}/{scheme}/n{n}_p{p}/c{cores}/{consumer}/rep{rep}"  # a cell's relative directory
CELL_FIELDS = ("network", "scheme", "n", "p", "cores", "consumer", "rep")  # a cell's identity


@dataclass(frozen=True, order=True)
class Cell:
    network: str
    scheme: str
    n: int
    p: int
    cores: str  # a number of cores per member, or "all"
    consumer: str
    rep: int

    @property
    def name(self) -> str:
        """The short form, also its directory under a workflow's runs: ``network/scheme/nN_pP/cC/consumer/repR``."""
        return CELL_NAME.format(**self.__dict__)

    def as_dict(self) -> dict:
        """The identity a cell's summary records (``summary["cell"]``)."""
        return dataclasses.asdict(self)

    @classmethod
    def of(cls, fields) -> "Cell":
        """The cell named by a mapping of :data:`CELL_FIELDS`: a summary's ``cell``, or a rule's
        wildcards (all strings). ``cores`` may be a number, ``"all"`` or ``None`` (all)."""
        try:
            return cls(str(fields["network"]), str(fields["scheme"]), int(fields["n"]), int(fields["p"]),
                       _cores(fields["cores"]), str(fields["consumer"]), int(fields["rep"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a cell identity (fields {', '.join(CELL_FIELDS)}): {fields!r}") from e


def _cores(c) -> str:
    return "all" if c in (None, "all") else str(int(c))


def batch_size(config: dict, network: str) -> int:
    return int(config["networks"][network]["batch_size"])


class GridError(ValueError):
    """An experiment of the config yields no valid cell; the message names it and the rule."""


def expand(config: dict) -> tuple[list[Cell], list[str]]:
    """Every valid cell of every experiment, without duplicates, in a stable order, and one note per
    experiment whose product had invalid combinations (how many were dropped, by which rule).

    Raises :class:`GridError` for an experiment that yields no valid cell at all."""
    out: set[Cell] = set()
    notes: list[str] = []
    for name, exp in config["experiments"].items():
        made, dropped = _experiment_cells(config, exp)
        rules = "; ".join(f"{why}: {', '.join(combos)}" for why, combos in dropped.items())
        if not made:
            raise GridError(f"experiments.{name}: no valid cell: {rules}")
        if dropped:
            k = sum(map(len, dropped.values()))
            notes.append(f"experiments.{name}: {k} invalid combination{'s' * (k > 1)} left out ({rules})")
        out |= made
    return sorted(out), notes


def _experiment_cells(config: dict, exp: dict) -> tuple[set[Cell], dict[str, list[str]]]:
    """One experiment's valid cells, and its invalid combinations by the rule they break."""
    made, dropped = set(), {}
    for network in exp["networks"]:
        batch = batch_size(config, network)
        for scheme in exp["schemes"]:
            for n in exp["n"]:
                ps = exp.get("p") or [None] if takes_p(scheme) else [n]
                for p in ps:
                    why = invalid(scheme, n, p, batch)
                    if why:
                        dropped.setdefault(why, []).append(f"{network} {scheme} n={n} p={p}")
                        continue
                    for cores in exp.get("cores", ["all"]):
                        for rep in range(int(exp.get("repeats", config.get("repeats", 1)))):
                            made.add(Cell(network, scheme, n, p, _cores(cores), exp["consumer"], rep))
    return made, dropped


def members_per_node(config: dict) -> dict[Cell, int]:
    """The cells whose experiment sets its own ``members_per_node`` (Slurm's ``--ntasks-per-node``),
    and that number. Raises :class:`GridError` for a cell two experiments place differently."""
    out: dict[Cell, int] = {}
    for name, exp in config["experiments"].items():
        if exp.get("members_per_node") is None:
            continue
        for cell in _experiment_cells(config, exp)[0]:
            k = int(exp["members_per_node"])
            if out.setdefault(cell, k) != k:
                raise GridError(f"experiments.{name}: cell {cell.name} is also in an experiment with "
                                f"members_per_node {out[cell]}, not {k}; give the cell one placement")
    return out


def cell_jobs(config: dict, cells: list[Cell], per_node: dict[Cell, int] | None = None) -> dict[str, list[Cell]]:
    """The MPI jobs that run several cells each (config ``cells_per_job``; 1: every cell alone),
    by name: the cells of one n and core limit, at most ``cells_per_job`` a job (``enspipe
    run-cells``), in rounds (:func:`rounds`): the cells a judge compares (one network, consumer
    and repeat; another scheme or P) run next to each other, repeat after repeat, A B A B, and a
    job takes whole rounds where they fit. The planner's cells (``auto``), the tf.data service's
    and the cells an experiment spreads over nodes its own way run alone, as does a group of one."""
    k = int(config.get("cells_per_job", 1))
    groups: dict[tuple[int, str], list[Cell]] = {}
    for c in sorted(cells):
        if k > 1 and c.scheme != AUTO and not SCHEME_KINDS[c.scheme].service and c not in (per_node or {}):
            groups.setdefault((c.n, c.cores), []).append(c)
    jobs = {}
    for (n, cores), group in groups.items():
        packed: list[list[Cell]] = []
        for r in rounds(group):
            if not packed or len(packed[-1]) + len(r) > k:
                packed.append([])
            for i in range(0, len(r), k):  # a round larger than a job fills jobs of its own
                if len(packed[-1]) == k:
                    packed.append([])
                packed[-1] += r[i:i + k]
        for i, job in enumerate(j for j in packed if len(j) > 1):
            jobs[f"n{n}_c{cores}_{i}"] = job
    return jobs


def rounds(cells: list[Cell]) -> list[list[Cell]]:
    """``cells`` as rounds: the cells of one network, consumer and repeat (those a judge compares
    with each other: another scheme or P), in scheme and P order; the rounds by network, consumer,
    then repeat, so that a comparison's repeats alternate (A B A B) close together in time."""
    out: dict[tuple, list[Cell]] = {}
    for c in sorted(cells, key=lambda c: (c.network, c.consumer, c.rep, c.scheme, c.p)):
        out.setdefault((c.network, c.consumer, c.rep), []).append(c)
    return list(out.values())


def cells(config: dict) -> list[Cell]:
    """Every valid cell of every experiment (see :func:`expand`)."""
    return expand(config)[0]


def takes_p(scheme: str) -> bool:
    """Whether a cell of ``scheme`` chooses P (``auto`` does not: the plan does, when it starts)."""
    return scheme != AUTO and SCHEME_KINDS[scheme].takes_p


def invalid(scheme: str, n: int, p: int | None, batch: int) -> str | None:
    """Why a combination is not a cell (the scheme's rule, as its error states it), or None.
    ``auto`` is valid wherever some scheme is (the baseline always is)."""
    if scheme == AUTO:
        return invalid("baseline", n, None, batch)
    try:
        make_scheme(scheme, n, p if SCHEME_KINDS[scheme].takes_p else None, batch)
    except ConfigError as e:
        return e.problem
    return None


def valid(scheme: str, n: int, p: int, batch: int) -> bool:
    return invalid(scheme, n, p, batch) is None


def calibrations(config: dict) -> list[tuple[str, str]]:
    """(network, cores) pairs whose preprocessing rate rp the grid needs: every core limit a
    cell uses, and full cores wherever an emulated accelerator's rate is relative to rp."""
    every = cells(config) + lag_cells(config)
    pairs = {(c.network, c.cores) for c in every}
    pairs |= {(c.network, "all") for c in every if c.consumer == "emulated"}
    return sorted(pairs)


def trained_networks(config: dict) -> list[str]:
    """Networks trained for real somewhere in the grid whose rc is not configured: their rc is
    measured (``enspipe calibrate-rc``) on the accelerator the cells train on."""
    nets = {c.network for c in cells(config) if c.consumer == "train"}
    return sorted(n for n in nets if config["networks"][n].get("rc") is None)


def run_args(config: dict, cell: Cell, rates: str | None = None, comm: str | None = None) -> list[str]:
    """``enspipe run`` arguments for a cell (without --data/--out), every value a string. An
    emulated accelerator's rate comes from the calibration file ``rates`` at run time (``--rate-from``):
    which rc applies is decided in one place, :mod:`enspipe.run.calibration`. An ``auto`` cell
    plans from the same file and the collective costs ``comm`` (``enspipe calibrate-comm``)."""
    args = ["--network", cell.network, "--scheme", cell.scheme, "--consumer", cell.consumer,
            "--batch-size", str(batch_size(config, cell.network)), "--image-size", str(config["image_size"]),
            "--steps", str(config["steps"]), "--warmup", str(config["warmup"]),
            "--seed", str(int(config.get("seed", default("seed"))) + cell.rep), "--rep", str(cell.rep),
            "--monitor-interval", str(config.get("monitor_interval", default("monitor_interval")))]
    if takes_p(cell.scheme):
        args += ["--preprocessors", str(cell.p)]
    args += ["--preprocess-impl", str(config.get("preprocess_impl", default("preprocess_impl"))),
             "--decode-cache", str(config.get("decode_cache", default("decode_cache")))]
    if cell.cores != "all":
        args += ["--cores", cell.cores]
    if cell.consumer == "emulated" or cell.scheme == AUTO:
        if rates is None:
            raise ValueError(f"{cell.name}: the emulated consumer and the auto scheme need the calibration file "
                             "(rates.json)")
        args += ["--rate-from", rates]
    if cell.scheme == AUTO and comm:
        args += ["--plan-comm", comm]
    power = config.get("power", {})
    args += ["--power", ",".join(power.get("sources", default("power"))),
             "--idle-watts", str(power.get("idle_watts", default("idle_watts"))),
             "--watts-per-core", str(power.get("watts_per_core", default("watts_per_core")))]
    if power.get("csv"):
        args += ["--power-csv", str(power["csv"])]
    return args


def lag_cells(config: dict) -> list[Cell]:
    """The lag cells of the config's ``lag`` section (none without one): one per scheme, each with
    an emulated accelerator, ``slow_member`` slowed ``slowdown`` times (``--slow-member``)."""
    lag = config.get("lag")
    if not lag:
        return []
    out = []
    batch = batch_size(config, lag["network"])
    for scheme in lag["schemes"]:
        p = int(lag.get("p", 1)) if SCHEME_KINDS[scheme].takes_p else int(lag["n"])
        why = invalid(scheme, int(lag["n"]), p, batch)
        if why:
            raise GridError(f"lag: {scheme} with n={lag['n']}, p={p}: {why}")
        out.append(Cell(lag["network"], scheme, int(lag["n"]), p, _cores(lag.get("cores", "all")), "emulated", 0))
    if not 0 <= int(lag.get("slow_member", 1)) < int(lag["n"]):
        raise GridError(f"lag: slow_member {lag.get('slow_member', 1)} is not a member of n={lag['n']}")
    return out


def lag_args(config: dict, cell: Cell, rates: str) -> list[str]:
    """``enspipe run`` arguments of a lag cell: a cell's, the slowed member, and the accelerators'
    rate rc = one member's calibrated preprocessing rate at the cell's cores over n (its share of
    one member's capacity), so that the slow member's rc / slowdown lies below what any arm
    delivers to a member and the slow member, not its input, sets the pace (paper_vs_run judges it)."""
    import json

    lag = config["lag"]
    with open(rates) as f:
        rp = json.load(f)["networks"][cell.network]["rp"]
    key = cell.cores if cell.cores in rp else max(rp, key=lambda k: float(k) if k.replace(".", "").isdigit() else 0)
    args = run_args(config, cell, rates)
    i = args.index("--rate-from")
    args[i:i + 2] = ["--rate", f"{float(rp[key]) / cell.n:.3f}"]
    return args + ["--slow-member", f"{int(lag.get('slow_member', 1))}:{float(lag.get('slowdown', 3))}"]


def shell_args(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def slurm_request(config: dict, members: int, per_node: int | None = None) -> dict:
    """A cell's Slurm request for its ``members`` ranks (config ``slurm``): the extra sbatch flags
    (whole nodes; ``members_per_node``, or ``per_node`` where its experiment sets it, as
    ``--ntasks-per-node``, so a cell spreads over ceil(members / K) nodes instead of being packed
    onto as few as the cores allow; ``gpus_per_member`` as ``--gpus-per-task``) and the memory per
    node (``--mem``)."""
    s = config.get("slurm") or {}
    spread = per_node or s.get("members_per_node")
    per_node = min(members, spread or members)
    extra = ["--exclusive"] if s.get("exclusive", True) else []
    if spread:
        extra.append(f"--ntasks-per-node={per_node}")
    if s.get("gpus_per_member"):
        extra.append(f"--gpus-per-task={int(s['gpus_per_member'])}")
    return {"slurm_extra": " ".join(extra), "mem_mb": per_node * int(s.get("mem_mb_per_task", 4000))}
