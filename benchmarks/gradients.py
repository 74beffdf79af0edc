"""How a data-parallel member's ranks exchange gradients (``--gradient-exchange``): measured on
this machine's CPU ranks, simulated at the paper's scale, and Ako's partial exchange against the
whole all-reduce.

    python benchmarks/gradients.py measure  [--networks mobilenet_v2,resnet_50] [--ranks 2,4] [--repeats 3]
    python benchmarks/gradients.py simulate [--networks ...] [--gbits 1,2.5,5,10,25] [--ranks 2,8]
    python benchmarks/gradients.py ako      [--networks tiny] [--seeds 0,1,2] [--epochs 40]
    python benchmarks/gradients.py progress [--repeats 5]

``measure``: ``enspipe profile`` of each network (its rates and its layers, cached), then, for every
rank count and repeat, one cell per exchange (``whole``, ``blocks``, ``prophet``; the order reversed
every other repeat): ``mpiexec -n g enspipe run --consumer train --data-parallel g`` on one member.
Prints the step time (the measured window over its steps: median and range over the repeats), each
option's step time over whole's (the median of the repeats' ratios), the bytes a rank sends a step,
the share of the blocks' bytes summed before backpropagation ended (MPI progressed during it) and
the wait after it. Ranks beyond the cores are oversubscribed, and the table says so.

``simulate``: SIMULATED, nothing run: the same profiles' layers (at the rank count's share of the
batch) timed by :func:`enspipe.plan.gradients.simulate_step` for links of 1-25 Gbit/s and a 50 us
latency, beside Prophet's reported gain.

``ako``: per network and seed, one member on 2 ranks trained ``--epochs`` epochs with the whole
all-reduce and with Ako's partial exchange (``--ako-partitions``), the same seeds: bytes a rank
sends a step, the step time and the validation loss after the first and the last epoch (mean and
std over the seeds).

``progress``: whether MPI moves a posted all-reduce while the rank computes. Two ranks post an
``Iallreduce`` of 1-16 MB, then (a) wait at once, (b) compute 20 ms making no MPI call and then
wait, (c) compute 20 ms beside enspipe's exchange thread (:class:`~enspipe.exchange.gradients.
BlockExchange`) and then take the sum. The computation is numpy's matrix products, which release
the GIL as TensorFlow's ops do. Prints the wait after the computation (median over the repeats):
where MPI did not progress, (b) waits as long as (a).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from cells import MPIEXEC, run_outputs, schedule, spread

EXCHANGES = ("whole", "blocks", "prophet")
HERE = os.path.dirname(os.path.abspath(__file__))


def datasets(images: int, classes: int = 10) -> tuple[str, str]:
    """A training set of ``images`` and a validation set of 64, in the temp folder (made once)."""
    from enspipe.data.synthetic import ensure_dataset

    root = os.path.join(tempfile.gettempdir(), f"enspipe-bench-grad-{images}")
    train = ensure_dataset(os.path.join(root, "train"), images, seed=3, num_classes=classes).root
    val = ensure_dataset(os.path.join(root, "val"), 64, seed=4, num_classes=classes).root
    return train, val


def profile(network: str, data: str, a) -> str:
    """``enspipe profile``'s JSON of the network (cached under the temp folder)."""
    cache = os.path.join(tempfile.gettempdir(), "enspipe-bench-grad-profiles")
    cmd = [sys.executable, "-m", "enspipe", "profile", "--network", network, "--data", data, "--cache", cache,
           "--accelerators", "1,2,4", "--batch-size", str(a.batch), "--steps", "5",
           "--image-size", str(a.image_size), "--", "--warmup", "2", "--cpu-monitor", "none"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    (path,) = glob.glob(os.path.join(cache, f"{network}_{a.image_size}px_b{a.batch}_*.json"))
    return path


def train_args(network: str, g: int, a, steps: int, warmup: int) -> list:
    return ["--consumer", "train", "--network", network, "--scheme", "all_shared", "--data-parallel", g,
            "--batch-size", a.batch, "--image-size", a.image_size, "--steps", steps, "--warmup", warmup,
            "--lr", a.lr, "--cpu-monitor", "none", *(["--cores", a.cores] if a.cores else [])]


def cell(data: str, network: str, g: int, exchange: str, a, extra=()) -> dict:
    args = [*train_args(network, g, a, a.steps, a.warmup), "--gradient-exchange", exchange, *extra]
    return run_outputs([MPIEXEC, "-n", str(g)], data, args, ("summary.json",))["summary.json"]


def _exchange_options(exchange: str, profile_path: str) -> list[str]:
    return {"whole": [], "blocks": ["--gradient-block-mb", "4"],
            "prophet": ["--gradient-profile", profile_path]}[exchange]


def measure(a) -> None:
    data, _ = datasets(a.images)
    per_rank = f"{a.cores} core(s) a rank" if a.cores else "every core for every rank"
    print(f"# measured on {os.cpu_count()} cores: {a.image_size} px, global batch {a.batch}, {a.steps} steps "
          f"after {a.warmup}+ warm-up, {per_rank}, {a.repeats} repeats interleaved; one member on g ranks")
    print(f"{'network':<14}{'g':>3} {'exchange':<9}{'step s (median, range)':>26}{'over whole':>12}"
          f"{'MB/step':>9}{'before bwd end':>16}{'wait after s':>14}")
    for network in a.networks:
        path = profile(network, data, a)
        todo = [(g, x) for g in a.ranks for x in EXCHANGES]
        runs: dict = {}
        for rep, (g, x) in schedule(todo, a.repeats):
            s = cell(data, network, g, x, a, _exchange_options(x, path))
            runs.setdefault((g, x), []).append(s)
        for g in a.ranks:
            whole = [s["ranks"][0]["seconds"] / s["ranks"][0]["steps_measured"] for s in runs[(g, "whole")]]
            for x in EXCHANGES:
                ss = runs[(g, x)]
                step = [s["ranks"][0]["seconds"] / s["ranks"][0]["steps_measured"] for s in ss]
                ratio = float(np.median(np.array(step) / np.array(whole)))
                ex = [s["ranks"][0]["gradient_exchange"] for s in ss]
                before = [e.get("done_before_backward_end") for e in ex if e.get("done_before_backward_end") is not None]
                after = [e.get("exposed_seconds_mean") for e in ex if e.get("exposed_seconds_mean") is not None]
                over = " (oversubscribed)" if ss[0]["placement"]["oversubscribed"] else ""
                print(f"{network:<14}{g:>3} {x:<9}{spread(step, digits=3):>26}{ratio:>12.2f}"
                      f"{ex[0]['bytes_per_step'] / 2**20:>9.1f}"
                      f"{(f'{np.median(before):.0%}' if before else '-'):>16}"
                      f"{(f'{np.median(after):.4f}' if after else '-'):>14}{over}")


def simulate(a) -> None:
    from enspipe.plan.gradients import PROPHET_GAIN, fixed_blocks, prophet_blocks, simulate_step, whole_block
    from enspipe.run.profile import layers_for

    data, _ = datasets(a.images)
    print(f"# SIMULATED (plan.gradients.simulate_step), nothing run: this machine's profiles ({a.image_size} px, "
          f"global batch {a.batch}, CPU) on links of the Gbit/s column and {a.latency * 1e6:g} us latency; ring "
          f"all-reduce among g ranks (each rank's layers as profiled at the nearest count's share of the batch); "
          f"blocks of 4 MB")
    print(f"# Prophet reports {PROPHET_GAIN}")
    print(f"{'network':<14}{'g':>3}{'Gbit/s':>8}{'whole ms':>10}{'blocks ms':>11}{'prophet ms':>12}"
          f"{'whole/blocks':>14}{'whole/prophet':>15}{'blocks/prophet':>16}")
    for network in a.networks:
        with open(profile(network, data, a)) as f:
            record = json.load(f)
        for g in a.sim_ranks:
            p = layers_for(record, g)
            for gbit in a.gbits:
                bw = gbit * 1e9 / 8
                t = {"whole": simulate_step(p, whole_block(p), False, g, bw, a.latency),
                     "blocks": simulate_step(p, fixed_blocks(p.sizes, 4 * 2**20), False, g, bw, a.latency),
                     "prophet": simulate_step(p, prophet_blocks(p, g, bw, a.latency), True, g, bw, a.latency)}
                print(f"{network:<14}{g:>3}{gbit:>8g}{t['whole'] * 1e3:>10.3g}{t['blocks'] * 1e3:>11.3g}"
                      f"{t['prophet'] * 1e3:>12.3g}"
                      f"{t['whole'] / t['blocks']:>14.2f}{t['whole'] / t['prophet']:>15.2f}"
                      f"{t['blocks'] / t['prophet']:>16.2f}")


def ako(a) -> None:
    data, val = datasets(a.images)
    spe = a.images // a.batch
    print(f"# one member on 2 ranks, {a.epochs} epochs of {a.images} images (global batch {a.batch}, "
          f"{a.image_size} px), lr {a.lr}; seeds {a.seeds}; validation loss on 64 other images after the last "
          f"epoch (rank 0's replica); ako: {a.partitions} partitions, one sent a step")
    print(f"{'network':<14}{'exchange':<10}{'MB/step':>9}{'step s (median, range)':>26}"
          f"{'val loss, epoch 1':>22}{'val loss, last epoch':>24}")
    for network in a.networks:
        runs: dict = {}
        for rep, (seed, x) in schedule([(s, x) for s in a.seeds for x in ("whole", "ako")], 1):
            extra = ["--ako-partitions", a.partitions] if x == "ako" else []
            args = [*train_args(network, 2, a, a.epochs * spe, 0), "--gradient-exchange", x, *extra,
                    "--seed", seed, "--member-epochs", a.epochs, "--validation-data", val]
            runs.setdefault(x, []).append(
                run_outputs([MPIEXEC, "-n", "2"], data, args, ("summary.json",))["summary.json"])
        for x in ("whole", "ako"):
            ss = runs[x]
            step = [s["ranks"][0]["seconds"] / s["ranks"][0]["steps_measured"] for s in ss]
            losses = np.array([s["ranks"][0]["member_state"]["val_losses"] for s in ss])
            first, last = (f"{np.mean(v):.4f} +- {np.std(v):.4f}" for v in (losses[:, 0], losses[:, -1]))
            mb = ss[0]["ranks"][0]["gradient_exchange"]["bytes_per_step"] / 2**20
            print(f"{network:<14}{x:<10}{mb:>9.3f}{spread(step, digits=3):>26}{first:>22}{last:>24}")


def progress_worker(repeats: int) -> None:
    """One rank of ``progress`` (under mpiexec -n 2)."""
    import time

    from mpi4py import MPI

    from enspipe.exchange.gradients import BlockExchange

    comm = MPI.COMM_WORLD
    a = np.random.default_rng(0).random((256, 256), dtype=np.float32)

    def compute(seconds: float) -> None:  # numpy's matrix products, the GIL released, as TensorFlow's ops do
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            a @ a

    if comm.Get_rank() == 0:
        print(f"{'MB':>5}{'wait at once ms':>17}{'wait after 20 ms, no MPI call':>31}"
              f"{'wait after 20 ms, exchange thread':>35}{'summed before the wait':>24}")
    for mb in (1, 4, 16):
        n = mb * 2**20 // 4
        send, recv = np.ones(n, np.float32), np.empty(n, np.float32)
        x = BlockExchange(comm, [n])
        waits = {k: [] for k in ("now", "idle", "thread")}
        ahead = []  # the exchange thread had the sum before the rank asked for it
        for _ in range(repeats + 1):
            for k in waits:
                comm.Barrier()
                if k == "thread":
                    x.ready(0, [send])
                    compute(0.02)
                    t = time.perf_counter()
                    ahead.append(x.blocks[0].completed == x.blocks[0].readied)
                    x.wait(0)  # a copy of the sum: most of what is left
                else:
                    req = comm.Iallreduce(send, recv, op=MPI.SUM)
                    compute(0.02 if k == "idle" else 0.0)
                    t = time.perf_counter()
                    req.Wait()
                waits[k].append(time.perf_counter() - t)
        x.close()
        med = {k: float(np.median(v[1:])) * 1e3 for k, v in waits.items()}  # the first: untimed
        if comm.Get_rank() == 0:
            print(f"{mb:>5}{med['now']:>17.2f}{med['idle']:>31.2f}{med['thread']:>35.2f}"
                  f"{f'{sum(ahead[1:])} of {repeats}':>24}")


def progress(a) -> None:
    print(f"# two ranks on {os.cpu_count()} cores, median of {a.repeats} repeats (ms)")
    subprocess.run([MPIEXEC, "-n", "2", sys.executable, os.path.abspath(__file__), "progress-worker",
                    "--repeats", str(a.repeats)], check=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("what", choices=("measure", "simulate", "ako", "progress", "progress-worker"))
    p.add_argument("--networks", type=lambda s: s.split(","), default=None,
                   help="networks, comma-separated (default: mobilenet_v2,resnet_50; ako: tiny)")
    p.add_argument("--ranks", type=ints, default=[2, 4], help="measure: the member's rank counts (default: 2,4)")
    p.add_argument("--cores", type=int, default=1,
                   help="measure, ako: cores per rank (enspipe run --cores; default: 1, a rank per accelerator; "
                        "0: every rank may use every core)")
    p.add_argument("--sim-ranks", type=ints, default=[2, 8], help="simulate: rank counts (default: 2,8)")
    p.add_argument("--gbits", type=lambda s: [float(x) for x in s.split(",")], default=[1, 2.5, 5, 10, 25],
                   help="simulate: link bandwidths in Gbit/s (default: 1,2.5,5,10,25)")
    p.add_argument("--latency", type=float, default=50e-6, help="simulate: link latency in seconds (default: 5e-5)")
    p.add_argument("--image-size", type=int, default=64, help="image side in pixels (default: 64)")
    p.add_argument("--batch", type=int, default=16, help="the member's global batch (default: 16)")
    p.add_argument("--images", type=int, default=128, help="images in the generated dataset (default: 128)")
    p.add_argument("--steps", type=int, default=10, help="measure: steps in the window (default: 10)")
    p.add_argument("--warmup", type=int, default=3, help="measure: warm-up steps (default: 3)")
    p.add_argument("--repeats", type=int, default=3, help="measure, progress: repeats (default: 3)")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (default: 0.1)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2], help="ako: seeds (default: 0,1,2)")
    p.add_argument("--epochs", type=int, default=40, help="ako: epochs trained (default: 40)")
    p.add_argument("--partitions", type=int, default=4, help="ako: --ako-partitions (default: 4)")
    a = p.parse_args()
    if a.networks is None:
        a.networks = ["tiny"] if a.what == "ako" else ["mobilenet_v2", "resnet_50"]
    if a.what == "progress-worker":
        return progress_worker(a.repeats)
    {"measure": measure, "simulate": simulate, "ako": ako, "progress": progress}[a.what](a)


if __name__ == "__main__":
    main()
