"""Real MPI jobs under mpiexec -n 2..4 (oversubscribed on small machines)."""
import json
import os
import time

import pytest

from conftest import enspipe, manifest, summary, with_option

pytestmark = pytest.mark.mpi
COMMON = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--steps", "7", "--warmup", "0",
          "--cores", "1", "--image-size", "32", "--shuffle-buffer", "16"]


def _cells():
    for n in (1, 2, 3, 4):
        yield n, "baseline", None
        yield n, "all_shared", None
        for p in range(1, n):
            yield n, "single_broadcast", p
        for p in range(1, n + 1):
            yield n, "multi_broadcast", p


def _batch_digests(out, rank):
    with open(os.path.join(out, f"events.rank{rank:04d}.jsonl")) as f:
        return [e["batch_digest"] for e in map(json.loads, f) if e["event"] == "step"]


@pytest.mark.parametrize("n, scheme, p", list(_cells()), ids=lambda v: str(v))
def test_exactly_once_for_every_member(dataset, tmp_path, n, scheme, p):
    extra = ["--preprocessors", p] if p else []
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--scheme", scheme, *extra, *COMMON, n=n)
    assert r.returncode == 0, r.stderr[-3000:]
    s, want = summary(tmp_path), manifest(dataset)["digest"]
    assert (s["scheme"], s["n"], len(s["ranks"])) == (scheme, n, n)
    for rank in s["ranks"]:
        assert rank["epochs"] == [{"epoch": 0, "count": 50, "digest": want, "missing": 0}], rank["rank"]
        assert rank["images"] == 56
    orders = [_batch_digests(tmp_path, r) for r in range(n)]
    if scheme == "baseline":
        assert all(rank["bytes_sent"] == 0 for rank in s["ranks"])
        if n > 1:
            assert orders[0] != orders[1]  # own streams, own orders
    else:
        assert all(o == orders[0] for o in orders)  # same batches, same order
        roles = [rank["role"] for rank in s["ranks"]]
        if scheme == "single_broadcast":
            assert roles[p - 1] == "leader" and roles[p:] == ["compute-only"] * (n - p)


def test_shared_batches_equal_a_single_members(dataset, tmp_path):
    """Stateless per-element seeds: All-Shared over 3 ranks delivers the very batches one rank makes."""
    one = enspipe("run", "--data", dataset, "--out", tmp_path / "one", "--scheme", "all_shared", *COMMON, n=1)
    three = enspipe("run", "--data", dataset, "--out", tmp_path / "three", "--scheme", "all_shared", *COMMON, n=3)
    assert one.returncode == 0 and three.returncode == 0, three.stderr[-2000:]
    assert _batch_digests(tmp_path / "one", 0) == _batch_digests(tmp_path / "three", 2)


@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_failed_rank_ends_the_job_fast(dataset, tmp_path, kind):
    t = time.monotonic()
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--scheme", "all_shared",
                *with_option(COMMON, "--steps", 500), n=3, env={"ENSPIPE_INJECT_FAULT": f"1:3:{kind}"}, timeout=120)
    elapsed = time.monotonic() - t
    assert r.returncode != 0
    assert elapsed < 60  # includes TensorFlow start-up of 3 oversubscribed ranks; the abort itself is immediate
    assert not (tmp_path / "summary.json").exists()
    if kind == "raise":
        assert "rank 1 failed" in r.stderr and (tmp_path / "error.rank0001.txt").exists()
