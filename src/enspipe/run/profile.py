"""Measured profiles (``enspipe profile``): a network's training rate on g = 1, 2, 4, ...
accelerators, for FLEET's allocation (:class:`enspipe.plan.fleet.Profile`, ``measured``).

For each g, one short ``enspipe run`` job trains the network as one data-parallel member on g
ranks (``--consumer train --data-parallel g``: each rank trains on its part of every batch and
the ranks all-reduce gradients). The rate on g is the images the member trained over the seconds
its consumer spent training (``trained_images / accelerator_busy_seconds``, the slowest rank's):
the training's own pace, without the input pipeline's waits. On a machine with GPUs each rank
trains on one; without, on its CPU cores (and the profile says ``device: CPU``, so a CPU profile is
never mistaken for an accelerator's).

Its ``layers`` (:func:`layer_profile`), for Prophet's blocks (``--gradient-exchange prophet``):
per count g, at a rank's share of the batch, each trainable variable's gradient size and when
backpropagation makes it, and the forward pass's time, measured in this process by hooks on the
gradients that run as soon as each exists (a stateless ``numpy_function``; medians over steps).

A profile is cached per network, image size, batch and machine (:func:`profile_path`): a second
``enspipe profile`` with the same key reads it instead of measuring (``--force`` measures again).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time

from enspipe.common.atomic import write_json_atomic
from enspipe.common.tfimport import import_tensorflow
from enspipe.measure.node import cpu_model
from enspipe.models.networks import network_spec
from enspipe.plan.fleet import fill_rates
from enspipe.plan.gradients import LayerProfile


def machine() -> dict:
    """What a profile was measured on: the host, its CPU model and count, its GPUs."""
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.split("\n")
        gpus = [g.strip() for g in gpus if g.strip()]
    except (OSError, subprocess.SubprocessError):
        gpus = []
    return {"node": platform.node(), "cpu_model": cpu_model(), "cpus": os.cpu_count(), "gpus": gpus}


def machine_key(m: dict) -> str:
    """A short key of the machine's hardware (not its host name: identical nodes share profiles)."""
    return hashlib.sha256(json.dumps([m["cpu_model"], m["cpus"], m["gpus"]]).encode()).hexdigest()[:12]


def profile_path(cache: str, network: str, image_size: int, batch: int, m: dict) -> str:
    return os.path.join(cache, f"{network}_{image_size}px_b{batch}_{machine_key(m)}.json")


def measure(network: str, data: str, cache: str, accelerators: tuple[int, ...], batch: int, steps: int,
            image_size: int, lr: float, run_args: list[str], launcher: list[str], force: bool = False,
            say=print) -> dict:
    """The network's profile (measured now, or the cached one); raises RuntimeError naming the
    failed job's log."""
    m = machine()
    path = profile_path(cache, network, image_size, batch, m)
    if os.path.exists(path) and not force:
        with open(path) as f:
            cached = json.load(f)
        if [r["accelerators"] for r in cached["runs"]] == list(accelerators):
            say(f"profile of {network} on this machine, cached: {path}")
            return cached
    runs = []
    work = path[:-len(".json")] + ".runs"
    for g in accelerators:
        out = os.path.join(work, f"g{g}")
        cmd = [*launcher, "-n", str(g), sys.executable, "-m", "enspipe", "run", "--data", data, "--out", out,
               "--scheme", "all_shared" if g > 1 else "baseline", "--consumer", "train", "--network", network,
               "--data-parallel", str(g), "--batch-size", str(batch), "--steps", str(steps),
               "--image-size", str(image_size), "--lr", str(lr), *run_args]
        os.makedirs(work, exist_ok=True)
        log = os.path.join(work, f"g{g}.log")
        with open(log, "w") as f:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        if rc != 0:
            raise RuntimeError(f"profiling {network} on {g} accelerator(s) failed (exit {rc}); see {log}")
        with open(os.path.join(out, "summary.json")) as f:
            s = json.load(f)
        busy = max(x["accelerator_busy_seconds"] for x in s["ranks"])
        trained = s["ranks"][0]["trained_images"]
        runs.append({"accelerators": g, "rate": trained / busy, "trained_images": trained, "busy_seconds": busy,
                     "device": s["ranks"][0]["device"], "out": os.path.abspath(out)})
        say(f"{network} on {g}: {trained / busy:.1f} images/s ({s['ranks'][0]['device']})")
    num_classes = json.load(open(os.path.join(data, "manifest.json")))["num_classes"]
    layers = {str(g): layer_profile(network, num_classes, image_size, max(1, batch // g), steps).as_dict()
              for g in accelerators}
    record = {"network": network, "image_size": image_size, "batch_size": batch, "source": "measured",
              "device": runs[0]["device"], "machine": m, "machine_key": machine_key(m), "measured": time.time(),
              "accelerators": list(accelerators), "rates": [r["rate"] for r in runs], "runs": runs,
              "layers": layers}
    write_json_atomic(path, record)
    return record


def layer_profile(network: str, num_classes: int, image_size: int, batch: int, steps: int = 10, seed: int = 0):
    """The network's :class:`~enspipe.plan.gradients.LayerProfile` at ``batch`` images a rank, on
    this process's device: medians over ``steps`` training steps after 3 unmeasured ones (random
    images: the times do not depend on the pixels)."""
    import_tensorflow(trains=True)
    import keras
    import numpy as np
    import tensorflow as tf

    model = network_spec(network).build(num_classes, image_size, seed)
    variables = model.trainable_variables
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(learning_rate=1e-4)
    stamps: dict[int, float] = {}

    def stamp(i):
        def at(*_):
            stamps[i] = time.perf_counter()
            return np.int32(i)
        return at

    @tf.function(jit_compile=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        marks = [tf.numpy_function(stamp(-1), [loss], tf.int32, stateful=False)]
        grads = tape.gradient(loss, variables)
        marks += [tf.numpy_function(stamp(i), [g], tf.int32, stateful=False) for i, g in enumerate(grads)]
        optimizer.apply_gradients(zip(grads, variables))
        return marks

    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (batch, image_size, image_size, 3)).astype(np.float32)
    y = rng.integers(0, num_classes, batch).astype(np.int32)
    forward, ready = [], []
    for k in range(3 + steps):
        stamps.clear()
        t0 = time.perf_counter()
        step(x, y)
        if k >= 3:
            forward.append(stamps[-1] - t0)
            ready.append([stamps[i] - stamps[-1] for i in range(len(variables))])
    # a hook may run a little after a gradient it follows (its thread's turn): never before the loss
    return LayerProfile(tuple(v.path for v in variables),
                        tuple(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables),
                        tuple(max(0.0, float(t)) for t in np.median(ready, axis=0)), float(np.median(forward)), batch)


def layers_for(record: dict, ranks: int):
    """The profile's layers measured at ``ranks`` ranks (or the nearest count measured)."""
    layers = record.get("layers") or {}
    if not layers:
        return None
    g = min(layers, key=lambda k: (abs(int(k) - ranks), int(k)))
    return LayerProfile.from_dict(layers[g])


def rates_by_count(record: dict) -> tuple[float, ...]:
    """The profile's rates on 1..max(measured) accelerators (see :func:`enspipe.plan.fleet.fill_rates`)."""
    return fill_rates(record["accelerators"], record["rates"])
