"""One preprocessing worker process (``python -m enspipe.engine.worker FD``): see
:mod:`enspipe.engine.workers`. It reads messages from the SOCK_SEQPACKET socket ``FD`` until it
closes, and exits then: it never outlives its member."""
from __future__ import annotations

import ctypes
import importlib
import json
import mmap
import os
import signal
import socket
import struct
import sys

import numpy as np

from enspipe.data.decoding import whole_decodes
from enspipe.engine.memory import set_malloc

_PR_SET_PDEATHSIG = 1
ROW = 6  # a chunk's row: slot, position, sample, epoch, offset, length
FAULT_KEY = "ENSPIPE_FAULT_CRASH_POSITION"  # tests only: the stream position whose image kills its worker


def die_with_parent(parent: int) -> None:
    """SIGKILL when the thread that started this process ends (Linux); exit if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(0)


def main(fd: int, parent: int) -> None:
    die_with_parent(parent)
    sock = socket.socket(fileno=fd)
    init = json.loads(sock.recv(1 << 20))  # a user's pickled augmentation travels in it
    set_malloc(init["malloc"])  # the member's policy: a fresh process's page faults cost as much here
    module, name = init["function"].split(":")
    fn, errors = getattr(importlib.import_module(module), name)(**init["kwargs"])
    shape, dtype = tuple(init["shape"]), np.dtype(init["dtype"])
    crash = int(os.environ.get(FAULT_KEY, "-1"))
    inp = out = None
    told: dict[str, int] = {}  # the whole decodes counted in replies so far
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        except ConnectionResetError:
            return
        if not msg:
            return  # the member closed the pool, or ended
        if msg[:1] == b"R":  # new regions: the encoded images' and the output slots'
            sizes = json.loads(msg[1:])
            inp = mmap.mmap(fds[0], sizes["input"], prot=mmap.PROT_READ)
            omap = mmap.mmap(fds[1], sizes["output"])
            out = slots(omap, shape, dtype)
            for f in fds:
                os.close(f)
            continue
        rows = np.frombuffer(msg, np.int64).reshape(-1, ROW)
        status, why = bytearray(len(rows)), []
        for i, (slot, position, sample, epoch, offset, length) in enumerate(rows.tolist()):
            if position == crash:
                os.kill(os.getpid(), signal.SIGSEGV)
            try:
                out[slot] = fn(inp[offset:offset + length], position, sample, epoch)
            except Exception as e:  # noqa: BLE001 - undecodable (1), or the function's own failure (2), named
                status[i] = 1 if isinstance(e, errors) else 2
                why.append(f"{type(e).__name__}: {e}".replace("\0", " "))
        why_bytes = "\0".join(why).encode()
        now = whole_decodes()
        whole = {k: n - told.get(k, 0) for k, n in now.items() if n != told.get(k, 0)}
        told = now
        reply = struct.pack("<qq", len(rows), len(why_bytes)) + bytes(status) + why_bytes + json.dumps(whole).encode()
        try:
            sock.send(reply)
        except (BrokenPipeError, ConnectionResetError):
            return


def slots(region, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The output region as whole image slots: its size is a page multiple, not one of the image's."""
    per = int(np.prod(shape))
    count = len(region) // (per * dtype.itemsize)
    return np.frombuffer(region, dtype, count * per).reshape((count, *shape))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
