"""An ensemble without Keras: each member trains a softmax regression in plain numpy on the shared
stream, with its own learning rate.

    enspipe make-dataset --out data/train --num-images 960 --num-classes 10
    mpiexec -n 2 python examples/numpy_softmax.py --data data/train --epochs 2

Batches come as read-only numpy arrays that stay valid for as long as they are held, so any
framework (numpy, JAX, PyTorch via ``torch.from_numpy(x.copy())``) can take them. Each member
prints its loss per epoch and, last, that it saw every sample exactly once per epoch.
"""
from __future__ import annotations

import argparse

import numpy as np

import enspipe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training dataset (enspipe make-dataset, or JPEG class folders)")
    p.add_argument("--epochs", type=int, default=2, help="epochs to train (default 2)")
    p.add_argument("--batch-size", type=int, default=32, help="the global batch")
    p.add_argument("--image-size", type=int, default=32, help="preprocessed image side in px (default 32)")
    a = p.parse_args()

    with enspipe.SharedStream(a.data, batch_size=a.batch_size, scheme="all_shared", image_size=a.image_size) as stream:
        lr = 0.01 * (stream.member + 1)  # members differ in learning rate
        rng = np.random.default_rng(stream.member)
        features = a.image_size * a.image_size * 3
        w = rng.normal(0, 0.01, (features, stream.num_classes)).astype(np.float32)
        for epoch in range(a.epochs):
            losses = []
            for images, labels in stream:  # one epoch of read-only numpy batches
                x = images.reshape(len(images), -1)
                logits = x @ w
                logits -= logits.max(axis=1, keepdims=True)
                prob = np.exp(logits)
                prob /= prob.sum(axis=1, keepdims=True)
                losses.append(float(-np.log(prob[np.arange(len(labels)), labels] + 1e-9).mean()))
                prob[np.arange(len(labels)), labels] -= 1.0
                w -= lr * (x.T @ prob) / len(labels)
            print(f"member {stream.member}: epoch {epoch} loss {np.mean(losses):.4f}", flush=True)
    whole = [e for e in stream.epochs() if e["missing"] == 0 and e["count"] == stream.num_images]
    print(f"member {stream.member}: {len(whole)} epochs, each of the {stream.num_images} samples exactly once",
          flush=True)


if __name__ == "__main__":
    main()
