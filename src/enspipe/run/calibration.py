"""Calibration: one member's preprocessing rate rp per network and core limit, and the emulated
accelerator's rate rc derived from it (or configured), in one ``rates.json`` the cells read."""
from __future__ import annotations

import json

from enspipe.plan.errors import ConfigError


def rates(config: dict, summaries: dict[tuple[str, str], str], measured_rc: dict[str, str] | None = None) -> dict:
    """``summaries``: (network, cores) -> the calibration run's summary.json (baseline, n = 1, peak);
    ``measured_rc``: network -> the JSON of :func:`measure_accelerator_rate`, where the grid trains
    on a real accelerator. rc is the configured ``rc``, else the measured one, else ``rc_ratio`` x rp
    (:func:`accelerator_rate`); cells read it from here (``enspipe run --rate-from``)."""
    out: dict = {"networks": {}, "method": "peak images/s of one baseline member (n = 1, consumer peak)"}
    rp: dict[str, dict[str, float]] = {}
    rp_cpu: dict[str, dict[str, float]] = {}  # CPU-s per preprocessed image: the cost model's input
    machine = None
    for (network, cores), path in sorted(summaries.items()):
        with open(path) as f:
            s = json.load(f)
        rp.setdefault(network, {})[cores] = s["images_per_second_per_member"]
        per_image = [r.get("cpu_seconds_per_image") for r in s.get("ranks", [])]
        if per_image and per_image[0] is not None:
            rp_cpu.setdefault(network, {})[cores] = per_image[0]
        machine = machine or s.get("machine")
    for network in config["networks"]:
        full = rp.get(network, {}).get("all")
        measured = None
        if network in (measured_rc or {}):
            with open(measured_rc[network]) as f:
                measured = json.load(f)
        try:
            rc, source = accelerator_rate(config, network, full, measured)
        except ValueError:
            rc, source = None, "not calibrated (no cell needs it)"
        out["networks"][network] = {"rp": rp.get(network, {}), "rp_cpu": rp_cpu.get(network, {}),
                                    "rc": rc, "rc_source": source,
                                    "rc_over_rp": rc / full if rc and full else None}
    out["machine"] = machine
    return out


def measure_accelerator_rate(network: str, batch_size: int, image_size: int, steps: int, warmup: int,
                             num_classes: int = 1000, seed: int = 0, trainer: str = "keras") -> dict:
    """rc: images/s of real training steps on one fixed, already preprocessed batch (no input
    pipeline), on the GPU when the ``trainer``'s framework (``keras`` or ``torch``) sees one,
    else the CPU. Warm-up steps are not timed."""
    import time

    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.uniform(-1, 1, (batch_size, image_size, image_size, 3)).astype(np.float32)
    labels = rng.integers(0, num_classes, batch_size)
    if trainer == "torch":
        from enspipe.run.torch_train import TorchTrainConsumer

        train = TorchTrainConsumer(network, num_classes, image_size, lr=0.01, seed=seed)
    else:
        from enspipe.run.consumers import TrainConsumer

        train = TrainConsumer(network, num_classes, image_size, lr=0.01, seed=seed)
    for _ in range(warmup):
        train.step(images, labels)
    t0 = time.perf_counter()
    for _ in range(steps):
        train.step(images, labels)  # each step ends in float(loss): synchronous on a GPU too
    seconds = time.perf_counter() - t0
    return {"network": network, "rc": steps * batch_size / seconds, "device": train.device, "trainer": trainer,
            "batch_size": batch_size, "image_size": image_size, "steps": steps, "warmup": warmup,
            "seconds": seconds}


def accelerator_rate(config: dict, network: str, rp_full: float | None,
                     measured: dict | None = None) -> tuple[float, str]:
    """The accelerator's rate rc for a network and where it came from: the configured absolute
    ``rc`` (images/s), else the rate ``measured`` by real training steps (:func:`measure_accelerator_rate`),
    else ``rc_ratio`` times the calibrated full-core preprocessing rate of one member."""
    net = config["networks"][network]
    if net.get("rc") is not None:
        return float(net["rc"]), "configured rc (images/s)"
    if measured:
        return float(measured["rc"]), f"measured: training steps on {measured['device']}"
    if rp_full is None:
        raise ValueError(f"networks.{network}: rc_ratio needs the calibrated preprocessing rate")
    return float(net["rc_ratio"]) * rp_full, f"rc_ratio {net['rc_ratio']} x calibrated rp {rp_full:.1f} images/s"


def read_rate(rates_json: str, network: str) -> tuple[float, str]:
    """The rc a cell emulates for ``network`` from the workflow's calibration file, and its source
    (``enspipe run --rate-from``); a file that lacks it is a :class:`ConfigError` naming the fix."""
    try:
        with open(rates_json) as f:
            net = json.load(f)["networks"][network]
        return float(net["rc"]), f"{rates_json}: {net['rc_source']}"
    except OSError as e:
        raise ConfigError("rate_from", f"cannot read {rates_json}: {e.strerror}", "run the calibration first") from None
    except (KeyError, ValueError, TypeError):
        raise ConfigError("rate_from", f"{rates_json} has no rc for {network}",
                          "calibrate this network, or pass --rate") from None
