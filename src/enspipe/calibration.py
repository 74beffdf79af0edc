"""Calibration: one member's preprocessing rate rp per network and core limit, and the emulated
accelerator's rate rc derived from it (or configured), in one ``rates.json`` the cells read."""
from __future__ import annotations

import json

from enspipe.grid import accelerator_rate


def rates(config: dict, summaries: dict[tuple[str, str], str]) -> dict:
    """``summaries``: (network, cores) -> the calibration run's summary.json (baseline, n = 1, peak)."""
    out: dict = {"networks": {}, "method": "peak images/s of one baseline member (n = 1, consumer peak)"}
    rp: dict[str, dict[str, float]] = {}
    machine = None
    for (network, cores), path in sorted(summaries.items()):
        with open(path) as f:
            s = json.load(f)
        rp.setdefault(network, {})[cores] = s["images_per_second_per_member"]
        machine = machine or s.get("machine")
    for network in config["networks"]:
        full = rp.get(network, {}).get("all")
        try:
            rc, source = accelerator_rate(config, network, full)
        except ValueError:
            rc, source = None, "not calibrated (no cell needs it)"
        out["networks"][network] = {"rp": rp.get(network, {}), "rc": rc, "rc_source": source,
                                    "rc_over_rp": rc / full if rc and full else None}
    out["machine"] = machine
    return out
