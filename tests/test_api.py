"""The library: enspipe.SharedStream called from a member's own script under mpiexec."""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import EVERY_SCHEME, MPIEXEC, cell_said, enspipe, run_cells, said, selected, step_values

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def members(mode: str, n: int, out, timeout: float = 240, without_tf: bool = False, **options):
    """Run tests/stream_member.py under mpiexec -n ``n`` (``without_tf``: as where TensorFlow is not
    installed, tests/without_tf.py); returns (CompletedProcess, per-member json)."""
    cmd = [MPIEXEC, "-n", str(n), sys.executable, *([os.path.join(HERE, "without_tf.py")] if without_tf else []),
           os.path.join(HERE, "stream_member.py"), mode, str(out), json.dumps(options)]
    env = {**os.environ, "ENSPIPE_TEST_HANG_S": str(max(timeout - 30, timeout / 2))}  # stacks, not silence
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    found = [out / f"member{k}.json" for k in range(n)]
    return r, [json.loads(p.read_text()) for p in found if p.exists()]


def member_cases(n: int, out, cases: dict, timeout: float = 600):
    """Several streams one after another in one job of ``n`` members (tests/stream_member.py
    ``cases``: MPI and TensorFlow start once), each case ``name: (mode, options)``; returns
    (CompletedProcess, {name: per-member json})."""
    spec = json.dumps([[name, mode, options] for name, (mode, options) in cases.items()])
    cmd = [MPIEXEC, "-n", str(n), sys.executable, os.path.join(HERE, "stream_member.py"), "cases", str(out), spec]
    env = {**os.environ, "ENSPIPE_TEST_HANG_S": str(timeout - 30)}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return r, {name: [json.loads(p.read_text()) for p in (out / name / f"member{k}.json" for k in range(n))
                      if p.exists()] for name in cases}


def test_the_public_names_are_documented_and_import_lazily():
    code = ("import sys, enspipe; assert 'tensorflow' not in sys.modules and 'mpi4py' not in sys.modules; "
            "print(sorted(n for n in enspipe.__all__ if not getattr(enspipe, n).__doc__ and n != '__version__'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize("options, field", [
    ({"batch_size": 0}, "batch_size"),
    ({"scheme": "all_shard"}, "scheme"),
    ({"scheme": "tfdata_service"}, "scheme"),
    ({"preprocess": "inceptoin"}, "preprocess"),
    ({"preprocess": lambda image, seed: image, "wire_dtype": "uint8"}, "wire_dtype"),
    ({"data": "/nonexistent/enspipe-data"}, "data"),
    ({"peer_timeout": 0}, "peer_timeout"),
    ({"threads": 0}, "threads"),
    ({"cores": 0}, "cores"),
    ({"cores": True}, "cores"),
    ({"scheme": "auto"}, "calibration"),
    ({"calibration": "rates.json"}, "calibration"),
])
def test_bad_options_name_their_field_before_any_collective(dataset, options, field):
    import enspipe

    kwargs = {"data": dataset, "batch_size": 10, **options}
    with pytest.raises(enspipe.ConfigError) as e:
        enspipe.SharedStream(kwargs.pop("data"), kwargs.pop("batch_size"), **kwargs)
    assert e.value.field == field


def _raises(image, seed):
    raise RuntimeError("my augmentation is broken")


def _ragged(image, seed):
    import tensorflow as tf

    side = 30 + tf.cast(tf.random.stateless_uniform([], seed, 0, 8, tf.int32), tf.int32)
    return tf.image.resize(image, tf.stack([side, side]))


def _two(image, seed):
    return image, image


@pytest.mark.parametrize("fn, words", [
    (_raises, "my augmentation is broken"),
    (_ragged, "not a fixed one"),
    (_two, "not one tensor"),
])
def test_a_user_preprocess_that_fails_its_probe_is_named(dataset, fn, words):
    import enspipe

    with pytest.raises(enspipe.ConfigError) as e:
        enspipe.SharedStream(dataset, 10, preprocess=fn)
    assert e.value.field == "preprocess"
    assert fn.__name__ in str(e.value) and words in str(e.value)


KEPT = [
    # the MPI path's receive ring, where held slots are pinned: quick, with a user's preprocess (below)
    pytest.param("all_shared", None, False, marks=pytest.mark.slow),
    pytest.param("all_shared", None, True, marks=pytest.mark.slow),  # node-shared slots: copied out
    pytest.param("baseline", None, True, marks=pytest.mark.slow),
    pytest.param("single_broadcast", 1, False, marks=pytest.mark.slow),
]
CHECKSUM_STEPS = 8


@pytest.fixture(scope="module")
def two_members(request, dataset, tmp_path_factory) -> dict:
    """The selected cases of the two tests below in two jobs of 2 members: every library stream
    one after another (tests/stream_member.py cases), and the enspipe run cells to compare with
    (enspipe run-cells). Returns {case: per-member json}, and under "cells" {scheme, p: folder}."""
    kept = {f"keep-{c['scheme']}-{c['p']}-{c['shm']}": ("keep", dict(
        data=dataset, batch_size=10, image_size=32, scheme=c["scheme"], preprocessors=c["p"], node_shm=c["shm"],
        queue_depth=2, block_images=1, steps=15)) for c in selected(request, "test_kept_batches_never_change")}
    delivered = selected(request, "test_the_library_delivers_the_batches_enspipe_run_does")
    # batch 10 divides the dataset: the library's epochs are the cell's global batches (where it does
    # not, the library regroups the same samples at epoch ends: tests/test_epochs.py)
    sums = {f"sums-{c['scheme']}-{c['p']}": ("checksums", dict(data=dataset, batch_size=10, image_size=32,
                                                               scheme=c["scheme"], preprocessors=c["p"],
                                                               steps=CHECKSUM_STEPS)) for c in delivered}
    if delivered:  # the first also as SharedStream(StreamConfig(...)): the same stream
        first = next(iter(sums.values()))
        sums["sums-config"] = (first[0], {**first[1], "as_config": True, "cores": 1})  # pinned as cells are
    out = tmp_path_factory.mktemp("two_members")
    r, res = member_cases(2, out, kept | sums)
    res["job"] = r
    cells = {(c["scheme"], c["p"]): ["--data", dataset, "--scheme", c["scheme"], "--batch-size", 10, "--image-size",
                                     32, "--warmup", 0, "--steps", CHECKSUM_STEPS, "--batch-checksums", "--consumer",
                                     "peak", "--cpu-monitor", "none", *(["--preprocessors", c["p"]] if c["p"] else [])]
             for c in delivered}
    res["cells"] = run_cells(2, cells, tmp_path_factory.mktemp("cells")) if cells else {}
    return res


@pytest.mark.mpi
@pytest.mark.parametrize("scheme, p, shm", KEPT)
def test_kept_batches_never_change(two_members, scheme, p, shm):
    """Every batch is kept for 3 epochs' worth of steps, far past twice any ring's depth (queue 2:
    a ring of 2 + 1 + unit slots), and still equals its checksum taken when it came."""
    res = two_members[f"keep-{scheme}-{p}-{shm}"]
    assert len(res) == 2, said(two_members["job"])
    _kept_unchanged(res, scheme, shm)


def _kept_unchanged(res: list[dict], scheme: str, shm: bool) -> None:
    assert len(res) == 2
    for m in res:
        assert all(row["read_only"] for row in m["rows"])
        assert [row["first"] for row in m["rows"]] == [row["last"] for row in m["rows"]]
        assert [(e["count"], e["missing"]) for e in m["epochs"]] == [(50, 0)] * 3  # 150 samples: 3 whole epochs
    if scheme == "all_shared" and not shm:
        assert res[0]["paths"] == {"0,1": "mpi"}
        assert res[0]["ring_replaced"] > 0  # the pin did the work: slots were left to their holders
    if scheme != "baseline":
        assert [x["first"] for x in res[0]["rows"]] == [x["first"] for x in res[1]["rows"]]


@pytest.mark.mpi
@pytest.mark.parametrize("scheme, p", EVERY_SCHEME)
def test_the_library_delivers_the_batches_enspipe_run_does(two_members, scheme, p):
    res, out = two_members[f"sums-{scheme}-{p}"], two_members["cells"][(scheme, p)]
    assert len(res) == 2, said(two_members["job"])
    assert os.path.exists(os.path.join(out, "summary.json")), cell_said(out)
    for rank in range(2):
        assert [x["first"] for x in res[rank]["rows"]] == step_values(out, rank, "batch_checksum")[:CHECKSUM_STEPS]
    first = next(k for k in two_members if k.startswith("sums-") and k != "sums-config")
    if first == f"sums-{scheme}-{p}":
        pinned = two_members["sums-config"]
        assert [m["rows"] for m in pinned] == [m["rows"] for m in res]
        # cores=1: each member on one core of its own while the host has two (shared where it has one)
        cores = [m["affinity"] for m in pinned]
        assert all(len(c) == 1 for c in cores), cores
        assert len({c[0] for c in cores}) == min(2, len(os.sched_getaffinity(0))), cores


@pytest.mark.mpi
def test_a_user_preprocess_goes_on_the_wire_as_it_returns_and_kept_batches_never_change(dataset, tmp_path):
    r, res = members("keep", 2, tmp_path, data=dataset, batch_size=10, preprocess="gray40", scheme="all_shared",
                     node_shm=False, queue_depth=2, block_images=1, steps=15)
    assert r.returncode == 0, said(r)
    assert res[0]["spec"] == [[40, 40, 1], "uint8"]
    assert {(tuple(x["shape"]), x["dtype"]) for m in res for x in m["rows"]} == {((10, 40, 40, 1), "uint8")}
    _kept_unchanged(res, "all_shared", False)


@pytest.mark.timing
@pytest.mark.mpi
def test_an_exception_inside_the_stream_aborts_the_job_fast_naming_it(dataset, tmp_path):
    t = time.monotonic()
    r, _ = members("raise", 2, tmp_path, timeout=120, data=dataset, batch_size=10, image_size=32,
                   log_dir=str(tmp_path / "logs"), backend="pillow")  # the abort does not depend on the backend
    assert r.returncode != 0
    assert time.monotonic() - t < 90
    assert "a bug in the member's training step" in r.stderr and "aborting the job" in r.stderr, r.stderr[-2000:]
    said = [(tmp_path / "logs" / f).read_text() for f in os.listdir(tmp_path / "logs") if f.startswith("error.rank")]
    assert said and all("ValueError: a bug in the member's training step" in x for x in said)


@pytest.fixture(scope="module")
def example_data(tmp_path_factory):
    from enspipe.data.synthetic import make_dataset

    root = tmp_path_factory.mktemp("example")
    make_dataset(str(root / "train"), 96, seed=3, num_classes=10, images_per_shard=40)
    make_dataset(str(root / "val"), 24, seed=4, num_classes=10, images_per_shard=40)
    return root


def _example(data, out, n: int, *extra, env: dict | None = None) -> list[dict]:
    r = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, os.path.join(ROOT, "examples", "train_ensemble.py"),
                        "--data", data / "train", "--validation-data", data / "val", "--out", out,
                        "--epochs", "3,1,2", "--image-size", "32", *extra], capture_output=True, text=True,
                       timeout=400, env={**os.environ, **(env or {})})
    assert r.returncode == 0, said(r)
    return [json.loads((out / f"member{k}" / "result.json").read_text()) for k in range(3)]


@pytest.mark.mpi
def test_the_example_trains_three_models_each_sample_once_per_epoch(example_data, tmp_path):
    """examples/train_ensemble.py: three Keras models, model.fit with validation, checkpoints and
    early stopping; member 1 stops after 1 epoch and serves the others until they are done."""
    results = _example(example_data, tmp_path / "runs", 3)
    assert [x["model"] for x in results] == ["small_cnn", "wide_cnn", "mlp"]
    assert [x["epochs_trained"] for x in results] == [3, 1, 2]
    for x in results:
        trained = x["epochs_trained"]
        assert [(e["epoch"], e["count"], e["missing"]) for e in x["stream_epochs"]][:trained] == \
            [(e, 96, 0) for e in range(trained)]
        assert len({e["digest"] for e in x["stream_epochs"]}) == 1  # the same samples every epoch
        assert all(np.isfinite(x["history"]["val_loss"]))
        assert len(os.listdir(tmp_path / "runs" / f"member{x['member']}")) == trained + 1  # checkpoints + result


@pytest.mark.mpi
@pytest.mark.slow
def test_the_examples_members_train_alike_in_one_process(example_data, tmp_path):
    """The same three members in one process (--members-per-rank 3) train to the losses they reach
    in three processes: the same batches, in the same order, each model on every one. Kernels run on
    one thread each (on a pool, three processes on two cores differed in the third digit); the
    losses are then equal in most runs, and within 6e-5 in the rest seen."""
    one_thread = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    alone = _example(example_data, tmp_path / "three", 3, env=one_thread)
    together = _example(example_data, tmp_path / "one", 1, "--members-per-rank", "3", env=one_thread)
    for a, one in zip(alone, together):
        assert one["epochs_trained"] == a["epochs_trained"]
        assert one["history"]["val_loss"] == pytest.approx(a["history"]["val_loss"], rel=2e-4)
        trained = a["epochs_trained"]
        assert [e["digest"] for e in one["stream_epochs"][:trained]] == [e["digest"] for e in a["stream_epochs"][:trained]]


def test_members_per_rank_is_checked(dataset, tmp_path):
    import enspipe as lib

    with pytest.raises(lib.ConfigError) as e:
        lib.SharedStream(dataset, 10, members_per_rank=0)
    assert e.value.field == "members_per_rank"
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--network", "tiny", "--consumer", "train",
                "--members-per-rank", 3, "--member-networks", "tiny,tiny")
    assert r.returncode == 2 and "--member-networks: 2 values for 3 members" in r.stderr
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--members-per-rank", 2, "--data-parallel", 2,
                "--consumer", "emulated", "--rate", 100)
    assert r.returncode == 2 and "--members-per-rank" in r.stderr


@pytest.mark.mpi
@pytest.mark.slow
def test_a_rank_trains_its_members_on_every_batch(dataset, tmp_path):
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--network", "tiny", "--consumer", "train",
                "--members-per-rank", 2, "--scheme", "all_shared", "--image-size", 32, "--batch-size", 10,
                "--warmup", 1, "--steps", 5, "--cpu-monitor", "none", "--lr", "0.01,0.05", n=2)
    assert r.returncode == 0, said(r)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["members_per_rank"] == 2 and [x["members"] for x in s["ranks"]] == [[0, 1], [2, 3]]
    assert all(x["loss_last"] is not None and x["max_rss_bytes"] > 0 for x in s["ranks"])


@pytest.mark.mpi
@pytest.mark.slow  # the quick suite runs the Keras example (above) and the torch and JAX ones (make test-notf)
def test_the_numpy_example_trains_without_keras(tmp_path):
    from enspipe.data.synthetic import make_dataset

    make_dataset(str(tmp_path / "train"), 96, seed=3, num_classes=10, images_per_shard=40)
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, os.path.join(ROOT, "examples", "numpy_softmax.py"),
                        "--data", tmp_path / "train", "--epochs", "2", "--batch-size", "16"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    for m in range(2):  # (mpiexec may join two ranks' lines: search, do not split)
        losses = [float(x) for x in re.findall(rf"member {m}: epoch \d loss (\d+\.\d{{4}})", r.stdout)]
        assert len(losses) == 2 and losses[-1] < losses[0], r.stdout
        assert f"member {m}: 2 epochs, each of the 96 samples exactly once" in r.stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_scheme_auto_runs_the_plans_choice(dataset, tmp_path):
    """As `enspipe run --scheme auto` (tests/test_plan.py): one member preprocesses 400 images/s, the
    accelerators train 100: the plan shares the preprocessing, and every member runs its choice."""
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"machine": {"cpus": os.cpu_count()},
                                 "networks": {"alexnet_v2": {"rp": {"1": 400.0}, "rp_cpu": {"1": 0.0025},
                                                             "rc": 100.0, "rc_source": "test"}}}))
    r, res = members("keep", 3, tmp_path, data=dataset, batch_size=12, image_size=32, scheme="auto",
                     calibration=str(rates), network="alexnet_v2", accelerator_rate=100.0, steps=5)
    assert r.returncode == 0, said(r)
    planned = res[0]["planned"]
    assert planned["requested"] == "auto" and planned["scheme"] != "baseline"
    assert {m["scheme"] for m in res} == {planned["scheme"]} and all(m["planned"] == planned for m in res)
    assert [x["first"] for x in res[0]["rows"]] == [x["first"] for x in res[2]["rows"]]
