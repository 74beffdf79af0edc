"""The cost model, its fit, and ``enspipe plan`` / ``enspipe calibrate-comm``."""
import json
import math
import random
import time

import pytest

from conftest import enspipe

from enspipe.plan.errors import ConfigError
from enspipe.plan.model import CommCosts, Machine, fit_comm, plan, predict

SCHEMES = ("baseline", "all_shared", "single_broadcast", "multi_broadcast", "hierarchical")


def machine(**kw) -> Machine:
    return Machine(**({"rp": {1: 90.0, 2: 170.0}, "rc": None, "cores_per_node": 2} | kw))


def _ps(scheme, n):
    return [None] if scheme in ("baseline", "all_shared", "hierarchical") else \
        range(1, n if scheme == "single_broadcast" else n + 1)


def test_sharing_never_predicts_below_one_nth_of_the_baselines_cpu_nor_above_its_inputs_rates():
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(2, 16)
        m = machine(rp={1: rng.uniform(20, 400)}, rc=rng.choice([None, rng.uniform(10, 2000)]),
                    cores_per_node=rng.choice([2, 8, 16]), nodes=rng.randint(1, n), core_limit=rng.choice([None, 1]),
                    comm=CommCosts(alpha=rng.uniform(1e-6, 1e-4), bandwidth=rng.uniform(1e9, 2e10)))
        batch = rng.choice([16, 32, 64])
        base = predict("baseline", n, None, batch, 224, m)
        for scheme in SCHEMES[1:]:
            for p in _ps(scheme, n):
                if p is not None and p > batch:
                    continue
                x = predict(scheme, n, p, batch, 224, m)
                assert x.cpu_seconds_per_image >= base.cpu_seconds_per_image / n * (1 - 1e-9), (scheme, n, p)
                ceiling = min(m.rc or math.inf, batch / (batch / x.p / m.rate_at(x.cores_per_member)))
                assert x.images_per_second <= ceiling * (1 + 1e-9), (scheme, n, p)


def test_the_regimes():
    m = machine()  # 2 cores, rp 170 images/s on both
    # preprocessing-bound, peak: All-Shared gains the members' cores, the baseline duplicates work
    base = predict("baseline", 2, None, 64, 224, m)
    shared = predict("all_shared", 2, None, 64, 224, m)
    assert base.bound == shared.bound == "preprocessing"
    assert shared.images_per_second > 1.8 * base.images_per_second
    assert shared.cpu_seconds_per_image < 0.6 * base.cpu_seconds_per_image
    # accelerator-bound: every scheme at rc
    slow = machine(rc=20.0)
    for scheme in SCHEMES:
        for p in _ps(scheme, 4):
            x = predict(scheme, 4, p, 32, 224, slow)
            assert x.bound == "accelerator" and x.images_per_second == pytest.approx(20.0)
    # a slow network between nodes: the exchange bounds a large batch
    thin = machine(nodes=4, comm=CommCosts(inter_node_bandwidth=1e8))
    assert predict("all_shared", 4, None, 64, 224, thin).bound == "exchange"
    assert predict("all_shared", 4, None, 64, 224, machine(nodes=4)).bound == "preprocessing"
    # more members than cores: each member's share of the node
    assert predict("all_shared", 4, None, 64, 224, m).oversubscribed


def test_the_ranking_puts_the_fastest_first_then_the_cheapest():
    out = plan(4, 64, 224, machine())
    rates = [x.images_per_second for x in out]
    assert rates == sorted(rates, reverse=True)
    assert {x.scheme for x in out} == set(SCHEMES)
    with pytest.raises(ConfigError):
        predict("tfdata_service", 2, 1, 64, 224, machine())


def test_fit_recovers_latency_and_bandwidth():
    alpha, bw, p = 15e-6, 3e9, 4
    rows = [{"bytes": m, "allgather_s": (p - 1) * alpha + (p - 1) / p * m / bw,
             "bcast_s": (math.log2(p) + p - 1) * alpha + 2 * (p - 1) / p * m / bw}
            for m in (1 << 16, 1 << 20, 1 << 24)]
    c = fit_comm({"ranks": p, "hosts": ["h"], "rows": rows, "barrier_s": 5e-6, "copy_bytes": 1 << 20,
                  "copy_s": (1 << 20) / 8e9})
    assert c.alpha == pytest.approx(alpha, rel=1e-6) and c.bandwidth == pytest.approx(bw, rel=1e-6)
    assert c.copy_bandwidth == pytest.approx(8e9) and c.alpha_node == 5e-6


def test_plan_prints_a_ranking_fast_and_as_json():
    t = time.perf_counter()
    r = enspipe("plan", "--n", "4", "--rp", "1:90,2:170", "--batch-size", "64", "--cores-per-node", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ranked"][0]["images_per_second"] >= out["ranked"][-1]["images_per_second"]
    assert out["sources"]["comm"] == "assumed"
    r = enspipe("plan", "--n", "150", "--nodes", "150", "--rp", "16:700", "--cores-per-node", "16", "--rc", "1000",
                "--batch-size", "128", "--p", "5,20")
    assert r.returncode == 0 and "ASSUMED" in r.stdout and "bottleneck" in r.stdout, r.stderr
    assert time.perf_counter() - t < 30  # two interpreter starts; the planning itself is milliseconds


@pytest.mark.parametrize("args, option", [
    (["--n", "0", "--rp", "1:90", "--batch-size", "8"], "--n"),
    (["--n", "2", "--batch-size", "8"], "--rp"),
    (["--n", "2", "--rp", "one:90", "--batch-size", "8"], "--rp"),
    (["--n", "2", "--network", "alexnet_v2", "--rates", "/no/rates.json"], "--rates"),
    (["--n", "2", "--rp", "1:90", "--batch-size", "8", "--schemes", "bogus"], "--schemes"),
    (["--n", "2", "--rp", "1:90", "--batch-size", "8", "--nodes", "3"], "--nodes"),
    (["--n", "2", "--rp", "1:90", "--batch-size", "8", "--comm", "/no/comm.json"], "--comm"),
    (["--n", "2", "--rp", "1:90", "--batch-size", "8", "--rc", "-5"], "--rc"),
])
def test_plan_argument_errors_exit_2_naming_the_option(args, option):
    r = enspipe("plan", *args)
    assert r.returncode == 2 and option in r.stderr, r.stderr


@pytest.mark.mpi
def test_calibrate_comm_fits_this_machine(tmp_path):
    out = tmp_path / "comm.json"
    r = enspipe("calibrate-comm", "--out", out, "--max-mb", "4", "--repeats", "3", n=2)
    assert r.returncode == 0, r.stderr[-2000:]
    c = json.loads(out.read_text())
    assert c["bandwidth"] > 1e7 and c["copy_bandwidth"] > 1e8 and c["alpha"] >= 0
    assert c["measured"]["ranks"] == 2 and len(c["measured"]["rows"]) >= 3
    r = enspipe("plan", "--n", "2", "--rp", "1:90", "--batch-size", "16", "--comm", out)
    assert r.returncode == 0 and "ASSUMED" not in r.stdout, r.stderr
    r = enspipe("calibrate-comm", "--out", out)
    assert r.returncode == 2 and "mpiexec" in r.stderr
