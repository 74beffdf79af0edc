"""Three different Keras models trained as one ensemble on one shared input pipeline.

Each MPI rank is one member: it builds its own model (defined below), and all of them read one
stream of batches whose preprocessing All-Shared splits among them (each member preprocesses a
third of every batch). Every member trains with ``model.fit``, a validation set, checkpoints and
early stopping, and may train for its own number of epochs: a member that is done keeps serving
its share of the batches to the others until they are done too.

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
                                  preprocess="inception", seed=a.seed)
    import keras

    me = stream.member
    epochs = a.epochs[me] if len(a.epochs) > 1 else a.epochs[0]
    keras.utils.set_random_seed(a.seed + me)
    model = MODELS[me % len(MODELS)](stream.num_classes, a.image_size)
    model.compile(optimizer=keras.optimizers.SGD(a.lr), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    out = os.path.join(a.out, f"member{me}")
    os.makedirs(out, exist_ok=True)
    callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(out, "epoch{epoch:02d}.weights.h5"),
                                                 save_weights_only=True),
                 keras.callbacks.EarlyStopping(monitor="val_loss", patience=a.patience)]
    history = model.fit(stream.dataset(), epochs=epochs, steps_per_epoch=stream.steps_per_epoch,
                        validation_data=enspipe.validation_set(a.validation_data, "inception", a.image_size),
                        callbacks=callbacks, verbose=0)
    stream.close()  # serves the other members' batches until every member is done
    result = {"member": me, "model": model.name, "epochs_trained": len(history.history["loss"]),
              "history": history.history, "stream_epochs": stream.epochs(), "num_images": stream.num_images,
              "scheme": stream.scheme.name}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"member {me} ({model.name}): {result['epochs_trained']} epochs, val_loss "
          f"{history.history['val_loss'][-1]:.3f}", flush=True)


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
    return p.parse_args()


if __name__ == "__main__":
    main()
