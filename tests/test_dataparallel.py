"""Data-parallel members (``--data-parallel g``, FLEET's members on several accelerators): a
member's g ranks split each shared batch and all-reduce gradients, which trains the same model as
one rank on the whole batch."""
import json

import numpy as np
import pytest

from conftest import enspipe, said, step_values, summary, with_option
from enspipe.run.consumers import batch_slice

COMMON = ["--network", "tiny", "--batch-size", "8", "--steps", "6", "--warmup", "0", "--cores", "1",
          "--image-size", "32", "--shuffle-buffer", "16", "--batch-checksums", "--cpu-monitor", "none"]


@pytest.mark.parametrize("size, g", [(8, 2), (8, 3), (7, 4), (5, 5), (32, 6)])
def test_a_batch_splits_into_contiguous_parts_in_order(size, g):
    parts = [batch_slice(size, g, j) for j in range(g)]
    assert [i for p in parts for i in range(size)[p]] == list(range(size))
    assert max(p.stop - p.start for p in parts) - min(p.stop - p.start for p in parts) <= 1


@pytest.mark.mpi
@pytest.mark.slow
def test_a_member_on_two_ranks_trains_as_one_rank_on_the_whole_batch(dataset, tmp_path):
    one = enspipe("run", "--data", dataset, "--out", tmp_path / "one", "--consumer", "train", "--lr", "0.05", *COMMON, n=1)
    assert one.returncode == 0, said(one)
    two = enspipe("run", "--data", dataset, "--out", tmp_path / "two", "--consumer", "train", "--lr", "0.05",
                  "--scheme", "all_shared", "--data-parallel", "2", *COMMON, n=2)
    assert two.returncode == 0, said(two)
    reference = step_values(tmp_path / "one", 0, "loss")
    assert len(reference) == 6 and len(set(reference)) > 1  # it trains: the loss moves
    for rank in (0, 1):  # both ranks saw the whole batch and report the member's loss
        assert step_values(tmp_path / "two", rank, "batch_checksum") == step_values(tmp_path / "one", 0, "batch_checksum")
        np.testing.assert_allclose(step_values(tmp_path / "two", rank, "loss"), reference, rtol=1e-4)
    assert [r["member"] for r in summary(tmp_path / "two")["ranks"]] == [0, 0]


@pytest.mark.mpi
@pytest.mark.slow
def test_two_emulated_members_of_two_ranks_each(dataset, tmp_path):
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--consumer", "emulated", "--rate", "400",
                "--scheme", "multi_broadcast", "--preprocessors", "2", "--data-parallel", "2",
                "--slow-member", "1:2", *COMMON, n=4)
    assert r.returncode == 0, said(r)
    ranks = summary(tmp_path)["ranks"]
    assert [x["member"] for x in ranks] == [0, 0, 1, 1]
    assert all(x["epochs"] == [] or x["epochs"][0]["missing"] == 0 for x in ranks)


@pytest.mark.parametrize("args, n, says", [
    (["--consumer", "peak", "--data-parallel", "2"], None, "--data-parallel"),
    (["--consumer", "emulated", "--rate", "100", "--data-parallel", "2", "--scheme", "tfdata_service"], None,
     "--data-parallel"),
    (["--consumer", "emulated", "--rate", "100", "--data-parallel", "3", "--scheme", "all_shared"], 2,
     "multiple of 3"),
    (["--consumer", "emulated", "--rate", "100", "--data-parallel", "2", "--scheme", "all_shared",
      "--slow-member", "1:2"], 2, "no member 1 among 1"),
])
def test_bad_data_parallel_options_exit_2(dataset, tmp_path, args, n, says):
    r = enspipe("run", "--data", dataset, "--out", tmp_path, *COMMON, *args, n=n)
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]


@pytest.mark.mpi
@pytest.mark.slow
def test_a_flotilla_of_members_with_their_own_rates_widths_and_epochs(dataset, tmp_path):
    """Three emulated members on 1, 2 and 1 accelerators at 100, 200 and 400 images/s, training 1,
    2 and 1 epochs of 50 images in batches of 10: each trains its epochs (then its accelerators
    idle), busy at least images / rate, and every rank still receives every batch."""
    args = with_option(COMMON, "--batch-size", 10)
    r = enspipe("run", "--data", dataset, "--out", tmp_path, *with_option(args, "--steps", 10), "--consumer",
                "emulated", "--member-rates", "100,200,400", "--data-parallel", "1,2,1", "--member-epochs", "1,2,1",
                "--scheme", "all_shared", n=4)
    assert r.returncode == 0, said(r)
    ranks = summary(tmp_path)["ranks"]
    assert [x["member"] for x in ranks] == [0, 1, 1, 2]
    assert [x["trained_images"] for x in ranks] == [50, 100, 100, 50]
    for x, least in zip(ranks, [50 / 100, 50 / 200, 50 / 200, 50 / 400]):  # a rank of member 1 trains half of each batch
        assert least <= x["accelerator_busy_seconds"] < least + 1.0, x
    assert all(x["epochs"][0]["missing"] == 0 and len(x["epochs"]) == 2 for x in ranks)
    idle = [sum(e.get("idle", False) for e in map(json.loads, open(tmp_path / f"events.rank{rank:04d}.jsonl"))
                if e["event"] == "step") for rank in range(4)]
    assert idle == [5, 0, 0, 5]


@pytest.mark.parametrize("args, n, says", [
    (["--member-rates", "100,200", "--data-parallel", "1"], 3, "2 values for 3 members"),
    (["--member-rates", "100,200", "--data-parallel", "1,2"], 2, "1+2 = 3 ranks are not the job's 2"),
    (["--rate", "100", "--member-epochs", "2"], 2, "not a whole number of batches of 8"),
    (["--rate", "100", "--member-epochs", "2,0"], None, "--member-epochs"),
    (["--rate", "100", "--scaling-efficiency", "1.5"], None, "--scaling-efficiency"),
])
def test_bad_member_options_exit_2(dataset, tmp_path, args, n, says):
    r = enspipe("run", "--data", dataset, "--out", tmp_path, *COMMON, "--consumer", "emulated", "--scheme",
                "all_shared", *args, n=n)
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]


# -- how a member's ranks exchange gradients (--gradient-exchange) ---------------------------------
TRAIN = ["--consumer", "train", "--lr", "0.05", "--scheme", "all_shared", "--data-parallel", "2"]


@pytest.fixture(scope="module")
def whole(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    r = enspipe("run", "--data", dataset, "--out", out, *TRAIN, *COMMON, n=2)
    assert r.returncode == 0, said(r)
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("exchange", ["blocks", pytest.param("prophet", marks=pytest.mark.slow)])
def test_block_exchanges_train_as_the_whole_all_reduce_step_by_step(dataset, tmp_path, whole, request, exchange):
    """Blocks of gradients all-reduced during backpropagation (prophet: applied at the next step's
    start, block by block) make the very updates of one all-reduce after it: the same losses."""
    extra = (["--gradient-block-mb", "0.002"] if exchange == "blocks"
             else ["--gradient-profile", request.getfixturevalue("tiny_profile")[0]])
    r = enspipe("run", "--data", dataset, "--out", tmp_path, *TRAIN, *COMMON, "--gradient-exchange", exchange, *extra,
                n=2)
    assert r.returncode == 0, said(r)
    reference = step_values(whole, 0, "loss")
    assert len(reference) == 6 and len(set(reference)) > 1
    for rank in (0, 1):
        np.testing.assert_allclose(step_values(tmp_path, rank, "loss"), reference, rtol=1e-5)
    s = summary(tmp_path)
    assert s["gradient_exchange"].startswith(exchange)
    x = s["ranks"][0]["gradient_exchange"]
    assert x["kind"] == exchange and x["blocks"] >= 2 and 0 <= x["done_before_backward_end"] <= 1
    assert x["bytes_per_step"] == summary(whole)["ranks"][0]["gradient_exchange"]["bytes_per_step"]  # the loss too


@pytest.mark.mpi
@pytest.mark.slow
def test_ako_exchanges_a_partition_a_step_and_says_its_replicas_differ(dataset, tmp_path, whole):
    r = enspipe("run", "--data", dataset, "--out", tmp_path, *TRAIN, *COMMON, "--gradient-exchange", "ako",
                "--ako-partitions", "4", n=2)
    assert r.returncode == 0, said(r)
    s = summary(tmp_path)
    assert "replicas differ" in s["gradient_exchange"] and "not an equivalent" in s["gradient_exchange"]
    losses = [step_values(tmp_path, rank, "loss") for rank in (0, 1)]
    assert losses[0] == losses[1] and np.isfinite(losses[0]).all()  # the member's loss, summed over its parts
    assert losses[0][0] == step_values(whole, 0, "loss")[0]  # the same start; from then on the replicas differ
    assert losses[0][1:] != step_values(whole, 0, "loss")[1:]
    ako, full = (x["ranks"][0]["gradient_exchange"]["bytes_per_step"] for x in (s, summary(whole)))
    assert ako < full / 3  # a quarter of the gradient to one peer, against a ring all-reduce's whole


@pytest.mark.parametrize("args, n, says", [
    (["--consumer", "train", "--gradient-exchange", "blocks"], None, "every member is on one rank"),
    (["--consumer", "emulated", "--rate", "100", "--data-parallel", "2", "--gradient-exchange", "blocks"], None,
     "the emulated consumer has none"),
    ([*TRAIN, "--gradient-exchange", "prophet"], None, "--gradient-profile"),
    ([*TRAIN, "--gradient-exchange", "ako", "--ako-partitions", "3"], None, "do not fit a member of [2] ranks"),
    ([*TRAIN, "--gradient-exchange", "ako"], None, "--ako-partitions"),
    ([*TRAIN, "--ako-partitions", "4"], None, "is for --gradient-exchange ako"),
    ([*TRAIN, "--gradient-exchange", "blocks", "--member-batch-multipliers", "2"], None, "batch multiplier"),
    ([*TRAIN, "--gradient-exchange", "blocks", "--transport", "horovod"], None, "--gradient-exchange"),
])
def test_bad_exchange_options_exit_2_before_any_work(dataset, tmp_path, args, n, says):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", *COMMON, *args, n=n)
    assert r.returncode == 2 and says in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_a_prophet_profile_must_be_the_members_networks_with_layers(dataset, tmp_path, tiny_profile):
    record = json.loads(tiny_profile[0].read_text())
    for name, changed, says in (("other", {"network": "vgg_a"}, "is 'vgg_a''s"), ("old", {"layers": None}, "no layers"),
                                ("size", {"image_size": 64}, "measured at 64 px")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(record | changed))
        r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", *COMMON, *TRAIN, "--gradient-exchange",
                    "prophet", "--gradient-profile", path)
        assert r.returncode == 2 and "--gradient-profile" in r.stderr and says in r.stderr, r.stderr[-2000:]
