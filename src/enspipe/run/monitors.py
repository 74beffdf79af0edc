"""What a cell measures beside its members: the node's CPU monitor (each host's first rank) and
Slurm's energy counter for the job step (rank 0)."""
from __future__ import annotations

from enspipe.measure.cpumon import resolve_source
from enspipe.measure.node import NodeMonitor
from enspipe.measure.power import PowerUnavailable, SlurmStepCounter
from enspipe.run.config import RunConfig


def start_node_monitor(cfg: RunConfig, host: str):
    m = cfg.measure
    return NodeMonitor(cfg.out, host, resolve_source(m.cpu_monitor), cfg.energy.power, m.monitor_interval)


def slurm_counter(cfg: RunConfig):
    if cfg.energy.power != ("auto",) and "slurm" not in cfg.energy.power:
        return None
    try:
        return SlurmStepCounter()
    except (PowerUnavailable, OSError) as e:
        if "slurm" in cfg.energy.power:
            raise PowerUnavailable(f"--power slurm: {e}") from None
        return None


def read_slurm(counter) -> float | None:
    return counter.read()["step"] if counter else None
