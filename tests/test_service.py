"""The tf.data service arm (``--scheme tfdata_service``): real dispatcher and workers under mpiexec."""
import numpy as np
import pytest

from conftest import enspipe, manifest, said, step_values, summary, with_option

from enspipe.data.ledger import DeliveryCounter

COMMON = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--steps", "7", "--warmup", "0",
          "--image-size", "32", "--shuffle-buffer", "16", "--batch-checksums", "--cpu-monitor", "none"]


def _run(dataset, out, n, *args):
    r = enspipe("run", "--data", dataset, "--out", out, *args, n=n)
    assert r.returncode == 0, said(r)
    return summary(out)


@pytest.mark.mpi
def test_one_worker_delivers_all_shareds_batches(dataset, tmp_path):
    """One worker streams enspipe's own stream (order, augmentation seeds): while no member lags,
    every member gets All-Shared's batches bit for bit, each sample once per epoch."""
    s = _run(dataset, tmp_path / "svc", 2, "--scheme", "tfdata_service", "--preprocessors", "1", *COMMON)
    _run(dataset, tmp_path / "as", 2, "--scheme", "all_shared", *COMMON)
    assert (s["scheme"], s["p"], s["transport"]) == ("tfdata_service", 1, "tf.data service (gRPC)")
    assert s["service"]["workers"] == 1 and s["service"]["sharding"] == "OFF"
    assert [r["role"] for r in s["ranks"]] == ["dispatcher+worker", "trainer"]
    want = step_values(tmp_path / "as", 0, "batch_checksum")
    for rank in range(2):
        assert step_values(tmp_path / "svc", rank, "batch_checksum") == want
    assert s["delivery"]["exactly_once"] is False and s["delivery"]["skipped_samples"] == 0
    assert s["delivery"]["distinct_min"] == 50 == s["delivery"]["window_samples"]
    digest = manifest(dataset)["digest"]
    assert all(r["epochs"][0]["digest"] == digest for r in s["ranks"])
    assert s["window"]["images_preprocessed"] is None  # the workers' count is not observable: not guessed


@pytest.mark.mpi
@pytest.mark.slow
def test_several_workers_each_stream_the_whole_dataset(dataset, tmp_path):
    """ShardingPolicy.OFF: each of P workers streams the whole dataset in its own order, and the
    members read from all of them (a client learns of a worker's task at its next heartbeat to the
    dispatcher, so a member may start on one); the delivery counter sees it. An emulated
    accelerator of 60 images/s makes the 240 images last 4 s, however loaded the machine, so every
    task has reached the clients well before the end (at peak rate, a loaded CI machine once saw
    each member read one worker's stream only). Reading two independent orders shows in the
    exactly-once ledger (an epoch that is not the dataset once) or in the delivery windows (one that
    misses samples), whichever the interleaving reaches: a member that took three batches of one
    stream before staying on the other once gave every window all 50 samples and its first epoch 74."""
    args = with_option(COMMON, "--consumer", "emulated")
    s = _run(dataset, tmp_path, 4, "--scheme", "tfdata_service", "--preprocessors", "2", *args, "--rate", "60",
             "--steps", "30")
    assert [r["role"] for r in s["ranks"]] == ["dispatcher+worker", "worker", "trainer", "trainer"]
    assert all(r["images"] == 240 for r in s["ranks"])
    assert all(1 <= r["delivery"]["streams"] <= 2 for r in s["ranks"])
    both = [r for r in s["ranks"] if r["delivery"]["streams"] == 2]
    assert both, [r["delivery"] for r in s["ranks"]]
    digest = manifest(dataset)["digest"]
    for r in both:
        not_once = [e for e in r["epochs"] if (e["count"], e["digest"]) != (50, digest)]
        assert not_once or r["delivery"]["distinct_min"] < 50, (r["epochs"], r["delivery"])


@pytest.mark.mpi
@pytest.mark.slow  # the lag judge is tested on tables (test_findings); the test grid's run has lag cells
def test_a_lagging_member_skips_on_a_small_cache(dataset, tmp_path):
    """A member 20x slower than the others on a ~10-element cache: the service lets the others run
    ahead and drops elements for it (slow enough that the fast member outruns it even when the
    worker's production, not the fast member's accelerator, sets the fast pace). What it skipped are
    whole elements (batches) of the one stream, enspipe's own, in order: counted against that stream
    run alone, not against the fast member's (which stops first, so a skip after its end is not in it)."""
    s = _run(dataset, tmp_path / "svc", 2, "--scheme", "tfdata_service", "--preprocessors", "1", *COMMON,
             "--consumer", "emulated", "--rate", "800", "--slow-member", "1:20", "--tfdata-cache-mb", "1",
             "--steps", "40")
    fast, slow = s["ranks"]
    skipped = slow["delivery"]["skipped_samples"]
    assert fast["delivery"]["skipped_samples"] == 0
    assert skipped > 0 and skipped % 8 == 0
    assert s["delivery"]["skipped_by_member"] == [0, skipped]
    # the stream itself, far enough for a late start (up to the fast member's 40) and every skip
    _run(dataset, tmp_path / "alone", 1, "--scheme", "baseline", *COMMON, "--steps", str(80 + skipped // 8))
    stream = step_values(tmp_path / "alone", 0, "batch_checksum")
    at = {c: i for i, c in enumerate(stream)}
    assert len(at) == len(stream)  # every batch of the stream is told apart by its checksum
    assert step_values(tmp_path / "svc", 0, "batch_checksum") == stream[:40]
    got = [at.get(c) for c in step_values(tmp_path / "svc", 1, "batch_checksum")]
    assert None not in got and got == sorted(got) and len(got) == 40
    assert sum(b - a - 1 for a, b in zip(got, got[1:])) * 8 == skipped  # whole batches, counted exactly


def test_delivery_counter_counts_gaps_and_windows():
    c = DeliveryCounter(10)
    for k in (0, 1, 3, 4, 7):  # batches of 4 positions; batches 2, 5 and 6 never arrive
        pos = np.arange(k * 4, k * 4 + 4)
        c.add(pos % 10, pos)
    out = c.summary()
    assert out["skipped_samples"] == 12 and out["delivered"] == 20
    assert out["full_windows"] == 2 and out["distinct_min"] == 8  # positions 0-7, 12-13 hold 8 distinct samples
    c = DeliveryCounter(6)
    c.add(np.array([1, 2, 3]), np.array([0, 1, 2]), stream=5)
    c.add(np.array([1, 2, 3]), np.array([0, 1, 2]), stream=9)  # another worker's stream: no gap, a repeat
    assert c.skipped == 0 and c.windows == [3] and c.summary()["streams"] == 2


@pytest.mark.parametrize("n, args, option", [
    (2, ["--scheme", "tfdata_service", "--preprocessors", "3"], "--preprocessors"),
    (2, ["--scheme", "tfdata_service"], "--preprocessors"),
    (None, ["--scheme", "tfdata_service", "--preprocessors", "1", "--tfdata-compression", "ZSTD"],
     "--tfdata-compression"),
    (None, ["--scheme", "all_shared", "--tfdata-compression", "AUTO"], "--tfdata-compression"),
    (None, ["--scheme", "all_shared", "--tfdata-cache-mb", "8"], "--tfdata-cache-mb"),
    (None, ["--scheme", "tfdata_service", "--preprocessors", "1", "--tfdata-cache-mb", "0"], "--tfdata-cache-mb"),
    (None, ["--scheme", "tfdata_service", "--preprocessors", "1", "--on-corrupt", "skip"], "--on-corrupt"),
    (None, ["--slow-member", "0:3"], "--slow-member"),
    (None, ["--consumer", "emulated", "--rate", "100", "--slow-member", "1:0.5"], "--slow-member"),
    (None, ["--consumer", "emulated", "--rate", "100", "--slow-member", "one:3"], "--slow-member"),
    (2, ["--consumer", "emulated", "--rate", "100", "--slow-member", "2:3"], "--slow-member"),
])
def test_bad_service_and_lag_options_exit_2_naming_the_option(dataset, tmp_path, n, args, option):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--network", "tiny", *args, n=n)
    assert r.returncode == 2, r.stderr[-2000:]
    assert option in r.stderr
    assert not (tmp_path / "o" / "summary.json").exists()
