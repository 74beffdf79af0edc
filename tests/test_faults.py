"""Bad input and faults: damaged data is noticed and counted, wrong options are refused before any
work (exit 2, nothing created), and a lost rank or node fails the cell fast without a summary
that looks complete."""
import json
import os
import shutil
import struct
import subprocess
import sys
import time

import psutil
import pytest

from conftest import MPIEXEC, enspipe, events, said, summary, with_option

BASE = ["--network", "tiny", "--consumer", "peak", "--batch-size", "8", "--steps", "7", "--warmup", "0",
        "--cores", "1", "--image-size", "32", "--shuffle-buffer", "16", "--cpu-monitor", "none"]
# a lost rank or node fails the cell the same way whatever the backend: the pillow one starts in a
# second, TensorFlow's in several
PILLOW = ["--backend", "pillow"]


def _copy(dataset, tmp_path, name="d") -> str:
    out = tmp_path / name
    shutil.copytree(dataset, out)
    return str(out)


def _manifest(data) -> dict:
    with open(os.path.join(data, "manifest.json")) as f:
        return json.load(f)


def _write_manifest(data, m: dict) -> None:
    with open(os.path.join(data, "manifest.json"), "w") as f:
        json.dump(m, f)


def _offsets(path) -> list[int]:
    raw, out, o = open(path, "rb").read(), [], 0
    while o < len(raw):
        out.append(o)
        o += 16 + struct.unpack("<Q", raw[o:o + 8])[0]
    return out


def _damage(path, record: int, where: str) -> None:
    """Flip a byte of one record's image bytes (``data``) or of its length field (``length``)."""
    raw = bytearray(open(path, "rb").read())
    o = _offsets(path)[record]
    raw[o + (12 + 200 if where == "data" else 0)] ^= 0xFF
    open(path, "wb").write(bytes(raw))


def _shard(data, i=0) -> str:
    return os.path.join(data, _manifest(data)["shards"][i]["path"])


def _skipped_events(out) -> list[dict]:
    return [e for e in events(out) if e["event"] == "skipped"]


# -- damaged data ----------------------------------------------------------------------------------
def test_a_corrupt_record_fails_the_run_naming_it(dataset, tmp_path):
    data = _copy(dataset, tmp_path)
    _damage(_shard(data), 3, "data")
    r = enspipe("run", "--data", data, "--out", tmp_path / "o", *BASE, timeout=120)
    assert r.returncode != 0 and "corrupt TFRecord at record 3" in r.stderr and "--on-corrupt skip" in r.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


@pytest.mark.parametrize("where", ["data", pytest.param("length", marks=pytest.mark.slow)])
def test_on_corrupt_skip_skips_and_counts_only_what_is_lost(dataset, tmp_path, where):
    """A record whose image bytes are damaged is skipped alone; one whose length field is damaged
    loses the rest of its shard (it cannot be followed), and every lost record is counted."""
    data = _copy(dataset, tmp_path)
    shard = _shard(data)
    _damage(shard, 3, where)
    in_shard = _manifest(data)["shards"][0]["num_records"]
    r = enspipe("run", "--data", data, "--out", tmp_path / "o", "--on-corrupt", "skip", *BASE)
    assert r.returncode == 0, said(r)
    rank = summary(tmp_path / "o")["ranks"][0]
    name = os.path.basename(shard)
    lost = {f"{name}:3"} if where == "data" else {f"{name}:{i}" for i in range(3, in_shard)}
    assert set(rank["skipped"]) == lost and set(rank["skipped_by_epoch"]["0"]) == lost
    assert rank["epochs"][0]["count"] == 50 - len(lost) and rank["epochs"][0]["missing"] == len(lost)
    assert {e["reason"] for e in _skipped_events(tmp_path / "o")} == {"corrupt record"}


def test_an_emptied_shard_is_refused_before_any_work(dataset, tmp_path):
    data = _copy(dataset, tmp_path)
    open(_shard(data, 1), "wb").close()
    r = enspipe("run", "--data", data, "--out", tmp_path / "o", *BASE)
    assert r.returncode == 2 and "--data" in r.stderr and os.path.basename(_shard(data, 1)) in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_manifest_that_does_not_add_up_is_refused(dataset, tmp_path):
    data = _copy(dataset, tmp_path)
    _write_manifest(data, _manifest(data) | {"num_images": 51})
    r = enspipe("run", "--data", data, "--out", tmp_path / "o", *BASE)
    assert r.returncode == 2 and "--data" in r.stderr and "promises 51 images" in r.stderr
    assert not (tmp_path / "o").exists()


def test_a_manifest_with_a_wrong_digest_is_refused_before_reading(dataset, tmp_path):
    data = _copy(dataset, tmp_path)
    _write_manifest(data, _manifest(data) | {"digest": "0123456789abcdef"})
    r = enspipe("run", "--data", data, "--out", tmp_path / "o", *BASE, timeout=120)
    assert r.returncode != 0 and "digest 0123456789abcdef is not its shards'" in r.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


def test_a_shard_that_lost_records_fails_naming_the_first_one(dataset, tmp_path):
    """A shard that lost records behind the manifest's back (its size not recorded, as in an older
    manifest): a member reads records by number, so the first one missing fails the run, naming it."""
    data = _copy(dataset, tmp_path)
    shard = _shard(data, 1)
    offsets = _offsets(shard)
    with open(shard, "r+b") as f:
        f.truncate(offsets[5])  # keep 5 records of 20
    m = _manifest(data)
    for s in m["shards"]:
        s.pop("bytes")
    _write_manifest(data, m)
    r = enspipe("run", "--data", data, "--out", tmp_path / "o", *BASE)
    assert r.returncode != 0 and f"{os.path.basename(shard)}: corrupt TFRecord at record 5" in r.stderr
    assert "holds 5 of the manifest's 20 records" in r.stderr and not (tmp_path / "o" / "summary.json").exists()


def test_an_epoch_short_of_the_manifest_fails_naming_the_shard():
    """The last line of defence (data that vanished without a read error): a completed epoch that
    lacks samples no member skipped fails the cell, naming the shards they came from."""
    from enspipe.run.summary import short_epochs as _short_epochs

    lacking = [f"b.tfrecord:{i}" for i in range(5, 20)]
    reports = [{"rank": 0, "epochs": [{"epoch": 0, "count": 35}], "short_epochs": {0: lacking},
                "skipped_by_epoch": {}}]
    why = _short_epochs(reports, 50)
    assert "15 of the manifest's 50 samples never arrived" in why and "b.tfrecord (15)" in why
    reports[0]["skipped_by_epoch"] = {0: lacking}  # skipped and counted: no failure
    assert _short_epochs(reports, 50) is None
    reports[0] |= {"short_epochs": {0: None}, "skipped_by_epoch": {}}  # a manifest without record counts
    assert "35 of the manifest's 50 samples delivered and 15 not skipped" in _short_epochs(reports, 50)


# -- options refused before any work ---------------------------------------------------------------
@pytest.mark.parametrize("option, value", [
    ("--sample-interval", "inf"), ("--sample-interval", "nan"), ("--sample-interval", "0"),
    ("--sample-interval", "-1"), ("--rate", "nan"), ("--idle-watts", "inf"), ("--peer-timeout", "0"),
    ("--lr", "nan"), ("--on-corrupt", "ignore"),
])
def test_every_numeric_option_has_a_finite_range(dataset, tmp_path, option, value):
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", *BASE, option, value)
    assert r.returncode == 2 and option.lstrip("-").split("-")[0] in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_an_output_that_cannot_be_a_directory_is_refused_creating_nothing(dataset, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker, blocker / "cell"):
        r = enspipe("run", "--data", dataset, "--out", out, *BASE)
        assert r.returncode == 2 and "--out" in r.stderr and "not a directory" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_dataset_folder_without_data_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("not a TFRecord")
    r = enspipe("run", "--data", tmp_path / "d", "--out", tmp_path / "o", *BASE)
    assert r.returncode == 2 and "--data" in r.stderr and "not a TFRecord file" in r.stderr


# -- a lost rank or node ---------------------------------------------------------------------------
def _start(dataset, out, n, launcher=()):
    """A long All-Shared run in the background."""
    cmd = [MPIEXEC, *launcher, "-n", str(n), sys.executable, "-m", "enspipe", "run", "--data", dataset,
           "--out", str(out), "--scheme", "all_shared", *with_option(BASE, "--steps", 2000), *PILLOW]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(out, n, timeout=120):
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        logs = [out / f"events.rank{r:04d}.jsonl" for r in range(n)]
        if all(p.exists() and '"event": "step"' in p.read_text() for p in logs):
            return
        time.sleep(0.2)
    raise AssertionError("the ranks never started their steps")


@pytest.mark.mpi
@pytest.mark.parametrize("which", [pytest.param("rank 0's proxy", marks=pytest.mark.slow), "another proxy"])
def test_a_lost_node_fails_the_cell_fast(dataset, tmp_path, which):
    """``kill -9`` of a ``hydra_pmi_proxy`` is what a node failure looks like to MPICH: the node's
    members die with it and the others notice within the heartbeat timeout; no summary appears."""
    out = tmp_path / "o"
    proc = _start(dataset, out, 4, ("-launcher", "fork", "-hosts", "a:2,b:2"))
    try:
        _wait_for_steps(out, 4)
        proxies = [p for p in psutil.Process(proc.pid).children() if "hydra_pmi_proxy" in p.name()]
        assert len(proxies) == 2
        ranks = {p.pid: {int(c.environ().get("PMI_RANK", -1)) for c in p.children()} for p in proxies}
        victim = next(p for p in proxies if (0 in ranks[p.pid]) == (which == "rank 0's proxy"))
        t = time.monotonic()
        victim.kill()
        proc.wait(timeout=60)
        elapsed = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert elapsed < 30, elapsed  # the heartbeat's 10 s, start-up of nothing, and the abort
    assert not (out / "summary.json").exists()
    # no member runs on: each gets SIGKILL when its proxy dies, and the kernel may take a moment to
    # tear down a process that maps TensorFlow (seen under load: one still exiting as mpiexec
    # returned); an orphan that escaped would run its 2000 steps for minutes
    deadline = time.monotonic() + 10
    while (left := [c for c in psutil.process_iter(["cmdline"]) if str(out) in " ".join(c.info["cmdline"] or [])]):
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def _segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("mpich_shm_")} if os.path.isdir("/dev/shm") else set()


@pytest.mark.mpi
@pytest.mark.alone  # any enspipe run beside it (another xdist worker's) would free the orphans first
def test_a_killed_rank_0_leaves_no_summary_and_the_next_run_frees_its_shared_memory(dataset, tmp_path):
    """A SIGKILLed job leaves MPICH's /dev/shm segments behind (it unlinks them at MPI_Finalize);
    run after run they would fill /dev/shm. The next cell removes those no process uses, saying so."""
    before = _segments()
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "killed", "--scheme", "all_shared", *BASE, *PILLOW, n=2,
                env={"ENSPIPE_INJECT_FAULT": "0:3:kill"}, timeout=120)
    assert r.returncode != 0 and not (tmp_path / "killed" / "summary.json").exists()
    left = _segments() - before
    if not left:
        pytest.skip("this MPICH left no segment in /dev/shm after the kill: nothing to free")
    for f in left:  # as if the kill were a while ago (a segment younger than 5 s may be a starting job's)
        os.utime(os.path.join("/dev/shm", f), (time.time() - 60, time.time() - 60))
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "next", "--scheme", "all_shared", *BASE, *PILLOW, n=2)
    assert r.returncode == 0, said(r)
    assert not left & _segments() and "orphaned MPICH shared-memory segments" in r.stderr


@pytest.mark.mpi
def test_a_rank_that_dies_in_native_code_leaves_its_python_stack(dataset, tmp_path):
    """A segmentation fault (as a library's native code may die) fails the cell, and the rank's
    Python stacks reach stderr (faulthandler), so the log says where it died."""
    r = enspipe("run", "--data", dataset, "--out", tmp_path / "o", "--scheme", "all_shared", *BASE, *PILLOW, n=2,
                env={"ENSPIPE_INJECT_FAULT": "1:3:crash"}, timeout=120)
    assert r.returncode != 0 and not (tmp_path / "o" / "summary.json").exists()
    assert "Fatal Python error: Segmentation fault" in r.stderr and "in inject" in r.stderr, said(r)


def test_only_segments_nobody_uses_are_reaped(tmp_path):
    import mmap

    from enspipe.exchange.shm import reap_orphans

    def segment(name, age):
        path = tmp_path / f"mpich_shm_{name}"
        path.write_bytes(b"x" * 4096)
        os.utime(path, (time.time() - age, time.time() - age))
        return path

    segment("orphan", 60), segment("young", 0)
    held, mapped = segment("held", 60), segment("map", 60)
    other = tmp_path / "not_mpich"
    other.write_bytes(b"y")
    os.utime(other, (0, 0))
    with open(held, "rb"), open(mapped, "r+b") as f:
        m = mmap.mmap(f.fileno(), 4096)
        os.close(os.dup(f.fileno()))
        f.close()  # only the mapping keeps it in use
        assert reap_orphans(str(tmp_path)) == (1, 4096)
        m.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpich_shm_held", "mpich_shm_map", "mpich_shm_young",
                                                          "not_mpich"]
    assert reap_orphans(str(tmp_path)) == (2, 8192)  # nobody holds or maps those two any more


OWN_TEMPDIR = "from enspipe.common import tempdirs; import time; print(tempdirs.own(), flush=True); time.sleep(120)"


@pytest.mark.timing
def test_only_killed_ranks_temporary_folders_are_reaped(tmp_path):
    """A rank killed before it left (SIGKILL, a time limit) leaves its own temporary folder; the
    next rank removes it at once, but never a live rank's or one that is not enspipe's."""
    import signal

    from enspipe.common.tempdirs import reap_killed

    env = dict(os.environ, TMPDIR=str(tmp_path))
    ranks = [subprocess.Popen([sys.executable, "-c", OWN_TEMPDIR], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    try:
        killed, alive = (p.stdout.readline().strip() for p in ranks)
        ranks[0].send_signal(signal.SIGKILL)
        ranks[0].wait(timeout=30)
        (tmp_path / "enspipe-rank-legacy").mkdir()  # no owner file: not judged
        assert os.path.isdir(killed) and reap_killed(str(tmp_path)) == 1  # its lock is free: gone at once
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["enspipe-rank-legacy", os.path.basename(alive)])
    finally:
        for p in ranks:
            p.kill()
            p.wait(timeout=30)
    assert reap_killed(str(tmp_path)) == 1 and not os.path.exists(alive)


RING_END = r"""
import sys, time
from mpi4py import MPI
from enspipe.common.liveness import Heartbeat
comm, ended = MPI.COMM_WORLD, []
for i in range(60):  # beats every 2 ms: many end with a beat in flight
    hb = Heartbeat(comm, on_loss=lambda peer, s: sys.exit(f"lost {peer}"), on_stall=sys.exit,
                   interval=0.002, timeout=20).start()
    time.sleep(0.001 * ((i + comm.Get_rank()) % 7))
    hb.finish(comm.Barrier)
    ended.append(hb.ended)
sys.stdout.write(f"ended {all(ended)}\n")  # one write: the ranks share the pipe
"""


@pytest.mark.mpi
def test_the_heartbeat_ring_ends_with_every_beat_taken_and_no_cancel(tmp_path):
    """Each rank's last beat (BYE) ends its successor's receiving: every request completes and the
    ring's communicator is freed, with no MPI_Cancel (cancelled receives have stalled MPI_Wait in
    libfabric modules; a CI cell once stopped for good where the ring cancelled one)."""
    script = tmp_path / "ring.py"
    script.write_text(RING_END)
    r = subprocess.run([MPIEXEC, "-n", "3", sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, said(r)
    assert r.stdout.count("ended True") == 3, r.stdout


@pytest.mark.timing
def test_a_stuck_end_writes_every_threads_stack_and_calls_on_stall(capfd):
    from enspipe.common.liveness import deadline

    stalled = []
    with deadline(0.2, stalled.append):
        time.sleep(0.6)
    assert stalled == [0.2]
    assert "in test_a_stuck_end_writes_every_threads_stack_and_calls_on_stall" in capfd.readouterr().err
    with deadline(5, stalled.append):  # a block that ends in time: nothing called
        pass
    time.sleep(0.1)
    assert stalled == [0.2]


def test_a_lost_peer_is_ended_only_where_it_is_the_same_process_on_this_host():
    """end_process SIGKILLs a stopped process by its identity (a stopped one takes no SIGTERM), and
    nothing where the identity names another host, a reused pid (another start time) or itself."""
    import signal

    from enspipe.common.host import end_process, process_identity, start_ticks

    me = process_identity()
    assert me["pid"] == os.getpid() and me["started"] == start_ticks(os.getpid()) is not None
    assert not end_process(me)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        identity = {**me, "pid": child.pid, "started": start_ticks(child.pid)}
        host, boot = me["host"].split("/")
        assert not end_process({**identity, "host": f"another-host/{boot}"})
        assert not end_process({**identity, "host": f"{host}/another-boot"})
        assert not end_process({**identity, "started": identity["started"] - 1})  # the pid, reused
        assert child.poll() is None
        assert end_process(identity)
        assert child.wait(timeout=30) == -signal.SIGKILL
        assert not end_process(identity)  # gone
    finally:
        child.kill()
        child.wait()
