"""Members that train for real across runs (issue 19): a checkpoint at every epoch end, resumed
from where it stopped; early stopping on a validation loss; a run that ends where FLEET would
re-plan; an arm of trained members re-planned when one converges, and resumed after a kill losing
no more than the epoch each member was in; a missing or corrupt checkpoint refused, named."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import enspipe, said, summary
from enspipe.plan.ensemble import Ensemble, converged
from enspipe.plan.errors import ConfigError

BATCH, IMAGES = 10, 50  # the session dataset: 5 steps an epoch
SPE = IMAGES // BATCH
TINY = ["--network", "tiny", "--image-size", "32", "--shuffle-buffer", "16", "--cpu-monitor", "none"]


@pytest.fixture(scope="session")
def validation(tmp_path_factory):
    from enspipe.data.synthetic import make_dataset

    out = str(tmp_path_factory.mktemp("val") / "v20")
    make_dataset(out, 20, seed=11, num_classes=10, images_per_shard=20)
    return out


def _iterations(prefix: str) -> int:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    key = next(k for k in reader.get_variable_to_shape_map() if k.startswith("optimizer/") and "iteration" in k)
    return int(reader.get_tensor(key))


def _state(ck, name) -> dict:
    return json.loads((ck / name / "state.json").read_text())


@pytest.mark.parametrize("losses, patience, min_delta, expect", [
    ([3.0, 2.0, 1.0], 1, 0.0, False),         # improving
    ([3.0, 2.0, 2.5], 1, 0.0, True),          # one epoch without a better loss
    ([3.0, 2.0, 2.5, 1.9], 2, 0.0, False),    # the second one improved
    ([3.0, 2.0, 1.95], 1, 0.1, True),         # an improvement below min_delta does not count
    ([3.0, 2.0], 0, 0.0, False),              # patience 0: never
    ([3.0], 1, 0.0, False),                   # not enough epochs to judge
    ([float("nan"), float("nan")], 1, 0.0, True),
])
def test_early_stopping_rule(losses, patience, min_delta, expect):
    assert converged(losses, patience, min_delta) is expect


def test_a_checkpoint_round_trips_and_a_bad_one_is_named(tmp_path):
    import keras
    import numpy as np
    import tensorflow as tf

    from enspipe.models.networks import NETWORKS
    from enspipe.run import checkpoint

    def build(seed):
        model, opt = NETWORKS["tiny"].build(10, 32, seed), keras.optimizers.SGD(0.1)
        opt.build(model.trainable_variables)
        return model, opt

    model, opt = build(0)
    opt.iterations.assign(7)
    state = checkpoint.MemberState("a", "tiny", epochs=2, images=100, val_losses=[2.3, 2.2])
    checkpoint.save(str(tmp_path), state, tf.train.Checkpoint(model=model, optimizer=opt))
    state.epochs = 3
    orphan = tmp_path / "a" / "ckpt-2_temp"  # what TensorFlow leaves of a write killed midway (seen in CI)
    orphan.mkdir()
    (orphan / "part-00000-of-00001.index").write_bytes(b"half")
    checkpoint.save(str(tmp_path), state, tf.train.Checkpoint(model=model, optimizer=opt))
    assert sorted(os.listdir(tmp_path / "a")) == ["ckpt-3.data-00000-of-00001", "ckpt-3.index", "state.json"]
    back = checkpoint.load(str(tmp_path), "a", "tiny")
    assert back.epochs == 3 and back.val_losses == [2.3, 2.2] and back.weights == "ckpt-3"
    other, other_opt = build(5)
    checkpoint.restore(str(tmp_path), back, tf.train.Checkpoint(model=other, optimizer=other_opt))
    assert all(np.array_equal(x, y) for x, y in zip(model.get_weights(), other.get_weights()))
    assert int(other_opt.iterations) == 7
    assert checkpoint.problem(str(tmp_path), "a", "tiny") is None
    assert checkpoint.load(str(tmp_path), "new", "tiny") is None  # never trained: nothing to resume

    assert "not 'a' training 'vgg_a'" in checkpoint.problem(str(tmp_path), "a", "vgg_a")
    (tmp_path / "a" / "ckpt-3.index").write_bytes(b"garbage")
    assert "ckpt-3" in checkpoint.problem(str(tmp_path), "a", "tiny")
    (tmp_path / "a" / "state.json").unlink()
    assert "state.json is missing" in checkpoint.problem(str(tmp_path), "a", "tiny")
    (tmp_path / "a" / "state.json").write_text("{not json")
    assert "unreadable" in checkpoint.problem(str(tmp_path), "a", "tiny")


def _run(dataset, out, ck, epochs, *extra, n=2):
    return enspipe("run", "--data", dataset, "--out", out, "--scheme", "all_shared", "--consumer", "train",
                   "--batch-size", BATCH, "--warmup", 0, "--steps", max(epochs) * SPE, "--member-epochs",
                   ",".join(map(str, epochs)), "--member-names", "a,b", "--checkpoint-dir", ck, "--lr", "0.05",
                   *TINY, *extra, n=n)


@pytest.fixture(scope="module")
def resumed(dataset, tmp_path_factory):
    """Members a and b train 1 and 2 epochs, then 2 and 1 more from their checkpoints: the
    checkpoint directory, and what the first run left there."""
    tmp = tmp_path_factory.mktemp("resumed")
    ck = tmp / "ck"
    r = _run(dataset, tmp / "r0", ck, [1, 2])
    assert r.returncode == 0, said(r)
    first = {"epochs": [_state(ck, m)["epochs"] for m in "ab"], "b_iterations": _iterations(str(ck / "b" / "ckpt-2"))}
    r = _run(dataset, tmp / "r1", ck, [2, 1])
    assert r.returncode == 0, said(r)
    return ck, first


@pytest.mark.mpi
def test_members_checkpoint_every_epoch_and_resume_where_they_stopped(resumed):
    ck, first = resumed
    assert first == {"epochs": [1, 2], "b_iterations": 2 * SPE}
    a, b = _state(ck, "a"), _state(ck, "b")
    assert (a["epochs"], b["epochs"]) == (3, 3) and [x["epochs"] for x in b["runs"]] == [2, 1]
    # the optimizer went on from its checkpoint: every step of both runs, none twice, none lost
    assert _iterations(str(ck / "a" / "ckpt-3")) == _iterations(str(ck / "b" / "ckpt-3")) == 3 * SPE
    assert sorted(os.listdir(ck / "b")) == ["ckpt-3.data-00000-of-00001", "ckpt-3.index", "state.json"]


@pytest.mark.mpi
def test_early_stopping_idles_a_member_and_the_run_ends_where_too_few_still_train(dataset, validation, tmp_path):
    ck = tmp_path / "ck"
    # min_delta 10: no epoch improves enough, so member b converges after 1 + patience epochs
    r = _run(dataset, tmp_path / "r", ck, [1, 5], "--validation-data", validation, "--member-patience", "0,1",
             "--min-delta", "10", "--stop-below", "1")
    assert r.returncode == 0, said(r)
    b = _state(ck, "b")
    assert b["converged"] and b["epochs"] == 2 and len(b["val_losses"]) == 2
    s = summary(tmp_path / "r")
    ranks = {x["member_name"]: x for x in s["ranks"]}
    assert ranks["b"]["trained_images"] == 2 * IMAGES and ranks["a"]["trained_images"] == IMAGES
    assert ranks["b"]["stopped_early"] and ranks["b"]["steps_measured"] == 2 * SPE  # not the 5 epochs' steps


@pytest.mark.mpi
def test_a_corrupt_or_lost_checkpoint_is_refused_before_any_work(dataset, resumed, tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(resumed[0], ck)
    (ck / "b" / "ckpt-3.index").write_bytes(b"garbage")
    r = _run(dataset, tmp_path / "r1", ck, [1, 1])
    assert r.returncode == 2 and "--checkpoint-dir" in r.stderr and "ckpt-3" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "r1").exists()
    (ck / "a" / "state.json").unlink()
    r = _run(dataset, tmp_path / "r1", ck, [1, 1])
    assert r.returncode == 2 and "state.json is missing" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("member, says", [
    ({"network": "nope"}, "unknown network"),
    ({"patience": 2}, "early stopping needs a validation loss"),
    ({"lr": -1, "network": "tiny"}, "lr must be"),
    ({"name": "a/b"}, "directory"),
])
def test_a_bad_trained_member_is_refused_naming_it(member, says):
    base = {"name": "a", "rate": 10, "epochs": 2}
    with pytest.raises(ConfigError) as e:
        Ensemble.from_dict({"accelerators": 2, "members": [{**base, **member}]})
    assert says in str(e.value)
    with pytest.raises(ConfigError) as e:  # one round trains or emulates all its members
        Ensemble.from_dict({"accelerators": 2, "members": [{**base, "network": "tiny"}, {**base, "name": "b"}]})
    assert "some members name a network" in str(e.value)


TRAINED = {"accelerators": 2, "members": [
    {"name": "quick", "rate": 60, "epochs": 2, "network": "tiny", "lr": 0.05},
    {"name": "slow", "rate": 15, "epochs": 6, "network": "tiny", "lr": 0.05},
    {"name": "early", "rate": 30, "epochs": 6, "network": "tiny", "lr": 0.05, "patience": 1}],
    "min_delta": 10.0}  # 'early' converges after 2 of its 6 epochs


def _arm(spec, dataset, out, validation, arm="fleet", in_job=False):
    return [sys.executable, "-m", "enspipe", "ensemble", "--spec", str(spec), "--arm", arm, "--data", dataset,
            "--out", str(out), "--batch-size", str(BATCH), "--validation", validation,
            *(["--in-job"] if in_job else []), "--", *TINY]


def _epoch_events(out) -> dict[str, list[int]]:
    """Every member_epoch event of every round, finished or interrupted: member -> epochs."""
    seen: dict[str, list[int]] = {}
    for d in sorted(os.listdir(out)):
        if d.startswith("round") and os.path.isdir(out / d):
            for f in sorted((out / d).glob("events.rank*.jsonl")):
                for e in map(json.loads, f.open()):
                    if e["event"] == "member_epoch" and e["checkpoint"]:
                        seen.setdefault(e["member"], []).append(e["epochs"])
    return seen


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("in_job", [False, True], ids=["job-per-round", "in-job"])
def test_a_trained_fleet_arm_replans_when_a_member_converges_and_resumes_after_a_kill(dataset, validation, tmp_path,
                                                                                      in_job):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(TRAINED))
    out = tmp_path / "fleet"
    proc = subprocess.Popen(_arm(spec, dataset, out, validation, in_job=in_job), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    slow = out / "checkpoints" / "slow" / "state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:  # kill inside slow's training, after an epoch
        if slow.exists() and 1 <= json.loads(slow.read_text())["epochs"] < 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the arm ended before slow had trained an epoch"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = json.loads(slow.read_text())["epochs"]
    before = _epoch_events(out).get("slow", [])  # none yet where the kill fell between its first checkpoint and event
    assert kept >= max(before, default=0)  # every epoch it had finished is in its checkpoint: it loses only the one
    r = subprocess.run(_arm(spec, dataset, out, validation, in_job=in_job), capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, said(r)
    rec = json.loads((out / "ensemble.json").read_text())
    assert rec["interrupted_rounds"] and not rec["emulated"] and rec["in_job"] is in_job
    assert any(d.endswith(".interrupted") for d in os.listdir(out))
    states = rec["member_states"]
    assert states["quick"]["epochs"] == 2 and states["slow"]["epochs"] == 6
    assert states["early"]["converged"] and states["early"]["epochs"] == 2  # early stopping, not its bound
    for name, st in states.items():  # each epoch trained once (none twice, the last its bound), in the weights too
        seen = _epoch_events(out)[name]  # (the kill may fall between a checkpoint and its event)
        assert seen == sorted(set(seen)) and seen[-1] == st["epochs"] and len(seen) >= st["epochs"] - 1
        assert _iterations(str(out / "checkpoints" / name / st["weights"])) == st["epochs"] * SPE
    after = [t for t in rec["timeline"] if t["member"] != "early" and t["start"] is not None
             and t["start"] > max(x["end"] for x in rec["timeline"] if x["member"] == "early")]
    assert after  # the arm went on without the converged member


def test_an_arm_with_patience_needs_a_validation_set_and_readable_checkpoints(dataset, validation, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(TRAINED))
    r = enspipe("ensemble", "--spec", spec, "--arm", "fleet", "--data", dataset, "--out", tmp_path / "o",
                "--batch-size", BATCH)
    assert r.returncode == 2 and "--validation" in r.stderr, r.stderr[-2000:]
    from enspipe.data.manifest import read_manifest
    from enspipe.run.ensemble import claim_directory, identity

    ens = Ensemble.from_dict(TRAINED)  # the same arm, started before: its directory and a broken state
    assert claim_directory(str(tmp_path / "o2"), identity(ens, "fleet", read_manifest(dataset).digest, BATCH, 0, [],
                                                          validation), False) is None
    ck = tmp_path / "o2" / "checkpoints" / "slow"
    ck.mkdir(parents=True)
    (ck / "state.json").write_text("{broken")
    r = enspipe("ensemble", "--spec", spec, "--arm", "fleet", "--data", dataset, "--out", tmp_path / "o2",
                "--batch-size", BATCH, "--validation", validation)
    assert r.returncode == 2 and "slow" in r.stderr and "unreadable" in r.stderr, r.stderr[-2000:]
    other = dict(TRAINED, min_delta=0.5)  # another ensemble in the same directory: refused, or started over
    spec.write_text(json.dumps(other))
    args = ["ensemble", "--spec", spec, "--arm", "fleet", "--data", dataset, "--out", tmp_path / "o2",
            "--batch-size", BATCH, "--validation", validation]
    r = enspipe(*args)
    assert r.returncode == 2 and "--out" in r.stderr and "another arm" in r.stderr, r.stderr[-2000:]
    assert (ck / "state.json").exists()  # nothing touched


@pytest.mark.mpi
@pytest.mark.slow
def test_a_batch_multiplier_is_one_update_on_the_batches_together(dataset, tmp_path):
    import numpy as np
    import tensorflow as tf

    def train(batch, k, name):
        ck = tmp_path / name
        r = enspipe("run", "--data", dataset, "--out", tmp_path / f"out-{name}", "--consumer", "train", "--batch-size",
                    batch, "--warmup", 0, "--steps", IMAGES // batch, "--member-epochs", 1, "--member-names", "a",
                    "--checkpoint-dir", ck, "--member-batch-multipliers", k, "--lr", "0.1", *TINY, n=1)
        assert r.returncode == 0, said(r)
        reader = tf.train.load_checkpoint(str(ck / "a" / "ckpt-1"))
        weights = [v for v in reader.get_variable_to_shape_map()  # Keras 3 tracks them through its optimizer
                   if v.startswith("optimizer/_trainable_variables/")]
        return {v: reader.get_tensor(v) for v in weights}, _iterations(str(ck / "a" / "ckpt-1"))

    (two, updates2), (one, updates1) = train(5, 2, "k2"), train(10, 1, "k1")
    assert updates2 == updates1 == IMAGES // 10  # 10 batches of 5, an update every 2
    assert two.keys() == one.keys() and two
    for v in one:
        np.testing.assert_allclose(two[v], one[v], rtol=1e-4, atol=1e-6, err_msg=v)
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "bad", "--consumer", "train", "--batch-size", 10,
                "--steps", 5, "--member-epochs", 1, "--member-batch-multipliers", 2, *TINY, n=1)
    assert r.returncode == 2 and "--member-batch-multipliers" in r.stderr  # 2 does not divide an epoch's 5 batches


def test_an_arms_directory_resumes_only_the_same_arm_or_starts_fresh(tmp_path):
    from enspipe.run.ensemble import IDENTITY, claim_directory

    out = str(tmp_path / "arm")
    assert claim_directory(out, {"arm": "fleet", "seed": 0}, False) is None  # new
    (tmp_path / "arm" / "round00").mkdir()
    assert claim_directory(out, {"arm": "fleet", "seed": 0}, False) is None  # the same arm: it resumes
    assert (tmp_path / "arm" / "round00").exists()
    assert "another arm" in claim_directory(out, {"arm": "fleet", "seed": 1}, False)
    assert (tmp_path / "arm" / "round00").exists()  # refused: nothing touched
    assert claim_directory(out, {"arm": "fleet", "seed": 1}, True) is None  # --fresh: emptied, then its own
    assert sorted(os.listdir(out)) == [IDENTITY]


def test_a_checkpoint_keeps_batch_norms_moving_statistics(tmp_path):
    """Not only what the optimizer updates: MobileNetV2's BatchNorm moving means and variances
    (non-trainable) come back too."""
    import numpy as np

    from enspipe.run.consumers import TrainConsumer

    a = TrainConsumer("mobilenet_v2", 10, 32, 0.01, seed=0)
    frozen = [v for v in a.model.weights if not v.trainable]
    assert frozen
    rng = np.random.default_rng(0)
    for v in frozen:
        v.assign(rng.random(v.shape).astype("float32"))
    a.trackable().write(str(tmp_path / "ckpt-1"))
    b = TrainConsumer("mobilenet_v2", 10, 32, 0.01, seed=1)
    b.trackable().read(str(tmp_path / "ckpt-1")).assert_existing_objects_matched()
    for x, y in zip(a.model.weights, b.model.weights):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.name)
