"""A user's own augmentation on the TF-free backend (enspipe.data.transforms): a numpy callable and
a kornia pipeline (torchvision's where it imports), run in worker processes, seeded per sample, so
every member count and worker count gives the same batches; bad ones refused before any work."""
import os
import sys

import numpy as np
import pytest

from conftest import said
from test_api import members

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import user_transforms  # noqa: E402

OPTIONS = {"batch_size": 10, "backend": "pillow", "steps": 10}


def _batches(res):
    return [[row["first"] for row in m["rows"]] for m in res]


@pytest.mark.mpi
@pytest.mark.parametrize("transform, spec", [
    ("user_transforms:crop_flip", ([24, 24, 3], "uint8")),
    pytest.param("user_transforms:kornia_pipeline()", ([3, 20, 20], "float32"), id="kornia")])
def test_a_users_augmentation_is_the_same_on_any_member_and_worker_count(dataset, tmp_path, transform, spec):
    """Two members with one worker each, one member with two workers: the same batches, each
    sample once per epoch, the output's own shape and dtype on the wire."""
    if "kornia" in transform:
        pytest.importorskip("kornia", reason="pip install kornia to test a kornia pipeline")
    runs = {}
    for n, threads in ((2, 1), (1, 2)):
        out = tmp_path / f"n{n}"
        out.mkdir()
        r, res = members("checksums", n, out, data=dataset, preprocess=transform, threads=threads, **OPTIONS)
        assert r.returncode == 0, said(r)
        assert len(res) == n
        for m in res:
            assert m["spec"] == list(spec)
            assert [(e["count"], e["missing"]) for e in m["epochs"]][:1] == [(50, 0)]
        runs[n] = _batches(res)
    assert runs[2][0] == runs[2][1] == runs[1][0]


def test_torchvision_v2_pipeline_runs_where_torchvision_imports(dataset):
    """torchvision's transforms.v2 on the uint8 tensors it expects. On the CPU machines torchvision
    0.28/0.29 cannot be imported beside torch 2.13.0+cpu (`operator torchvision::nms does not
    exist`); this runs where it can (the GPU machine's torchvision 0.26)."""
    pytest.importorskip("torch", reason="pip install torch")
    try:
        pipeline = user_transforms.torchvision_pipeline()
    except Exception as e:  # noqa: BLE001 - ImportError, or the operator registration's RuntimeError
        pytest.skip(f"torchvision does not import here ({type(e).__name__}: {str(e)[:120]})")
    from enspipe import StreamConfig

    _, pre = StreamConfig(data=dataset, batch_size=10, backend="pillow", preprocess=pipeline).check()
    assert (pre.shape, str(pre.dtype)) == ((3, 20, 20), "float32")


@pytest.mark.parametrize("fn, said_", [
    (lambda image: image, "cannot be sent to the worker processes"),
    (user_transforms.fails, "failed on the dataset's sample 0 (train-00000-of-00003:0): KeyError: 'no such lookup "
                            "table'; fix the function: it gets a uint8 array (H, W, 3)"),
    (user_transforms.changing, "for the dataset's first 2 samples"),
    (user_transforms.text, "return a numeric tensor or array per image")])
def test_a_bad_augmentation_is_named_before_any_work(dataset, fn, said_):
    from enspipe import ConfigError, StreamConfig

    state = np.random.get_state()[1].copy()
    with pytest.raises(ConfigError) as e:
        StreamConfig(data=dataset, batch_size=10, backend="pillow", preprocess=fn).check()
    assert e.value.field == "preprocess" and said_ in str(e.value)
    assert (np.random.get_state()[1] == state).all()  # the probe left numpy's generator as it was


@pytest.mark.timing
def test_the_attach_server_serves_a_users_augmentation_to_trials_that_ask_for_it(tmp_path, dataset, monkeypatch):
    """`enspipe serve --preprocess user_transforms:crop_flip`: two trials that ask for it share it,
    each with exact epochs of its output's shape; one that asks for another is refused, naming both."""
    import enspipe
    from serve_helpers import ServerProcess

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.path.dirname(user_transforms.__file__),
                                                                   os.environ.get("PYTHONPATH")])))
    server = ServerProcess(tmp_path, dataset, "--preprocess", "user_transforms:crop_flip")
    try:
        with pytest.raises(enspipe.ConfigError, match="preprocess: the server makes 'user_transforms:crop_flip', "
                                                      "not 'inception'"):
            enspipe.attach(server.sock, preprocess="inception")
        trials = [enspipe.attach(server.sock, preprocess="user_transforms:crop_flip") for _ in range(2)]
        for trial in trials:
            assert trial.element_spec == ((24, 24, 3), np.dtype(np.uint8))
        for _ in range(trials[0].steps_per_epoch):  # side by side: one preprocessing for both
            for trial in trials:
                images, _ = trial.next_batch()
                assert images.shape[1:] == (24, 24, 3)
        for trial in trials:
            assert [(e["count"], e["missing"]) for e in trial.epochs()] == [(50, 0)]
            trial.close()
        assert server.stop()["total"]["sharing_factor"] > 1.5
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def test_serve_refuses_an_augmentation_it_cannot_import_or_run(tmp_path, dataset, monkeypatch):
    from conftest import enspipe as cli

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(user_transforms.__file__))
    for spec, words in (("user_transforms:nope", "user_transforms has no nope"),
                        ("no_such_module:fn", "cannot import no_such_module"),
                        ("user_transforms:fails", "failed on the dataset's sample 0 (train-00000-of-00003:0): "
                                                  "KeyError")):
        r = cli("serve", "--data", dataset, "--batch-size", 8, "--socket", str(tmp_path / "z.sock"),
                "--preprocess", spec)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert not (tmp_path / "z.sock").exists()
