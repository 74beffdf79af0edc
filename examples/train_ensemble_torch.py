"""Train an ensemble of three PyTorch models on one shared input pipeline, with no TensorFlow.

Run it with one process per member (each rank trains one ``torch.nn`` model)::

    mpiexec -n 3 python examples/train_ensemble_torch.py --data data/train --validation-data data/val \\
        --out runs/ --epochs 3,1,2

Every member takes its batches from ``enspipe.SharedStream`` as torch tensors (``stream.torch()``:
channels-last, on the GPU where there is one): the members share the decoding and augmentation
(All-Shared by default) and each sees every sample exactly once per epoch. Each member validates
after every epoch, writes a checkpoint, stops early when its validation loss stops improving, and
may train for its own number of epochs (``--epochs 3,1,2``); a member that is done serves its
share of the batches to the others until they are done too. Each member writes
``OUT/memberK/result.json``: its losses, its epochs and the stream's per-epoch ledger.
"""
from __future__ import annotations

import argparse
import json
import os

import enspipe


def small_cnn(num_classes: int):
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, num_classes))


def wide_cnn(num_classes: int):
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 48, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(48, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(64, num_classes))


def mlp(num_classes: int):
    import torch.nn as nn

    return nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(3 * 64, 64), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(64, num_classes))


MODELS = [small_cnn, wide_cnn, mlp]


def main() -> None:
    a = _args()
    # uint8 on the wire: 4x less to exchange; the model sees x / 127.5 - 1, inception's [-1, 1]
    stream = enspipe.SharedStream(a.data, batch_size=a.batch_size, scheme=a.scheme, image_size=a.image_size,
                                  preprocess="inception", seed=a.seed, wire_dtype="uint8")
    import torch

    torch.manual_seed(a.seed + stream.member)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    build = MODELS[stream.member % len(MODELS)]
    model = build(stream.num_classes).to(device).to(memory_format=torch.channels_last)
    val_x, val_y = enspipe.validation_set(a.validation_data, "inception", a.image_size)
    validation = (torch.from_numpy(val_x).permute(0, 3, 1, 2).to(device), torch.from_numpy(val_y).long().to(device))
    epochs = a.epochs[stream.member] if len(a.epochs) > 1 else a.epochs[0]
    history = _fit(stream, model, epochs, validation, _out(a, stream.member), a, device)
    stream.close()  # serves the other members' batches until every member is done
    result = {"member": stream.member, "model": build.__name__, "epochs_trained": len(history["loss"]),
              "history": history, "stream_epochs": stream.epochs(), "num_images": stream.num_images,
              "scheme": stream.scheme.name, "device": str(device)}
    with open(os.path.join(_out(a, stream.member), "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"member {stream.member} ({build.__name__}): {result['epochs_trained']} epochs, val_loss "
          f"{history['val_loss'][-1]:.3f}", flush=True)


def _fit(stream, model, epochs: int, validation, out: str, a, device) -> dict:
    """The member's loop: an epoch of the shared stream, validation, a checkpoint, early stopping."""
    import torch

    optimizer = torch.optim.SGD(model.parameters(), lr=a.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    history: dict[str, list[float]] = {"loss": [], "val_loss": []}
    best, waited = float("inf"), 0
    for epoch in range(epochs):
        model.train()
        total, batches = 0.0, 0
        for images, labels in stream.torch(layout="channels_last", device=device):
            loss = loss_fn(model(images.float() / 127.5 - 1.0), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        model.eval()
        with torch.no_grad():
            val_loss = float(loss_fn(model(validation[0]), validation[1]))
        history["loss"].append(total / batches)
        history["val_loss"].append(val_loss)
        torch.save(model.state_dict(), os.path.join(out, f"epoch{epoch + 1:02d}.pt"))
        best, waited = (val_loss, 0) if val_loss < best else (best, waited + 1)
        if waited > a.patience:
            break
    return history


def _out(a, member: int) -> str:
    out = os.path.join(a.out, f"member{member}")
    os.makedirs(out, exist_ok=True)
    return out


def _args(doc: str = __doc__) -> argparse.Namespace:
    """The members' options (the Lightning example's too; ``doc``: the script's docstring)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training dataset (enspipe make-dataset, or image class folders)")
    p.add_argument("--validation-data", required=True, help="a small dataset each member validates on")
    p.add_argument("--out", required=True, help="where each member writes its checkpoints and result.json")
    p.add_argument("--epochs", default="3", type=lambda s: [int(x) for x in s.split(",")],
                   help="epochs per member: one number for all, or one per member (3,1,2)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--patience", type=int, default=2, help="epochs without a better validation loss before stopping")
    p.add_argument("--scheme", default="all_shared", help="how the members share preprocessing")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


if __name__ == "__main__":
    main()
