"""Train an ensemble of three JAX models on one shared input pipeline, with no TensorFlow.

Run it with one process per member::

    mpiexec -n 3 python examples/train_ensemble_jax.py --data data/train --validation-data data/val \\
        --out runs/ --epochs 3,1,2

Every member takes its batches from ``enspipe.SharedStream`` as ``jax.Array`` s (``stream.jax()``:
copies, so no array aliases memory enspipe reuses) and trains its own model in plain JAX (an MLP
of its own width, SGD by ``jax.grad``). The members share the decoding and augmentation and each
sees every sample exactly once per epoch; each validates after every epoch, writes a checkpoint
(``.npz``), stops early when its validation loss stops improving, and may train for its own
number of epochs. Each member writes ``OUT/memberK/result.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

import enspipe

WIDTHS = (32, 64, 128)  # each member's hidden width


def _init(key, sizes):
    import jax

    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        key, sub = jax.random.split(key)
        params.append((jax.random.normal(sub, (fan_in, fan_out)) * np.sqrt(2.0 / fan_in), np.zeros(fan_out)))
    return params


def _forward(params, images):
    """Images (uint8 NHWC) pooled to 8 x 8, scaled to [-1, 1], through the MLP -> logits."""
    import jax.numpy as jnp

    b, h, w, c = images.shape
    x = images.astype(jnp.float32) / 127.5 - 1.0
    x = x.reshape(b, 8, h // 8, 8, w // 8, c).mean(axis=(2, 4)).reshape(b, -1)
    for i, (weights, bias) in enumerate(params):
        x = x @ weights + bias
        if i < len(params) - 1:
            x = jnp.maximum(x, 0)
    return x


def _loss(params, images, labels):
    import jax
    import jax.numpy as jnp

    logits = _forward(params, images)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))


def main() -> None:
    a = _args()
    stream = enspipe.SharedStream(a.data, batch_size=a.batch_size, scheme=a.scheme, image_size=a.image_size,
                                  preprocess="inception", seed=a.seed, wire_dtype="uint8")
    import jax

    width = WIDTHS[stream.member % len(WIDTHS)]
    params = _init(jax.random.PRNGKey(a.seed + stream.member), [8 * 8 * 3, width, stream.num_classes])
    val_x, val_y = enspipe.validation_set(a.validation_data, "inception", a.image_size)
    validation = (jax.device_put(np.round((val_x + 1.0) * 127.5).astype(np.uint8)), jax.device_put(val_y))
    epochs = a.epochs[stream.member] if len(a.epochs) > 1 else a.epochs[0]
    history = _fit(stream, params, epochs, validation, _out(a, stream.member), a)
    stream.close()  # serves the other members' batches until every member is done
    result = {"member": stream.member, "model": f"mlp{width}", "epochs_trained": len(history["loss"]),
              "history": history, "stream_epochs": stream.epochs(), "num_images": stream.num_images,
              "scheme": stream.scheme.name}
    with open(os.path.join(_out(a, stream.member), "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"member {stream.member} (mlp{width}): {result['epochs_trained']} epochs, val_loss "
          f"{history['val_loss'][-1]:.3f}", flush=True)


def _fit(stream, params, epochs: int, validation, out: str, a) -> dict:
    import jax

    @jax.jit
    def step(params, images, labels):
        loss, grads = jax.value_and_grad(_loss)(params, images, labels)
        return jax.tree_util.tree_map(lambda p, g: p - a.lr * g, params, grads), loss

    evaluate = jax.jit(_loss)
    history: dict[str, list[float]] = {"loss": [], "val_loss": []}
    best, waited = float("inf"), 0
    for epoch in range(epochs):
        losses = []
        for images, labels in stream.jax():
            params, loss = step(params, images, labels)
            losses.append(float(loss))
        val_loss = float(evaluate(params, *validation))
        history["loss"].append(float(np.mean(losses)))
        history["val_loss"].append(val_loss)
        np.savez(os.path.join(out, f"epoch{epoch + 1:02d}.npz"),
                 **{f"{k}{i}": np.asarray(v) for i, layer in enumerate(params) for k, v in zip("wb", layer)})
        best, waited = (val_loss, 0) if val_loss < best else (best, waited + 1)
        if waited > a.patience:
            break
    return history


def _out(a, member: int) -> str:
    out = os.path.join(a.out, f"member{member}")
    os.makedirs(out, exist_ok=True)
    return out


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training dataset (enspipe make-dataset, or image class folders)")
    p.add_argument("--validation-data", required=True, help="a small dataset each member validates on")
    p.add_argument("--out", required=True, help="where each member writes its checkpoints and result.json")
    p.add_argument("--epochs", default="3", type=lambda s: [int(x) for x in s.split(",")],
                   help="epochs per member: one number for all, or one per member (3,1,2)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64, help="a multiple of 8")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--patience", type=int, default=2, help="epochs without a better validation loss before stopping")
    p.add_argument("--scheme", default="all_shared", help="how the members share preprocessing")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


if __name__ == "__main__":
    main()
