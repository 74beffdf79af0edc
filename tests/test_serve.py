"""The attach server (``enspipe serve``) and its consumers (``enspipe.attach``), as real processes:
exact epochs per consumer, sharing among staggered ones, the status, and the faults: a consumer
killed with SIGKILL, a server that dies, a consumer that asks for another stream, a socket in use
or stale, a budget too small."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import enspipe

from serve_helpers import HERE, ServerProcess, _consumer, _result, _wait_for

pytestmark = pytest.mark.timing  # processes that race each other, waited for with deadlines


@pytest.fixture
def server(tmp_path, dataset):
    s = ServerProcess(tmp_path, dataset)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def test_staggered_consumers_each_get_exact_epochs_and_share(server, tmp_path, dataset):
    a = _consumer(server, tmp_path, dataset, "a", epochs=4, pause=0.1)
    _wait_for(lambda: os.path.exists(a[1] + ".progress"), what="a's first epoch")
    b = _consumer(server, tmp_path, dataset, "b", epochs=3, pause=0.1)
    ra, rb = _result(*a), _result(*b)
    digests = set()
    for r, n in ((ra, 4), (rb, 3)):
        assert [e["epoch"] for e in r["epochs"]] == list(range(n))
        assert all(e["count"] == 50 and e["missing"] == 0 for e in r["epochs"]), r
        digests |= {e["digest"] for e in r["epochs"]}
    assert len(digests) == 1  # the same 50 samples in every epoch of both
    total = server.stop()["total"]
    assert total["delivered"] == 350
    assert total["sharing_factor"] > 1.3, total  # b's epochs overlapped a's last two or three
    assert "stopped" in server.output()


def test_a_consumer_killed_with_sigkill_is_let_go_and_the_others_go_on(server, tmp_path, dataset):
    victim = _consumer(server, tmp_path, dataset, "victim", epochs=50, pause=0.05)
    other = _consumer(server, tmp_path, dataset, "other", epochs=3, pause=0.02)
    _wait_for(lambda: len(server.status()["consumers"]) == 2, what="two consumers")
    victim[0].send_signal(signal.SIGKILL)
    victim[0].wait()
    _wait_for(lambda: any(d["name"] == "victim" for d in server.status()["departed"]), timeout=5,
              what="the server to notice the killed consumer")
    (gone,) = [d for d in server.status()["departed"] if d["name"] == "victim"]
    assert gone["how"] == "gone"
    r = _result(*other)
    assert len(r["epochs"]) == 3 and all(e["missing"] == 0 for e in r["epochs"])
    # nothing held or awaited for the dead one (nor the other, gone too): every copy cached or free
    _wait_for(lambda: server.status()["memory"]["slots_in_use"] == 0, timeout=10, what="every slot let go")


def test_a_server_that_dies_ends_the_consumers_iteration_at_once(server, tmp_path, dataset):
    c = _consumer(server, tmp_path, dataset, "c", epochs=1000, pause=0.01)
    _wait_for(lambda: os.path.exists(c[1] + ".progress"), what="c's first epoch")
    killed = time.monotonic()
    server.proc.send_signal(signal.SIGKILL)
    text = c[0].communicate(timeout=30)[0]
    noticed = time.monotonic() - killed
    assert c[0].returncode == 0, text
    with open(c[1]) as f:
        r = json.load(f)
    assert "has ended" in r["error"] and noticed < 5, (r, noticed)


def test_a_consumer_asking_for_another_stream_is_refused_naming_the_difference(server, dataset, tmp_path):
    import enspipe

    with pytest.raises(enspipe.ConfigError, match="batch_size: the server makes 8, not 16"):
        enspipe.attach(server.sock, batch_size=16)
    with pytest.raises(enspipe.ConfigError, match="image_size: the server makes 32, not 224"):
        enspipe.attach(server.sock, image_size=224)
    from enspipe.data.synthetic import make_dataset

    other = str(tmp_path / "other")
    make_dataset(other, 20, seed=9, num_classes=10, images_per_shard=20)
    with pytest.raises(enspipe.ConfigError, match="dataset: the server serves"):
        enspipe.attach(server.sock, data=other)
    with pytest.raises(enspipe.ConfigError, match="no server answers"):
        enspipe.attach(str(tmp_path / "nobody.sock"))
    with enspipe.attach(server.sock, data=dataset, batch_size=8, image_size=32) as s:  # the same: welcome
        images, labels = s.next_batch()
        assert images.shape == (8, 32, 32, 3) and s.steps_per_epoch == 7


def test_bad_serve_options_exit_2_before_any_work(server, tmp_path, dataset):
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--socket", server.sock)
    assert r.returncode == 2 and "in use by a live server" in r.stderr, r.stderr
    r = enspipe("serve", "--data", dataset, "--batch-size", 64, "--socket", str(tmp_path / "x.sock"),
                "--memory", "1MB")
    assert r.returncode == 2 and "memory" in r.stderr and "one consumer needs at least" in r.stderr, r.stderr
    r = enspipe("serve", "--data", str(tmp_path / "none"), "--batch-size", 8, "--socket", str(tmp_path / "y.sock"))
    assert r.returncode == 2 and "no such directory" in r.stderr
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--preprocess", "resnet")
    assert r.returncode == 2 and "unknown preprocessing" in r.stderr
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--device", "cuda")
    assert r.returncode == 2 and "--device: the pillow backend makes its samples on the CPU into host memory, not on 'cuda'" in r.stderr, r.stderr
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--backend", "gpu", "--preprocess", "mine.aug:fn")
    assert r.returncode == 2 and "the gpu backend runs its own preprocessings" in r.stderr, r.stderr


def test_the_gpu_backends_server_gives_exact_epochs_from_its_tensor_ops(tmp_path, dataset):
    """``--backend gpu --device cpu``: the gpu backend's torch ops (the CPU decoder, CPU tensors)
    make the samples into the pool, a chunk of a batch at a time; two consumers each get exact
    epochs, and the status counts the decodes."""
    pytest.importorskip("torch", reason="the gpu backend's ops are torch's")
    s = ServerProcess(tmp_path, dataset, "--backend", "gpu", "--device", "cpu", "--preprocess", "standard-jitter")
    try:
        a = _consumer(s, tmp_path, dataset, "a", epochs=2)
        b = _consumer(s, tmp_path, dataset, "b", epochs=2)
        for r in (_result(*a), _result(*b)):
            assert [e["count"] for e in r["epochs"]] == [50, 50] and all(e["missing"] == 0 for e in r["epochs"]), r
        status = s.stop()
        assert status["backend"] == "gpu" and status["memory"]["pool_on"] == "host"
        decodes = status["decodes"]
        assert decodes["device"] == "cpu" and decodes["on_cpu"] == status["total"]["preprocessed"] >= 50, status
    finally:
        s.proc.kill()


def test_a_stale_socket_is_removed_with_a_message(tmp_path, dataset):
    import socket as so

    stale = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    stale.bind(str(tmp_path / "s.sock"))
    stale.close()  # the file stays; nobody listens
    s = ServerProcess(tmp_path, dataset, "--idle-exit", "0.5")
    s.proc.wait(30)
    assert "removed a stale socket" in s.output() and s.proc.returncode == 0


def test_memory_stays_within_the_budget_with_a_lagging_consumer(tmp_path, dataset):
    """A pool of 3 batches per consumer and then some; one consumer ten times slower: the fast one
    evicts what the slow one waited for, which is made again for it (counted), and both still get
    exact epochs."""
    s = ServerProcess(tmp_path, dataset, "--ahead", "0", batch=4, memory=str(32 * 32 * 3 * 4 * 28))
    try:
        slow = _consumer(s, tmp_path, dataset, "slow", epochs=1, pause=0.2)
        _wait_for(lambda: any(c["name"] == "slow" for c in s.status()["consumers"]), what="the slow one attached")
        fast = _consumer(s, tmp_path, dataset, "fast", epochs=6, pause=0.0)  # it laps the slow one
        peak = 0
        while fast[0].poll() is None or slow[0].poll() is None:
            peak = max(peak, s.status()["memory"]["held_bytes"])
            time.sleep(0.05)
        for r in (_result(*fast), _result(*slow)):
            assert r["epochs"] and all(e["missing"] == 0 for e in r["epochs"]), r
        status = s.stop()
        assert status["malloc"] == "keep"  # a member's default, in the server and its workers
        assert peak <= status["memory"]["budget_bytes"]
        assert status["total"]["evictions"] > 0 and status["total"]["preprocessed_again"]["evicted"] > 0, status
    finally:
        s.proc.kill()


def test_the_optuna_example_runs_a_search_whose_trials_share_the_server(tmp_path):
    """examples/optuna_search.py: 6 trials in 3 worker processes on one journal storage, some
    pruned; every trial's epochs exact, and the server's sharing factor above 1."""
    pytest.importorskip("optuna", reason="Optuna is not installed here (pip install optuna): the example's test "
                        "skips")
    from enspipe.data.synthetic import make_dataset

    data = str(tmp_path / "d240")
    make_dataset(data, 240, seed=1, num_classes=10, images_per_shard=80)
    import shutil
    import tempfile

    runtime = tempfile.mkdtemp(prefix="enspipe-")  # the example's own server socket, in a short path (< 108 bytes)
    try:
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "optuna_search.py"), "--data", data,
                            "--trials", "6", "--workers", "3", "--epochs", "3"], capture_output=True, text=True,
                           timeout=300, env=dict(os.environ, XDG_RUNTIME_DIR=runtime))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trials = [line for line in r.stdout.splitlines() if line.startswith("trial ")]
    assert len(trials) == 6
    for line in trials:
        epochs = int(line.split(" epochs ")[1].split()[0])
        assert f"(each exactly once: {epochs})" in line, line
    factor = float(r.stdout.split("sharing factor ")[-1].split()[0])
    assert "server (stopped)" in r.stdout and factor > 1.2, r.stdout


def test_the_ray_tune_example_runs_a_search_whose_trials_share_the_server(tmp_path):
    """examples/ray_tune_search.py: 4 trials of a torch model, 2 at a time in Ray's actor
    processes, under ASHA; every trial's epochs exact, each trial's epochs within the limit, and
    the server's deliveries the trials' samples, shared (factor above 1)."""
    pytest.importorskip("ray.tune", reason="Ray Tune is not installed here (pip install 'ray[tune]'): the "
                        "example's test skips")
    pytest.importorskip("torch", reason="the example trains a torch model (pip install torch)")
    import shutil
    import tempfile

    from enspipe.data.synthetic import make_dataset

    data = str(tmp_path / "d160")
    make_dataset(data, 160, seed=1, num_classes=10, images_per_shard=80)
    runtime = tempfile.mkdtemp(prefix="enspipe-")  # the example's own server socket, in a short path (< 108 bytes)
    try:
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "ray_tune_search.py"), "--data", data,
                            "--trials", "4", "--concurrent", "2", "--epochs", "3", "--out", str(tmp_path / "out.json")],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, XDG_RUNTIME_DIR=runtime, RAY_USAGE_STATS_ENABLED="0"))
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["trials"]) == 4
    for t in out["trials"]:
        assert t["error"] is None and 1 <= t["epochs"] <= 3 and t["exact_epochs"] == t["epochs"], t
    assert out["server"]["delivered"] >= 160 * sum(t["epochs"] for t in out["trials"])
    assert out["server"]["sharing_factor"] > 1.0, out["server"]


def test_an_attached_stream_as_torch_tensors_and_jax_arrays(server, dataset):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
    import enspipe

    with enspipe.attach(server.sock) as s:
        batches = list(s.torch(layout="NCHW"))  # the rest of epoch 0
        assert len(batches) == 7 and sum(len(labels) for _, labels in batches) == 50
        images, labels = batches[0]
        assert images.shape == (8, 3, 32, 32) and labels.dtype == torch.int64
        try:
            import jax  # noqa: F401
        except ImportError:
            return
        assert sum(len(labels) for _, labels in s.jax()) == 50  # epoch 1
        assert [e["missing"] for e in s.epochs()] == [0, 0]


def test_the_servers_options_are_the_streams_samples_with_the_same_defaults_and_checks(tmp_path):
    """ServeOptions and StreamConfig are both a SampleConfig: every sample field has one default,
    and a bad value is refused by both, naming the same field with the same problem."""
    import dataclasses

    from enspipe import ConfigError, StreamConfig
    from enspipe.engine.config import SampleConfig
    from enspipe.serve.wire import ServeOptions

    shared = {f.name: f.default for f in dataclasses.fields(SampleConfig)}
    assert {"data", "batch_size", "preprocess", "image_size", "seed", "wire_dtype", "fast_mode", "backend"} <= set(shared)
    for cls in (StreamConfig, ServeOptions):
        assert {f.name: f.default for f in dataclasses.fields(cls) if f.name in shared} == shared, cls
    assert ServeOptions(data=str(tmp_path), batch_size=8).wire_dtype == "float32"  # as SharedStream delivers
    for bad in ({"data": ""}, {"batch_size": 0}, {"image_size": True}, {"seed": 1.5}, {"wire_dtype": "float16"},
                {"fast_mode": "yes"}):
        refusals = []
        for cls in (StreamConfig, ServeOptions):
            with pytest.raises(ConfigError) as e:
                cls(**{"data": str(tmp_path), "batch_size": 8, **bad})
            refusals.append((e.value.field, e.value.problem))
        assert refusals[0] == refusals[1] and refusals[0][0] == next(iter(bad)), refusals
    with pytest.raises(ConfigError, match=r"unknown backend 'tf'; choose one of auto, pillow, gpu"):
        ServeOptions(data=str(tmp_path), batch_size=8, backend="tf")  # a row that does not serve


def test_serve_sizes_its_default_pool_for_its_consumers_and_says_how(tmp_path, dataset):
    """No --memory: the pool holds what 8 consumers need (each batch x (2 + ahead)), said at start
    with how to change it; --workers above the cores this process may use is said in one line."""
    import os

    from conftest import enspipe as cli

    cores = len(os.sched_getaffinity(0))
    r = cli("serve", "--data", dataset, "--batch-size", 8, "--image-size", 32, "--socket", str(tmp_path / "d.sock"),
            "--idle-exit", "0.5", "--workers", cores + 1)
    assert r.returncode == 0, r.stderr
    assert ("pool 256 samples of 12288 bytes (3.0 MiB; sized for 8 consumers, each batch_size x (2 + ahead) = 32 "
            "samples): room for 8 consumers at once; --memory SIZE or --max-consumers N sizes it") in r.stdout, r.stdout
    assert f"--workers {cores + 1} is more than the {cores} cores this process may use" in r.stderr, r.stderr
    r = cli("serve", "--data", dataset, "--batch-size", 8, "--image-size", 32, "--socket", str(tmp_path / "e.sock"),
            "--idle-exit", "0.5", "--max-consumers", 2)
    assert r.returncode == 0 and "pool 72 samples" in r.stdout and "room for 2 consumers" in r.stdout, r.stdout
