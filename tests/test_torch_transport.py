"""The torch transport (torch.distributed process groups over gloo) as PyTorch users launch members:
by ``torchrun`` and by ``mpiexec``. Every scheme gives each member the batches mpi4py's transport
gives, bit for bit, each sample once per epoch; a member that dies or hangs ends the job, saying
which; members that disagree are told so before any batch. Runs where torch is installed (make
test-notf's environment)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import MPIEXEC, said

pytest.importorskip("torch", reason="pip install 'enspipe[torch]' (or torch==2.13.0+cpu) to test the torch transport")
pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
MEMBER = os.path.join(HERE, "stream_member.py")
TORCHRUN = shutil.which("torchrun", path=os.path.dirname(sys.executable))
COMMON = {"batch_size": 10, "image_size": 32, "backend": "pillow", "steps": 12}
# 10 images among 3 or 4 preprocessors: blocks of unequal size, padded for torch's gather
CASES = {"all_shared": {"scheme": "all_shared", "pause_s": 0.3, "peer_timeout": 2},  # outlasts peer_timeout
         "single": {"scheme": "single_broadcast", "preprocessors": 1, "wire_dtype": "uint8"},
         "multi": {"scheme": "multi_broadcast", "preprocessors": 2},
         "skip": {"scheme": "all_shared", "skip_corrupt": True}}  # block sizes exchanged, not known


def _launch(launcher: str, n: int, out, cases: dict, timeout: float = 400, env: dict | None = None):
    """tests/stream_member.py ``cases`` under ``torchrun --nproc-per-node n`` or ``mpiexec -n n``;
    returns (CompletedProcess, {case: per-member json})."""
    spec = json.dumps([[name, mode, options] for name, (mode, options) in cases.items()])
    if launcher == "torchrun":
        cmd = [TORCHRUN, "--standalone", "--nproc-per-node", str(n), MEMBER, "cases", str(out), spec]
    else:
        cmd = [MPIEXEC, "-n", str(n), sys.executable, MEMBER, "cases", str(out), spec]
    full = {**os.environ, "ENSPIPE_TEST_HANG_S": str(timeout - 30), **(env or {})}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full, cwd=out)
    return r, {name: [json.loads(p.read_text()) for p in (out / name / f"member{k}.json" for k in range(n))
                      if p.exists()] for name in cases}


def _cases(dataset, extra: dict) -> dict:
    return {name: ("checksums", {"data": dataset, **COMMON, **o, **extra}) for name, o in CASES.items()}


def _batches(res: list[dict]) -> list[list[str]]:
    return [[row["first"] for row in m["rows"]] for m in res]


# launcher, options, each group's path, the batches' type
RUNS = {"torchrun": ("torchrun", {}, "torch-shm", "numpy"),
        "mpiexec_torch": ("mpiexec", {"transport": "torch"}, "torch-shm", "numpy"),
        "gloo": ("torchrun", {"node_shm": False}, "torch-gloo", "numpy"),
        # the device paths (a GPU's shared ring, NCCL) with torch CPU tensors
        "tensors": ("torchrun", {"device": "cpu"}, "torch-shm", "torch"),
        "gloo_tensors": ("torchrun", {"device": "cpu", "node_shm": False}, "torch-gloo", "torch")}


@pytest.mark.parametrize("n", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_every_scheme_over_torch_gives_mpi4pys_batches_bit_for_bit(dataset, tmp_path, n):
    """The same cases under mpiexec with mpi4py (the reference), and over the torch transport:
    under torchrun (its default) and mpiexec, through the members' shared ring of slots and
    through gloo, as numpy arrays and as torch tensors (device='cpu'). Every member's batches are
    identical, each sample once per epoch, and a kept batch never changes."""
    runs = {}
    for name, (launcher, extra, *_) in {"mpi4py": ("mpiexec", {}), **RUNS}.items():
        out = tmp_path / name
        out.mkdir()
        r, res = _launch(launcher, n, out, _cases(dataset, extra))
        assert r.returncode == 0, f"{name}: {said(r)}"
        runs[name] = res
    for case in CASES:
        reference = runs["mpi4py"][case]
        assert len(reference) == n
        assert {row["type"] for m in reference for row in m["rows"]} == {"numpy"}
        for name, (_, _, path, kind) in RUNS.items():
            res = runs[name][case]
            assert len(res) == n, (name, case)
            assert _batches(res) == _batches(reference), (name, case)
            assert {row["type"] for m in res for row in m["rows"]} == {kind}, (name, case)
            for m in res:
                assert set(m["paths"].values()) == {path}, (name, case)
                assert [(e["count"], e["missing"]) for e in m["epochs"]][:2] == [(50, 0), (50, 0)], (name, case)
                assert all(row["first"] == row["last"] and row["read_only"] for row in m["rows"])
        assert all(b == _batches(reference)[0] for b in _batches(reference)), case  # one stream, shared


END_S = 15  # s: beyond peer_timeout, for the job's end (the abort's grace, the launcher's clean-up) on a loaded machine
# launcher and options: torchrun over the members' shared ring and over gloo, mpiexec with mpi4py
ENDINGS = {"torchrun_shm": ("torchrun", {}), "torchrun_gloo": ("torchrun", {"node_shm": False}),
           "mpiexec_mpi4py": ("mpiexec", {})}


@pytest.mark.timing
@pytest.mark.parametrize("way", ENDINGS)
@pytest.mark.parametrize("mode", ["kill", "stop"])
def test_a_member_that_dies_or_hangs_ends_the_job_within_peer_timeout(dataset, tmp_path, mode, way):
    """SIGKILL (dies) or SIGSTOP (alive, silent) to the last member at its third batch: the job ends
    within peer_timeout (plus END_S) of the signal. A stopped member is named by its successor's
    heartbeat, which SIGKILLs it (it is on this host) before aborting: a stopped process takes no
    SIGTERM, so torchrun would wait 30 s more for it, and gloo's own timeout is 30 min."""
    import time

    launcher, extra = ENDINGS[way]
    peer_timeout = 5
    cases = {"c": (mode, {"data": dataset, **COMMON, **extra, "peer_timeout": peer_timeout})}
    r, res = _launch(launcher, 2, tmp_path, cases, timeout=180)
    ended = time.time()
    assert r.returncode != 0 and res["c"] == [], said(r)
    took = ended - float((tmp_path / "c" / "signalled_at").read_text())
    print(f"{way} {mode}: the job ended {took:.1f} s after the signal")
    assert took < peer_timeout + END_S, f"the job ended {took:.1f} s after the signal; {said(r)}"
    if mode == "stop":
        assert "member 0: member 1 silent for" in r.stderr, said(r)
        assert "enspipe: rank 1 (pid " in r.stderr and "ended with SIGKILL" in r.stderr, said(r)


def test_members_that_disagree_are_told_which(dataset, tmp_path):
    """One member asks for another preprocessing: every member's stream refuses to start, naming
    both values and their members."""
    cases = {"c": ("checksums", {"data": dataset, **COMMON, "rank_options": {"1": {"preprocess": "vgg"}}})}
    r, res = _launch("torchrun", 2, tmp_path, cases, timeout=180)
    assert r.returncode != 0, said(r)
    assert "preprocess=: the members resolved different values ({'inception': [0], 'vgg': [1]}" in r.stderr, said(r)


def test_torchrun_without_the_torch_transport_is_refused(dataset, tmp_path):
    cases = {"c": ("checksums", {"data": dataset, **COMMON, "transport": "mpi4py"})}
    r, _ = _launch("torchrun", 2, tmp_path, cases, timeout=180)
    assert r.returncode != 0
    assert "torchrun launched this member, so there is no MPI world for the mpi4py transport" in r.stderr, said(r)


def test_a_cell_over_the_torch_transport_trains_and_says_so(dataset, tmp_path):
    """`enspipe run --transport torch` under mpiexec: torch.distributed meets at a port rank 0
    names over MPI; the summary records the transport and each group's path, exactly once."""
    cli = shutil.which("enspipe", path=os.path.dirname(sys.executable))
    out = tmp_path / "cell"
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, os.path.join(HERE, "without_tf.py"), cli, "run",
                        "--data", dataset, "--out", out, "--scheme", "all_shared", "--network", "tiny",
                        "--consumer", "train", "--batch-size", "10", "--image-size", "32", "--wire-dtype", "uint8",
                        "--warmup", "1", "--steps", "10", "--cpu-monitor", "none", "--transport", "torch"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, said(r)
    s = json.loads((out / "summary.json").read_text())
    assert s["transport"] == "torch" and s["delivery"]["exactly_once"]
    assert [rank["exchange_paths"] for rank in s["ranks"]] == [{"0,1": "torch-shm"}] * 2


def test_a_torch_world_of_another_size_than_mpis_is_refused(dataset, tmp_path):
    """Under mpiexec -n 2 with torch's env:// variables for 3 processes: refused, naming both sizes."""
    cases = {"c": ("checksums", {"data": dataset, **COMMON, "transport": "torch"})}
    env = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    r, res = _launch("mpiexec", 2, tmp_path, cases, timeout=120, env=env)
    assert r.returncode != 0 and res["c"] == []
    assert "transport=: torch's WORLD_SIZE=3 is not the 2 members MPI launched" in r.stderr, said(r)


@pytest.mark.parametrize("options, says", [
    ({"device": "cuda"}, "device=: the mpi4py transport exchanges batches in host memory"),
    ({"device": "gpu0", "transport": "torch"}, "device=: 'gpu0' is not a device the batches can be exchanged on"),
    ({"device": "cuda:0", "transport": "torch"}, "device=: CUDA is not available here")])
def test_a_device_the_batches_cannot_be_exchanged_on_is_refused_naming_it(dataset, options, says):
    import torch

    from enspipe.plan.errors import ConfigError
    from enspipe.engine.config import StreamConfig

    if "CUDA" in says and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError) as e:
        StreamConfig(data=dataset, batch_size=10, **options)
    assert says in str(e.value)


def test_members_that_would_share_a_gpu_over_nccl_are_refused_naming_them():
    """NCCL refuses two ranks on one GPU: a group whose members are not all on one GPU (the shared
    ring's case) may have no two on one. GPUs are told apart by identity (CUDA_VISIBLE_DEVICES
    renumbers them per process) and host, before any group is made."""
    from enspipe.exchange.torchdist import _check_gpus, shared_gpus
    from enspipe.plan.errors import ConfigError

    assert shared_gpus([("a", "GPU-1"), ("a", "GPU-2"), ("b", "GPU-1"), ("a", "GPU-1"), ("a", None),
                        ("a", None)]) == {("a", "GPU-1"): [0, 3]}
    on_one = [("node7", "GPU-1")] * 2 + [("node8", "GPU-2"), ("node8", "GPU-3")]
    _check_gpus([(0, 1), (2, 3)], on_one)  # one group on one GPU (its ring), one over NCCL on two
    with pytest.raises(ConfigError) as e:
        _check_gpus([(0, 1, 2, 3)], on_one)
    assert ("device=: members [0, 1] would exchange on one GPU (GPU-1 on node7) with others of their group "
            "elsewhere, and NCCL refuses two ranks on one GPU") in str(e.value)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu.sh runs it)")
def test_members_on_one_gpu_share_its_ring_through_cuda_ipc(dataset, tmp_path):
    """Two members on one GPU (device='cuda'): every scheme through the ring of slots on the GPU
    (torch-ipc), each member's batches bit for bit mpi4py's, each sample once per epoch."""
    runs = {}
    for name, launcher, extra in (("mpi4py", "mpiexec", {}), ("ipc", "torchrun", {"device": "cuda"})):
        (tmp_path / name).mkdir()
        r, runs[name] = _launch(launcher, 2, tmp_path / name, _cases(dataset, extra))
        assert r.returncode == 0, f"{name}: {said(r)}"
    for case in CASES:
        res = runs["ipc"][case]
        assert _batches(res) == _batches(runs["mpi4py"][case]), case
        for m in res:
            assert set(m["paths"].values()) == {"torch-ipc"} and {row["type"] for row in m["rows"]} == {"torch"}
            assert [(e["count"], e["missing"]) for e in m["epochs"]][:2] == [(50, 0), (50, 0)], case
