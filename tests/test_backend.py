"""The pillow backend: enspipe without TensorFlow (Pillow and numpy preprocess, numpy orders the
stream), every scheme exactly once, in processes where TensorFlow cannot be imported."""
import io
import os

import numpy as np
import pytest
from PIL import Image

from enspipe.data import pixels
from enspipe.data.order import NumpyOrder, canonical_numbers
from enspipe.data.records import CYCLE, _interleaved, first_samples
from conftest import EVERY_SCHEME, MPIEXEC, said, synthetic_jpeg as _jpeg
from test_api import members


@pytest.mark.parametrize("name, lo, hi", [("inception", -1.0, 1.0), ("vgg", -123.68, 255 - 103.94),
                                          ("standard", -0.485 / 0.229, (1 - 0.406) / 0.225),
                                          ("standard-jitter", -0.485 / 0.229, (1 - 0.406) / 0.225)])
def test_a_sample_comes_out_the_same_wherever_it_is_preprocessed(name, lo, hi):
    enc = _jpeg(300, 400)
    a = pixels.PREPROCESSING[name](enc, 64, pixels.generator(7, 12))
    b = pixels.PREPROCESSING[name](enc, 64, pixels.generator(7, 12))
    c = pixels.PREPROCESSING[name](enc, 64, pixels.generator(7, 13))
    assert a.shape == (64, 64, 3) and a.dtype == np.uint8
    assert (a == b).all() and not (a == c).all()
    wire = pixels.to_wire(name, a, "float32")
    assert wire.dtype == np.float32 and lo - 1e-4 <= wire.min() and wire.max() <= hi + 1e-4
    q = pixels.to_wire(name, a, "uint8")
    assert q.dtype == np.uint8 and np.abs(q.astype(float) / 255 * (hi - lo) + lo - wire).max() <= (hi - lo) / 255


def test_sixteen_bit_grey_keeps_its_top_eight_bits():
    grey = (np.arange(48 * 64).reshape(48, 64) * 20).astype(np.uint16)
    b = io.BytesIO()
    Image.fromarray(grey).save(b, "PNG")
    x = pixels.decode(b.getvalue())
    assert x.shape == (48, 64, 3) and (x[..., 0] == grey >> 8).all() and (x[..., 1] == x[..., 2]).all()


def test_every_image_a_folder_includes_decodes_and_every_undecodable_one_is_named():
    from quirky_folder import quirky_files

    for name, (content, verdict, *_) in quirky_files().items():
        if content is None or verdict not in (None, "undecodable"):
            continue
        if verdict is None:
            assert pixels.inception_train(content, 32, pixels.generator(0, 1)).shape == (32, 32, 3), name
        else:
            with pytest.raises(pixels.Undecodable):
                pixels.inception_train(content, 32, pixels.generator(0, 1))


def test_crops_follow_slims_distorted_bounding_box():
    for i in range(200):
        left, top, w, h = pixels.sample_crop(pixels.generator(0, i), 400, 300)
        assert 0 <= left and left + w <= 400 and 0 <= top and top + h <= 300
        assert w * h >= 0.1 * 400 * 300
        assert (w, h) == (400, 300) or 0.7 <= w / h <= 1.4


@pytest.mark.parametrize("delta, factor", [(0.13, 0.7), (-0.2, 1.4), (0.2, 1.5), (-0.05, 0.5)])
def test_colour_steps_keep_hsv_as_colorsys_defines_it(delta, factor):
    """The hue and saturation steps (float32, OpenCV's HSV), rounded once: within 1 of 255 of
    colorsys's HSV, turning either way and saturating either way (S at most 1)."""
    import colorsys

    x = (np.random.default_rng(0).random((20, 20, 3)) * 255).astype(np.uint8)
    f = x.astype(np.float32) / 255

    def rounded(y):
        return np.clip(y * 255 + 0.5, 0, 255).astype(int).reshape(-1, 3)

    hue, sat = rounded(pixels.colour_op(f, "h", delta)), rounded(pixels.colour_op(f, "s", factor))
    for h_got, s_got, p in zip(hue, sat, x.reshape(-1, 3) / 255.0):
        h, s, v = colorsys.rgb_to_hsv(*p)
        assert np.abs(h_got - np.round(np.array(colorsys.hsv_to_rgb((h + delta) % 1, s, v)) * 255)).max() <= 1
        assert np.abs(s_got - np.round(np.array(colorsys.hsv_to_rgb(h, min(1, s * factor), v)) * 255)).max() <= 1


def test_opencv_decodes_a_complete_jpeg_as_pillow_does_and_leaves_a_truncated_one_to_pillow():
    """A complete JPEG's pixels by OpenCV are Pillow's (both libjpeg-turbo) to within 1 of 255,
    at full and DCT scale; a JPEG cut short goes to Pillow, which names it undecodable."""
    from enspipe.data import decoding

    enc = _jpeg(300, 400, 3)
    for size, scale in ((200, 1), (64, 4)):
        got, box = decoding.decoded_box(enc, decoding.open_image(enc), (0, 0, 400, 300), size)
        want, want_box = decoding.drafted(decoding.open_image(enc), (0, 0, 400, 300), size)
        assert got.shape == np.asarray(want).shape == (300 // scale, 400 // scale, 3) and box == want_box
        assert np.abs(got.astype(int) - np.asarray(want).astype(int)).max() <= 1
    cut = enc[:len(enc) // 2]
    assert not decoding._complete_jpeg(cut) and decoding._complete_jpeg(enc)
    with pytest.raises(pixels.Undecodable):
        decoding.decoded_box(cut, decoding.open_image(cut), (0, 0, 400, 300), 200)


def test_a_jpeg_is_decoded_at_the_scale_its_crop_needs():
    big = Image.open(io.BytesIO(_jpeg(800, 1200)))
    im, box = pixels._drafted(big, (0, 0, 1200, 800), 128)
    assert im.size == (300, 200) and box == (0, 0, 300, 200)  # 1/4: at 1/8 the crop would be under 128 px tall
    big = Image.open(io.BytesIO(_jpeg(800, 1200)))
    assert pixels._drafted(big, (400, 0, 1200, 800), 64)[1] == (50, 0, 150, 100)  # 1/8, the box scaled
    small = Image.open(io.BytesIO(_jpeg(80, 120)))
    assert pixels._drafted(small, (10, 10, 90, 70), 64)[0].size == (120, 80)
    with pytest.raises(pixels.Undecodable):
        pixels.inception_train(_jpeg(60, 60)[:300], 32, pixels.generator(0, 0))


def test_the_canonical_order_interleaves_shards_as_tf_data_does(dataset):
    from enspipe.data.build import load_manifest

    m = load_manifest(dataset)
    order = NumpyOrder(m, 0, shuffle_buffer=0).at(np.arange(4))
    assert [k for k, _ in first_samples(m, 4)] == list(order["key"])
    counts = [2, 0, 3, 1, 1, 4, 2]  # an empty shard's slot goes to the next shard at once
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    assert canonical_numbers(counts).tolist() == list(_interleaved([iter(range(f, f + c)) for f, c in zip(first, counts)],
                                                                   CYCLE))
    assert canonical_numbers([2, 0, 3, 1, 1]).tolist() == [0, 6, 2, 5, 1, 3, 4]


def test_a_shuffled_epoch_holds_every_sample_once_in_an_order_of_its_own(dataset):
    from enspipe.data.build import load_manifest

    m = load_manifest(dataset)
    order = NumpyOrder(m, 3, shuffle_buffer=1024)
    e0, e1 = order.at(np.arange(m.num_images)), order.at(np.arange(m.num_images, 2 * m.num_images))
    assert sorted(e0["key"]) == sorted(e1["key"]) and len(set(e0["key"])) == m.num_images
    assert list(e0["key"]) != list(e1["key"])
    assert list(NumpyOrder(m, 3, 1024).at(np.arange(m.num_images))["key"]) == list(e0["key"])


def _exactly_once(res: list[dict], n: int, images: int, epochs: int) -> None:
    assert len(res) == n
    for m in res:
        assert [(e["count"], e["missing"]) for e in m["epochs"]] == [(images, 0)] * epochs
        assert all(row["read_only"] and row["first"] == row["last"] for row in m["rows"])


@pytest.mark.mpi
@pytest.mark.parametrize("scheme, p", EVERY_SCHEME)
def test_every_scheme_delivers_each_sample_once_without_tensorflow(dataset, tmp_path, scheme, p):
    """50 samples, batches of 10, 15 steps: three whole epochs on each of 3 members, each
    preprocessing on 2 cores (its 2 worker processes)."""
    r, res = members("keep", 3, tmp_path, without_tf=True, data=dataset, batch_size=10, image_size=32,
                     scheme=scheme, preprocessors=p, steps=15, backend="pillow", wire_dtype="uint8", threads=2)
    assert r.returncode == 0, said(r)
    _exactly_once(res, 3, 50, 3)
    assert res[0]["spec"] == [[32, 32, 3], "uint8"]
    if scheme != "baseline":  # one stream: the same batches on every member
        assert len({tuple(x["first"] for x in m["rows"]) for m in res}) == 1


@pytest.mark.mpi
def test_the_schemes_share_one_stream_of_the_same_images(dataset, tmp_path):
    """Preprocessing is seeded per sample, so a batch is the same whoever preprocesses its images."""
    runs = {}
    for scheme, p in (("all_shared", None), ("single_broadcast", 1)):
        (tmp_path / scheme).mkdir()
        r, res = members("keep", 2, tmp_path / scheme, without_tf=True, data=dataset, batch_size=10, image_size=32,
                         scheme=scheme, preprocessors=p, steps=6, backend="pillow")
        assert r.returncode == 0, said(r)
        runs[scheme] = [x["first"] for x in res[0]["rows"]]
    assert runs["all_shared"] == runs["single_broadcast"]


@pytest.mark.mpi
def test_an_image_folder_without_tensorflow_skips_and_counts_what_cannot_be_decoded(tmp_path):
    root = tmp_path / "folder"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            (root / c / f"{i}.jpg").write_bytes(_jpeg(40 + i, 50, i))
    (root / "dog" / "cut.jpg").write_bytes(_jpeg(200, 200)[:900])  # its header reads; its data is cut short
    out = tmp_path / "out"
    out.mkdir()
    r, res = members("keep", 2, out, without_tf=True, data=str(root), batch_size=13, image_size=32, steps=3,
                     backend="pillow", skip_corrupt=True, shuffle_buffer=0, threads=2)
    assert r.returncode == 0, said(r)
    assert [(e["count"], e["missing"]) for e in res[0]["epochs"]][:2] == [(12, 1), (12, 1)]
    r, _ = members("keep", 2, out, without_tf=True, data=str(root), batch_size=13, image_size=32, steps=2,
                   backend="pillow", shuffle_buffer=0, threads=2)
    assert r.returncode != 0 and "dog/cut.jpg: undecodable image" in r.stderr, r.stderr[-2000:]


def test_the_backend_is_checked_before_any_collective(dataset):
    import enspipe as lib

    with pytest.raises(lib.ConfigError) as e:
        lib.SharedStream(dataset, 10, backend="opencv")
    assert e.value.field == "backend"
    with pytest.raises(lib.ConfigError) as e:
        lib.SharedStream(dataset, 10, backend="pillow", preprocess=lambda image, seed: image)
    assert e.value.field == "preprocess" and "cannot be sent to the worker processes" in str(e.value)


def test_without_tensorflow_the_default_is_pillow_and_tf_is_refused(dataset):
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import enspipe, sys\nfrom enspipe.engine.config import StreamConfig\n"
            f"print(StreamConfig(data={str(dataset)!r}, batch_size=8).backend)\n"
            f"try:\n    StreamConfig(data={str(dataset)!r}, batch_size=8, backend='tf')\n"
            "except enspipe.ConfigError as e:\n    print(e)\n")
    script = os.path.join(str(dataset), "..", "probe_backend.py")
    with open(script, "w") as f:
        f.write(code)
    r = subprocess.run([sys.executable, os.path.join(here, "without_tf.py"), script], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "pillow"
    assert "TensorFlow is not installed here" in r.stdout and "pip install tensorflow-cpu" in r.stdout


@pytest.mark.mpi
def test_the_data_commands_and_a_measured_cell_run_without_tensorflow(tmp_path):
    """make-dataset, index and `enspipe run` (peak and emulated consumers) where TensorFlow cannot
    be imported; Keras training and --backend tf say what to install."""
    import json
    import shutil
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    cli = [sys.executable, os.path.join(here, "without_tf.py"), shutil.which("enspipe", path=os.path.dirname(
        sys.executable))]
    data = tmp_path / "d"

    def run(*args, n=None):
        cmd = [*([MPIEXEC, "-n", str(n)] if n else []), *cli, *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    r = run("make-dataset", "--out", data, "--num-images", 40, "--seed", 2)
    assert r.returncode == 0, said(r)
    made = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").unlink()
    r = run("index", "--data", data)
    assert r.returncode == 0, said(r)
    assert json.loads((data / "manifest.json").read_text())["digest"] == made["digest"]
    for consumer in ("peak", "emulated"):
        out = tmp_path / consumer
        r = run("run", "--data", data, "--out", out, "--scheme", "all_shared", "--batch-size", 8, "--image-size", 32,
                "--warmup", 1, "--steps", 5, "--consumer", consumer, "--cpu-monitor", "none",
                *(["--rate", 400, "--preprocess", "standard", "--cores", 2] if consumer == "emulated" else []), n=2)
        assert r.returncode == 0, said(r)
        s = json.loads((out / "summary.json").read_text())
        assert s["backend"] == "pillow" and s["versions"]["tensorflow"] is None and s["consumer"] == consumer
        assert s["preprocessing"] == ("standard" if consumer == "emulated" else "inception")
        assert s["delivery"]["exactly_once"] and s["delivery"]["skipped_samples"] == 0
    for args, field in ((("--consumer", "train", "--trainer", "keras"), "--trainer"), (("--backend", "tf"), "--backend")):
        r = run("run", "--data", data, "--out", tmp_path / "no", *args)
        assert r.returncode == 2 and f"enspipe: error: {field}: " in r.stderr and "needs TensorFlow" in r.stderr
    for args in (("calibrate-rc", "--network", "tiny", "--out", tmp_path / "rc.json", "--trainer", "keras"),
                 ("profile", "--network", "tiny", "--data", data, "--cache", tmp_path / "profiles")):
        r = run(*args)
        assert r.returncode == 2 and "TensorFlow is not installed here; pip install 'enspipe[tf]'" in r.stderr, r.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["pillow", "tf"])
def test_the_standard_preprocessing_delivers_each_sample_once_on_either_backend(dataset, tmp_path, backend):
    """torchvision's standard transform by name, on 2 members of 2 cores each."""
    import importlib.util

    if backend == "tf" and importlib.util.find_spec("tensorflow") is None:
        pytest.skip("the tf backend needs TensorFlow, which this environment leaves out")
    r, res = members("keep", 2, tmp_path, without_tf=backend == "pillow", data=dataset, batch_size=10,
                     image_size=32, scheme="all_shared", steps=10, backend=backend, preprocess="standard",
                     threads=2)
    assert r.returncode == 0, said(r)
    _exactly_once(res, 2, 50, 2)
    assert res[0]["spec"] == [[32, 32, 3], "float32"]
