"""The Horovod transport (process sets) under mpiexec: every member's epochs exactly once, and the
very batches the mpi4py transport delivers, bit for bit, for the same seeds.

Runs where Horovod imports (``make horovod`` builds ``.venv-horovod``; ``make test-horovod`` and
``.ci/run`` run this file there); elsewhere every test skips, saying why.
"""
import pytest

from conftest import enspipe, manifest, said, step_values, summary
from enspipe.exchange.horovod import available

OK, WHY = available()
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.skipif(not OK, reason=WHY)]
COMMON = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--steps", "7", "--warmup", "0",
          "--cores", "1", "--image-size", "32", "--shuffle-buffer", "16", "--batch-checksums"]
CELLS = [(3, "all_shared", None), (3, "single_broadcast", 2), (3, "single_broadcast", 1), (3, "multi_broadcast", 2),
         (4, "multi_broadcast", 4), (4, "single_broadcast", 2), (2, "all_shared", None)]


def _checksums(out, rank):
    return step_values(out, rank, "batch_checksum")


def _run(dataset, out, transport, n, scheme, p, *extra):
    args = ["--preprocessors", p] if p else []
    r = enspipe("run", "--data", dataset, "--out", out, "--transport", transport, "--scheme", scheme, *args,
                *COMMON, *extra, n=n)
    assert r.returncode == 0, said(r)
    return summary(out)


@pytest.mark.parametrize("n, scheme, p", CELLS, ids=lambda v: str(v))
def test_exactly_once_and_bit_identical_to_mpi4py(dataset, tmp_path, n, scheme, p):
    hv = _run(dataset, tmp_path / "horovod", "horovod", n, scheme, p)
    want = manifest(dataset)["digest"]
    assert hv["transport"] == "horovod" and len(hv["ranks"]) == n
    for rank in hv["ranks"]:
        assert rank["epochs"] == [{"epoch": 0, "count": 50, "digest": want, "missing": 0}], rank["rank"]
        assert set(rank["exchange_paths"].values()) == {"horovod"}
    mp = _run(dataset, tmp_path / "mpi4py", "mpi4py", n, scheme, p)
    assert mp["transport"] == "mpi4py"
    reference = _checksums(tmp_path / "mpi4py", 0)
    assert len(reference) == 7
    for rank in range(n):  # every member of both transports: the same bytes in the same order
        assert _checksums(tmp_path / "horovod", rank) == reference, rank
        assert _checksums(tmp_path / "mpi4py", rank) == reference, rank
    # the same payload accounting per collective, rank by rank (each rank plays one role, so its
    # bytes per collective are fixed; how many collectives fall inside the measured window depends
    # on how far its exchange stage ran ahead of the consumer when the window opened)
    for h, m in zip(hv["ranks"], mp["ranks"]):
        assert h["rank"] == m["rank"] and h["collectives"] > 0 and m["collectives"] > 0, h["rank"]
        assert h["bytes_sent"] * m["collectives"] == m["bytes_sent"] * h["collectives"], h["rank"]


@pytest.mark.parametrize("scheme, p", [("all_shared", None), ("multi_broadcast", 2)])
def test_skipped_records_shorten_one_block_through_horovod(bad_jpeg_dataset, tmp_path, scheme, p):
    """With --skip-corrupt blocks vary in length (Horovod's allgather takes any; the broadcasts'
    receivers learn the sizes first): the same batches as mpi4py's, each epoch one image short."""
    data, key = bad_jpeg_dataset
    for transport in ("horovod", "mpi4py"):
        _run(data, tmp_path / transport, transport, 3, scheme, p, "--skip-corrupt")
    ranks = summary(tmp_path / "horovod")["ranks"]
    assert all(r["epochs"][0]["count"] == 11 and r["epochs"][0]["missing"] == 1 for r in ranks)
    assert {k for r in ranks for k in r["skipped"]} == {key}
    for rank in range(3):
        assert _checksums(tmp_path / "horovod", rank) == _checksums(tmp_path / "mpi4py", 0)


def test_a_failed_rank_ends_a_horovod_job_fast(dataset, tmp_path):
    import time

    t = time.monotonic()
    args = [a if a != "7" else "500" for a in COMMON]
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--transport", "horovod", "--scheme", "all_shared", *args,
                n=3, env={"ENSPIPE_INJECT_FAULT": "1:3:raise"}, timeout=120)
    assert r.returncode != 0 and time.monotonic() - t < 60
    assert "rank 1 failed" in r.stderr and not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize("n, widths", [(2, "2"), (3, "1,2")])
def test_data_parallel_gradients_over_horovod_process_sets_train_as_over_mpi4py(dataset, tmp_path, n, widths):
    """A data-parallel member's gradients summed on its Horovod process set: the same losses, step
    by step, as over its mpi4py group communicator (the same batches, model and weighting)."""
    import numpy as np

    train = ["--consumer", "train", "--data-parallel", widths, "--lr", "0.05"]
    for transport in ("mpi4py", "horovod"):
        _run(dataset, tmp_path / transport, transport, n, "all_shared", None, *train)
    for rank in range(n):
        a, b = step_values(tmp_path / "mpi4py", rank, "loss"), step_values(tmp_path / "horovod", rank, "loss")
        assert len(a) == len(b) == 7
        np.testing.assert_allclose(b, a, rtol=1e-5)
    with open(tmp_path / "horovod" / "events.rank0001.jsonl") as f:  # rank 1 is in the 2-rank member
        assert '"purpose": "gradients"' in f.read()


@pytest.mark.parametrize("scheme, p", [("all_shared", None), ("single_broadcast", 1)])
def test_the_library_on_horovod_delivers_the_batches_mpi4py_does(dataset, tmp_path, scheme, p):
    from test_api import members

    runs = {}
    for transport in ("horovod", "mpi4py"):
        (tmp_path / transport).mkdir()
        r, res = members("keep", 3, tmp_path / transport, data=dataset, batch_size=8, image_size=32, scheme=scheme,
                         preprocessors=p, transport=transport, steps=7)
        assert r.returncode == 0, said(r)
        runs[transport] = res
    assert set(runs["horovod"][0]["paths"].values()) == {"horovod"}
    for hv, mp in zip(runs["horovod"], runs["mpi4py"]):
        assert [x["first"] for x in hv["rows"]] == [x["first"] for x in mp["rows"]]
        assert [x["first"] for x in hv["rows"]] == [x["last"] for x in hv["rows"]]  # kept batches unchanged
