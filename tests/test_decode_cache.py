"""The decoded-image cache (``--decode-cache``, ``SharedStream(decode_cache=...)``): node-shared
pixels that later epochs take instead of decoding, the augmentation and the delivery unchanged."""
import numpy as np
import pytest

from conftest import enspipe, said, step_values, summary

from enspipe.plan.errors import ConfigError
from enspipe.plan.options import parse_size

COMMON = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--steps", "20", "--warmup", "0",
          "--image-size", "32", "--shuffle-buffer", "16", "--batch-checksums", "--cpu-monitor", "none"]


def _run(dataset, out, n, *args):
    r = enspipe("run", "--data", dataset, "--out", out, *COMMON, *args, n=n)
    assert r.returncode == 0, said(r)
    return summary(out)


def test_sizes():
    assert parse_size("8GB") == 8 * 10**9 and parse_size("512MiB") == 2**29 and parse_size("1.5g") == 15 * 10**8
    assert parse_size("0") == 0 == parse_size(0) and parse_size("4096") == 4096
    for bad in ("abc", "-1", "8XB", "", "GB"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)


@pytest.mark.parametrize("budget, says", [("lots", "not a size"), ("900TB", "available memory"),
                                          ("4KB", "too small")])
def test_a_budget_that_is_not_a_size_or_does_not_fit_fails_before_any_work(dataset, tmp_path, budget, says):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--decode-cache", budget, *COMMON)
    assert r.returncode == 2 and "--decode-cache" in r.stderr and says in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "o" / "summary.json").exists()


def test_the_library_checks_the_budget_too(dataset):
    from enspipe.engine.config import StreamConfig

    with pytest.raises(ConfigError, match="decode_cache"):
        StreamConfig(data=dataset, batch_size=8, decode_cache="eight gigs", backend="pillow")
    with pytest.raises(ConfigError, match="available memory"):
        StreamConfig(data=dataset, batch_size=8, decode_cache="900TB", backend="pillow").check()


@pytest.mark.mpi
# the backends cache alike; TensorFlow's import makes its case the slow one (make test-all runs both)
@pytest.mark.parametrize("backend", [pytest.param("tf", marks=pytest.mark.slow), "pillow"])
def test_later_epochs_hit_and_no_pixel_changes(dataset, tmp_path, backend):
    """All-Shared, 2 members, 3+ epochs of 50 images: the node decodes every sample once (twice
    where two decodes of it run at the same moment: 3 of 50 once in CI), every other lookup hits. Which epoch's
    lookup is the first depends on how far ahead a member's pipeline runs (it may preprocess a
    later epoch's share of a sample before the other preprocesses its share of an earlier one), so
    the count is per node, not per epoch. A cache too small for all of them (about 4 images a
    member) mixes hits and decodes, and delivers the same pixels; on the tf backend both equal the
    pixels of no cache at all. Every sample once per epoch, as without the cache."""
    args = ("--scheme", "all_shared", "--backend", backend)
    big = _run(dataset, tmp_path / "big", 2, *args, "--decode-cache", "256MB")
    small = _run(dataset, tmp_path / "small", 2, *args, "--decode-cache", "4MB")
    c = big["decode_cache"]
    rates = [e["hit_rate"] for e in c["epochs"]]
    assert len(rates) >= 3 and rates[0] < 0.5 and rates[-1] == 1.0, c["epochs"]
    assert c["distinct_images_held"] == 50 and c["not_stored_full"] == 0, c
    # every miss is stored or refused (kept meanwhile by another decode of the sample); a race of two
    # decodes at once is the exception, not half the samples (2 private caches: about 87 misses)
    assert 50 + c["decoded_twice"] <= c["misses"] < 75 and c["images_held"] <= 50 + c["decoded_twice"], c
    assert c["hits"] + c["misses"] == sum(e["lookups"] for e in c["epochs"]) >= 150
    assert c["bytes_held"] >= sum(int(np.prod(s)) for s in _shapes(dataset))
    assert c["cpu_saved_seconds"] > 0 and c["decode_cpu_seconds_per_image"] > 0
    s = small["decode_cache"]
    assert 0 < s["images_held"] < 20 and s["not_stored_full"] > 0 and 0 < s["hits"] < c["hits"]
    want = step_values(tmp_path / "big", 0, "batch_checksum")
    assert step_values(tmp_path / "small", 0, "batch_checksum") == want
    assert step_values(tmp_path / "big", 1, "batch_checksum") == want
    for run in (big, small):
        assert run["delivery"]["exactly_once"] is True, run["delivery"]
    if backend == "tf":
        none = _run(dataset, tmp_path / "none", 2, *args)
        assert none["decode_cache"] is None
        assert step_values(tmp_path / "none", 0, "batch_checksum") == want


def _shapes(dataset) -> list[tuple[int, ...]]:
    from enspipe.data.approximation import first_images
    from enspipe.data.build import load_manifest
    from enspipe.data.pixels import decode

    m = load_manifest(dataset)
    return [decode(e).shape for e in first_images(m, m.num_images)]


class _DictCache:
    """A cache's get and put over a dict (the element function's side of it)."""

    def __init__(self):
        self.held, self.gets, self.puts = {}, 0, 0

    def get(self, sample, epoch):
        self.gets += 1
        return self.held.get(sample)

    def put(self, sample, pixels):
        self.puts += 1
        self.held[sample] = pixels.copy()
        return True


@pytest.mark.parametrize("impl", ["crop-first", "reference"])
def test_cached_pixels_give_the_encoded_paths_values(impl):
    """The tf backend's element function with a cache: a miss decodes and stores, a hit takes the
    stored pixels, and both give the values of no cache (a user's function, which takes decoded
    images, too)."""
    import tensorflow as tf

    from enspipe.data.preprocessing import UserPreprocess
    from enspipe.data.synthetic import synthetic_jpeg
    from enspipe.engine.backends.tf import element_fn

    user = UserPreprocess(lambda image, seed: tf.image.resize(image, [16, 16]) + tf.cast(seed[1], tf.float32),
                          (16, 16, 3), np.dtype(np.float32))
    for prep in ("inception", user):
        cache = _DictCache()
        plain = element_fn(prep, 48, False, "float32", 3, impl)
        cached = element_fn(prep, 48, False, "float32", 3, impl, cache)
        for epoch in range(2):
            for i in range(3):
                e = {"encoded": tf.constant(synthetic_jpeg(0, i)[0]), "id": tf.constant(10**12 + i, tf.int64),
                     "epoch": tf.constant(epoch, tf.int64), "position": tf.constant(7 * i + epoch, tf.int64),
                     "label": tf.constant(0, tf.int64)}
                assert np.array_equal(plain(e)[0].numpy(), cached(e)[0].numpy())
        assert cache.puts == 3 and cache.gets == 6 and len(cache.held) == 3


@pytest.mark.mpi
@pytest.mark.slow  # the quick suite caches for enspipe's own preprocessing (above)
def test_the_library_caches_for_a_users_preprocess_function(dataset, tmp_path):
    """``SharedStream(decode_cache=...)`` with a user's function (it takes decoded images): the
    batches of 4 epochs are those of no cache."""
    from test_api import members

    got = {}
    for budget in ("64MB", 0):
        (tmp_path / str(budget)).mkdir()
        r, res = members("checksums", 2, tmp_path / str(budget), data=dataset, batch_size=10, preprocess="gray40",
                         scheme="all_shared", decode_cache=budget, steps=20)
        assert r.returncode == 0, said(r)
        got[budget] = [x["first"] for x in res[0]["rows"]]
    assert got["64MB"] == got[0] and len(got[0]) == 20


@pytest.mark.timing
def test_one_member_alone_caches_too(dataset, tmp_path):
    """A job of one process (MPI's window then is private memory, not a node's fresh pages)."""
    c = _run(dataset, tmp_path / "one", None, "--decode-cache", "128MB")["decode_cache"]
    assert [e["hit_rate"] for e in c["epochs"]][:3] == [0.0, 1.0, 1.0] and c["images_held"] == 50
    assert c["bytes_held"] == sum(int(np.prod(s)) for s in _shapes(dataset))


# the backends cache alike; TensorFlow's import makes its case the slow one (make test-all runs both)
@pytest.mark.parametrize("backend", [pytest.param("tf", marks=pytest.mark.slow), "pillow"])
def test_an_approximation_says_so_with_its_measured_error(dataset, tmp_path, backend):
    s = _run(dataset, tmp_path / "f", None, "--preprocess-impl", "fused-colour", "--backend", backend)
    a = s["approximation"]
    assert s["preprocess_impl"] in ("fused-colour", "pillow fused-colour") and a["samples"] == 16
    assert 0 < a["mean_abs_error"] <= a["p99_abs_error"] <= a["max_abs_error"] <= 2 and "YIQ" in a["what"]
    from enspipe.report.collect import preprocessing_path

    assert "APPROXIMATION" in preprocessing_path(s)
    assert _run(dataset, tmp_path / "e", None, "--backend", backend)["approximation"] is None


def test_the_tf_data_service_refuses_the_cache(dataset, tmp_path):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--scheme", "tfdata_service", "--decode-cache",
                "64MB", *COMMON)
    assert r.returncode == 2 and "--decode-cache" in r.stderr and "tf.data service" in r.stderr, r.stderr[-1000:]
