"""Cells across separate hosts: the namespaced Slurm cluster of `.ci/slurm-up --nodes 3`.

Each node there has its own hostname, /dev/shm, IPC and network (TCP over a bridge), so node
leaders really exchange over a network interface, and a node can crash, lose its link or lose its
slurmd while a cell runs. The nodes share the machine's kernel and cores: their summaries say so
(``hosts_per_kernel``), and timings here are not a cluster's."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import enspipe, manifest, said, slurm_nodes, step_values, summary

ROOT = os.path.join(os.path.dirname(__file__), "..")
NODE = os.path.join(ROOT, ".ci", "slurm-node")
PEER_TIMEOUT = 5
SLURM_REACTION = 60  # s: SlurmdTimeout (20 in .ci/slurm-up) + its ping cycle + the job's kill


def _nodes() -> list[str]:
    if not os.path.isdir("/run/netns"):
        return []
    return [n for n in sorted(slurm_nodes()) if n.startswith("node") and os.path.exists(f"/run/netns/enspipe-{n}")]


pytestmark = [pytest.mark.mpi, pytest.mark.skipif(
    len(_nodes()) < 3, reason="no namespaced Slurm cluster of 3 nodes here (`.ci/slurm-up --nodes 3` starts one, "
    "as root, where network namespaces can be made)")]


@pytest.fixture(autouse=True)
def _all_nodes_idle():
    """Every node up before a test (a fault test brings its node back, but Slurm may lag)."""
    for i in range(1, 4):
        _node("wait", i, "idle")


def _cell_args(data, out, scheme: str, steps: int, *extra) -> list:
    return ["run", "--data", data, "--out", out, "--scheme", scheme, "--consumer", "peak", "--batch-size", 10,
            "--image-size", 40, "--warmup", 2, "--steps", steps, "--peer-timeout", PEER_TIMEOUT, *extra]


def _srun(nodes: int, per_node: int, args: list) -> list[str]:
    return ["srun", "-N", str(nodes), "-n", str(nodes * per_node), f"--ntasks-per-node={per_node}", "--mpi=pmi2",
            "--kill-on-bad-exit=1", sys.executable, "-m", "enspipe", *map(str, args)]


# three hosts of one rank in the quick suite; two ranks per host (the one-node batches) in make test-all
@pytest.mark.parametrize("nodes, per_node, scheme", [(3, 1, "all_shared"),
                                                     pytest.param(2, 2, "all_shared", marks=pytest.mark.slow),
                                                     pytest.param(2, 2, "hierarchical", marks=pytest.mark.slow)])
def test_a_cell_spans_separate_hosts_with_the_one_node_batches(dataset, tmp_path, nodes, per_node, scheme):
    out, ref = tmp_path / "cluster", tmp_path / "one"
    r = subprocess.run(_srun(nodes, per_node, _cell_args(dataset, out, scheme, 10, "--batch-checksums")),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    s = summary(out)
    hosts = [x["host"] for x in s["ranks"]]
    assert len(set(hosts)) == nodes and all(hosts.count(h) == per_node for h in set(hosts))
    assert sorted(os.listdir(out)).count("mpstat.node1.json") + sorted(os.listdir(out)).count(
        "psutil-cpu.node1.jsonl") == 1  # one CPU monitor per host, named by it
    assert sorted(s["node_cpu_seconds"]) == sorted(set(hosts)) and s["hosts_per_kernel"] == nodes
    leaders = [x for x in s["ranks"] if any("mpi" in path for path in x["exchange_paths"].values())]
    assert {x["host"] for x in leaders} == set(hosts)  # each host's leader crosses the network
    if per_node > 1:  # the others take node-shared memory only
        assert all(set(x["exchange_paths"].values()) == {"node-shm"} for x in s["ranks"] if x not in leaders)
    whole = [e for x in s["ranks"] for e in x["epochs"] if not e.get("partial")]
    assert whole and all(e["count"] == manifest(dataset)["num_images"] and e["missing"] == 0 for e in whole)
    r = enspipe(*_cell_args(dataset, ref, scheme, 10, "--batch-checksums", "--no-node-shm"), n=nodes * per_node)
    assert r.returncode == 0, said(r)
    for rank in range(nodes * per_node):
        steps = 2 + 10  # warm-up and measured: drain steps past them may differ in number
        assert step_values(out, rank, "batch_checksum")[:steps] == step_values(ref, rank, "batch_checksum")[:steps]


def _started(out, ranks: int, timeout: float = 120) -> None:
    """Wait until every rank has logged a measured step."""
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        try:
            if all(step_values(out, r) for r in range(ranks)):
                return
        except (OSError, json.JSONDecodeError, KeyError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"the cell did not start within {timeout} s")


def _node(*args) -> None:
    subprocess.run(["bash", NODE, *map(str, args)], check=True, timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("fault, restore", [("crash", "start"), ("partition", "heal"), ("stop-slurmd", "start")])
def test_a_lost_node_fails_the_cell_and_a_rerun_completes(dataset, tmp_path, fault, restore):
    """A node crash (every process in its namespace killed), a partition (its link down) or its
    slurmd stopped: the cell ends within the peer timeout plus Slurm's reaction, writes no
    summary, keeps its logs; once the node is back, the same cell runs to the end."""
    out = tmp_path / "cell"
    cell = subprocess.Popen(_srun(3, 1, _cell_args(dataset, out, "all_shared", 100000)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _started(out, 3)
        t = time.monotonic()
        _node(fault, 2)
        _, err = cell.communicate(timeout=PEER_TIMEOUT + SLURM_REACTION + 60)
        took = time.monotonic() - t
    finally:
        if cell.poll() is None:
            cell.kill()
        _node(restore, 2)
        for i in range(1, 4):  # the killed job's steps cleaned up everywhere
            _node("wait", i, "idle")
    said = [line for line in err.splitlines() if line.startswith(("srun:", "enspipe:"))]
    print(f"{fault}: the cell ended {took:.1f} s after the fault (rc {cell.returncode}): {' | '.join(said[-3:])}")
    assert "node2" in err or list(out.glob("error.rank*.txt")), err[-2000:]  # the reason is kept
    assert cell.returncode != 0 and took <= PEER_TIMEOUT + SLURM_REACTION, (took, err[-2000:])
    assert not (out / "summary.json").exists()
    assert all((out / f"events.rank{r:04d}.jsonl").exists() for r in range(3))  # the logs are kept
    rerun = tmp_path / "rerun"
    args = _cell_args(dataset, rerun, "all_shared", 10)
    r = subprocess.run(_srun(3, 1, args[:args.index("--peer-timeout")]), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    assert len({x["host"] for x in summary(rerun)["ranks"]}) == 3


MEMBER = os.path.join(ROOT, "tests", "stream_member.py")
END_S = 15  # s: beyond the peer timeout, for the abort's grace and srun's end of the step, on a loaded machine


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_member_that_hangs_under_srun_ends_the_job_within_peer_timeout(dataset, tmp_path, nodes):
    """`srun` of two SharedStream members (tests/stream_member.py), on one node or one per node; the
    last is stopped (SIGSTOP) at its third batch. Its successor's heartbeat names it after the peer
    timeout and aborts the job: on its own host it SIGKILLs it first, on another node srun ends
    the step. Either way the job ends within the peer timeout plus END_S of the signal."""
    options = {"data": dataset, "batch_size": 10, "image_size": 32, "backend": "pillow", "peer_timeout": PEER_TIMEOUT}
    spec = json.dumps([["c", "stop", options]])
    cmd = ["srun", "-N", str(nodes), "-n", "2", f"--ntasks-per-node={2 // nodes}", "--mpi=pmi2", "--kill-on-bad-exit=1",
           sys.executable, MEMBER, "cases", str(tmp_path), spec]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path,
                       env={**os.environ, "ENSPIPE_TEST_HANG_S": "150"})
    ended = time.time()
    assert r.returncode != 0 and not list((tmp_path / "c").glob("member*.json")), said(r)
    took = ended - float((tmp_path / "c" / "signalled_at").read_text())
    print(f"srun, {nodes} node(s): the job ended {took:.1f} s after the signal")
    assert took < PEER_TIMEOUT + END_S, f"the job ended {took:.1f} s after the signal; {said(r)}"
    assert "member 0: member 1 silent for" in r.stderr, said(r)
    assert ("ended with SIGKILL" in r.stderr) == (nodes == 1), said(r)  # on its host only


@pytest.mark.slow
def test_the_workflow_spreads_cells_and_a_fleet_arm_over_nodes(tmp_path):
    """config/cluster.yaml through `snakemake --profile slurm` (the one Slurm run of the workflow:
    the test grid runs locally, tests/test_workflow.py): every cell a Slurm job and an MPI cell a
    step of n tasks; one member per node (the paper's layout, an experiment's members_per_node),
    two per node on two nodes (slurm.members_per_node), hierarchical, and FLEET's arm (the fleet
    one: the arms differ in their plans, not in how Slurm runs them) in one allocation over two
    nodes."""
    import pandas as pd
    import yaml

    from test_workflow import snakemake

    with open(os.path.join(ROOT, "config", "cluster.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["heterogeneous"]["arms"] = ["fleet"]
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(cfg))
    r = snakemake("--profile", "slurm", "--configfile", tmp_path / "cluster.yaml", "--slurm-no-account",
                  "--slurm-status-command", "squeue", workdir=tmp_path, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    table = pd.read_csv(tmp_path / "results" / "tables" / "cells.csv")
    assert len(table) == 4 and table["epochs_exact"].all(), table.to_string()
    for path in table["summary"]:  # every cell ran as a Slurm job; MPI cells as a step of n tasks
        s = summary(tmp_path / os.path.dirname(path))
        assert s["slurm"] and s["slurm"]["job_id"] and "step_id" in s["slurm"], path
    runs = tmp_path / "results" / "runs" / "alexnet_v2"
    for cell, per_host in (("all_shared/n3_p3", 1), ("baseline/n3_p3", 1), ("all_shared/n4_p4", 2),
                           ("hierarchical/n4_p4", 2)):
        s = summary(runs / cell / "c1" / "peak" / "rep0")
        hosts = [x["host"] for x in s["ranks"]]
        assert all(hosts.count(h) == per_host for h in hosts) and len(set(hosts)) == s["n"] // per_host, cell
        assert s["delivery"]["exactly_once"] and s["slurm"]["ntasks"] == str(s["n"]), cell
        if cell.startswith("hierarchical"):
            assert sum("node-shm+mpi" in x["exchange_paths"].values() for x in s["ranks"]) == 2  # the leaders
    rounds = sorted((tmp_path / "results" / "heterogeneous" / "fleet").glob("round*/summary.json"))
    assert rounds and all(len({x["host"] for x in summary(p.parent)["ranks"]}) == 2 for p in rounds)


def test_an_attach_server_spans_two_hosts_and_shares_their_preprocessing(dataset, tmp_path):
    """`srun -N 2 enspipe serve`: a rank per host, each serving the consumer that a second job step
    starts on its host (its own /dev/shm); the ranks exchange copies over the network. Every
    consumer's epochs exact, and the job made fewer copies than it delivered."""
    consumer = os.path.join(os.path.dirname(__file__), "attach_consumer.py")
    sock = str(tmp_path / "s-{rank}.sock")
    serve = " ".join(["srun", "--overlap", *_srun(2, 1, [
        "serve", "--data", dataset, "--batch-size", 8, "--image-size", 32, "--memory", "8MB", "--workers", 1,
        "--socket", sock, "--idle-exit", 8])[1:]])
    each = (f"{sys.executable} {consumer} {tmp_path}/s-$SLURM_NODEID.sock {dataset} 3 0.05 "
            f"{tmp_path}/c$SLURM_NODEID.json")  # rank r serves the r-th node of the allocation
    script = (f"{serve} & until [ -S {tmp_path}/s-0.sock ] && [ -S {tmp_path}/s-1.sock ]; do sleep 0.2; done; "
              f"srun -N 2 -n 2 --ntasks-per-node=1 --overlap bash -c '{each}'; wait")
    r = subprocess.run(["salloc", "-N", "2", "-n", "2", "--ntasks-per-node=1", "bash", "-c", script],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    statuses = [json.load(open(tmp_path / f"s-{k}.sock.status.json")) for k in (0, 1)]
    for k in (0, 1):
        epochs = json.load(open(tmp_path / f"c{k}.json"))["epochs"]
        assert [e["missing"] for e in epochs] == [0, 0, 0] and all(e["count"] == 50 for e in epochs)
    job = statuses[0]["mpi"]["job"]
    assert statuses[0]["state"] == "stopped" and job["delivered"] == 300 and job["preprocessed"] < 300, statuses
    assert all(st["mpi"]["received"] > 0 for st in statuses)  # copies crossed between the hosts
