"""The stream as PyTorch tensors and JAX arrays (stream.torch(), stream.jax()), without TensorFlow:
every sample once per epoch, kept batches unchanged, no warnings, the same pixels as each other."""
import pytest

from enspipe.api.frameworks import require_framework
from conftest import EVERY_SCHEME, MPIEXEC, said
from test_api import members


def _run(mode: str, tmp_path, n: int = 2, **options):
    out = tmp_path / f"{mode}_{options.get('layout', 'NHWC')}"
    out.mkdir()
    r, res = members(mode, n, out, without_tf=True, batch_size=10, image_size=32, backend="pillow",
                     wire_dtype="uint8", epochs=2, **options)
    assert r.returncode == 0, said(r)
    assert len(res) == n
    for m in res:
        assert m["warnings"] == []
        assert [(e["count"], e["missing"]) for e in m["epochs"]][:2] == [(50, 0), (50, 0)]
        assert len(m["rows"]) == 10 and all(row["first"] == row["last"] for row in m["rows"])
        assert all(row["label_dtype"] == {"torch": "torch.int64", "jax": "int32"}[mode] for row in m["rows"])
    assert [row["first"] for row in res[0]["rows"]] == [row["first"] for row in res[1]["rows"]]
    return res


@pytest.mark.mpi
def test_torch_tensors_in_each_layout_carry_the_same_batches(dataset, tmp_path):
    pytest.importorskip("torch", reason="pip install 'enspipe[torch]' (or torch==2.13.0+cpu) to test the torch handoff")
    digests = {}
    for layout in ("NHWC", "channels_last", "NCHW"):
        res = _run("torch", tmp_path, data=dataset, layout=layout)
        row = res[0]["rows"][0]
        assert row["type"] == "torch" and row["dtype"] == "torch.uint8"
        assert row["shape"] == ([10, 32, 32, 3] if layout == "NHWC" else [10, 3, 32, 32])
        assert row["contiguous"] == (layout != "channels_last")
        if layout != "NHWC":
            assert row["channels_last"] == (layout == "channels_last")
        digests[layout] = [r["first"] for r in res[0]["rows"]]
    assert digests["NHWC"] == digests["channels_last"] == digests["NCHW"]
    # exchanged as torch tensors (device='cpu': the path NCCL's GPU tensors take): yielded as they are
    (tmp_path / "tensors").mkdir()
    res = _run("torch", tmp_path / "tensors", data=dataset, layout="channels_last", transport="torch", device="cpu")
    assert res[0]["rows"][0]["channels_last"] and [r["first"] for r in res[0]["rows"]] == digests["NHWC"]


@pytest.mark.mpi
def test_jax_arrays_carry_the_torch_streams_batches(dataset, tmp_path):
    pytest.importorskip("jax", reason="pip install 'enspipe[jax]' to test the JAX handoff")
    pytest.importorskip("torch", reason="pip install 'enspipe[torch]' to compare with the torch handoff")
    jax = _run("jax", tmp_path, data=dataset)
    torch = _run("torch", tmp_path, data=dataset)
    assert jax[0]["rows"][0]["type"] == "jaxlib" and jax[0]["rows"][0]["shape"] == [10, 32, 32, 3]
    assert [r["first"] for r in jax[0]["rows"]] == [r["first"] for r in torch[0]["rows"]]


def test_a_missing_framework_says_what_to_install():
    with pytest.raises(ImportError, match=r"pip install 'enspipe\[torch\]'"):
        require_framework("enspipe_no_such_framework", "torch")


@pytest.fixture(scope="module")
def example_sets(tmp_path_factory):
    """The examples' data: embedded shards, and image class folders (train and val of each)."""
    import io

    import numpy as np
    from PIL import Image

    from enspipe.data.synthetic import make_dataset, synthetic_image

    root = tmp_path_factory.mktemp("examples")
    make_dataset(str(root / "shards" / "train"), 60, seed=3, num_classes=10, images_per_shard=25)
    make_dataset(str(root / "shards" / "val"), 20, seed=4, num_classes=10, images_per_shard=25)
    for split, count in (("train", 48), ("val", 16)):
        for i in range(count):
            image, label = synthetic_image(5 if split == "train" else 6, i, 4)
            folder = root / "folders" / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            b = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(image[::4, ::4])).save(b, "JPEG", quality=85)
            (folder / f"{i:03d}.jpg").write_bytes(b.getvalue())
    return root


@pytest.mark.mpi
@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("kind", ["shards", pytest.param("folders", marks=pytest.mark.slow)])
def test_the_examples_train_three_members_each_sample_once_per_epoch(example_sets, tmp_path, framework, kind):
    """examples/train_ensemble_{torch,jax}.py without TensorFlow: three models, validation,
    checkpoints, per-member epochs (3, 1, 2); every epoch each member trained on holds every sample once."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip(framework, reason=f"pip install 'enspipe[{framework}]' to run its example")
    here = os.path.dirname(os.path.abspath(__file__))
    data = example_sets / kind
    out = tmp_path / "runs"
    r = subprocess.run([MPIEXEC, "-n", "3", sys.executable, os.path.join(here, "without_tf.py"),
                        os.path.join(os.path.dirname(here), "examples", f"train_ensemble_{framework}.py"),
                        "--data", data / "train", "--validation-data", data / "val", "--out", out,
                        "--epochs", "3,1,2", "--image-size", "32", "--batch-size", "8"],
                       capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, said(r)
    assert "Warning" not in r.stderr, r.stderr[-2000:]
    images = 60 if kind == "shards" else 48
    results = [json.loads((out / f"member{k}" / "result.json").read_text()) for k in range(3)]
    assert [x["epochs_trained"] for x in results] == [3, 1, 2]
    for x in results:
        trained = x["epochs_trained"]
        assert [(e["epoch"], e["count"], e["missing"]) for e in x["stream_epochs"]][:trained] == \
            [(e, images, 0) for e in range(trained)]
        assert len({e["digest"] for e in x["stream_epochs"]}) == 1
        assert all(v == v and v < 10 for v in x["history"]["val_loss"])  # finite
        assert len(os.listdir(out / f"member{x['member']}")) == trained + 1  # checkpoints + result


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_the_lightning_example_trains_each_member_its_own_model(example_sets, tmp_path, launcher):
    """examples/train_ensemble_lightning.py: three Trainer(devices=1), one per member, under torchrun
    (the torch transport) and under mpiexec (mpi4py); each a job of its own (world size 1, rank 0,
    a single-device strategy), with its own epochs (3, 1, 2), checkpoints and validation, and every
    epoch it trained on holding every sample once."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("lightning", reason="pip install 'enspipe[lightning]' to run the Lightning example")
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(os.path.dirname(here), "examples", "train_ensemble_lightning.py")
    launch = ([shutil.which("torchrun", path=os.path.dirname(sys.executable)), "--standalone", "--nproc-per-node", "3"]
              if launcher == "torchrun" else [MPIEXEC, "-n", "3", sys.executable])
    data, out = example_sets / "shards", tmp_path / "runs"
    r = subprocess.run([*launch, example, "--data", data / "train", "--validation-data", data / "val", "--out", out,
                        "--epochs", "3,1,2", "--image-size", "32", "--batch-size", "8"],
                       capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, said(r, chars=8000)
    results = [json.loads((out / f"member{k}" / "result.json").read_text()) for k in range(3)]
    assert [x["epochs_trained"] for x in results] == [3, 1, 2]
    for x in results:
        trained = x["epochs_trained"]
        assert x["transport"] == ("torch" if launcher == "torchrun" else "mpi4py")
        assert x["trainer"] == {"world_size": 1, "global_rank": 0, "strategy": "SingleDeviceStrategy"}
        assert [(e["epoch"], e["count"], e["missing"]) for e in x["stream_epochs"]][:trained] == \
            [(e, 60, 0) for e in range(trained)]
        assert len(x["history"]["loss"]) == len(x["history"]["val_loss"]) == trained
        assert all(v == v and v < 10 for v in x["history"]["val_loss"])  # finite
        assert sorted(os.listdir(out / f"member{x['member']}" / "checkpoints")) == \
            [f"epoch{e:02d}.ckpt" for e in range(trained)]


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_the_imagenet_style_example_trains_two_torchvision_models(example_sets, tmp_path, launcher):
    """examples/train_imagenet_style.py, PyTorch's reference ImageNet script ported: two members,
    resnet18 and mobilenet_v3_small, from one stream with the user's own torchvision v1 transforms,
    on image class folders (train/ and val/), top-1 and top-5 per epoch, a checkpoint per member;
    every epoch one pass of every sample once, the last batch short (48 images, batch 10)."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("torchvision", reason="pip install torchvision to run the ImageNet-style example")
    here = os.path.dirname(os.path.abspath(__file__))
    example = os.path.join(os.path.dirname(here), "examples", "train_imagenet_style.py")
    launch = ([shutil.which("torchrun", path=os.path.dirname(sys.executable)), "--standalone", "--nproc-per-node", "2"]
              if launcher == "torchrun" else [MPIEXEC, "-n", "2", sys.executable])
    out = tmp_path / "runs"
    r = subprocess.run([*launch, example, example_sets / "folders", "-a", "resnet18,mobilenet_v3_small", "--epochs",
                        "2", "-b", "10", "--image-size", "32", "--lr", "0.01", "--out", out, "-j", "1",
                        "--print-freq", "2"], capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, said(r, chars=8000)
    assert "member 0 Epoch: [1][5/5]" in r.stdout and " * Acc@1 " in r.stdout, r.stdout[-3000:]
    for arch in ("resnet18", "mobilenet_v3_small"):
        x = json.loads((out / arch / "result.json").read_text())
        assert [h["epoch"] for h in x["history"]] == [0, 1]
        assert all(0 <= h["acc1"] <= h["acc5"] <= 100 for h in x["history"])
        assert [(e["epoch"], e["count"], e["missing"]) for e in x["stream_epochs"]][:2] == [(0, 48, 0), (1, 48, 0)]
        assert {"checkpoint.pth.tar", "model_best.pth.tar", "result.json"} <= set(os.listdir(out / arch))


@pytest.mark.mpi
@pytest.mark.parametrize("scheme, p", EVERY_SCHEME)
def test_a_cell_trains_torch_members_on_every_scheme_exactly_once(dataset, tmp_path, scheme, p):
    """`enspipe run --consumer train` without TensorFlow: the torch trainer, the pillow backend, a
    uint8 wire; the summary says so, the losses are finite and each sample came once per epoch."""
    import json
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("torch", reason="pip install 'enspipe[torch]' to run the torch train consumer")
    here = os.path.dirname(os.path.abspath(__file__))
    cli = shutil.which("enspipe", path=os.path.dirname(sys.executable))
    out = tmp_path / "cell"
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, os.path.join(here, "without_tf.py"), cli, "run",
                        "--data", dataset, "--out", out, "--scheme", scheme, *(["--preprocessors", str(p)] if p else []),
                        "--network", "tiny", "--consumer", "train", "--batch-size", "10", "--image-size", "32",
                        "--wire-dtype", "uint8", "--warmup", "1", "--steps", "10", "--cpu-monitor", "none"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    s = json.loads((out / "summary.json").read_text())
    assert (s["backend"], s["consumer"], s["versions"]["tensorflow"]) == ("pillow", "train", None)
    assert s["trainer"] == "torch" and s["delivery"]["exactly_once"]
    for rank in s["ranks"]:
        assert rank["device"] == "CPU" and 0 < rank["loss_last"] < 10


def test_calibrate_rc_times_torch_training_steps(tmp_path):
    import json
    import os
    import shutil
    import subprocess
    import sys

    pytest.importorskip("torch", reason="pip install 'enspipe[torch]' to time torch training steps")
    here = os.path.dirname(os.path.abspath(__file__))
    cli = shutil.which("enspipe", path=os.path.dirname(sys.executable))
    r = subprocess.run([sys.executable, os.path.join(here, "without_tf.py"), cli, "calibrate-rc", "--network", "tiny",
                        "--image-size", "32", "--steps", "5", "--warmup", "1", "--out", tmp_path / "rc.json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, said(r)
    rc = json.loads((tmp_path / "rc.json").read_text())
    assert rc["trainer"] == "torch" and rc["rc"] > 0 and rc["device"] in ("CPU", "GPU") and rc["steps"] == 5

