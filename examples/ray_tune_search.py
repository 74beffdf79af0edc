"""A Ray Tune search of a torch model whose trials share one node's preprocessing: each trial runs in
its own Ray actor process, attaches to the node's attach server, trains with its sampled learning
rate and width, reports once per epoch, and is stopped early by ASHA or ends; it detaches then.

    enspipe make-dataset --out data/train --num-images 480 --num-classes 10
    enspipe serve --data data/train --batch-size 32 --image-size 32 &     # one per node
    python examples/ray_tune_search.py --data data/train --trials 8 --concurrent 2 --epochs 4

(Without a server for the dataset the example starts one and stops it at the end.) Trials start
whenever Ray has a free CPU, run at their own speeds (their widths differ) and stop at any epoch;
each gets its own epochs, every sample exactly once in each, while the server preprocesses each
sample once for every trial that needs it at about that time. The example prints each trial, the
server's sharing factor (deliveries per preprocessed image) and, with ``--out``, writes both as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

from optuna_search import start_server


def trainable(config: dict) -> None:
    """One trial, in its Ray actor: attach, train a small CNN of ``config``'s width with SGD at its
    learning rate, report the epoch's loss and the stream's ledger each epoch, detach at the end
    (or when ASHA stops it: the actor ends, and the server lets go of what it still needed)."""
    import torch
    from ray import tune

    import enspipe

    torch.set_num_threads(1)
    stream = enspipe.attach(config["data"], wire_dtype="float32",  # inception's [-1, 1]; a uint8 server is refused
                            name=f"trial-{tune.get_context().get_trial_id()}")
    try:
        torch.manual_seed(config["seed"])
        w = config["width"]
        model = torch.nn.Sequential(torch.nn.Conv2d(3, w, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                    torch.nn.Conv2d(w, w, 3, padding=1), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                    torch.nn.Linear(w, stream.num_classes))
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        for epoch in range(config["epochs"]):
            total, batches = 0.0, 0
            for images, labels in stream.torch(layout="channels_last"):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total, batches = total + loss.item(), batches + 1
            ledger = stream.epochs()
            tune.report({"loss": total / batches, "epochs": len(ledger),
                         "exact_epochs": sum(e["missing"] == 0 and e["count"] == stream.num_images for e in ledger)})
    finally:
        stream.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the training dataset (enspipe make-dataset, or image folders)")
    p.add_argument("--trials", type=int, default=8, help="trials in all")
    p.add_argument("--concurrent", type=int, default=2, help="trials at once (each takes one CPU)")
    p.add_argument("--epochs", type=int, default=4, help="epochs of a trial that ASHA does not stop")
    p.add_argument("--batch-size", type=int, default=32, help="the server's batch, where the example starts it")
    p.add_argument("--image-size", type=int, default=32, help="the server's image side, where the example starts it")
    p.add_argument("--out", help="write the trials and the server's totals here as JSON")
    a = p.parse_args()

    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    server, sock = start_server(a.data, a.batch_size, a.image_size)
    ray.init(num_cpus=a.concurrent, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        space = {"lr": tune.loguniform(1e-3, 0.3), "width": tune.choice([8, 16, 32]), "seed": tune.randint(0, 1000),
                 "data": os.path.abspath(a.data), "epochs": a.epochs}
        tuner = tune.Tuner(tune.with_resources(trainable, {"cpu": 1}), param_space=space,
                           tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=a.trials,
                                                       scheduler=ASHAScheduler(max_t=a.epochs, grace_period=1,
                                                                               reduction_factor=2)),
                           run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="ray-tune-"), name="enspipe",
                                                     verbose=0))
        results = tuner.fit()
    finally:
        ray.shutdown()
        if server is not None:
            server.terminate()  # its last status has the totals
            server.wait()
    trials = []
    for r in results:
        m = r.metrics or {}
        trials.append({"trial": m.get("trial_id"), "lr": r.config["lr"], "width": r.config["width"],
                       "epochs": m.get("epochs", 0), "exact_epochs": m.get("exact_epochs", 0), "loss": m.get("loss"),
                       "error": str(r.error) if r.error else None})
        print(f"trial {trials[-1]['trial']}: lr {r.config['lr']:.4f} width {r.config['width']:2d} epochs "
              f"{trials[-1]['epochs']} (each exactly once: {trials[-1]['exact_epochs']}) loss {m.get('loss', 0):.4f}"
              + (f" error {trials[-1]['error']}" if r.error else ""), flush=True)
    with open(sock + ".status.json") as f:
        total = json.load(f)["total"]
    print(f"server: {total['preprocessed']} images preprocessed, {total['delivered']} delivered, sharing factor "
          f"{total['sharing_factor']}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"trials": trials, "server": total}, f, indent=1)
    if any(t["error"] for t in trials):
        raise SystemExit("a trial failed")


if __name__ == "__main__":
    main()
