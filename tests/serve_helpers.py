"""The attach server as a real process (one, or an MPI job of several ranks) and consumers as real
processes (tests/attach_consumer.py), for tests/test_serve*.py."""
import json
import os
import signal
import subprocess
import sys
import time

from conftest import MPIEXEC

HERE = os.path.dirname(__file__)
CONSUMER = os.path.join(HERE, "attach_consumer.py")


def _wait_for(predicate, timeout=30.0, what="it"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"waited {timeout} s for {what}")


class ServerProcess:
    """``enspipe serve`` on a dataset at 32 px; with ``ranks`` > 1, an MPI job whose rank r serves
    ``s-r.sock`` (``socks``); ``sock`` is rank 0's."""

    def __init__(self, tmp_path, data, *extra, batch=8, memory="8MB", ranks=1, sock=None, umask=-1, env=None):
        """``sock``: its socket (default: in ``tmp_path``); ``umask``: the server's (-1: this one's);
        ``env``: variables set for it."""
        sock = sock or str(tmp_path / ("s-{rank}.sock" if ranks > 1 else "s.sock"))
        self.socks = [sock.replace("{rank}", str(r)) for r in range(ranks)]
        self.sock = self.socks[0]
        self.log = open(tmp_path / f"server{len(list(tmp_path.glob('server*.log')))}.log", "w+")
        cmd = [sys.executable, "-m", "enspipe", "serve", "--data", data, "--batch-size", str(batch), "--image-size",
               "32", "--socket", sock, "--memory", memory, "--workers", "2" if ranks == 1 else "1",
               "--status-interval", "0.2", *extra]
        self.proc = subprocess.Popen([MPIEXEC, "-n", str(ranks), *cmd] if ranks > 1 else cmd, stdout=self.log,
                                     stderr=subprocess.STDOUT, text=True, umask=umask,
                                     env={**os.environ, **(env or {})})
        from enspipe.serve.wire import live_server

        _wait_for(lambda: self.proc.poll() is not None or all(os.path.exists(s) and live_server(s)
                                                               for s in self.socks), what="the server's sockets")
        assert self.proc.poll() is None, self.output()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def status(self, rank: int = 0) -> dict:
        with open(self.socks[rank] + ".status.json") as f:
            return json.load(f)

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        return self.status()


def _consumer(server, tmp_path, dataset, name, epochs=2, pause=0.0, rank=0, as_torch=False):
    out = str(tmp_path / f"{name}.json")
    proc = subprocess.Popen([sys.executable, CONSUMER, server.socks[rank], dataset, str(epochs), str(pause), out, name,
                             *(["torch"] if as_torch else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, out


def _result(proc, out):
    text = proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, text
    with open(out) as f:
        return json.load(f)


