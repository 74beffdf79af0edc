"""``enspipe plan``: which scheme and how many preprocessors for an ensemble, from measured costs.

A :class:`PlanRequest` gathers the inputs (rp from the calibration's ``rates.json`` or the command
line, rc, the collective costs of ``enspipe calibrate-comm``, the node layout) and validates them
before anything runs; :func:`run_plan` prints :func:`enspipe.plan.model.plan`'s ranking as a
table or JSON. Everything the prediction rests on is printed with it (where rp, rc and the
collective costs came from), and costs that were assumed rather than fitted say so.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from enspipe.models.networks import network_spec
from enspipe.plan.curves import ModelInputs, crossings, peak_curves
from enspipe.plan.errors import ConfigError, require
from enspipe.plan.model import CommCosts, Machine, plan
from enspipe.plan.schemes import DEFAULT_BLOCK_IMAGES, SCHEME_KINDS


def _read_json(path: str, option: str, fix: str) -> dict:
    require(os.path.isfile(path), option, f"{path!r} is not a file", fix)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(option, f"{path!r} is not readable JSON ({e})", fix) from None


def comm_costs(path: str | None, option: str = "plan_comm") -> CommCosts:
    """``enspipe calibrate-comm``'s fitted costs from ``path``, or the assumed ones (labelled so)."""
    if not path:
        return CommCosts()
    return CommCosts.from_dict(_read_json(path, option, "write it with enspipe calibrate-comm"), source=path)


def rp_from_rates(rates: dict, network: str) -> tuple[dict, dict | None, float | None]:
    """(rp by cores, CPU-s per image by cores, rc) of ``network`` in a calibration's ``rates.json``
    (``all`` is the calibration machine's CPU count)."""
    entry = rates.get("networks", {}).get(network)
    require(bool(entry and entry.get("rp")), "rates", f"no rp for {network} in the calibration file",
            "calibrate the network first (the workflow's calibration, rates.json) or pass --rp")
    cpus = (rates.get("machine") or {}).get("cpus") or os.cpu_count()
    def cores(c):
        return float(cpus) if c == "all" else float(c)

    rp = {cores(c): float(v) for c, v in entry["rp"].items()}
    cpu = {cores(c): float(v) for c, v in (entry.get("rp_cpu") or {}).items()} or None
    return rp, cpu, entry.get("rc")


def parse_rp(text: str) -> dict:
    try:
        pairs = [x.split(":") for x in text.split(",") if x.strip()]
        rp = {float(c): float(v) for c, v in pairs}
    except ValueError:
        raise ConfigError("rp", f"expected CORES:RATE[,...], got {text!r}", "pass e.g. --rp 1:90,2:170") from None
    require(bool(rp) and all(c > 0 and v > 0 for c, v in rp.items()), "rp",
            f"cores and rates must be > 0, got {text!r}", "pass e.g. --rp 1:90,2:170")
    return rp


@dataclass(frozen=True)
class PlanRequest:
    """A validated planning question: the ensemble, the machine and where each input came from."""

    n: int
    batch: int
    image_size: int
    wire_dtype: str
    machine: Machine
    schemes: tuple[str, ...] | None
    ps: tuple[int, ...] | None
    sources: dict

    @classmethod
    def from_args(cls, a) -> "PlanRequest":
        require(a.n is not None and a.n >= 1, "n", f"must be >= 1, got {a.n}",
                "pass the number of members (or --config for a config's whole grid)")
        require(a.rp is not None or (a.rates and a.network), "rp", "no preprocessing rate to plan from",
                "pass --network with --rates RATES.json (the workflow's calibration), or --rp CORES:RATE")
        require(not (a.peak and a.rc is not None), "rc", "--peak and --rc contradict each other", "pass one")
        sources = {}
        rc, cpu = a.rc, None
        if a.rp is not None:
            rp, sources["rp"] = parse_rp(a.rp), "--rp"
        else:
            rates = _read_json(a.rates, "rates", "pass the calibration's rates.json")
            rp, cpu, rates_rc = rp_from_rates(rates, a.network)
            sources["rp"] = a.rates
            if rc is None and not a.peak and rates_rc:
                rc, sources["rc"] = float(rates_rc), a.rates
        if rc is not None:
            sources.setdefault("rc", "--rc")
        if a.peak:
            rc, sources["rc"] = None, "none (peak)"
        comm = comm_costs(a.comm, "comm")
        sources["comm"] = comm.source
        require(a.batch_size is not None or a.network, "batch_size", "no batch size", "pass --batch-size or --network")
        batch = a.batch_size if a.batch_size is not None else network_spec(a.network).batch_size
        require(batch >= 1, "batch_size", f"must be >= 1, got {batch}", "pass a positive batch")
        require(32 <= a.image_size <= 1024, "image_size", f"must be in [32, 1024], got {a.image_size}", "e.g. 224")
        schemes = tuple(s.strip() for s in a.schemes.split(",")) if a.schemes else None
        bad = [s for s in schemes or () if s not in SCHEME_KINDS or SCHEME_KINDS[s].service]
        require(not bad, "schemes", f"unknown or unmodelled scheme(s) {bad}",
                f"choose from {', '.join(k for k, v in SCHEME_KINDS.items() if not v.service)}")
        ps = tuple(int(p) for p in a.p) if a.p else None
        require(ps is None or all(p >= 1 and p == int(p) for p in a.p), "p", f"P must be integers >= 1, got {a.p}",
                "pass e.g. --p 5,20")
        machine = Machine(rp=rp, rc=rc, cpu_per_image=cpu, cores_per_node=a.cores_per_node or os.cpu_count() or 1, nodes=a.nodes,
                          core_limit=a.core_limit, accelerators_per_node=a.accelerators_per_node, comm=comm)
        require(a.nodes <= a.n, "nodes", f"{a.nodes} nodes for {a.n} members", "pass at most one node per member")
        return cls(a.n, batch, a.image_size, a.wire_dtype, machine, schemes, ps, sources)

    def predictions(self):
        out = plan(self.n, self.batch, self.image_size, self.machine, self.wire_dtype, self.schemes)
        return [x for x in out if self.ps is None or x.p in self.ps or not _takes_p(x.scheme)]


def run_plan(req: PlanRequest, as_json: bool = False, top: int = 10) -> int:
    preds = req.predictions()
    if as_json:
        print(json.dumps({"n": req.n, "batch_size": req.batch, "image_size": req.image_size,
                          "wire_dtype": req.wire_dtype, "nodes": req.machine.nodes,
                          "cores_per_node": req.machine.cores_per_node, "rc": req.machine.rc,
                          "sources": req.sources, "comm": req.machine.comm.as_dict(),
                          "ranked": [p.as_dict() for p in preds]}, indent=1))
        return 0
    m = req.machine
    print(f"n={req.n} on {m.nodes} node(s) x {m.cores_per_node} cores, batch {req.batch}, {req.image_size} px "
          f"{req.wire_dtype}; rc {'none (peak)' if m.rc is None else f'{m.rc:.0f} images/s'}")
    print("inputs: " + "; ".join(f"{k} from {v}" for k, v in req.sources.items())
          + ("  [collective costs ASSUMED: run enspipe calibrate-comm]" if m.comm.source == "assumed" else ""))
    print(f"{'#':>3}  {'scheme':<24}{'img/s/member':>14}{'CPU ms/img':>12}  {'bound':<14}bottleneck")
    for i, x in enumerate(preds[:top], 1):
        label = f"{x.scheme} (P={x.p})" if _takes_p(x.scheme) else x.scheme
        over = " (oversubscribed)" if x.oversubscribed else ""
        print(f"{i:>3}  {label:<24}{x.images_per_second:>14.1f}{x.cpu_seconds_per_image * 1e3:>12.2f}  "
              f"{x.bound:<14}{x.bottleneck}{over}")
    return 0


def run_grid_plan(config_path: str, network: str | None = None, as_json: bool = False) -> int:
    """``enspipe plan --config``: every peak cell of a config's grid predicted from its ``model``
    section (:mod:`enspipe.plan.curves`), and the n at which each pipeline falls below each rc."""
    import yaml

    require(os.path.isfile(config_path), "config", f"{config_path!r} is not a file", "pass e.g. config/paper.yaml")
    try:
        with open(config_path) as f:
            cfg = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError("config", f"{config_path!r} is not readable YAML ({e})", "fix the file") from None
    require(isinstance(cfg, dict) and "experiments" in cfg and "networks" in cfg, "config",
            f"{config_path!r} is not an enspipe config (no experiments or networks)", "pass e.g. config/paper.yaml")
    inputs = ModelInputs.from_config(cfg)
    network = network or next(iter(inputs.rp))
    cross = crossings(cfg, inputs, network)
    if as_json:
        print(json.dumps({"label": "predicted", "config": config_path, "network": network, "source": inputs.source,
                          "cores_per_node": inputs.cores_per_node, "comm": inputs.comm.as_dict(),
                          "rc": inputs.rc, "curves": peak_curves(cfg, inputs), "crossings": cross}, indent=1))
        return 0
    bw0 = inputs.comm.inter_node_bandwidth
    print(f"PREDICTED peak(n), {network}'s preprocessing, one member per {inputs.cores_per_node}-core node "
          f"({config_path}); inputs: {inputs.source}")
    print(f"collectives: {inputs.comm.bcast} broadcast, {bw0 / 1e9:g} GB/s between nodes ({inputs.comm.source}); "
          f"rc: " + ", ".join(f"{k} {v:g}" for k, v in inputs.rc.items()))
    bws = sorted({r["inter_node_bandwidth"] for r in cross})
    head = "".join(f"{'below ' + k[:9]:>17}" for k in inputs.rc)
    print(f"{'scheme':<18}{'P':>4}{'cores':>6}{'peak, largest n':>17}{head}   (first n below rc at "
          + ", ".join(f"{b / 1e9:g}" for b in bws) + " GB/s; - never)")
    keyed: dict[tuple, dict] = {}
    for r in cross:
        keyed.setdefault((r["scheme"], r["p"], r["cores"]), {})[(r["rc_network"], r["inter_node_bandwidth"])] = r
    for (scheme, p, cores), by in keyed.items():
        peak = by[(next(iter(inputs.rc)), bw0)]["rate_at_largest_n"]
        cells = "".join(f"{'/'.join(str(by[(k, b)]['crosses_at_n'] or '-') for b in bws):>17}" for k in inputs.rc)
        print(f"{scheme:<18}{p or '':>4}{cores:>6}{peak:>17.0f}{cells}")
    return 0


def choose(calibration: str, network: str, n: int, nodes: int, cores_per_node: int, *, batch: int, image_size: int,
           rc: float | None, core_limit: int | None, wire_dtype: str = "float32", node_shm: bool = True,
           comm_json: str | None = None, block_images: int = DEFAULT_BLOCK_IMAGES) -> dict:
    """``--scheme auto``: the planner's first choice for a cell's own members and placement, with
    what it predicted and the runners-up, as the summary records it (``planned``)."""
    rp, cpu, _ = rp_from_rates(_read_json(calibration, "rate_from", "pass the workflow's rates.json"), network)
    comm = comm_costs(comm_json)
    machine = Machine(rp=rp, rc=rc, cpu_per_image=cpu, cores_per_node=cores_per_node, nodes=nodes,
                      core_limit=core_limit, comm=comm)
    ranked = plan(n, batch, image_size, machine, wire_dtype, node_shm=node_shm, block_images=block_images)
    best = ranked[0]
    return {"requested": "auto", "scheme": best.scheme, "p": best.p,
            "predicted": {"images_per_second": best.images_per_second,
                          "cpu_seconds_per_image": best.cpu_seconds_per_image, "bound": best.bound,
                          "bottleneck": best.bottleneck},
            "runners_up": [{"scheme": x.scheme, "p": x.p, "images_per_second": x.images_per_second,
                            "cpu_seconds_per_image": x.cpu_seconds_per_image} for x in ranked[1:4]],
            "inputs": {"calibration": calibration, "comm": comm.source, "nodes": nodes,
                       "cores_per_node": cores_per_node, "rc": rc, "core_limit": core_limit}}


def choose_together(comm, nodes: int, cores_per_node: int, calibration: str, network: str, **inputs) -> dict:
    """:func:`choose` made once, on ``comm``'s rank 0, and given to every rank (collective): the
    same plan everywhere. A plan that cannot be made raises :class:`ConfigError` on every rank."""
    choice = None
    if comm.Get_rank() == 0:
        try:
            choice = choose(calibration, network, comm.Get_size(), nodes, cores_per_node, **inputs)
        except ConfigError as e:
            choice = {"error": [e.field, e.problem, e.fix]}
    choice = comm.bcast(choice, root=0)
    if "error" in choice:
        raise ConfigError(*choice["error"])
    return choice


def _takes_p(scheme: str) -> bool:
    """Whether the scheme registry says ``scheme`` chooses its number of preprocessors P."""
    return SCHEME_KINDS[scheme].takes_p
