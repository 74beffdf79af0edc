"""Three different Keras models trained as one ensemble on one shared input pipeline.

Each MPI rank is one member: it builds its own model (defined below), and all of them read one
stream of batches whose preprocessing All-Shared splits among them (each member preprocesses a
third of every batch). Every member trains with ``model.fit``, a validation set, checkpoints and
early stopping, and may train for its own number of epochs: a member that is done keeps serving
its share of the batches to the others until they are done too. With ``--members-per-rank K`` a
process trains K of the members on every batch it gets (``mpiexec -n 1 ... --members-per-rank 3``:
the whole ensemble in one process, one pipeline, no exchange).

    enspipe make-dataset --out data/train --num-images 960 --num-classes 10
    enspipe make-dataset --out data/val --num-images 96 --num-classes 10 --seed 1
    mpiexec -n 3 python examples/train_ensemble.py --data data/train --validation-data data/val \
        --out runs/ensemble --epochs 3

``--data`` may also be a folder of JPEGs with one subfolder per class. Each member writes
``OUT/member<k>/`` (its checkpoints and ``result.json``: its model, history and the epochs its
stream delivered, each sample exactly once).
"""
from __future__ import annotations

import argparse
import json
import os

import enspipe


def small_cnn(num_classes: int, size: int):
    import keras

    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes),
    ], name="small_cnn")


def wide_cnn(num_classes: int, size: int):
    import keras

    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.Conv2D(48, 5, strides=4, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(num_classes),
    ], name="wide_cnn")


def mlp(num_classes: int, size: int):
    import keras

    return keras.Sequential([
        keras.Input((size, size, 3)),
        keras.layers.AveragePooling2D(4),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(num_classes),
    ], name="mlp")


MODELS = [small_cnn, wide_cnn, mlp]


def main() -> None:
    a = _args()
    stream = enspipe.SharedStream(a.data, batch_size=a.batch_size, scheme=a.scheme, image_size=a.image_size,
                                  preprocess="inception", seed=a.seed, members_per_rank=a.members_per_rank)
    import keras

    validation = enspipe.validation_set(a.validation_data, "inception", a.image_size)
    models = {}
    for m in stream.local_members:  # one member per process, or several (--members-per-rank)
        keras.utils.set_random_seed(a.seed + m)
        models[m] = MODELS[m % len(MODELS)](stream.num_classes, a.image_size)
        models[m].compile(optimizer=keras.optimizers.SGD(a.lr), metrics=["accuracy"],
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    epochs = {m: a.epochs[m] if len(a.epochs) > 1 else a.epochs[0] for m in models}
    if len(models) == 1:
        histories = {m: _fit(stream, model, epochs[m], validation, _out(a, m), a.patience) for m, model in models.items()}
    else:
        histories = _train_together(stream, models, epochs, validation, a)
    stream.close()  # serves the other members' batches until every member is done
    for m, history in histories.items():
        result = {"member": m, "model": models[m].name, "epochs_trained": len(history["loss"]), "history": history,
                  "stream_epochs": stream.epochs(), "num_images": stream.num_images, "scheme": stream.scheme.name}
        with open(os.path.join(_out(a, m), "result.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(f"member {m} ({models[m].name}): {result['epochs_trained']} epochs, val_loss "
              f"{history['val_loss'][-1]:.3f}", flush=True)


def _fit(stream, model, epochs: int, validation, out: str, patience: int) -> dict:
    """One member in this process: Keras's own loop, with checkpoints and early stopping."""
    import keras

    callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(out, "epoch{epoch:02d}.weights.h5"),
                                                 save_weights_only=True),
                 keras.callbacks.EarlyStopping(monitor="val_loss", patience=patience)]
    return model.fit(stream.dataset(), epochs=epochs, steps_per_epoch=stream.steps_per_epoch,
                     validation_data=validation, callbacks=callbacks, verbose=0).history


def _train_together(stream, models: dict, epochs: dict, validation, a) -> dict:
    """Several members in this process: every batch trains each member still training, one after
    another; each validates, checkpoints and may stop early at its epoch ends."""
    histories = {m: {} for m in models}
    best, waited, training = {m: float("inf") for m in models}, dict.fromkeys(models, 0), set(models)
    for epoch in range(max(epochs.values())):
        training = {m for m in training if epoch < epochs[m]}
        if not training:
            break
        for images, labels in stream:  # one epoch of the shared stream
            logs = {m: models[m].train_on_batch(images, labels, return_dict=True) for m in training}
        for m in sorted(training):
            val = models[m].evaluate(*validation, verbose=0, return_dict=True)
            for k, v in {**logs[m], **{f"val_{k}": v for k, v in val.items()}}.items():
                histories[m].setdefault(k, []).append(float(v))
            models[m].save_weights(os.path.join(_out(a, m), f"epoch{epoch + 1:02d}.weights.h5"))
            best[m], waited[m] = (val["loss"], 0) if val["loss"] < best[m] else (best[m], waited[m] + 1)
            if waited[m] > a.patience:
                training.discard(m)
    return histories


def _out(a, member: int) -> str:
    out = os.path.join(a.out, f"member{member}")
    os.makedirs(out, exist_ok=True)
    return out


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training dataset (enspipe make-dataset, or JPEG class folders)")
    p.add_argument("--validation-data", required=True, help="a small dataset each member validates on")
    p.add_argument("--out", required=True, help="where each member writes its checkpoints and result.json")
    p.add_argument("--epochs", type=lambda s: [int(x) for x in s.split(",")], default=[3],
                   help="epochs to train: one for every member, or E0,E1,E2 one per member (default 3)")
    p.add_argument("--batch-size", type=int, default=32, help="the global batch every member trains on")
    p.add_argument("--image-size", type=int, default=64, help="preprocessed image side in px (default 64)")
    p.add_argument("--scheme", default="all_shared", help="how the members share preprocessing")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    p.add_argument("--patience", type=int, default=5, help="early stopping: epochs without a better val_loss")
    p.add_argument("--seed", type=int, default=0, help="data order, augmentation and initialisation seed")
    p.add_argument("--members-per-rank", type=int, default=1, help="members each process trains on every batch "
                   "(default 1: one per rank; 3 with mpiexec -n 1: the whole ensemble in one process)")
    return p.parse_args()


if __name__ == "__main__":
    main()
