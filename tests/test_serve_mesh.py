"""An attach server of several MPI ranks (``mpiexec -n 2 enspipe serve --socket s-{rank}.sock``),
each with its own socket, pool and consumers, sharing the preprocessing: exact epochs on every
rank, samples made once for consumers of both, the job's totals in each status; and the faults:
two ranks on one socket, a rank killed, a stop."""
import os
import signal
import time

from conftest import enspipe

from serve_helpers import ServerProcess, _consumer, _result, _wait_for


def test_consumers_on_two_ranks_get_exact_epochs_and_share_the_preprocessing(tmp_path, dataset):
    s = ServerProcess(tmp_path, dataset, ranks=2)
    try:
        a = _consumer(s, tmp_path, dataset, "a", epochs=3, pause=0.05, rank=0)
        b = _consumer(s, tmp_path, dataset, "b", epochs=3, pause=0.05, rank=1)
        for r in (_result(*a), _result(*b)):
            assert [e["epoch"] for e in r["epochs"]] == [0, 1, 2]
            assert all(e["count"] == 50 and e["missing"] == 0 for e in r["epochs"]), r
        s.stop()
        statuses = [s.status(0), s.status(1)]
    finally:
        s.proc.kill()
    assert all(st["state"] == "stopped" for st in statuses)
    mpi = [st["mpi"] for st in statuses]
    assert [m["rank"] for m in mpi] == [0, 1] and mpi[0]["job"] == mpi[1]["job"], mpi
    job = mpi[0]["job"]
    assert job["delivered"] == 300 and job["preprocessed"] == sum(m["preprocessed_here"] for m in mpi), mpi
    assert all(m["received"] > 0 and m["preprocessed_here"] > 0 for m in mpi), mpi  # each made some for the other
    assert job["sharing_factor"] > 1.2, mpi  # one copy served both ranks' consumers (2 at best)


def test_two_ranks_on_one_socket_are_refused_before_any_work(tmp_path, dataset):
    sock = str(tmp_path / "one.sock")
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--image-size", 32, "--memory", "8MB", "--socket",
                sock, n=2)
    assert r.returncode != 0 and "--socket: ranks" in r.stderr and "{rank}" in r.stderr, r.stderr
    assert not os.path.exists(sock) and "serving" not in r.stdout + r.stderr


def test_a_rank_killed_ends_the_other_ranks_consumers_at_once(tmp_path, dataset):
    s = ServerProcess(tmp_path, dataset, ranks=2)
    try:
        c = _consumer(s, tmp_path, dataset, "c", epochs=1000, pause=0.01, rank=0)
        _wait_for(lambda: os.path.exists(c[1] + ".progress"), what="c's first epoch")
        killed = time.monotonic()
        os.kill(s.status(1)["pid"], signal.SIGKILL)
        r = _result(*c)
        noticed = time.monotonic() - killed
        assert "has ended" in r["error"] and noticed < 10, (r, noticed)
        s.proc.wait(30)
        assert s.proc.returncode != 0
    finally:
        s.proc.kill()


def test_a_stop_on_one_rank_stops_every_rank(tmp_path, dataset):
    s = ServerProcess(tmp_path, dataset, ranks=2)
    try:
        os.kill(s.status(1)["pid"], signal.SIGTERM)  # rank 1 alone is told; rank 0 hears it in the next round
        s.proc.wait(30)
        assert s.proc.returncode == 0, s.output()
        assert [s.status(r)["state"] for r in (0, 1)] == ["stopped", "stopped"]
        assert not any(os.path.exists(sock) for sock in s.socks)
    finally:
        s.proc.kill()


def test_a_check_that_fails_on_one_rank_alone_ends_every_rank_before_any_work(tmp_path, dataset):
    (tmp_path / "d0").mkdir()  # rank 1's socket directory does not exist
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--image-size", 32, "--memory", "8MB", "--socket",
                str(tmp_path / "d{rank}" / "s.sock"), n=2, timeout=60)
    assert r.returncode != 0 and r.stderr.count("no such directory") == 2, r.stderr  # rank 1's, and rank 0 names it
    assert "rank 1: --socket" in r.stderr and not os.path.exists(tmp_path / "d0" / "s.sock")
