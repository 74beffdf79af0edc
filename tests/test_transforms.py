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


def _expected_nchw(dataset, fn):
    """The dataset's images in canonical order through ``fn`` itself, as NCHW float arrays."""
    import torch

    from enspipe.data.build import load_manifest
    from enspipe.data.decoding import decode
    from enspipe.data.parse import first_keyed
    from enspipe.data.transforms import given, input_kind

    out = []
    for _, encoded in first_keyed(load_manifest(dataset), 50):
        x = fn(given(decode(encoded).copy(), input_kind(fn)))
        x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        out.append(x if x.shape[0] == 3 else x.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def _pipelines():
    pytest.importorskip("torchvision", reason="pip install torchvision (the TF-free venv has it)")
    pytest.importorskip("kornia", reason="pip install kornia")
    return {"tv1": ("user_transforms:TV1", "CHW"), "tv2": ("user_transforms:TV2", "CHW"),
            "numpy": ("user_transforms:center32", "HWC"), "kornia": ("user_transforms:kornia_center()", "CHW")}


def _check_layouts(rows, own):
    assert rows["None"]["shapes"] == [[3, 32, 32] if own == "CHW" else [32, 32, 3]], rows
    for layout in ("NCHW", "channels_last"):
        assert rows[layout]["shapes"] == [[3, 32, 32]], (layout, rows)
    assert rows["NHWC"]["shapes"] == [[32, 32, 3]], rows
    assert rows["NCHW"]["contiguous"] and rows["NHWC"]["contiguous"]
    assert rows["channels_last"]["channels_last"]


@pytest.mark.mpi
def test_every_layout_yields_what_is_asked_with_the_transforms_own_values(dataset, tmp_path):
    """torchvision v1 and v2 pipelines, kornia (CHW) and a numpy callable (HWC) on a shared stream
    of two members: stream.torch(layout=None, NCHW, channels_last, NHWC) yields those shapes and
    memory formats, and the same image gives the transform's own values in every layout."""
    from test_api import member_cases

    pipelines = _pipelines()
    cases = {name: ("layouts", {"data": dataset, "batch_size": 12, "preprocess": spec, "shuffle_buffer": 0,
                                "backend": "pillow", "threads": 1}) for name, (spec, _) in pipelines.items()}
    r, res = member_cases(2, tmp_path, cases)
    assert r.returncode == 0, said(r)
    for name, (spec, layout) in pipelines.items():
        module, attr = spec.split(":")
        fn = getattr(user_transforms, attr.removesuffix("()"))
        want = _expected_nchw(dataset, fn() if attr.endswith("()") else fn)
        for k, member in enumerate(res[name]):
            assert member["sample_layout"] == layout, name
            _check_layouts(member["layouts"], layout)
            for asked in ("None", "NCHW", "channels_last", "NHWC"):
                got = np.load(tmp_path / name / f"{asked}.member{k}.npy").astype(np.float32)
                assert got.shape == want.shape and np.abs(got - want).max() < 1e-5, (name, asked)


@pytest.mark.timing
@pytest.mark.parametrize("spec, layout", [("user_transforms:TV1", "CHW"), ("user_transforms:center32", "HWC"),
                                          ("standard", "HWC")])
def test_a_served_stream_yields_every_layout_with_the_transforms_own_values(tmp_path, dataset, monkeypatch, spec,
                                                                             layout):
    """The same through `enspipe serve --preprocess ...` and attach: the layout travels with the pool
    (a built-in's, whose draws differ per epoch: shapes and memory formats)."""
    _pipelines()
    import torch

    import enspipe
    from serve_helpers import ServerProcess

    builtin = ":" not in spec

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.path.dirname(user_transforms.__file__),
                                                                   os.environ.get("PYTHONPATH")])))
    want = None if builtin else _expected_nchw(dataset, getattr(user_transforms, spec.split(":")[1]))
    server = ServerProcess(tmp_path, dataset, "--preprocess", spec, memory="64MB")
    try:
        with enspipe.attach(server.sock, preprocess=spec) as stream:
            assert stream.sample_layout == layout
            for asked in (None, "NCHW", "channels_last", "NHWC"):
                xs = [x for x, _ in stream.torch(layout=asked)]
                shape = {None: (3, 32, 32) if layout == "CHW" else (32, 32, 3), "NHWC": (32, 32, 3)}.get(asked,
                                                                                                   (3, 32, 32))
                assert {tuple(x.shape[1:]) for x in xs} == {shape}, asked
                assert asked != "channels_last" or all(x.is_contiguous(memory_format=torch.channels_last) for x in xs)
                got = torch.cat(xs)
                if asked == "NHWC" or (asked is None and layout == "HWC"):
                    got = got.permute(0, 3, 1, 2)
                got = got.float().numpy()
                if builtin:
                    assert got.shape == (50, 3, 32, 32)
                    continue
                # a served epoch is shuffled: each sample matched to the image it is, one for one
                nearest = [int(np.abs(want - x).reshape(len(want), -1).max(axis=1).argmin()) for x in got]
                assert sorted(nearest) == list(range(50)), asked
                assert max(float(np.abs(want[i] - x).max()) for i, x in zip(nearest, got)) < 1e-5, asked
    finally:
        server.stop()


def test_an_output_whose_channel_axis_cannot_be_told_apart_is_refused(dataset):
    from enspipe import ConfigError, StreamConfig

    with pytest.raises(ConfigError) as e:
        StreamConfig(data=dataset, batch_size=10, backend="pillow", preprocess=user_transforms.ambiguous).check()
    assert e.value.field == "preprocess" and "(3, 32, 3) has no channel axis that can be told apart" in str(e.value)
    assert str(e.value).startswith("preprocess=: ")  # a Python caller reads its keyword, not a flag


def test_torchvision_v1_and_v2_pipelines_are_given_what_they_take():
    pytest.importorskip("torchvision", reason="pip install torchvision")
    import torchvision.transforms as T

    from enspipe.data.transforms import input_kind

    assert input_kind(user_transforms.TV1) == "pil" and input_kind(user_transforms.TV2) == "tensor"
    assert input_kind(T.Compose([T.ToPILImage(), T.Resize(40)])) == "array"  # what ToPILImage takes
    assert input_kind(T.RandomResizedCrop(32)) == "pil" and input_kind(user_transforms.center32) == "array"


def test_validation_set_takes_the_users_pipeline(dataset):
    import enspipe

    _pipelines()
    for fn in (user_transforms.TV1, user_transforms.center32):
        images, labels = enspipe.validation_set(dataset, preprocess=fn, image_size=32)
        want = _expected_nchw(dataset, fn)
        got = images if images.shape[1] == 3 else images.transpose(0, 3, 1, 2)
        assert len(labels) == 50 and np.abs(got.astype(np.float32) - want).max() < 1e-5


def test_an_unknown_keyword_is_a_config_error_naming_the_nearest(dataset):
    import enspipe

    with pytest.raises(enspipe.ConfigError) as e:
        enspipe.SharedStream(dataset, 10, num_workers=4)
    assert e.value.field == "num_workers" and "did you mean threads=?" in str(e.value)
    assert "SharedStream takes no keyword 'num_workers'" in str(e.value) and "preprocess" in str(e.value)
    with pytest.raises(enspipe.ConfigError, match="did you mean image_size="):
        enspipe.SharedStream(dataset, 10, image_sise=64)


@pytest.mark.mpi
def test_outputs_smaller_than_a_page_work_and_a_workers_failure_is_named(dataset, tmp_path):
    """Three numbers per image through two worker processes; a transform whose output changes shape
    in a worker fails the member naming the function, the file, the shapes; more threads than
    cores is said in one line."""
    from test_api import members

    cores = len(os.sched_getaffinity(0))
    r, res = members("epochs", 1, tmp_path / "tiny", data=dataset, batch_size=12, backend="pillow",
                     preprocess="user_transforms:tiny", threads=cores + 1, epochs=1)
    assert r.returncode == 0, said(r)
    assert [b["len"] for b in res[0]["passes"][0]] == [12, 12, 12, 12, 2]
    assert f"threads={cores + 1} is more than the {cores} cores this process may use" in r.stderr, said(r)
    assert r.stderr.count("oversubscribed") == 1
    r, _ = members("epochs", 1, tmp_path / "bad", data=dataset, batch_size=12, backend="pillow",
                   preprocess="user_transforms:fifth_wrong", threads=2, epochs=1, shuffle_buffer=0)
    assert r.returncode != 0
    assert "preprocess user_transforms.fifth_wrong failed on train-" in r.stderr, said(r)
    assert "returned uint8 (9, 9, 3)" in r.stderr and "uint8 (8, 8, 3) for the first" in r.stderr, said(r)
    assert "on-corrupt" not in r.stderr and "skip_corrupt" not in r.stderr
