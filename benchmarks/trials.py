"""Trials that come and go: the attach server (``enspipe serve`` + ``enspipe.attach``) with
consumers that attach at different times and run at different speeds, against one consumer
alone, ``SharedStream`` at n = 4, and the tf.data service's cross-trainer cache.

    python benchmarks/trials.py [--images 384] [--size 64] [--batch 16] [--repeats 3]

Every consumer is a process started beforehand that waits for its start time, attaches, trains
``--epochs`` epochs with an emulated step (a sleep of ``--step-ms`` per batch, the accelerator's
time) and reports its images/s (from its first batch to its last), its process CPU and its ledger.
Arms, interleaved within each repeat:

* ``alone``: one consumer;
* ``staggered``: 4 consumers attaching 0, 1/4, 1/2 and 3/4 of ``alone``'s epoch apart;
* ``mixed``: 4 consumers attached together, one with a step twice as long;
* ``staggered_2ranks``: ``staggered`` on an MPI server of 2 ranks (``mpiexec -n 2 enspipe serve``,
  a socket each; consumers 0 and 2 on rank 0, 1 and 3 on rank 1), the ranks sharing the
  preprocessing: the job's sharing factor and CPU (both ranks' on this one machine);
* ``together``: 4 consumers attached together at full speed (no step), for the handoff's CPU,
  beside ``shared_stream``: ``SharedStream`` (all_shared, the pillow backend, uint8) at n = 4
  under mpiexec, each member taking every batch at once;
* ``tfdata``: the tf.data service (a dispatcher and one worker with the cross-trainer cache, in
  one process) read by the 4 staggered consumers (where TensorFlow is installed).

CPU per delivered image: the server's process CPU (from its status) and every consumer's, over all
deliveries; for SharedStream and the service every member's (or the service process's and every
trainer's). The attach server and SharedStream run Pillow and numpy; the service runs TensorFlow's
preprocessing, whose CPU per image is its own: its row is read against its own ``alone``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from cells import MPIEXEC, schedule, spread

HERE = os.path.abspath(__file__)


# -- a consumer process -----------------------------------------------------------------------------
def consumer(a: argparse.Namespace) -> None:
    """Wait for the start time, attach, train, write what was measured."""
    import enspipe

    time.sleep(max(0.0, a.start_at - time.time()))
    cpu0, ids = time.process_time(), []
    stream = enspipe.attach(a.sock, name=a.name)
    first = None
    for _ in range(a.epochs):
        for images, labels in stream:
            first = first or time.perf_counter()
            time.sleep(a.step_ms / 1e3)
    seconds = time.perf_counter() - first
    epochs = stream.epochs()
    stream.close()
    _write(a.out, {"images": sum(e["count"] for e in epochs), "seconds": seconds, "cpu": time.process_time() - cpu0,
                   "exact": all(e["missing"] == 0 for e in epochs) and len(epochs) == a.epochs, "twice": 0,
                   "missed": sum(e["missing"] for e in epochs)})


def _write(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)


def _spawn(args: list) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, HERE, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def _collect(procs: list, outs: list) -> list[dict]:
    for p in procs:
        text = p.communicate(timeout=600)[0]
        if p.returncode:
            raise RuntimeError(f"a consumer failed:\n{text[-3000:]}")
    return [json.load(open(o)) for o in outs]


# -- the attach arms --------------------------------------------------------------------------------
def attach_arm(a, tmp: str, starts: list[float], steps_ms: list[float], ranks: int = 1) -> dict:
    """The consumers on one server, or on an MPI server of ``ranks`` ranks (consumer k on rank k mod
    ranks): the sharing factor and CPU are then the job's (every rank's)."""
    sock = os.path.join(tmp, "s-{rank}.sock")
    socks = [sock.replace("{rank}", str(r)) for r in range(ranks)]
    cmd = [sys.executable, "-m", "enspipe", "serve", *map(str, ["--data", a.data, "--batch-size", a.batch,
           "--image-size", a.size, "--socket", sock, "--memory", a.memory, "--status-interval", 60, "--wire-dtype", "uint8"])]
    server = subprocess.Popen([MPIEXEC, "-n", str(ranks), *cmd] if ranks > 1 else cmd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    from enspipe.serve.wire import live_server

    while not all(live_server(x) for x in socks):
        if server.poll() is not None:
            raise RuntimeError(server.communicate()[0])
        time.sleep(0.05)
    t0 = time.time() + 3.0  # every consumer imported and waiting
    outs = [os.path.join(tmp, f"c{k}.json") for k in range(len(starts))]
    procs = [_spawn(["--consumer", "--sock", socks[k % ranks], "--start-at", t0 + s, "--step-ms", st, "--epochs",
                     a.epochs, "--out", o, "--name", f"c{k}"]) for k, (s, st, o) in enumerate(zip(starts, steps_ms, outs))]
    results = _collect(procs, outs)
    server.terminate()
    server.communicate(timeout=60)
    status = [json.load(open(x + ".status.json")) for x in socks]
    made = status[0]["mpi"]["job"]["preprocessed"] if ranks > 1 else status[0]["total"]["preprocessed"]
    delivered = sum(st["total"]["delivered"] for st in status)
    cpu = sum(st["total"]["cpu_seconds_serving"] for st in status) + sum(r["cpu"] for r in results)
    again = sum(st["total"]["preprocessed_again"]["evicted"] for st in status)
    return {"rates": [r["images"] / r["seconds"] for r in results], "exact": all(r["exact"] for r in results),
            "sharing": delivered / made, "again": again / made, "cpu_ms": 1e3 * cpu / delivered,
            "missed": sum(r["missed"] for r in results), "twice": 0}


# -- SharedStream at n = 4 --------------------------------------------------------------------------
def member(a: argparse.Namespace) -> None:
    import enspipe

    stream = enspipe.SharedStream(a.data, a.batch, scheme="all_shared", image_size=a.size, backend="pillow",
                                  wire_dtype="uint8")
    cpu0 = time.process_time()
    n = 0
    for _ in range(a.epochs):
        for images, labels in stream:
            n += len(labels)
    cpu = time.process_time() - cpu0
    stream.close()
    _write(os.path.join(a.out, f"m{stream.member}.json"), {"images": n, "cpu": cpu})


def shared_stream_arm(a, tmp: str) -> dict:
    r = subprocess.run([MPIEXEC, "-n", "4", sys.executable, HERE, *map(str, ["--member", "--data", a.data, "--batch",
                        a.batch, "--size", a.size, "--epochs", a.epochs, "--out", tmp])], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(r.stderr[-3000:])
    ms = [json.load(open(os.path.join(tmp, f"m{k}.json"))) for k in range(4)]
    return {"cpu_ms": 1e3 * sum(m["cpu"] for m in ms) / sum(m["images"] for m in ms)}


# -- the tf.data service ----------------------------------------------------------------------------
def service_host(a: argparse.Namespace) -> None:
    """A dispatcher and one worker (cross-trainer cache) serving enspipe's TensorFlow preprocessing."""
    from types import SimpleNamespace

    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2

    from enspipe.data.build import load_manifest
    from enspipe.run.service import service_dataset

    svc = tf.data.experimental.service
    dispatcher = svc.DispatchServer(svc.DispatcherConfig(port=0, protocol="grpc"))
    address = f"localhost:{dispatcher.target.rsplit(':', 1)[1]}"
    worker = svc.WorkerServer(service_config_pb2.WorkerConfig(
        dispatcher_address=address, worker_address="localhost:%port%", port=0, protocol="grpc",
        cross_trainer_cache_size_bytes=int(a.memory_bytes)))
    cfg = SimpleNamespace(global_batch=a.batch, stream=SimpleNamespace(image_size=a.size, wire_dtype="uint8",
                                                                       shuffle_buffer=1024, seed=0),
                          preprocess=SimpleNamespace(fast_mode=False, preprocess_impl="crop-first"))
    ds = service_dataset(load_manifest(a.data), cfg, "inception", os.cpu_count(), 1)
    dataset_id = svc.register_dataset(f"grpc://{address}", ds).numpy().decode()
    cpu0 = time.process_time()
    _write(a.out + ".tmp", {"address": address, "dataset_id": dataset_id})
    os.replace(a.out + ".tmp", a.out)
    sys.stdin.read()  # until the benchmark closes stdin
    _write(a.out, {"cpu": time.process_time() - cpu0})
    worker.stop()
    dispatcher.stop()


def trainer(a: argparse.Namespace) -> None:
    import tensorflow as tf

    from enspipe.data.ledger import DeliveryCounter
    from enspipe.run.service import element_spec
    from types import SimpleNamespace

    svc = tf.data.experimental.service
    host = json.load(open(a.sock))
    cfg = SimpleNamespace(global_batch=a.batch, stream=SimpleNamespace(image_size=a.size, wire_dtype="uint8"))
    time.sleep(max(0.0, a.start_at - time.time()))
    cpu0 = time.process_time()
    ds = svc.from_dataset_id(processing_mode=svc.ShardingPolicy.OFF, service=f"grpc://{host['address']}",
                             dataset_id=host["dataset_id"].encode(), element_spec=element_spec(cfg), job_name="trials",
                             cross_trainer_cache=svc.CrossTrainerCache(trainer_id=a.name))
    counter, steps, first = DeliveryCounter(a.images), a.epochs * (a.images // a.batch), None
    for images, meta, stream in ds.take(steps):
        first = first or time.perf_counter()
        m = meta.numpy()
        counter.add(m[:, 0], m[:, 2], int(stream))
        time.sleep(a.step_ms / 1e3)
    s = counter.summary()
    twice = sum(counter.num_images - w for w in counter.windows)  # a window missing k samples saw k twice
    _write(a.out, {"images": s["delivered"], "seconds": time.perf_counter() - first, "cpu": time.process_time() - cpu0,
                   "missed": s["skipped_samples"] + twice, "twice": twice, "exact": twice == 0 and not s["skipped_samples"]})


def service_arm(a, tmp: str, starts: list[float], steps_ms: list[float]) -> dict:
    info = os.path.join(tmp, "service.json")
    host = subprocess.Popen([sys.executable, HERE, *map(str, ["--service-host", "--data", a.data, "--batch", a.batch,
                             "--size", a.size, "--out", info, "--memory-bytes", parse(a.memory)])], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not os.path.exists(info):
        if host.poll() is not None:
            raise RuntimeError(host.communicate()[0][-3000:])
        time.sleep(0.1)
    t0 = time.time() + 8.0  # TensorFlow imported in every trainer
    outs = [os.path.join(tmp, f"t{k}.json") for k in range(len(starts))]
    procs = [_spawn(["--trainer", "--sock", info, "--start-at", t0 + s, "--step-ms", st, "--epochs", a.epochs,
                     "--out", o, "--name", f"t{k}", "--batch", a.batch, "--size", a.size, "--images", a.images])
             for k, (s, st, o) in enumerate(zip(starts, steps_ms, outs))]
    results = _collect(procs, outs)
    host.communicate("", timeout=60)
    cpu = json.load(open(info))["cpu"] + sum(r["cpu"] for r in results)
    delivered = sum(r["images"] for r in results)
    return {"rates": [r["images"] / r["seconds"] for r in results], "exact": all(r["exact"] for r in results),
            "cpu_ms": 1e3 * cpu / delivered, "missed": sum(r["missed"] for r in results),
            "twice": sum(r["twice"] for r in results), "sharing": None, "again": None}


def parse(size: str) -> int:
    from enspipe.plan.options import parse_size

    return parse_size(size)


# -- the table ----------------------------------------------------------------------------------------
def _tf_installed() -> bool:
    from enspipe.engine.config import tensorflow_installed

    return tensorflow_installed()


def run_arms(a, step_ms: float, epoch_s: float) -> list[tuple[str, object]]:
    quarter = [k * epoch_s / 4 for k in range(4)]
    arms = [("alone", lambda t: attach_arm(a, t, [0.0], [step_ms])),
            ("staggered", lambda t: attach_arm(a, t, quarter, [step_ms] * 4)),
            ("mixed", lambda t: attach_arm(a, t, [0.0] * 4, [step_ms] * 3 + [2 * step_ms])),
            ("together", lambda t: attach_arm(a, t, [0.0] * 4, [0.0] * 4)),
            ("staggered_2ranks", lambda t: attach_arm(a, t, quarter, [step_ms] * 4, ranks=2)),
            ("shared_stream", lambda t: shared_stream_arm(a, t))]
    if _tf_installed():
        arms += [("tfdata_alone", lambda t: service_arm(a, t, [0.0], [step_ms])),
                 ("tfdata", lambda t: service_arm(a, t, quarter, [step_ms] * 4))]
    return arms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--images", type=int, default=384)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--memory", default="64MB", help="the server's pool (and the service worker's cache)")
    p.add_argument("--arms", default="", help="comma-separated arms to run (default: all; alone always runs)")
    a = p.parse_args()
    from enspipe.data.synthetic import make_dataset

    with tempfile.TemporaryDirectory() as tmp:
        a.data = os.path.join(tmp, "data")
        make_dataset(a.data, a.images, seed=1, num_classes=10, images_per_shard=128)
        with tempfile.TemporaryDirectory() as t:
            full = attach_arm(argparse.Namespace(**{**vars(a), "epochs": 1}), t, [0.0], [0.0])["rates"][0]
        step_ms = 1e3 * a.batch / (0.5 * full)  # a consumer trains at half what the server makes alone
        epoch_s = a.images / (0.5 * full)
        print(f"one consumer at full speed: {full:.0f} images/s; emulated step {step_ms:.1f} ms per batch of "
              f"{a.batch}; an epoch about {epoch_s:.2f} s; {os.cpu_count()} cores", flush=True)
        arms = [(n, f) for n, f in run_arms(a, step_ms, epoch_s) if not a.arms or n in {"alone", *a.arms.split(",")}]
        got: dict[str, list[dict]] = {name: [] for name, _ in arms}
        for _, (name, fn) in schedule(arms, a.repeats):
            with tempfile.TemporaryDirectory() as t:
                got[name].append(fn(t))
    report(got)


def report(got: dict) -> None:
    alone = float(np.median([r["rates"][0] for r in got["alone"]]))
    tf_alone = float(np.median([r["rates"][0] for r in got["tfdata_alone"]])) if got.get("tfdata_alone") else None
    print("\n| arm | images/s per consumer / alone (median, range over consumers and repeats) | sharing factor | "
          "re-preprocessed share | CPU ms per delivered image | samples missed / twice | exact epochs |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in got.items():
        base = tf_alone if name.startswith("tfdata") else alone
        rates = [x / base for r in rows if "rates" in r for x in r["rates"]]
        fast = [x / base for r in rows if "rates" in r for x in (r["rates"][:3] if name == "mixed" else r["rates"])]
        cell = spread(fast, digits=2) if rates else "-"
        if name == "mixed":
            cell += f" (the slow one {spread([r['rates'][3] / base for r in rows], digits=2)})"
        sharing = spread([r["sharing"] for r in rows], digits=2) if rows[0].get("sharing") else "-"
        again = spread([100 * r["again"] for r in rows], digits=1) + " %" if rows[0].get("again") is not None else "-"
        misses = f"{sum(r['missed'] for r in rows)} / {sum(r['twice'] for r in rows)}" if "missed" in rows[0] else "-"
        exact = ("yes" if all(r["exact"] for r in rows) else "no") if "exact" in rows[0] else "-"
        print(f"| {name} | {cell} | {sharing} | {again} | {spread([r['cpu_ms'] for r in rows], digits=2)} | "
              f"{misses} | {exact} |")
    if "together" in got and "shared_stream" in got:
        ratio = [t["cpu_ms"] / s["cpu_ms"] for t, s in zip(got["together"], got["shared_stream"])]
        print(f"\nattach handoff: CPU per delivered image {spread(ratio, digits=3)}x SharedStream's at n = 4 "
              "(goal: at most 1.05x)")
    if "staggered" in got:
        print(f"staggered: sharing factor {spread([r['sharing'] for r in got['staggered']], digits=2)} (goal >= 3.5, "
              "ideal 4); each consumer's images/s at least 0.9x alone's (goal)")


if __name__ == "__main__":
    q = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("--consumer", "--member", "--service-host", "--trainer"):
        q.add_argument(flag, action="store_true")
    for name, kind in (("--sock", str), ("--start-at", float), ("--step-ms", float), ("--epochs", int), ("--out", str),
                       ("--name", str), ("--data", str), ("--batch", int), ("--size", int), ("--images", int),
                       ("--memory-bytes", int)):
        q.add_argument(name, type=kind)
    known, rest = q.parse_known_args()
    if known.consumer:
        consumer(known)
    elif known.member:
        member(known)
    elif known.service_host:
        service_host(known)
    elif known.trainer:
        trainer(known)
    else:
        main()
