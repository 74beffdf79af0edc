"""Train an ensemble of three Lightning members on one shared input pipeline: each its own
``LightningModule`` and ``Trainer(devices=1)``, none joined into another's DDP job.

Run it with one process per member, under torchrun or MPI's launcher::

    torchrun --nproc-per-node 3 examples/train_ensemble_lightning.py --data data/train \\
        --validation-data data/val --out runs/ --epochs 3,1,2
    mpiexec -n 3 python examples/train_ensemble_lightning.py ...          (the same)

Every member's ``Trainer`` fits on ``stream.torch().loader()`` (a DataLoader of the stream's
batches: one epoch each time Lightning iterates it, ``len()`` the batches per epoch), validates
after every epoch, keeps a checkpoint per epoch and stops early when its validation loss stops
improving; a member that is done serves its share of the batches to the others until they are
done too. Each member writes ``OUT/memberK/result.json`` (its losses, its epochs, the stream's
per-epoch ledger and what its Trainer was), its checkpoints and its CSV log.

The one setting Lightning needs: ``plugins=[enspipe.lightning_member()]``. Under torchrun or
mpiexec Lightning sees a job of several processes (its TorchElastic or MPI environment) and would
make them one data-parallel model; this environment tells each Trainer that it is a job of one
process, rank 0, so each member trains its own model and saves its own checkpoints.
"""
from __future__ import annotations

import json
import os
import warnings

import enspipe
from train_ensemble_torch import MODELS, _args


def main() -> None:
    a = _args(__doc__)
    # uint8 on the wire: 4x less to exchange; the model sees x / 127.5 - 1, inception's [-1, 1]
    stream = enspipe.SharedStream(a.data, batch_size=a.batch_size, scheme=a.scheme, image_size=a.image_size,
                                  preprocess="inception", seed=a.seed, wire_dtype="uint8")
    import lightning as L
    import torch

    L.seed_everything(a.seed + stream.member, verbose=False)
    build = MODELS[stream.member % len(MODELS)]
    member = _module(build(stream.num_classes), a.lr)
    epochs = a.epochs[stream.member] if len(a.epochs) > 1 else a.epochs[0]
    out = os.path.join(a.out, f"member{stream.member}")
    val_x, val_y = enspipe.validation_set(a.validation_data, "inception", a.image_size)
    validation = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.from_numpy(val_x).permute(0, 3, 1, 2), torch.from_numpy(val_y).long()), batch_size=64)
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(os.path.join(out, "checkpoints"), "epoch{epoch:02d}",
                                                      save_top_k=-1, auto_insert_metric_name=False)
    trainer = L.Trainer(devices=1, accelerator="auto", max_epochs=epochs, plugins=[enspipe.lightning_member()],
                        callbacks=[L.pytorch.callbacks.EarlyStopping("val_loss", patience=a.patience), checkpoints],
                        logger=L.pytorch.loggers.CSVLogger(out, name="log"), enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")  # the batches come ready
        # Lightning suggests sync_dist=True where torch.distributed is up (torchrun's members): that would
        # average the members' metrics over the stream's process group; each member's metrics are its own
        warnings.filterwarnings("ignore", ".*sync_dist=True.*")
        # stream.torch() itself would do; .loader() is the same batches as a DataLoader, which some of
        # Lightning's and Hugging Face's checks insist on
        trainer.fit(member, train_dataloaders=stream.torch(layout="channels_last").loader(),
                    val_dataloaders=validation)
    stream.close()  # serves the other members' batches until every member is done
    result = {"member": stream.member, "model": build.__name__, "epochs_trained": trainer.current_epoch,
              "history": member.history, "stream_epochs": stream.epochs(), "num_images": stream.num_images,
              "scheme": stream.scheme.name, "transport": stream.config.transport,
              "trainer": {"world_size": trainer.world_size, "global_rank": trainer.global_rank,
                          "strategy": type(trainer.strategy).__name__}}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"member {stream.member} ({build.__name__}): {result['epochs_trained']} epochs, val_loss "
          f"{member.history['val_loss'][-1]:.3f}", flush=True)


def _module(net, lr: float):
    """The member's LightningModule: ``net`` trained with SGD on cross-entropy."""
    import lightning as L
    import torch

    class Member(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net.to(memory_format=torch.channels_last)
            self.history: dict[str, list[float]] = {"loss": [], "val_loss": []}

        def forward(self, images):
            return self.net(images.float() / 127.5 - 1.0)

        def training_step(self, batch, _):
            loss = torch.nn.functional.cross_entropy(self(batch[0]), batch[1])
            self.log("loss", loss, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch, _):
            self.log("val_loss", torch.nn.functional.cross_entropy(self(batch[0]), batch[1]))

        def on_validation_epoch_end(self):
            self.history["val_loss"].append(float(self.trainer.callback_metrics["val_loss"]))

        def on_train_epoch_end(self):
            self.history["loss"].append(float(self.trainer.callback_metrics["loss"]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=lr)

    return Member()


if __name__ == "__main__":
    main()
