"""What the benchmark scripts share: the dataset, one cell under mpiexec, and spread statistics."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def dataset(images: int = 1000) -> str:
    """The embedded dataset of ``images`` images in the temp folder (made once, then reused)."""
    from enspipe.data.synthetic import ensure_dataset

    return ensure_dataset(os.path.join(tempfile.gettempdir(), f"enspipe-bench-{images}"), images).root


def run_cell(data: str, n: int, args: list[str], launcher: tuple[str, ...] = ()) -> dict:
    """``mpiexec -n N enspipe run ARGS`` on ``data``; returns its summary."""
    return run_under([MPIEXEC, *launcher, "-n", str(n)], data, args)


def run_under(launch: list[str], data: str, args: list[str]) -> dict:
    """``LAUNCH python -m enspipe run ARGS`` on ``data`` (LAUNCH: mpiexec's or srun's command line
    up to the program); returns its summary."""
    return run_outputs(launch, data, args, ("summary.json",))["summary.json"]


def run_outputs(launch: list[str], data: str, args: list[str], names: tuple[str, ...]) -> dict[str, dict]:
    """As :func:`run_under`, returning the cell's JSON outputs ``names`` by name."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [*launch, sys.executable, "-m", "enspipe", "run", "--data", data, "--out", out, *map(str, args)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        out_files = {}
        for name in names:
            with open(os.path.join(out, name)) as f:
                out_files[name] = json.load(f)
        return out_files


def cpu_per_image(s: dict) -> float:
    """Process CPU-seconds of all members per delivered image per member (the cell's own CPU)."""
    return s["cpu_seconds_total"] / float(np.mean([r["images"] for r in s["ranks"]])) / s["n"]


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    """``median (min-max)`` of the values times ``scale``."""
    v = np.asarray(values, float) * scale
    return f"{np.median(v):.{digits}f} ({v.min():.{digits}f}-{v.max():.{digits}f})"


def schedule(todo: list, repeats: int) -> list[tuple[int, object]]:
    """Every item once per repeat, the order reversed in every other repeat (A B C, C B A, A B C):
    two items paired in a ratio may run minutes apart within a repeat, and a drift of the machine's
    speed over those minutes would bias every repeat's ratio alike; run both ways, it raises the
    ratio in one repeat and lowers it in the next."""
    return [(rep, item) for rep in range(repeats) for item in (todo if rep % 2 == 0 else todo[::-1])]
