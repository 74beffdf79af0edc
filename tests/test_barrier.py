"""The node barrier that sleeps (enspipe.exchange.shm.SleepingBarrier): process-shared semaphores
in shared memory. Nobody passes before all have arrived, nobody laps the others, and a process
that waits for a late one sleeps instead of spending CPU."""
import mmap
import os
import time

import numpy as np
import pytest

from enspipe.exchange import shm

pytestmark = pytest.mark.skipif(shm._semaphores() is None or not hasattr(os, "fork"),
                                reason="no process-shared POSIX semaphores here")

N, ROUNDS = 4, 200


def forked(n: int, body) -> list[int]:
    """Run ``body(i, barrier, marks)`` in n forked processes sharing one barrier; their exit codes."""
    mem = mmap.mmap(-1, shm.SleepingBarrier.BYTES + 8 * n + 64)
    raw = np.frombuffer(mem, np.uint8)
    shm.SleepingBarrier(raw[:shm.SleepingBarrier.BYTES], n, init=True)
    marks = raw[shm.SleepingBarrier.BYTES:shm.SleepingBarrier.BYTES + 8 * n].view(np.int64)
    pids = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                code = body(i, shm.SleepingBarrier(raw[:shm.SleepingBarrier.BYTES], n, init=False), marks)
            finally:
                os._exit(code)
        pids.append(pid)
    codes, deadline = {}, time.monotonic() + 60
    while len(codes) < n and time.monotonic() < deadline:
        for p in pids:
            if p not in codes:
                done, status = os.waitpid(p, os.WNOHANG)
                if done:
                    codes[p] = os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    for p in set(pids) - set(codes):  # a barrier that never opens: fail, do not hang
        os.kill(p, 9)
        os.waitpid(p, 0)
        codes[p] = "hung"
    return [codes[p] for p in pids]


def test_nobody_passes_before_everyone_arrived_round_after_round():
    def body(i, barrier, marks):
        for r in range(1, ROUNDS + 1):
            if i == r % N:
                time.sleep(0.001)  # a different straggler each round
            marks[i] = r
            barrier.wait()
            if marks.min() < r:  # someone has not arrived, yet we passed
                return 3
            barrier.wait()  # and nobody writes round r+1 before everyone has checked round r
        return 0

    assert forked(N, body) == [0] * N


def test_a_waiting_process_sleeps_while_a_late_one_is_still_working():
    def body(i, barrier, marks):
        if i == 0:
            time.sleep(0.5)
        cpu = time.process_time()
        barrier.wait()
        marks[i] = int(1e6 * (time.process_time() - cpu))  # us of CPU spent waiting
        barrier.wait()
        return 0 if i != 1 or max(marks[1:]) < 20_000 else 4  # 0.5 s waited on less than 20 ms of CPU

    assert forked(N, body) == [0] * N
