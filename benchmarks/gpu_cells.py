"""The paper's cells on one GPU shared by n members, and enspipe's NVML reader against nvidia-smi.

    python benchmarks/gpu_cells.py --out DIR [--n 2,4,8] [--cores 1,2] [--repeats 2] [--steps 20]

* ``peak``: one member's preprocessing rate rp on 1, 2, 4, 8 and 16 cores (``enspipe run
  --consumer peak --backend pillow``), the rate the workflow's ``rc_ratio`` multiplies.
* ``cells``: Baseline and All-Shared at each n and core limit per member, the members training
  enspipe's ``alexnet_v2`` in PyTorch on the one GPU (``--backend pillow --trainer torch
  --consumer train --power nvml``), the schemes alternated within each repeat, each n one MPI job
  (``enspipe run-cells``). Per cell: images/s per member, process CPU per image, the GPU's busy
  fraction (NVML's utilisation, sampled every 0.1 s over the cell's measured window) and NVML
  energy above idle (``enspipe idle-power --power nvml``) per image.
* ``nvml``: a recorded load (idle, 8 s of bf16 matrix products, idle, 6 s at half duty, idle)
  while three readers run: enspipe's ``PowerMonitor`` over ``NvmlCounter`` (the reader under
  test), a raw NVML sampler (energy counter, power, utilisation; the tests' fixture), and
  ``nvidia-smi --query-gpu=timestamp,power.draw -lms 100``. The energy of each phase from each.

Writes DIR/gpu_cells.json, DIR/nvml_samples.csv, DIR/nvidia_smi.csv and DIR/summaries.tar.gz (every
cell's summary.json, for ``benchmarks/gpu_report.py``). Needs mpiexec, PyTorch and, for the GPU
parts, nvidia-ml-py and nvidia-smi.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np

from cells import cpu_per_image, dataset

HERE = os.path.dirname(os.path.abspath(__file__))
LOAD = """
import json, sys, time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
def busy(seconds, duty):
    end = time.time() + seconds
    while time.time() < end:
        t = time.time()
        while time.time() - t < 0.1 * duty:
            (x @ x).sum().item()
        time.sleep(0.1 * (1 - duty))
marks = {}
for name, seconds, duty in [("idle0", 4, 0), ("full", 8, 1), ("idle1", 4, 0), ("half", 6, 0.5), ("idle2", 3, 0)]:
    t0 = time.time(); busy(seconds, duty) if duty else time.sleep(seconds); marks[name] = (t0, time.time())
print(json.dumps(marks))
"""


class NvmlSampler:
    """Raw NVML readings every ``interval`` s in a thread: t, total energy (mJ), power (mW), GPU and
    memory utilisation (%)."""

    FIELDS = ("t", "energy_mj", "power_mw", "util_gpu", "util_mem")

    def __init__(self, interval: float = 0.1):
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.interval, self.rows, self._stop = interval, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple:
        n, h = self.nvml, self.h
        u = n.nvmlDeviceGetUtilizationRates(h)
        return (time.time(), n.nvmlDeviceGetTotalEnergyConsumption(h), n.nvmlDeviceGetPowerUsage(h), u.gpu, u.memory)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.rows.append(self._read())

    def start(self) -> "NvmlSampler":
        self.rows.append(self._read())
        self._thread.start()
        return self

    def stop(self, path: str) -> None:
        self._stop.set()
        self._thread.join(2)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.FIELDS)
            w.writerows(self.rows)

    def busy_fraction(self, t0: float, t1: float) -> float | None:
        return busy_fraction(self.rows, t0, t1)


def busy_fraction(rows, t0: float, t1: float) -> float | None:
    """The GPU's mean NVML utilisation (the share of time a kernel ran) over [t0, t1], from the
    sampler's rows."""
    u = [r[3] for r in rows if t0 <= r[0] <= t1]
    return float(np.mean(u)) / 100 if u else None


def enspipe(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "enspipe", *map(str, args)], **kw)


def run_job(out: str, name: str, n: int, cells: list[tuple[str, list[str]]]) -> None:
    """The cells as one ``enspipe run-cells`` job of ``n`` ranks."""
    spec = os.path.join(out, f"{name}.json")
    with open(spec, "w") as f:
        json.dump({"n": n, "cells": [{"name": c, "args": args} for c, args in cells]}, f)
    r = enspipe("run-cells", spec)  # mpiexec -n N beside this python; one rank: no launcher
    print(f"{name}: run-cells exit {r.returncode}", flush=True)


def peak_cells(rows: list[dict], out: str, data: str, core_counts: list[int]) -> None:
    """Appends one member's peak rate at each core limit to ``rows`` as it is measured."""
    for k in core_counts:  # a job per core limit (enspipe sizes a process's pools once)
        run_job(out, f"peak_c{k}", 1, [(f"peak_c{k}", [
            "--data", data, "--out", os.path.join(out, "peak", f"c{k}"), "--consumer", "peak", "--backend", "pillow",
            "--cores", str(k), "--steps", str(5 * k), "--warmup", "2", "--batch-size", "128",
            "--cpu-monitor", "psutil"])])
        s = _summary(os.path.join(out, "peak", f"c{k}"))
        rows.append({"cores": k, "rp": s and s["images_per_second_per_member"],
                     "cpu_ms_per_image": s and 1000 * cpu_per_image(s)})
        print(f"peak c{k}: rp {rows[-1]['rp']}", flush=True)


def train_cells(rows: list[dict], out: str, data: str, a, idle: str, sampler: NvmlSampler | None) -> None:
    """Appends each train cell's row to ``rows`` as its job ends."""
    cpus = len(os.sched_getaffinity(0))
    power = ["--power", "nvml", "--idle-power", idle] if idle else []
    for n, c in [(n, c) for n in a.n for c in a.cores if n * c <= cpus]:  # a job per n and core limit
        cells = []
        for rep in range(a.repeats):
            for scheme in ("baseline", "all_shared") if rep % 2 == 0 else ("all_shared", "baseline"):
                name = f"{scheme}_n{n}_c{c}_rep{rep}"
                cells.append((name, ["--data", data, "--out", os.path.join(out, "cells", name), "--scheme", scheme,
                                     "--consumer", "train", "--trainer", "torch", "--backend", "pillow",
                                     "--network", a.network, "--batch-size", str(a.batch_size), "--cores", str(c),
                                     "--steps", str(a.steps), "--warmup", str(a.warmup), "--rep", str(rep),
                                     "--seed", str(rep), "--cpu-monitor", "psutil", *power]))
        run_job(out, f"train_n{n}_c{c}", n, cells)
        for name, _ in cells:
            s = _summary(os.path.join(out, "cells", name))
            rows.append(train_row(name, s, sampler))
            print(f"{name}: {rows[-1]}", flush=True)


def train_row(name: str, s: dict | None, sampler: NvmlSampler | None) -> dict:
    """A train cell's row from its summary (None: it failed) and the GPU's sampled utilisation."""
    scheme, n, c, rep = name.rsplit("_", 3)
    row = {"scheme": scheme, "n": int(n[1:]), "cores_per_member": int(c[1:]), "rep": int(rep[3:]), "ok": s is not None}
    if s is None:
        return row
    w = s["measured_window"]
    images = float(np.mean([r["images"] for r in s["ranks"]])) * s["n"]
    nvml = (s.get("energy_by_source") or {}).get("nvml")
    above = s.get("energy_above_idle_joules") if s.get("energy_source") == "nvml" else None
    row.update(images_per_second_per_member=s["images_per_second_per_member"],
               cpu_ms_per_image=1000 * cpu_per_image(s), accelerator=s["accelerator"],
               oversubscribed=s["placement"]["oversubscribed"], window_seconds=w["seconds"],
               gpu_busy=sampler.busy_fraction(w["start"], w["end"]) if sampler else None,
               nvml_joules=nvml, nvml_joules_above_idle=above,
               nvml_joules_per_image=nvml / images if nvml else None,
               nvml_above_idle_per_image=above / images if above else None)
    return row


def _summary(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            return json.load(f)
    except OSError:
        return None


def nvml_check(out: str) -> dict:
    """A recorded load read by enspipe's PowerMonitor(NvmlCounter), raw NVML and nvidia-smi."""
    from enspipe.measure.power import (COUNTER_INTERVAL, NvmlCounter, PowerMonitor, counter_energy, read_meter_csv,
                                       series_energy)

    smi_path = os.path.join(out, "nvidia_smi.csv")
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw,utilization.gpu", "--format=csv",
                            "-lms", "100", "-f", smi_path])
    mon = PowerMonitor([NvmlCounter()], interval=COUNTER_INTERVAL).start()  # as a cell's node monitor samples
    time.sleep(1.0)
    r = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=120)
    time.sleep(1.0)
    mon.stop()
    smi.terminate()
    smi.wait()
    if r.returncode != 0:
        return {"error": r.stderr[-2000:]}
    marks = json.loads(r.stdout.strip().splitlines()[-1])
    t, w = read_meter_csv(smi_path)
    phases = {}
    for name, (t0, t1) in marks.items():
        enspipe_j = counter_energy(mon.samples, t0, t1).get("nvml", {}).get("gpu0")
        smi_j = series_energy(t, w, t0, t1)
        phases[name] = {"seconds": t1 - t0, "enspipe_nvml_joules": enspipe_j, "nvidia_smi_joules": smi_j,
                        "ratio": enspipe_j / smi_j if enspipe_j and smi_j else None}
        print(f"nvml {name:6s} {t1 - t0:5.1f} s: enspipe {enspipe_j:9.1f} J, nvidia-smi {smi_j:9.1f} J", flush=True)
    with open(os.path.join(out, "enspipe_nvml_samples.json"), "w") as f:
        json.dump(mon.samples, f)
    return {"marks": marks, "phases": phases}


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    ap.add_argument("--cores", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--peak-cores", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--network", default="alexnet_v2")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--data", choices=("photos", "synthetic"), default="photos",
                    help="JPEG class folders of natural photos (enspipe.data.photos), or the embedded synthetic set")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: nvml, peak, cells")
    return ap.parse_args()


def _data(out: str, a: argparse.Namespace) -> str:
    if a.data == "photos":  # natural photographs decode like ImageNet's (the synthetic set decodes faster)
        from enspipe.data.photos import write_photo_folder

        return write_photo_folder(os.path.join(out, "photos"), a.images)
    return dataset(a.images)


def _write(out: str, result: dict, sampler: NvmlSampler | None) -> None:
    """gpu_cells.json, the sampler's nvml_samples.csv and every cell's summary in summaries.tar.gz."""
    if sampler:
        sampler.stop(os.path.join(out, "nvml_samples.csv"))
    with open(os.path.join(out, "gpu_cells.json"), "w") as f:
        json.dump(result, f, indent=1)
    with tarfile.open(os.path.join(out, "summaries.tar.gz"), "w:gz") as tar:
        for root, _, files in os.walk(out):
            for f in files:
                if f in ("summary.json", "summary.failed.json", "idle.json") or f.startswith("error.rank"):
                    tar.add(os.path.join(root, f), os.path.relpath(os.path.join(root, f), out))


def main() -> None:
    a = _args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a time limit still writes what was measured
    skip, out = set(a.skip.split(",")), os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    gpu = shutil.which("nvidia-smi") is not None
    result = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": gpu}
    sampler = NvmlSampler().start() if gpu else None  # the raw readings of every part below
    try:
        if gpu and "nvml" not in skip:
            try:
                result["nvml"] = nvml_check(out)
            except Exception as e:  # noqa: BLE001 - the cells still run; the record says what failed
                result["nvml"] = {"error": f"{type(e).__name__}: {e}"}
        data, idle = _data(out, a), os.path.join(out, "idle.json") if gpu else ""
        if idle:
            enspipe("idle-power", "--out", idle, "--seconds", "5", "--power", "nvml")
        if "peak" not in skip:
            peak_cells(result.setdefault("peak", []), out, data,
                       [k for k in a.peak_cores if k <= len(os.sched_getaffinity(0))])
        if "cells" not in skip:
            train_cells(result.setdefault("cells", []), out, data, a, idle, sampler)
    finally:
        _write(out, result, sampler)


if __name__ == "__main__":
    main()
