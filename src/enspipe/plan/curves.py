"""peak(n) predicted over a config's grid, from the inputs in its ``model`` section.

A config such as ``config/paper.yaml`` may carry the cost model's inputs for the cluster it
describes (the paper's: one member per 16-core node, its measured rates). :class:`ModelInputs`
reads and checks that section; :func:`peak_curves` predicts every peak cell of the config's
grid (each network, scheme, P, n and core limit) with :func:`enspipe.plan.model.predict`, one
member per node; :func:`crossings` says, for each curve and each network's accelerator rate rc,
the first n at which the curve falls below rc (the paper's question: does the pipeline still
saturate the GPU?) and how that n moves with the inter-node bandwidth, the input the paper does
not give. Everything here is a prediction, and every table built from it says so.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from enspipe.plan.errors import ConfigError, require
from enspipe.plan.model import CommCosts, Machine, predict
from enspipe.plan.schemes import SCHEME_KINDS

CURVE_COLUMNS = ("network", "scheme", "p", "cores", "n", "images_per_second", "cpu_seconds_per_image", "bound",
                 "inter_node_bandwidth", "label")
CROSSING_COLUMNS = ("scheme", "p", "cores", "rc_network", "rc", "inter_node_bandwidth", "above_at_smallest_n",
                    "crosses_at_n", "rate_at_largest_n", "label")
LABEL = "predicted"


@dataclass(frozen=True)
class ModelInputs:
    """A config's ``model`` section: the cost model's inputs for the cluster the config describes.

    Attributes:
      source: where the numbers came from, printed with every prediction.
      cores_per_node: cores of one node; members are placed one per node.
      rp: each network's one-member preprocessing images/s by cores.
      rc: each network's accelerator images/s (the horizontal lines of the paper's Fig. 10).
      comm: the collective costs (inter-node bandwidth, latency, broadcast algorithm).
      bandwidths: inter-node bandwidths (bytes/s) over which the crossing points are also given.
    """

    source: str
    cores_per_node: int
    rp: dict
    rc: dict
    comm: CommCosts
    bandwidths: tuple = ()

    @classmethod
    def from_config(cls, cfg: dict) -> "ModelInputs":
        m = cfg.get("model")
        require(isinstance(m, dict), "model", "the config has no model section (the cost model's inputs)",
                "add one as config/paper.yaml does, or plan from measured rates with --rates")
        rp = {net: {float(c): float(v) for c, v in by_cores.items()} for net, by_cores in m["rp"].items()}
        for net, by_cores in rp.items():
            require(bool(by_cores) and all(c > 0 and v > 0 for c, v in by_cores.items()), "model.rp",
                    f"{net}: needs rates > 0 at core counts > 0, got {by_cores}", "e.g. {1: 51, 16: 490}")
        rc = {net: float(v) for net, v in (m.get("rc") or {}).items()}
        require(all(v > 0 for v in rc.values()), "model.rc", f"rates must be > 0, got {rc}", "e.g. {alexnet_v2: 656}")
        comm = CommCosts.from_dict(m.get("comm") or {}, source=(m.get("comm") or {}).get("source", "model.comm"))
        bandwidths = tuple(float(b) for b in m.get("bandwidths") or ())
        require(all(b > 0 for b in bandwidths), "model.bandwidths", f"must be > 0 bytes/s, got {bandwidths}",
                "e.g. [1.0e9, 2.0e9, 4.0e9]")
        return cls(str(m.get("source", "")), int(m["cores_per_node"]), rp, rc, comm, bandwidths)


def _cores(c, cores_per_node: int):
    return None if c == "all" else float(c)


def peak_cells(cfg: dict, inputs: ModelInputs) -> list[tuple]:
    """(network, scheme, p, cores, n) of every peak cell of the config's experiments the model
    can predict (its networks with an rp; enspipe's schemes, not the tf.data service)."""
    out = set()
    for exp in (cfg.get("experiments") or {}).values():
        if exp.get("consumer") != "peak":
            continue
        for net in exp["networks"]:
            if net not in inputs.rp:
                continue
            for scheme in exp["schemes"]:
                kind = SCHEME_KINDS[scheme]
                if kind.service:
                    continue
                for n in exp["n"]:
                    for p in (exp.get("p") or [1]) if kind.takes_p else [None]:
                        if p is None or p <= kind.p_max(n):
                            for cores in exp["cores"]:
                                out.add((net, scheme, p, cores, int(n)))
    return sorted(out, key=lambda c: (c[0], c[1], c[2] or 0, str(c[3]), c[4]))


def peak_curves(cfg: dict, inputs: ModelInputs, bandwidth: float | None = None) -> list[dict]:
    """Every predictable peak cell of the config: images/s per member (peak(n)), CPU-s per image
    and the bound, one member per node, as rows (:data:`CURVE_COLUMNS`) labelled ``predicted``."""
    comm = inputs.comm if bandwidth is None else replace(inputs.comm, inter_node_bandwidth=bandwidth)
    batch = {net: spec["batch_size"] for net, spec in cfg["networks"].items()}
    rows = []
    for net, scheme, p, cores, n in peak_cells(cfg, inputs):
        machine = Machine(rp=inputs.rp[net], rc=None, cores_per_node=inputs.cores_per_node, nodes=n,
                          core_limit=_cores(cores, inputs.cores_per_node), comm=comm)
        try:
            x = predict(scheme, n, p, batch[net], cfg["image_size"], machine)
        except ConfigError:
            continue
        rows.append({"network": net, "scheme": scheme, "p": p, "cores": cores, "n": n,
                     "images_per_second": x.images_per_second, "cpu_seconds_per_image": x.cpu_seconds_per_image,
                     "bound": x.bound, "inter_node_bandwidth": comm.inter_node_bandwidth, "label": LABEL})
    return rows


def crossings(cfg: dict, inputs: ModelInputs, network: str | None = None) -> list[dict]:
    """For each curve of ``network``'s preprocessing (default: the first with an rp), each
    network's rc and each inter-node bandwidth (the model's, then ``bandwidths``): the first n
    whose predicted peak(n) falls below rc (None: it never does up to the grid's largest n; the
    smallest n where the curve starts below rc, ``above_at_smallest_n`` false), as rows
    (:data:`CROSSING_COLUMNS`)."""
    network = network or next(iter(inputs.rp))
    require(network in inputs.rp, "network", f"no rp for {network} in the model section",
            f"choose one of {', '.join(inputs.rp)}")
    rows = []
    for bw in (inputs.comm.inter_node_bandwidth,) + tuple(b for b in inputs.bandwidths
                                                           if b != inputs.comm.inter_node_bandwidth):
        curves: dict[tuple, list[dict]] = {}
        for row in peak_curves(cfg, inputs, bw):
            if row["network"] == network:
                curves.setdefault((row["scheme"], row["p"], row["cores"]), []).append(row)
        for (scheme, p, cores), g in curves.items():
            g = sorted(g, key=lambda r: r["n"])
            for rc_net, rc in inputs.rc.items():
                below = [r["n"] for r in g if r["images_per_second"] < rc]
                rows.append({"scheme": scheme, "p": p, "cores": cores, "rc_network": rc_net, "rc": rc,
                             "inter_node_bandwidth": bw, "above_at_smallest_n": g[0]["images_per_second"] >= rc,
                             "crosses_at_n": below[0] if below else None,
                             "rate_at_largest_n": g[-1]["images_per_second"], "label": LABEL})
    return rows
