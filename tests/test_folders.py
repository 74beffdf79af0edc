"""Image folders as users have them: every file included or named with its reason, by its content,
through convert, index, a two-member cell and the library; ImageNet's training and validation
layouts; conversion that resumes and never looks complete when interrupted."""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import enspipe, manifest, said, summary
from quirky_folder import make_quirky_folder

from enspipe.data.folders import accounted, list_folder
from enspipe.data.images import judge_bytes, read_image


@pytest.fixture(scope="module")
def quirky(tmp_path_factory):
    root = tmp_path_factory.mktemp("quirky") / "photos"
    return str(root), make_quirky_folder(str(root))


def _verdicts(rows: list[dict], included: list[str]) -> dict[str, str | None]:
    return {**{r["path"].rstrip("/"): r["reason"] for r in rows}, **{f: None for f in included}}


def _skipped_csv(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _expected(expected: dict, level: int) -> dict[str, str | None]:
    return {rel: v[level] for rel, v in expected.items()}


@pytest.mark.parametrize("level", ["decode", "header"])
def test_every_file_gets_its_verdict_by_content(quirky, level):
    root, expected = quirky
    files, labels, acc = accounted(list_folder(root), level)
    got = _verdicts([{"path": rel, "reason": v.reason} for rel, v in acc.rows], files)
    assert got == _expected(expected, 0 if level == "decode" else 1)
    assert acc.included == len(files) == len(labels)


def test_the_verdicts_are_the_pipelines_decoder(quirky):
    """What is included decodes with the pipeline's decoder; what is undecodable or unsupported does not."""
    import tensorflow as tf

    from enspipe.data.preprocessing import decode

    root, expected = quirky
    for rel, (verdict, _) in expected.items():
        if verdict in (None, "undecodable", "unsupported_format"):
            data = open(os.path.join(root, rel), "rb").read()
            try:
                decode(tf.constant(data)).numpy()
                ok = True
            except tf.errors.InvalidArgumentError:
                ok = False
            assert ok == (verdict is None), rel


def test_an_unreadable_file_and_the_extension_do_not_decide(tmp_path, monkeypatch):
    png = open(os.path.join(os.path.dirname(__file__), "quirky_folder.py"), "rb").read()
    assert judge_bytes(png, "x.JPEG").reason == "not_an_image"
    (tmp_path / "locked.jpg").write_bytes(b"\xff\xd8\xff")

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("builtins.open", refuse)
    v, _ = read_image(str(tmp_path / "locked.jpg"))
    assert (v.reason, v.detail) == ("unreadable", "Permission denied")


def _check_accounting(data_dir, m, expected):
    rows = _skipped_csv(os.path.join(data_dir, "skipped.csv"))
    left_out = {r["path"].rstrip("/"): r["reason"] for r in rows}
    want = {rel: v for rel, v in _expected(expected, 0).items() if v is not None}
    assert left_out == want
    acc = m["accounting"]
    assert acc["included"] == m["num_images"] == sum(v is None for v in want.values()) + sum(
        v is None for v in _expected(expected, 0).values())
    assert sum(acc["skipped"].values()) + sum(acc["ignored"].values()) == len(want)
    assert acc["ignored"] == {"hidden": 1, "non_image": 2} and acc["skipped"]["undecodable"] == 2


def test_convert_accounts_for_every_file_and_delivers_each_once(quirky, tmp_path):
    root, expected = quirky
    r = enspipe("convert", "--jpeg-dir", root, "--out", tmp_path / "s", "--images-per-shard", "5", "--workers", "2")
    assert r.returncode == 0, said(r)
    last = r.stdout.strip().splitlines()[-1]
    assert "18 images included, 8 files skipped" in last and str(tmp_path / "s" / "skipped.csv") in last and "--strict" in last
    m = manifest(tmp_path / "s")
    _check_accounting(tmp_path / "s", m, expected)
    assert m["classes"] == ["cat", "dog", "éléphant"] and m["numbering"] == "folders" and m["num_classes"] == 3
    from enspipe.data.build import load_manifest
    from enspipe.data.keys import digest_of
    from enspipe.data.shards import read_slices

    loaded = load_manifest(str(tmp_path / "s"))
    epoch = next(read_slices(loaded, 0, 8, False, loaded.num_images, 0, loaded.num_images))
    assert len(set(epoch["id"])) == 18 and digest_of(epoch["id"]) == loaded.digest
    strict = enspipe("convert", "--jpeg-dir", root, "--out", tmp_path / "t", "--strict", "--workers", "1")
    assert strict.returncode == 2 and "8 files skipped under --strict" in strict.stderr and "skipped.csv" in strict.stderr
    assert not (tmp_path / "t" / "manifest.json").exists()


def test_index_decodes_every_file_and_lists_what_it_left_out(quirky, tmp_path):
    root, expected = quirky
    data = tmp_path / "copy"
    shutil.copytree(root, data, symlinks=True)
    r = enspipe("index", "--data", data, "--workers", "1")
    assert r.returncode == 0, said(r)
    assert "18 images, 3 classes" in r.stdout and str(data / "skipped.csv") in r.stdout
    m = manifest(data)
    _check_accounting(data, m, expected)
    assert m["kind"] == "jpeg_folders" and len(m["files"]) == 18


@pytest.mark.mpi
def test_a_folder_given_to_a_two_member_cell_is_accounted_and_delivered_exactly_once(quirky, tmp_path):
    """Given directly, each file's header is checked; the truncated JPEG is found at training and
    skipped and counted under --on-corrupt skip; every other included image reaches both members once."""
    root, expected = quirky
    r = enspipe("run", "--data", root, "--out", tmp_path / "o", "--scheme", "all_shared", "--network", "tiny",
                "--consumer", "peak", "--batch-size", "4", "--steps", "6", "--warmup", "0", "--image-size", "32",
                "--on-corrupt", "skip", "--cpu-monitor", "none", n=2)
    assert r.returncode == 0, said(r)
    text = r.stdout + r.stderr
    assert "19 images included, 7 files skipped (" in text and " and 3 ignored (1 hidden, 2 non image)" in text
    s = summary(tmp_path / "o")
    assert s["dataset"]["accounting"]["included"] == 19
    assert {k for rank in s["ranks"] for k in rank["skipped_by_epoch"].get("0", [])} == {"dog/truncated.jpg"}
    for rank in s["ranks"]:  # the member that preprocessed it skipped it; neither got it
        assert rank["epochs"][0]["count"] == 18 and rank["epochs"][0]["missing"] == 1


@pytest.mark.mpi
def test_a_pillow_cells_summary_counts_the_images_its_workers_decoded_whole(quirky, tmp_path):
    """On 2 cores the pillow backend's worker processes decode; the images the region decode cannot
    take (ImageNet's PNG named .JPEG, a CMYK JPEG) are decoded whole, and the summary counts them
    by reason."""
    root, _ = quirky
    r = enspipe("run", "--data", root, "--out", tmp_path / "o", "--scheme", "baseline", "--network", "tiny",
                "--consumer", "peak", "--batch-size", "4", "--steps", "10", "--warmup", "0", "--image-size", "32",
                "--backend", "pillow", "--preprocess", "standard", "--cores", "2", "--on-corrupt", "skip",
                "--cpu-monitor", "none", n=1)
    assert r.returncode == 0, said(r)
    (rank,) = summary(tmp_path / "o")["ranks"]
    whole = rank["decodes"]["decoded_whole"]
    assert whole.get("not a JPEG (PNG)", 0) >= 1 and whole.get("not RGB or grey (CMYK)", 0) >= 1, whole


def test_the_library_says_what_it_left_out_and_delivers_each_once(quirky, tmp_path):
    root, _ = quirky
    code = ("import enspipe\n"
            f"with enspipe.SharedStream({root!r}, 4, image_size=32, skip_corrupt=True) as s:\n"
            "    for _ in s:\n"
            "        pass\n"
            "    print('epoch 0:', s.epochs()[0]['count'], s.epochs()[0]['missing'], s.num_classes)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert "epoch 0: 18 1 3" in r.stdout  # the truncated JPEG found at training, skipped and counted
    assert "19 images included, 7 files skipped (" in r.stderr and "and 3 ignored" in r.stderr
    assert "`enspipe index --data" in r.stderr and "skipped.csv" in r.stderr


# -- ImageNet as it is distributed -------------------------------------------------------------------
def _jpeg(seed: int) -> bytes:
    import io

    from PIL import Image

    b = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(b, "JPEG")
    return b.getvalue()


@pytest.fixture(scope="module")
def mini_imagenet(tmp_path_factory):
    """A miniature ImageNet: synset folders, a flat validation folder, Kaggle's CSV, the synset list."""
    root = tmp_path_factory.mktemp("imagenet")
    synsets = ["n01440764", "n01443537", "n01484850", "n01491361"]
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{s} class {i}, a fish\n" for i, s in enumerate(synsets)))
    for i, s in enumerate(synsets[:3]):  # the training set lacks the fourth class: the list still numbers it
        (root / "train" / s).mkdir(parents=True)
        for j in range(3):
            (root / "train" / s / f"{s}_{j}.JPEG").write_bytes(_jpeg(10 * i + j))
    (root / "val").mkdir()
    rows, truth = ["ImageId,PredictionString"], {}
    for k in range(8):
        name, s = f"ILSVRC2012_val_{k + 1:08d}", synsets[k % 4]
        (root / "val" / f"{name}.JPEG").write_bytes(_jpeg(100 + k))
        rows.append(f"{name},{s} 1 2 30 40 {s} 3 4 20 20")
        truth[f"{name}.JPEG"] = s
    (root / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    (root / "slim_val_labels.txt").write_text("".join(truth[f] + "\n" for f in sorted(truth)))
    return root, synsets, truth


@pytest.mark.parametrize("numbering", ["folders", pytest.param("slim", marks=pytest.mark.slow)])
def test_a_miniature_imagenet_converts_with_one_numbering(mini_imagenet, tmp_path, numbering):
    from enspipe.data.build import load_manifest
    from enspipe.data.shards import read_slices

    root, synsets, truth = mini_imagenet
    first = 1 if numbering == "slim" else 0
    common = ["--synsets", root / "LOC_synset_mapping.txt", "--numbering", numbering, "--workers", "1"]
    for split, extra in (("train", []), ("validation", ["--labels", root / "LOC_val_solution.csv"]),
                         ("slimval", ["--labels", root / "slim_val_labels.txt"])):
        src = root / ("train" if split == "train" else "val")
        r = enspipe("convert", "--jpeg-dir", src, "--out", tmp_path / split, "--split", split, *common, *extra)
        assert r.returncode == 0, said(r)
        m = manifest(tmp_path / split)
        assert m["num_classes"] == 4 + first and m["numbering"] == numbering and m["classes"] == synsets
        loaded = load_manifest(str(tmp_path / split))
        epoch = next(read_slices(loaded, 0, 0, False, loaded.num_images, 0, loaded.num_images))
        assert all(k.decode().startswith(f"{split}-") for k in epoch["key"])
        names = _filenames(tmp_path / split)
        for name, label in names.items():
            synset = name.split("/")[0] if split == "train" else truth[name]
            assert label == synsets.index(synset) + first, name
        assert len(names) == (9 if split == "train" else 8)


def _filenames(shards) -> dict[str, int]:
    """Each record's ``image/filename`` and label, read from the shards."""
    from enspipe.data.records import example_features, shard_records

    out = {}
    for f in sorted(os.listdir(shards)):
        if f.startswith(("train", "validation", "slimval")):
            for payload in shard_records(str(shards / f)):
                feats = example_features(payload)
                out[feats["image/filename"].bytes_list.value[0].decode()] = feats["image/class/label"].int64_list.value[0]
    return out


@pytest.mark.parametrize("case,words", [
    ("flat_without_labels", "not a folder of class folders"),
    pytest.param("empty_class", "a class folder with no files", marks=pytest.mark.slow),
    ("unknown_file", "names files that are not in the folder: ILSVRC2012_val_00000099"),
    pytest.param("unknown_synset", "has classes the synset list", marks=pytest.mark.slow),
    pytest.param("folders_not_in_list", "has classes the synset list", marks=pytest.mark.slow),
    pytest.param("numeric", "numeric labels", marks=pytest.mark.slow),
    pytest.param("missing_label", "have no line in", marks=pytest.mark.slow),
])
def test_bad_imagenet_input_gets_one_line(mini_imagenet, tmp_path, case, words):
    root, synsets, _ = mini_imagenet
    val, csv_path, syn = tmp_path / "val", tmp_path / "labels.csv", root / "LOC_synset_mapping.txt"
    shutil.copytree(root / "val", val)
    shutil.copy(root / "LOC_val_solution.csv", csv_path)
    args = ["--jpeg-dir", val, "--labels", csv_path, "--synsets", syn]
    if case == "flat_without_labels":
        args = ["--jpeg-dir", val]
    elif case == "empty_class":
        shutil.copytree(root / "train", tmp_path / "train")
        (tmp_path / "train" / "n01491361").mkdir()
        args = ["--jpeg-dir", tmp_path / "train"]
    elif case == "unknown_file":
        csv_path.write_text(csv_path.read_text() + "ILSVRC2012_val_00000099,n01440764 1 2 3 4\n")
    elif case == "unknown_synset":
        csv_path.write_text(csv_path.read_text().replace("n01443537", "n09999999"))
    elif case == "folders_not_in_list":
        (tmp_path / "short.txt").write_text("n01440764\n")
        args = ["--jpeg-dir", root / "train", "--synsets", tmp_path / "short.txt"]
    elif case == "numeric":
        csv_path.write_text("".join(f"ILSVRC2012_val_{k + 1:08d}.JPEG {k % 4 + 1}\n" for k in range(8)))
    elif case == "missing_label":
        csv_path.write_text("\n".join(csv_path.read_text().splitlines()[:-1]) + "\n")
    before = sorted(os.listdir(val))
    r = enspipe("convert", *args, "--out", tmp_path / "out", "--workers", "1")
    assert r.returncode == 2 and words in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and not (tmp_path / "out" / "manifest.json").exists()
    assert sorted(os.listdir(val)) == before


# -- conversion at scale: resumed, never complete-looking when interrupted ---------------------------
@pytest.fixture(scope="module")
def many(tmp_path_factory):
    root = tmp_path_factory.mktemp("many") / "imgs"
    for c in range(4):
        (root / f"c{c}").mkdir(parents=True)
        for j in range(150):
            (root / f"c{c}" / f"{j}.jpg").write_bytes(_jpeg(1000 * c + j))
    return root


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_conversion_leaves_no_manifest_and_resumes(many, tmp_path, sig):
    out = tmp_path / "s"
    cmd = [sys.executable, "-m", "enspipe", "convert", "--jpeg-dir", str(many), "--out", str(out),
           "--images-per-shard", "10", "--workers", "1"]
    # SIGINT as a terminal gives it: a test run in the background (`.ci/run &`) inherits SIGINT ignored,
    # and Python then keeps it ignored, so the conversion would run to its end (exit 0)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    state = out / ".enspipe-convert"
    while time.monotonic() < deadline and p.poll() is None and len(os.listdir(state) if state.exists() else []) < 3:
        time.sleep(0.05)
    assert p.poll() is None, "the conversion ended before the signal could interrupt it"
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and not (out / "manifest.json").exists()
    if sig == signal.SIGINT:
        assert p.returncode == 130 and "rerun the same command to resume" in err + _
    complete = len(os.listdir(out / ".enspipe-convert"))
    assert 3 <= complete < 60
    r = enspipe(*cmd[3:])
    assert r.returncode == 0, said(r)
    reused = int(r.stdout.split(" complete shards reused")[0].rsplit("(", 1)[1])
    assert reused >= complete - 1  # a shard renamed as the kill came may lack its note: rewritten
    fresh = enspipe(*cmd[3:-4], "--out", tmp_path / "fresh", "--images-per-shard", "10", "--workers", "2")
    assert fresh.returncode == 0
    assert manifest(out)["digest"] == manifest(tmp_path / "fresh")["digest"]
    assert manifest(out)["accounting"]["included"] == 600
    assert not [f for f in os.listdir(out) if f.endswith(".partial")] or sig == signal.SIGKILL


def test_progress_is_a_redrawn_line_on_a_terminal_and_plain_lines_elsewhere():
    import io

    from enspipe.common.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, log = Tty(), io.StringIO()
    for stream in (tty, log):
        p = Progress("convert", 100, stream, every=0.0)
        p.update(50, 5_000_000)
        p.update(100, 10_000_000)
        p.close()
    assert tty.getvalue().count("\r\033[K") == 3 and "left" in tty.getvalue() and tty.getvalue().endswith("\n")
    lines = log.getvalue().splitlines()
    assert len(lines) == 3 and lines[0].startswith("convert: 50/100 files (50.0%)") and "MB/s" in lines[0]
    assert json.dumps(lines)  # plain text, no control characters
    assert "\r" not in log.getvalue()


@pytest.mark.workflow
def test_the_workflows_data_stage_converts_a_users_folder_and_reports_its_counts(quirky, tmp_path):
    import yaml

    from test_workflow import _config, snakemake

    root, _ = quirky
    before = sorted(os.listdir(root))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(_config("test") | {"dataset": {"path": root}}))
    r = snakemake("results/tables/dataset.csv", "--cores", "2", "--configfile", cfg, workdir=tmp_path / "wd")
    assert r.returncode == 0, said(r)
    with open(tmp_path / "wd" / "results" / "tables" / "dataset.csv", newline="") as f:
        rows = {(x["verdict"], x["reason"]): int(x["files"]) for x in csv.DictReader(f)}
    assert rows[("skipped", "undecodable")] == 2 and rows[("ignored", "hidden")] == 1
    assert [n for (verdict, _), n in rows.items() if verdict == "included"] == [18]
    assert (tmp_path / "wd" / "results" / "dataset" / "skipped.csv").exists()
    assert sorted(os.listdir(root)) == before  # nothing written into the user's folder


def test_a_flat_folder_of_images_without_labels_is_named_with_the_fix(mini_imagenet):
    from enspipe.data.build import load_manifest
    from enspipe.data.manifest import DataError, check

    root, _, _ = mini_imagenet
    assert "holds images but no class folders" in check(str(root / "val")) and "--labels" in check(str(root / "val"))
    with pytest.raises(DataError, match="holds images but no class folders"):
        load_manifest(str(root / "val"))


def test_labels_files_of_every_kind_name_the_same_classes(mini_imagenet, tmp_path):
    """Kaggle's CSV, TF-Slim's list in file order, and `file class` lines split by commas, spaces or tabs."""
    from enspipe.data.folders import list_folder

    root, synsets, truth = mini_imagenet
    files = sorted(truth)
    kinds = {"kaggle.csv": None, "slim.txt": None,
             "comma.csv": "".join(f"{f},{truth[f]}\n" for f in files),
             "tabs.txt": "".join(f"{os.path.splitext(f)[0]}\t{truth[f]}\n" for f in files),
             "spaces.txt": "".join(f"{f}   {truth[f]}\n" for f in files)}
    shutil.copy(root / "LOC_val_solution.csv", tmp_path / "kaggle.csv")
    shutil.copy(root / "slim_val_labels.txt", tmp_path / "slim.txt")
    for name, text in kinds.items():
        if text is not None:
            (tmp_path / name).write_text(text)
        listing = list_folder(str(root / "val"), str(tmp_path / name), str(root / "LOC_synset_mapping.txt"))
        assert {f: synsets[label] for f, label in zip(listing.files, listing.labels)} == truth, name
