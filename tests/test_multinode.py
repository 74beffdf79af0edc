"""The multi-node path on one machine: MPICH's fork launcher with made-up host names gives separate
shared-memory domains ("nodes") that talk over its network module, as on a cluster.

* ``a:2,b:2``: two nodes of two ranks; every group assembles in node-shared memory and the node
  leaders all-gather across nodes (``node-shm+mpi``);
* ``a:1,b:3``: uneven nodes;
* ``a,b`` with one rank per host in turn (ranks 0, 2 on a; 1, 3 on b): a group's nodes interleave,
  so it falls back to the MPI collectives (``mpi``).

Every scheme delivers every sample exactly once per epoch to every member, and the very batches
(pixels and metadata, bit for bit) one member alone makes for itself. Both fake nodes are one
physical host: one CPU monitor, one set of per-host files.
"""
import os

import pytest

from conftest import cell_said, enspipe, manifest, run_cells, said, selected, step_values, summary

pytestmark = pytest.mark.mpi
COMMON = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--steps", "7", "--warmup", "0",
          "--cores", "1", "--image-size", "32", "--shuffle-buffer", "16", "--batch-checksums"]
PLACEMENTS = {
    "a2b2": ("-launcher", "fork", "-hosts", "a:2,b:2"),
    "a1b3": ("-launcher", "fork", "-hosts", "a:1,b:3"),
    "interleaved": ("-launcher", "fork", "-hosts", "a,b", "-ppn", "1"),
}
NODE_OF = {"a2b2": [0, 0, 2, 2], "a1b3": [0, 1, 1, 1], "interleaved": [0, 1, 0, 1]}
SCHEMES = {"all_shared": [], "single_broadcast": ["--preprocessors", "2"],
           "multi_broadcast": ["--preprocessors", "3"], "hierarchical": []}
QUICK = {("interleaved", "multi_broadcast"), ("a2b2", "hierarchical")}  # both exchange paths across nodes


@pytest.fixture(scope="module")
def alone(dataset, tmp_path_factory):
    """The batch checksums of one member that preprocesses every batch itself (no exchange)."""
    out = tmp_path_factory.mktemp("alone")
    r = enspipe("run", "--data", dataset, "--out", out, "--scheme", "all_shared", *COMMON, n=1)
    assert r.returncode == 0, said(r)
    return step_values(out, 0, "batch_checksum")


def _expected_path(placement: str, group: list[int]) -> str:
    nodes = [NODE_OF[placement][r] for r in group]
    if len(set(nodes)) == 1:
        return "node-shm"
    runs = [n for i, n in enumerate(nodes) if i == 0 or n != nodes[i - 1]]
    return "node-shm+mpi" if len(runs) == len(set(runs)) else "mpi"


@pytest.fixture(scope="module")
def across(request, dataset, tmp_path_factory) -> dict:
    """The selected cells of the matrix below, one shared job (enspipe run-cells) per placement."""
    cases = selected(request, "test_every_scheme_across_nodes_is_exact_and_bit_identical")
    outs = {}
    for placement in PLACEMENTS:
        cells = {(placement, c["scheme"]): ["--data", dataset, "--scheme", c["scheme"], *SCHEMES[c["scheme"]], *COMMON]
                 for c in cases if c["placement"] == placement}
        if cells:
            outs |= run_cells(4, cells, tmp_path_factory.mktemp(placement), launcher=PLACEMENTS[placement])
    return outs


@pytest.mark.parametrize("placement, scheme", [
    pytest.param(p, s, marks=() if (p, s) in QUICK else pytest.mark.slow) for p in PLACEMENTS for s in SCHEMES])
def test_every_scheme_across_nodes_is_exact_and_bit_identical(dataset, alone, across, placement, scheme):
    tmp_path = across[(placement, scheme)]
    assert os.path.exists(os.path.join(tmp_path, "summary.json")), cell_said(tmp_path)
    s, want = summary(tmp_path), manifest(dataset)["digest"]
    for rank in s["ranks"]:
        assert rank["epochs"] == [{"epoch": 0, "count": 50, "digest": want, "missing": 0}], rank["rank"]
        assert step_values(tmp_path, rank["rank"], "batch_checksum") == alone, rank["rank"]
        assert rank["mpi_node"] == NODE_OF[placement][rank["rank"]]
        for group, path in rank["exchange_paths"].items():
            assert path == _expected_path(placement, [int(g) for g in group.split(",")]), (group, path)
    # two MPI nodes, one physical host: one monitor and one set of per-host files
    host = s["ranks"][0]["host"]
    assert {r["host"] for r in s["ranks"]} == {host} and list(s["placement"]["hosts"]) == [host]
    info = s["placement"]["hosts"][host]
    assert (info["members"], info["mpi_nodes"]) == (4, len(set(NODE_OF[placement])))
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("cpu-marks.")) == [f"cpu-marks.{host}.json"]
    assert list(s["node_cpu_seconds"]) == [host]
    # four members pinned to one core each on a host of fewer cores share them, and say so
    assert s["placement"]["oversubscribed"] == (os.cpu_count() < 4)


@pytest.mark.slow  # the quick suite runs hierarchical on node-shared memory
def test_hierarchical_on_the_mpi_collectives_is_exact_and_bit_identical(dataset, alone, tmp_path):
    """The per-node plan without node-shared memory: three collectives per batch on a node leader,
    each into the receive ring, which must not hand out a buffer still in use downstream."""
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--scheme", "hierarchical", "--no-node-shm", *COMMON,
                n=4, launcher=PLACEMENTS["a2b2"])
    assert r.returncode == 0, said(r)
    s, want = summary(tmp_path), manifest(dataset)["digest"]
    for rank in s["ranks"]:
        assert rank["epochs"] == [{"epoch": 0, "count": 50, "digest": want, "missing": 0}], rank["rank"]
        assert step_values(tmp_path, rank["rank"], "batch_checksum") == alone, rank["rank"]
        assert set(rank["exchange_paths"].values()) == {"mpi"}
    assert {tuple(map(int, g.split(","))) for rank in s["ranks"] for g in rank["exchange_paths"]} == {
        (0, 1), (2, 3), (0, 2)}  # the plan saw the two nodes


@pytest.mark.slow
def test_across_nodes_equals_mpi_collectives_on_one_node(dataset, alone, tmp_path):
    """The node-leader path against the plain MPI collectives on one node (``--no-node-shm``)."""
    r = enspipe("run", "--data", dataset, "--out", tmp_path, "--scheme", "all_shared", "--no-node-shm", *COMMON, n=4)
    assert r.returncode == 0, said(r)
    assert all(p == "mpi" for rank in summary(tmp_path)["ranks"] for p in rank["exchange_paths"].values())
    for rank in range(4):
        assert step_values(tmp_path, rank, "batch_checksum") == alone


def test_hosts_on_one_kernel_share_its_cores():
    """Namespaced nodes or containers on one machine: their members together may oversubscribe it."""
    from enspipe.engine.placement import _machine_oversubscription

    hosts = {"n1": {"members": 2, "cpus": 2, "kernel": "k", "oversubscribed": False},
             "n2": {"members": 2, "cpus": 2, "kernel": "k", "oversubscribed": False},
             "x": {"members": 2, "cpus": 2, "kernel": "j", "oversubscribed": False}}
    _machine_oversubscription(hosts, None)
    assert [h["oversubscribed"] for h in hosts.values()] == [True, True, False]
    alone = {"n1": {"members": 1, "cpus": 4, "kernel": "k", "oversubscribed": False},
             "n2": {"members": 1, "cpus": 4, "kernel": "k", "oversubscribed": False}}
    _machine_oversubscription(alone, 2)
    assert not any(h["oversubscribed"] for h in alone.values())
