"""The attach server against what a hostile or broken local client does, each case beside a real
consumer that must keep exact epochs: frames that are not the protocol (garbage, an announced
64 MiB, a JSON list, a request before the hello, fields of the wrong type, unknown ops, slots it
does not hold), one consumer too many (the limit that applies named, with its fix), a server
killed with SIGKILL (its pool removed at once), and access (owner-only files whatever the umask;
another user refused as a permission matter; ``--group`` letting a group in)."""
import glob
import json
import os
import signal
import socket
import stat
import struct

import pytest

from conftest import enspipe

from serve_helpers import ServerProcess, _consumer, _result, _wait_for

pytestmark = pytest.mark.timing  # processes that race each other, waited for with deadlines

NOBODY = 65534


@pytest.fixture
def server(tmp_path, dataset):
    s = ServerProcess(tmp_path, dataset)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


def _raw(sock_path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sock_path)
    return s


def _frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def _answer(s: socket.socket) -> dict:
    from enspipe.serve import wire

    return wire.recv(s)


def _closed(s: socket.socket) -> bool:
    """Whether the server closed the connection (after its last word, if any)."""
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _hello(sock_path: str) -> tuple[socket.socket, dict]:
    s = _raw(sock_path)
    s.sendall(_frame(json.dumps({"op": "hello", "name": "raw"}).encode()))
    return s, _answer(s)


BEFORE_HELLO = {  # what a connection sends first -> what the refusal names
    "garbage": (_frame(b"\xff\xfegarbage"), "not JSON"),
    "64 MiB announced, never sent": (struct.pack("!I", 64 << 20), "frame of 67108864 bytes announced"),
    "a JSON list": (_frame(b"[1, 2, 3]"), "must be a hello, got a JSON list"),
    "next before any hello": (_frame(b'{"op": "next", "release": []}'), "must be a hello, got op 'next'"),
    "a hello of the wrong types": (_frame(b'{"op": "hello", "batch_size": "8"}'), "'batch_size' must be int"),
}
AFTER_HELLO = {  # what an attached consumer sends -> what the refusal names
    "an unknown op": ({"op": "dance"}, "unknown op 'dance'"),
    "a list": ([{"op": "next"}], "must be a JSON object, got a JSON list"),
    "release of the wrong type": ({"op": "next", "release": "0,1"}, "release must be a list of slot numbers"),
    "release of slots it does not hold": ({"op": "next", "release": [0, 1, 2]}, "does not hold"),
}


def test_frames_outside_the_protocol_are_refused_with_one_line_and_a_consumer_beside_keeps_exact_epochs(
        server, tmp_path, dataset):
    steady = _consumer(server, tmp_path, dataset, "steady", epochs=3, pause=0.01)
    _wait_for(lambda: any(c["name"] == "steady" for c in server.status()["consumers"]), what="the steady consumer")
    for case, (data, named) in BEFORE_HELLO.items():
        s = _raw(server.sock)
        s.sendall(data)
        answer = _answer(s)
        assert answer.get("reason") == "protocol" and named in answer["error"], (case, answer)
        assert _closed(s), case
        s.close()
    for case, (message, named) in AFTER_HELLO.items():
        s, info = _hello(server.sock)
        assert "consumer" in info, info
        s.sendall(_frame(json.dumps(message).encode()))
        answer = _answer(s)
        assert answer.get("reason") == "protocol" and named in answer["error"], (case, answer)
        assert _closed(s), case
        s.close()
    r = _result(*steady)
    assert len(r["epochs"]) == 3 and all(e["count"] == 50 and e["missing"] == 0 for e in r["epochs"]), r
    status = server.stop()
    malformed = [d for d in status["departed"] if d["how"].startswith("malformed")]
    assert len(malformed) == len(AFTER_HELLO), status["departed"]
    log = server.output()
    closed = [line for line in log.splitlines() if line.startswith("enspipe: closed ") and "malformed" in line]
    assert len(closed) == len(BEFORE_HELLO) + len(AFTER_HELLO), log
    assert "Traceback" not in log and "slots_in_use" not in log, log
    assert status["memory"]["slots_in_use"] == 0


def test_one_consumer_too_many_is_told_the_limit_that_applies_and_its_fix(tmp_path, dataset):
    import enspipe

    by_option = ServerProcess(tmp_path, dataset, "--max-consumers", "1", sock=str(tmp_path / "a.sock"))
    try:
        with enspipe.attach(by_option.sock) as first:
            first.next_batch()
            with pytest.raises(enspipe.ConfigError, match=r"1 are attached, the server's --max-consumers 1; "
                                                          r"start it with a larger --max-consumers"):
                enspipe.attach(by_option.sock)
        _wait_for(lambda: not by_option.status()["consumers"], what="the first consumer gone")
        with enspipe.attach(by_option.sock) as again:  # its place is free again
            again.next_batch()
    finally:
        by_option.stop()
    # ahead 0: each consumer needs 2 x 8 samples; 24 float32 samples' budget holds one
    by_memory = ServerProcess(tmp_path, dataset, "--ahead", "0", memory=str(24 * 32 * 32 * 3 * 4),
                              sock=str(tmp_path / "b.sock"))
    try:
        with enspipe.attach(by_memory.sock):
            with pytest.raises(enspipe.ConfigError, match=r"as many as the server's memory budget holds .*larger "
                                                          r"--memory or a smaller --ahead"):
                enspipe.attach(by_memory.sock)
    finally:
        by_memory.stop()


def _pools_of(pid: int) -> list[str]:
    from enspipe.serve.samples import POOL_PREFIX, SHM_DIR

    return glob.glob(os.path.join(SHM_DIR, f"{POOL_PREFIX}{pid}-*"))


@pytest.mark.alone  # a server started beside it (another xdist worker's) would remove the dead pool first
def test_a_server_killed_with_sigkill_leaves_no_pool(tmp_path, dataset):
    """Its consumer, finding it gone, removes its pool at once; a killed server without consumers
    leaves its pool until the next server starts, which removes it at once (however young)."""
    servers = []
    try:
        servers.append(first := ServerProcess(tmp_path, dataset))
        c = _consumer(first, tmp_path, dataset, "c", epochs=1000, pause=0.01)
        _wait_for(lambda: os.path.exists(c[1] + ".progress"), what="c's first epoch")
        (pool,) = _pools_of(first.proc.pid)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        assert "has ended" in _result(*c)["error"]
        assert not os.path.exists(pool)

        servers.append(second := ServerProcess(tmp_path, dataset))
        (pool,) = _pools_of(second.proc.pid)
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait()
        assert os.path.exists(pool)  # nobody noticed yet
        servers.append(third := ServerProcess(tmp_path, dataset))
        assert not os.path.exists(pool) and "removed 1 pool(s) of servers that died" in third.output(), \
            third.output()
        assert len(_pools_of(third.proc.pid)) == 1
        third.stop()
        assert not _pools_of(third.proc.pid)  # a server that stops removes its own
    finally:
        for s in servers:
            s.proc.kill()
            s.proc.wait()


# -- access -----------------------------------------------------------------------------------------
def _as_user(fn, uid: int, groups=()) -> dict:
    """``fn()``'s result (a dict) in a child forked from this process and turned into user ``uid``
    (with these supplementary groups): another local user, with enspipe already imported (this
    host's Python may be unreadable to that user)."""
    import enspipe.api.attach  # noqa: F401 - what the child needs, loaded before it is another user
    import enspipe.data.ledger  # noqa: F401
    import enspipe.serve.samples  # noqa: F401

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        try:
            os.setgroups(list(groups))
            os.setgid(uid)
            os.setuid(uid)
            out = fn()
        except BaseException as e:  # noqa: BLE001
            out = {"raised": type(e).__name__, "message": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return json.loads(text)


def _attach_and_read(sock):
    def fn():
        import enspipe

        with enspipe.attach(sock) as s:
            images, _ = s.next_batch()
            return {"shape": list(images.shape)}
    return fn


def _public_dir(tmp_path) -> str:
    """A folder another user can reach (pytest's own are root's alone)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="enspipe-access-")
    os.chmod(d, 0o755)
    return d


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as a second user (CI runs as root)")


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@needs_root
def test_files_are_owner_only_whatever_the_umask_and_another_user_is_refused_as_a_permission_matter(tmp_path,
                                                                                                     dataset):
    import shutil

    where = _public_dir(tmp_path)
    s = ServerProcess(tmp_path, dataset, sock=os.path.join(where, "s.sock"), umask=0)
    try:
        (pool,) = _pools_of(s.proc.pid)
        assert [_mode(p) for p in (s.sock, pool, s.sock + ".status.json")] == [0o600] * 3
        r = _as_user(_attach_and_read(s.sock), NOBODY)
        assert r.get("raised") == "ConfigError" and "permission denied" in r["message"], r
        assert "--group" in r["message"], r
        os.chmod(s.sock, 0o777)  # loosened by hand: the server still refuses the other user, by its credentials
        r = _as_user(_attach_and_read(s.sock), NOBODY)
        assert r.get("raised") == "ConfigError" and "the server refused this user" in r["message"], r
        assert _as_user(_attach_and_read(s.sock), 0) == {"shape": [8, 32, 32, 3]}
        assert "closed a connection: permission" in s.output()
    finally:
        s.stop()
        shutil.rmtree(where, ignore_errors=True)


@needs_root
def test_a_group_lets_its_members_attach_and_no_one_else(tmp_path, dataset):
    import grp
    import shutil

    gid = grp.getgrnam("users").gr_gid if "users" in {g.gr_name for g in grp.getgrall()} else 100
    where = _public_dir(tmp_path)
    s = ServerProcess(tmp_path, dataset, "--group", str(gid), sock=os.path.join(where, "s.sock"), umask=0)
    try:
        (pool,) = _pools_of(s.proc.pid)
        assert [(_mode(p), os.stat(p).st_gid) for p in (s.sock, pool, s.sock + ".status.json")] == \
            [(0o660, gid), (0o640, gid), (0o640, gid)]
        assert _as_user(_attach_and_read(s.sock), NOBODY, groups=[gid]) == {"shape": [8, 32, 32, 3]}
        r = _as_user(_attach_and_read(s.sock), NOBODY)
        assert r.get("raised") == "ConfigError" and "permission denied" in r["message"], r
    finally:
        s.stop()
        shutil.rmtree(where, ignore_errors=True)
    r = enspipe("serve", "--data", dataset, "--batch-size", 8, "--group", "no-such-group-here")
    assert r.returncode == 2 and "no group 'no-such-group-here'" in r.stderr, r.stderr


def _dies_at(sock_path: str, step: str) -> None:
    """A consumer that dies at ``step`` of its life (the server holds there until it has gone:
    :data:`enspipe.serve.server.HOLD_KEY`): before its hello, during its admission, between the
    welcome and its first request, or with a batch asked for and not yet received."""
    s = _raw(sock_path)
    if step != "hello":
        s.sendall(_frame(json.dumps({"op": "hello", "name": f"dies-at-{step}"}).encode()))
    if step in ("request", "batch"):
        assert "consumer" in _answer(s)
    if step == "batch":
        s.sendall(_frame(json.dumps({"op": "next", "release": []}).encode()))
    s.close()


@pytest.mark.parametrize("step", ["hello", "welcome", "request", "batch"])
def test_a_consumer_that_dies_at_any_step_of_its_attach_is_let_go_and_a_65th_is_admitted(tmp_path, dataset, step):
    """64 consumers (the default --max-consumers, all of which the pool holds) each die at ``step``;
    then none is listed, no slot is in use, and a 65th attaches and gets a batch."""
    import enspipe
    from enspipe.serve.server import HOLD_KEY

    server = ServerProcess(tmp_path, dataset, memory="64MB", env={HOLD_KEY: f"{step}:64"})
    try:
        for _ in range(64):
            _dies_at(server.sock, step)

        def ended() -> bool:  # the start's one probe and the 64, each accepted and ended
            c = server.status()["connections"]
            return c["accepted"] == c["closed"] >= 65

        _wait_for(ended, what="the 64 connections' ends")
        status = server.status()
        assert status["consumers"] == [], status
        # what was being made ahead for them, when they left, is cached once made
        _wait_for(lambda: server.status()["memory"]["slots_in_use"] == 0, what="no slot in use")
        assert status["consumers_left"] == (0 if step == "hello" else 64), status["departed"]
        with enspipe.attach(server.sock) as last:
            assert len(last.next_batch()[0]) == 8
    finally:
        log = server.output()
        server.stop()
    assert "Traceback" not in log, log
