"""The example's three Keras models trained three ways, side by side: enspipe's shared stream,
each member's own tf.data pipeline (a user's status quo), and the tf.data service.

    python benchmarks/three_ways.py [--epochs 2] [--image-size 64] [--repeats 3]

Each way is one ``mpiexec -n 3`` job of this file's ``--worker``; every member builds its model
from ``examples/train_ensemble.py`` (small_cnn, wide_cnn, mlp) and trains it with ``model.fit`` for
``--epochs`` epochs of the same synthetic dataset, batch and Slim inception preprocessing:

* ``enspipe``: ``enspipe.SharedStream(scheme="all_shared").dataset()``: each member preprocesses a
  third of every batch, and all-gathers;
* ``own tf.data``: every member reads the records, preprocesses every image itself (the same
  function, on a tf.data map with the member's share of the cores) and batches them;
* ``tf.data service``: member 0 runs the dispatcher and one worker that preprocesses the stream
  once; every member reads it as a trainer of one job through the cross-trainer cache (what the
  service offers for sharing; at most once per trainer, not exactly once).

It prints, per way, the job's wall time (launch to exit: TensorFlow's and MPI's start included),
the time in ``model.fit`` (the slowest member's), and the members' CPU together (user + system
of their processes, every thread), as the median (min-max) of the repeats, the ways interleaved
and counterbalanced within the repeats, with the ratio of each to enspipe paired per repeat.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from cells import MPIEXEC, dataset, schedule, spread

HERE = os.path.dirname(os.path.abspath(__file__))
WAYS = ("enspipe", "own tf.data", "tf.data service")


def _own_pipeline(data: str, batch: int, size: int, seed: int, rank: int, threads: int, repeat: bool):
    """A member's own tf.data pipeline over the dataset's records: shuffle, parse, decode and
    preprocess (Slim inception, the same function enspipe runs), batch, prefetch."""
    import tensorflow as tf

    from enspipe.data.preprocessing import decode, inception_train
    from enspipe.data.build import load_manifest
    from enspipe.data.shards import SLIM_FEATURES

    m = load_manifest(data)

    def one(i, record):
        ex = tf.io.parse_single_example(record, SLIM_FEATURES)
        image = inception_train(decode(ex["image/encoded"]), size, tf.stack([tf.constant(seed, tf.int64), i]))
        return image, ex["image/class/label"]

    ds = tf.data.TFRecordDataset(m.paths()).shuffle(1024, seed=seed + rank)
    ds = (ds.repeat() if repeat else ds).enumerate().map(one, num_parallel_calls=threads)
    opts = tf.data.Options()
    opts.threading.private_threadpool_size = threads
    return ds.batch(batch, drop_remainder=True).prefetch(2).with_options(opts), m


def worker(a: argparse.Namespace) -> None:
    """One member of one way: train the example's model for the epochs, write its numbers."""
    from mpi4py import MPI

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import keras
    from train_ensemble import MODELS

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    threads = max(1, (os.cpu_count() or 1) // n)
    stream = service = None
    if a.way == "enspipe":
        import enspipe

        stream = enspipe.SharedStream(a.data, a.batch_size, scheme="all_shared", image_size=a.image_size)
        ds, steps, classes = stream.dataset(), stream.steps_per_epoch, stream.num_classes
    else:
        ds, m = _own_pipeline(a.data, a.batch_size, a.image_size, 0, rank, threads, repeat=True)
        steps, classes = m.num_images // a.batch_size, m.num_classes
        if a.way == "tf.data service":
            ds, service = _service(ds, comm)
    keras.utils.set_random_seed(rank)
    model = MODELS[rank % len(MODELS)](classes, a.image_size)
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    t0 = time.perf_counter()
    model.fit(ds, epochs=a.epochs, steps_per_epoch=steps, verbose=0)
    fit = time.perf_counter() - t0
    if stream is not None:
        stream.close()
    comm.Barrier()  # the service's dispatcher and worker (member 0) serve until every trainer is done
    del service
    use = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.path.join(a.out, f"member{rank}.json"), "w") as f:
        json.dump({"fit_seconds": fit, "cpu_seconds": use.ru_utime + use.ru_stime}, f)


def _service(ds, comm):
    """Member 0 starts the dispatcher and one worker; every member reads ``ds`` through them as a
    trainer of one shared job (the cross-trainer cache)."""
    import tensorflow as tf

    servers = None
    if comm.Get_rank() == 0:
        dispatcher = tf.data.experimental.service.DispatchServer()
        address = dispatcher.target.split("://")[1]
        w = tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
        servers = (dispatcher, w)
        target = dispatcher.target
    target = comm.bcast(target if comm.Get_rank() == 0 else None, root=0)
    shared = ds.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.OFF, service=target, job_name="ensemble",
        cross_trainer_cache=tf.data.experimental.service.CrossTrainerCache(trainer_id=f"member{comm.Get_rank()}")))
    return shared, servers


def way(a: argparse.Namespace, name: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [MPIEXEC, "-n", "3", sys.executable, os.path.abspath(__file__), "--worker", name, "--out", out,
               "--data", a.data, "--epochs", str(a.epochs), "--image-size", str(a.image_size),
               "--batch-size", str(a.batch_size)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"{name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        members = [json.load(open(os.path.join(out, f"member{k}.json"))) for k in range(3)]
    return {"wall": wall, "fit": max(m["fit_seconds"] for m in members),
            "cpu": sum(m["cpu_seconds"] for m in members)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--images", type=int, default=1024, help="the synthetic dataset's size")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=WAYS, default=None, dest="way", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.way:
        return worker(a)
    a.data = dataset(a.images)
    got: dict[str, list] = {w: [None] * a.repeats for w in WAYS}
    for rep, name in schedule(list(WAYS), a.repeats):
        got[name][rep] = way(a, name)
        g = got[name][rep]
        print(f"repeat {rep} {name}: wall {g['wall']:.1f} s, fit {g['fit']:.1f} s, CPU {g['cpu']:.1f} s", flush=True)
    print(f"\nthree members (small_cnn, wide_cnn, mlp), {a.epochs} epochs of {a.images} images, batch {a.batch_size}, "
          f"{a.image_size} px, {os.cpu_count()} cores, {a.repeats} repeats, median (min-max)\n")
    print("| way | job wall s | model.fit s | CPU s, all members | CPU vs enspipe | wall vs enspipe |\n|---|---|---|---|---|---|")
    for name in WAYS:
        rows = got[name]
        cpu_ratio = [r["cpu"] / e["cpu"] for r, e in zip(rows, got["enspipe"])]
        wall_ratio = [r["wall"] / e["wall"] for r, e in zip(rows, got["enspipe"])]
        print(f"| {name} | {spread([r['wall'] for r in rows], 1, 1)} | {spread([r['fit'] for r in rows], 1, 1)} | "
              f"{spread([r['cpu'] for r in rows], 1, 1)} | {spread(cpu_ratio)} | {spread(wall_ratio)} |")


if __name__ == "__main__":
    main()
