"""The cost model, its fit, and ``enspipe plan`` / ``enspipe calibrate-comm``."""
import json
import math
import os
import random
import time
from dataclasses import replace

import pytest

from conftest import enspipe, said, summary

from enspipe.plan.errors import ConfigError
from enspipe.plan.model import CommCosts, Machine, bcast_terms, fit_comm, plan, predict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
             "bcast_s": math.ceil(math.log2(p)) * (alpha + m / bw)}  # MPICH: a binomial tree below 8 ranks
            for m in (1 << 16, 1 << 20, 1 << 24)]
    c = fit_comm({"ranks": p, "hosts": ["h"], "rows": rows, "barrier_s": 5e-6, "copy_bytes": 1 << 20,
                  "copy_s": (1 << 20) / 8e9})
    assert c.alpha == pytest.approx(alpha, rel=1e-6) and c.bandwidth == pytest.approx(bw, rel=1e-6)
    assert c.copy_bandwidth == pytest.approx(8e9) and c.alpha_node == 5e-6
    assert c.inter_node_bandwidth == CommCosts().inter_node_bandwidth  # one node: the parameter's
    inter = [{"bytes": m, "allgather_s": 2 * 50e-6 + 2 / 3 * m / 1e8, "bcast_s": 2 * (50e-6 + m / 1e8)}
             for m in (1 << 16, 1 << 20, 1 << 24)]  # 3 nodes, 100 MB/s between them
    c = fit_comm({"ranks": p, "hosts": ["a", "b", "c"], "rows": rows, "barrier_s": 5e-6, "copy_bytes": 1 << 20,
                  "copy_s": (1 << 20) / 8e9, "inter_node": {"ranks": 3, "rows": inter}}, 12.5e9)
    assert c.inter_node_bandwidth == pytest.approx(1e8, rel=1e-6) and c.bandwidth == pytest.approx(bw, rel=1e-6)
    assert "inter-node measured between 3 nodes" in c.source


def test_a_unit_pays_the_node_barrier_once_for_its_batches():
    """On node-shared memory the exchange's fixed cost is a barrier per unit (--block-images), not
    per batch; the MPI path still pays its latencies per batch; the baseline exchanges nothing."""
    from enspipe.plan.model import CommCosts, predict

    m = machine(comm=CommCosts(alpha_node=2e-3))
    x = {b: predict("all_shared", 4, None, 32, 64, m, block_images=b).stages["exchange"] for b in (1, 32)}
    assert x[1] - x[32] == pytest.approx(2e-3 * (1 - 1 / 4))  # shares of 8: units of 4 batches
    mpi = {b: predict("all_shared", 4, None, 32, 64, m, node_shm=False, block_images=b).stages["exchange"]
           for b in (1, 32)}
    assert mpi[1] == mpi[32]
    assert predict("baseline", 4, None, 32, 64, m, block_images=1).stages["exchange"] == 0


def test_mpich_picks_the_broadcast_algorithm_by_size_and_ranks():
    assert bcast_terms(4, 1 << 24) == (2, 2)            # fewer than 8 ranks: a binomial tree
    assert bcast_terms(150, 1000) == (8, 8)             # a short message: a binomial tree
    a, b = bcast_terms(150, 1 << 24)                    # large, many ranks: scatter + ring all-gather
    assert b == pytest.approx(2 * 149 / 150) and a == pytest.approx(math.log2(150) + 149)
    assert bcast_terms(150, 1 << 24, "binomial") == (8, 8)
    # a tree broadcast falls with n, the bandwidth-optimal one stays flat
    def sb(n, algorithm):
        m = machine(nodes=n, comm=CommCosts(inter_node_bandwidth=2e9, bcast=algorithm))
        return predict("single_broadcast", n, 5, 128, 224, replace(m, cores_per_node=16, rp={16: 500.0})).images_per_second
    assert sb(150, "binomial") < sb(20, "binomial") / 1.5
    assert sb(150, "scatter_allgather") == pytest.approx(sb(20, "scatter_allgather"), rel=0.1)
    with pytest.raises(ConfigError, match="bcast"):
        CommCosts(bcast="ring")


@pytest.mark.timing
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
    assert r.returncode == 0, said(r)
    c = json.loads(out.read_text())
    assert c["bandwidth"] > 1e7 and c["copy_bandwidth"] > 1e8 and c["alpha"] >= 0
    assert c["measured"]["ranks"] == 2 and len(c["measured"]["rows"]) >= 3
    r = enspipe("plan", "--n", "2", "--rp", "1:90", "--batch-size", "16", "--comm", out)
    assert r.returncode == 0 and "ASSUMED" not in r.stdout, r.stderr
    r = enspipe("calibrate-comm", "--out", out)
    assert r.returncode == 2 and "mpiexec" in r.stderr


def test_block_broadcasts_from_separate_nodes_send_at_once():
    """Multi-Broadcast with one member per node: each root's broadcast leaves over its own link, so
    the step takes the slowest broadcast or a node's link in, whichever is longer, not their sum
    (measured on 3 namespaced nodes with each link at 100 Mbit/s: benchmarks/nodes.py)."""
    bw, m = 12.5e6, 10 * 224 * 224 * 3 * 4
    comm = CommCosts(alpha=0.0, inter_node_bandwidth=bw)
    three = predict("multi_broadcast", 3, 2, 10, 224, machine(nodes=3, comm=comm)).stages["exchange"]
    assert three == pytest.approx(max(2 * (m / 2) / bw, m / bw))  # a binomial root sends twice
    one = predict("multi_broadcast", 3, 2, 10, 224, machine(nodes=3, comm=comm), node_shm=False)
    assert one.stages["exchange"] == pytest.approx(three)  # between nodes, MPI either way
    packed = predict("multi_broadcast", 4, 2, 10, 224, machine(nodes=2, comm=comm)).stages["exchange"]
    assert packed == pytest.approx(2 * 2 * (m / 2) / bw)  # both roots on node 0: they share its link


def test_the_papers_grid_predicted_from_its_own_measurements():
    """config/paper.yaml's model section: All-Shared flat above AlexNet's rc at full cores, Single-
    and Multi-Broadcast falling below it as n grows (the paper's Fig. 10a); the crossing moves out
    with the assumed inter-node bandwidth, and the table says so."""
    import yaml

    from enspipe.plan.curves import ModelInputs, crossings, peak_curves

    cfg = yaml.safe_load(open(os.path.join(ROOT, "config", "paper.yaml")))
    inputs = ModelInputs.from_config(cfg)
    curves = [r for r in peak_curves(cfg, inputs) if r["network"] == "alexnet_v2" and r["cores"] == "all"]

    def line(scheme, p=None):
        return [r["images_per_second"] for r in sorted(curves, key=lambda r: r["n"])
                if r["scheme"] == scheme and r["p"] == p]
    rc = inputs.rc["alexnet_v2"]
    shared = line("all_shared")
    assert min(shared) > rc and max(shared) / min(shared[1:]) < 1.2  # flat once the exchange bounds it
    for scheme in ("single_broadcast", "multi_broadcast"):
        for p in (5, 20):
            ys = line(scheme, p)
            assert ys == sorted(ys, reverse=True) and ys[-1] < rc  # falling, and below AlexNet's rc at n = 150
    cross = {(r["scheme"], r["p"], r["cores"], r["rc_network"], r["inter_node_bandwidth"]): r["crosses_at_n"]
             for r in crossings(cfg, inputs)}
    at = {bw: cross[("single_broadcast", 5, "all", "alexnet_v2", bw)] for bw in (1e9, 2e9, 4e9)}
    assert at[1e9] < at[2e9] and at[4e9] is None  # a faster network keeps it above rc up to n = 150
    assert cross[("all_shared", None, "all", "alexnet_v2", 2e9)] is None
    assert cross[("single_broadcast", 5, "all", "vgg_a", 2e9)] is None  # VGG stays well within


@pytest.mark.timing
def test_plan_over_the_papers_grid_answers_in_under_2_s():
    t = time.perf_counter()
    r = enspipe("plan", "--config", os.path.join(ROOT, "config", "paper.yaml"))
    took = time.perf_counter() - t
    assert r.returncode == 0 and "PREDICTED" in r.stdout and "single_broadcast" in r.stdout, r.stderr
    assert took < 2 * 5  # an interpreter start included, on a loaded CI machine; `time enspipe plan` says ~0.4 s
    r = enspipe("plan", "--config", os.path.join(ROOT, "config", "paper.yaml"), "--json")
    out = json.loads(r.stdout)
    assert out["label"] == "predicted" and out["crossings"] and out["curves"]
    r = enspipe("plan", "--config", os.path.join(ROOT, "config", "test.yaml"))
    assert r.returncode == 2 and "model" in r.stderr


def test_scheme_auto_is_refused_before_mpi_without_a_calibration(dataset, tmp_path):
    base = ["run", "--data", dataset, "--out", tmp_path / "o", "--scheme", "auto", "--batch-size", "8",
            "--image-size", "64", "--consumer", "peak"]
    r = enspipe(*base)
    assert r.returncode == 2 and "--rate-from" in r.stderr, r.stderr
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"machine": {"cpus": 2}, "networks": {"alexnet_v2": {"rp": {"1": 500}}}}))
    r = enspipe(*base, "--rate-from", rates, "--preprocessors", "1")
    assert r.returncode == 2 and "--preprocessors" in r.stderr, r.stderr
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--scheme", "all_shared", "--plan-comm", rates)
    assert r.returncode == 2 and "--plan-comm" in r.stderr, r.stderr


@pytest.mark.mpi
def test_scheme_auto_runs_the_plans_choice_and_labels_it(dataset, tmp_path):
    """n = 2 on this machine's cores, preprocessing at 1 core each: the calibration says one member
    preprocesses 400 images/s, the emulated accelerator trains 100: the plan picks a scheme that
    preprocesses once (not the baseline, which costs 2x the CPU), runs it, and says so. The cell's CPU
    monitor is the psutil sampler, as where sysstat is not installed."""
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"machine": {"cpus": os.cpu_count()},
                                 "networks": {"alexnet_v2": {"rp": {"1": 400.0}, "rp_cpu": {"1": 0.0025},
                                                             "rc": 100.0, "rc_source": "test"}}}))
    comm = tmp_path / "comm.json"
    comm.write_text(json.dumps(CommCosts(alpha=5e-5, bandwidth=5e9, source="test").as_dict()))
    out = tmp_path / "auto"
    r = enspipe("run", "--data", dataset, "--out", out, "--scheme", "auto", "--rate-from", rates, "--consumer",
                "emulated", "--batch-size", "12", "--image-size", "64", "--steps", "4", "--warmup", "1",
                "--cores", "1", "--cpu-monitor", "psutil", "--plan-comm", comm, "--backend", "pillow", n=2)
    assert r.returncode == 0, said(r)
    s = summary(out)
    planned = s["planned"]
    assert planned["requested"] == "auto" and planned["scheme"] == s["scheme"] != "baseline"
    assert s["cell"]["scheme"] == "auto" and s["cell"]["p"] == 2 and s["p"] == planned["p"]
    assert planned["predicted"]["bound"] == "accelerator" and planned["inputs"]["comm"] == str(comm)
    assert "scheme auto: the plan runs" in r.stdout
    assert s["cpu_source"] == "psutil" and s["node_cpu_seconds_total"] > 0  # the psutil monitor, asked for
