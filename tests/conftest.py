import functools
import json
import os
import shutil
import subprocess
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")


# every library scheme once, All-Shared in the quick suite and the rest in the slow one
EVERY_SCHEME = [
    ("all_shared", None),
    pytest.param("baseline", None, marks=pytest.mark.slow),
    pytest.param("single_broadcast", 1, marks=pytest.mark.slow),
    pytest.param("multi_broadcast", 2, marks=pytest.mark.slow),
    pytest.param("hierarchical", None, marks=pytest.mark.slow),
]


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """50 synthetic images in 3 shards: no test batch size divides 50."""
    from enspipe.data.synthetic import make_dataset

    out = str(tmp_path_factory.mktemp("data") / "d50")
    make_dataset(out, 50, seed=3, num_classes=10, images_per_shard=20)
    return out


@pytest.fixture(scope="session")
def tiny_profile(dataset, tmp_path_factory):
    """`enspipe profile` of tiny at 32 px, batch 8, on 1 and 2 ranks (its rates and its layers):
    ``(profile path, the command's arguments)``."""
    cache = tmp_path_factory.mktemp("profiles")
    args = ["profile", "--network", "tiny", "--data", dataset, "--cache", cache, "--accelerators", "1,2",
            "--batch-size", 8, "--steps", 4, "--image-size", 32, "--", "--warmup", 2, "--cpu-monitor", "none"]
    r = enspipe(*args)
    assert r.returncode == 0, said(r)
    (path,) = cache.glob("tiny_32px_b8_*.json")
    return path, args


def enspipe(*args, n: int | None = None, env: dict | None = None, timeout: float = 300, launcher=()):
    """Run the CLI (under mpiexec when n is given, with the ``launcher`` options, say fake hosts
    ``("-launcher", "fork", "-hosts", "a:2,b:2")``); returns the CompletedProcess."""
    cmd = [sys.executable, "-m", "enspipe", *map(str, args)]
    if n is not None:
        cmd = [MPIEXEC, *launcher, "-n", str(n), *cmd]
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


@functools.cache
def slurm_nodes() -> dict[str, str]:
    """Slurm's nodes and their states (``sinfo``); none where Slurm is not installed or no
    controller answers within 5 s (a configured cluster that is down waits 9 s per call)."""
    if not shutil.which("sinfo"):
        return {}
    try:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return {}
    return dict(line.split(None, 1) for line in r.stdout.splitlines() if line.strip()) if r.returncode == 0 else {}


def with_option(args: list, option: str, value) -> list:
    """A copy of ``args`` with ``option``'s value replaced (the option must be there)."""
    i = args.index(option)
    return [*args[:i + 1], str(value), *args[i + 2:]]


def summary(out) -> dict:
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def manifest(data) -> dict:
    with open(os.path.join(data, "manifest.json")) as f:
        return json.load(f)


@pytest.fixture(scope="session")
def bad_jpeg_dataset(tmp_path_factory):
    """Shards whose record 3 of shard 0 holds bytes that are not a JPEG."""
    import tensorflow as tf

    from enspipe.data.records import slim_example
    from enspipe.data.synthetic import make_dataset

    root = tmp_path_factory.mktemp("bad") / "d"
    m = make_dataset(str(root), 12, seed=2, num_classes=3, images_per_shard=6)
    shard = root / m.files[0]
    records = [r.numpy() for r in tf.data.TFRecordDataset(str(shard))]
    records[3] = slim_example(b"this is not a jpeg", 1, 10, 10, "bad.JPEG", "x")
    with tf.io.TFRecordWriter(str(shard)) as w:
        for rec in records:
            w.write(rec)
    m_json = manifest(root)  # an intended change: the manifest records the shard's new size
    m_json["shards"][0]["bytes"] = os.path.getsize(shard)
    (root / "manifest.json").write_text(json.dumps(m_json))
    return str(root), f"{m.files[0]}:3"


NOISE = ("oneDNN custom operations are on", "All log messages before absl::InitializeLog()")


def synthetic_jpeg(h: int, w: int, seed: int = 0) -> bytes:
    """An ``h`` x ``w`` JPEG (quality 90) of colour gradients with seeded noise."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 3 + y) % 256, (y * 2) % 256, (x + y * 5) % 256], -1) + rng.integers(0, 30, (h, w, 3))
    b = io.BytesIO()
    Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(b, "JPEG", quality=90)
    return b.getvalue()


def said(r: subprocess.CompletedProcess, chars: int = 3000) -> str:
    """A failed command's last words for an assertion message: its exit status, then the tails of
    its stderr and stdout without TensorFlow's start-up lines (a rank each, which can fill the tail)."""
    def tail(text):
        return "\n".join(line for line in (text or "").splitlines() if not any(n in line for n in NOISE))[-chars:]

    return f"exit status {r.returncode}\n--- stderr ---\n{tail(r.stderr)}\n--- stdout ---\n{tail(r.stdout)}"


def events(out, rank: int = 0) -> list[dict]:
    """Every event one rank of a cell logged, in order (its events.rankNNNN.jsonl)."""
    with open(os.path.join(out, f"events.rank{rank:04d}.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_values(out, rank: int, key: str = "batch_digest") -> list:
    """``key`` of every step event of one rank, in order (batch digests, checksums, ...)."""
    return [e[key] for e in events(out, rank) if e["event"] == "step"]


def selected(request, test_name: str) -> list[dict]:
    """The parameters of every selected test of this module named ``test_name`` (its parametrized
    cases in this session, after -m and -k): what a module's shared job must run."""
    return [item.callspec.params for item in request.session.items
            if getattr(item, "originalname", None) == test_name and item.module is request.module]


def run_cells(n: int, cells: dict, root, launcher=(), timeout: float = 900) -> dict:
    """Cells of ``n`` ranks, each named by its key with its ``enspipe run`` options (no --out), run
    as one MPI job (``enspipe run-cells``: Python, MPI and TensorFlow start once, not per cell),
    under mpiexec with the ``launcher`` options. Returns ``{name: its output folder}``; a folder
    without summary.json has the cell's summary.failed.json, and ``root/job.txt`` what the job said."""
    root = str(root)
    outs = {name: os.path.join(root, str(i)) for i, name in enumerate(cells)}
    spec = os.path.join(root, "job.json")
    with open(spec, "w") as f:
        json.dump({"n": n, "cells": [{"name": str(name), "args": [*map(str, args), "--out", outs[name]]}
                                     for name, args in cells.items()]}, f)
    r = enspipe("run-cells", spec, "--launcher", " ".join([MPIEXEC, *launcher, "-n", str(n)]), timeout=timeout)
    with open(os.path.join(root, "job.txt"), "w") as f:
        f.write(said(r, chars=20000))
    return outs


def cell_said(out) -> str:
    """Why a cell of a shared job has no summary: its failure record and the job's last words."""
    parts = []
    for name in ("summary.failed.json", os.path.join("..", "job.txt")):
        path = os.path.join(str(out), name)
        if os.path.exists(path):
            with open(path) as f:
                parts.append(f.read()[-6000:])
    return "\n".join(parts) or f"{out}: no summary and no record of a failure"
