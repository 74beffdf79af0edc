"""A hyperparameter search whose trials share one node's preprocessing: an Optuna study run by
several worker processes on one storage, each trial attaching to the node's attach server,
training a small softmax regression in numpy with its sampled learning rate and weight decay, and
detaching when it ends or is pruned.

    enspipe make-dataset --out data/train --num-images 480 --num-classes 10
    enspipe serve --data data/train --batch-size 32 --image-size 32 &    # one per node
    python examples/optuna_search.py --data data/train --trials 8 --workers 3

(Without a server for the dataset the example starts one and stops it at the end.) Trials start
whenever a worker is free and are pruned at any epoch; each gets its own epochs, every sample
exactly once in each, while the server preprocesses each sample once for every trial that needs
it at about that time. The example prints each trial and, last, the server's sharing factor.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import enspipe


def train_epoch(stream, w: np.ndarray, lr: float, decay: float) -> float:
    """One epoch of the trial's own stream: softmax regression on 8x8 average-pooled pixels; the
    epoch's mean loss."""
    losses = []
    for images, labels in stream:
        n, s = len(images), images.shape[1] // 8
        x = images.reshape(n, 8, s, 8, s, 3).mean(axis=(2, 4)).reshape(n, -1)  # float32, inception's [-1, 1]
        logits = x @ w
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        losses.append(float(-np.log(prob[np.arange(n), labels] + 1e-9).mean()))
        prob[np.arange(n), labels] -= 1.0
        w -= lr * ((x.T @ prob) / n + decay * w)
    return float(np.mean(losses))


def objective(trial, data: str, epochs: int) -> float:
    import optuna

    lr = trial.suggest_float("lr", 1e-3, 3.0, log=True)
    decay = trial.suggest_float("weight_decay", 1e-6, 1e-1, log=True)
    stream = enspipe.attach(data, wire_dtype="float32", name=f"trial{trial.number}")  # a uint8 server is refused
    try:
        w = np.zeros((8 * 8 * 3, stream.num_classes), np.float32)
        for epoch in range(epochs):
            loss = train_epoch(stream, w, lr, decay)
            trial.report(loss, epoch)
            trial.set_user_attr("exact_epochs", sum(e["missing"] == 0 for e in stream.epochs()))
            if trial.should_prune():
                raise optuna.TrialPruned()
        return loss
    finally:
        stream.close()  # detach: the server lets go of what this trial still needed


def worker(storage_path: str, study_name: str, data: str, trials: int, epochs: int) -> None:
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=JournalStorage(JournalFileBackend(storage_path)))
    study.optimize(lambda t: objective(t, data, epochs), n_trials=trials)


def start_server(data: str, batch_size: int, image_size: int):
    """A server for ``data`` where none answers on its socket: the process, else None."""
    from enspipe.serve.wire import default_socket, live_server

    sock = default_socket(data)
    if live_server(sock):
        return None, sock
    proc = subprocess.Popen([sys.executable, "-m", "enspipe", "serve", "--data", data, "--batch-size",
                             str(batch_size), "--image-size", str(image_size), "--memory", "256MB"])
    end = time.monotonic() + 60
    while not live_server(sock):
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit("the attach server did not start")
        time.sleep(0.1)
    return proc, sock


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="the training dataset (enspipe make-dataset, or image folders)")
    p.add_argument("--trials", type=int, default=8, help="trials in all")
    p.add_argument("--workers", type=int, default=3, help="worker processes running trials at once")
    p.add_argument("--epochs", type=int, default=3, help="epochs per trial that is not pruned")
    p.add_argument("--batch-size", type=int, default=32, help="the server's batch, where the example starts it")
    p.add_argument("--image-size", type=int, default=32, help="the server's image side, where the example starts it")
    a = p.parse_args()

    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    server, sock = start_server(a.data, a.batch_size, a.image_size)
    storage_path = os.path.join(tempfile.mkdtemp(prefix="optuna-"), "journal.log")
    study = optuna.create_study(study_name="enspipe", storage=JournalStorage(JournalFileBackend(storage_path)),
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    shares = [a.trials // a.workers + (i < a.trials % a.workers) for i in range(a.workers)]
    procs = [multiprocessing.get_context("spawn").Process(target=worker, args=(storage_path, "enspipe", a.data, n,
                                                                                a.epochs)) for n in shares if n]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    if server is not None:
        server.terminate()  # its last status has the totals
        server.wait()
    for t in sorted(study.trials, key=lambda t: t.number):
        print(f"trial {t.number}: {t.state.name.lower():8s} lr {t.params['lr']:.4f} weight_decay "
              f"{t.params['weight_decay']:.2e} epochs {len(t.intermediate_values)} (each exactly once: "
              f"{t.user_attrs.get('exact_epochs')}) loss {min(t.intermediate_values.values()):.4f}", flush=True)
    print(f"best: trial {study.best_trial.number}, loss {study.best_value:.4f}", flush=True)
    with open(sock + ".status.json") as f:
        status = json.load(f)
    total = status["total"]
    print(f"server ({status['state']}): {total['preprocessed']} images preprocessed, {total['delivered']} delivered, "
          f"sharing factor {total['sharing_factor']}", flush=True)
    if any(p.exitcode for p in procs):
        raise SystemExit("a worker failed")


if __name__ == "__main__":
    main()
