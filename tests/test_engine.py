"""The engine: its backend registry, and the CPU backend's worker processes (the same images as
in one process, failures named or skipped and counted, lifetimes bound to the member's, CPU and
cores the member's)."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import synthetic_jpeg

from enspipe.data.manifest import DataError
from enspipe.engine.backends.pillow import PillowEngine
from enspipe.measure import threadcpu

HERE = os.path.dirname(os.path.abspath(__file__))


def _slice(n: int, bad: tuple = ()) -> dict:
    enc = np.array([b"not a jpeg" if i in bad else synthetic_jpeg(60 + i, 80 - i, i) for i in range(n)], object)
    return {"encoded": enc, "id": np.arange(100, 100 + n), "epoch": np.zeros(n, np.int64),
            "position": np.arange(n, dtype=np.int64), "label": np.arange(n) % 3,
            "key": np.array([f"img{i}.jpg".encode() for i in range(n)], object)}


def _one_run(engine, item):
    try:
        return next(engine.run(lambda: item))
    finally:
        engine.close()


def test_every_backend_in_the_table_has_its_engine_module():
    from enspipe.engine.backends import BACKENDS, backend

    for name, row in BACKENDS.items():
        mod = backend(name)
        assert row.name == name and callable(mod.slices) and callable(mod.engine)
    with pytest.raises(ValueError, match="no backend 'nope'; one of tf, pillow, gpu"):
        backend("nope")


@pytest.mark.timing
@pytest.mark.parametrize("name, wire", [("inception", "uint8"), ("vgg", "float32")])
def test_workers_make_the_images_one_process_makes(name, wire):
    item = _slice(21)
    _, alone, meta1, _ = _one_run(PillowEngine(name, 32, False, wire, 5, 1, False), item)
    _, shared, meta3, _ = _one_run(PillowEngine(name, 32, False, wire, 5, 3, False), item)
    assert alone.shape == (21, 32, 32, 3) and alone.dtype == np.dtype(wire)
    assert np.array_equal(alone, shared) and np.array_equal(meta1, meta3)


class _Slices:
    """A stage's source of ``count`` slices of ``n`` images (fresh positions and keys each), as a
    pipeline hands them out: ``take()``, and ``poll()`` for an engine that works ahead."""

    def __init__(self, count: int, n: int):
        from enspipe.engine.backends.base import Stopped

        self.items, self.polled, self.stopped = [], 0, Stopped
        for j in range(count):
            item = _slice(n)
            item["position"] = item["position"] + n * j
            item["id"] = item["id"] + n * j
            item["key"] = np.array([f"s{j}img{i}.jpg".encode() for i in range(n)], object)
            self.items.append(item)
        self.left = list(self.items)

    def __call__(self):
        if not self.left:
            raise self.stopped
        return self.left.pop(0)

    def poll(self):
        self.polled += 1
        return self.left.pop(0) if self.left else None


def _drain(engine, take) -> list:
    out, it = [], engine.run(take)
    try:
        while True:
            out.append(next(it))
    except take.stopped:
        return out
    finally:
        engine.close()


@pytest.mark.timing
def test_workers_take_the_next_slice_ahead_and_give_each_slice_whole_in_order():
    alone = _drain(PillowEngine("vgg", 32, False, "float32", 5, 1, False), _Slices(5, 13))
    take = _Slices(5, 13)
    ahead = _drain(PillowEngine("vgg", 32, False, "float32", 5, 2, False), take)
    assert take.polled >= 4  # each slice but the first handed out while the one before was still made
    assert [a[0]["key"].tolist() for a in alone] == [b[0]["key"].tolist() for b in ahead]
    for (_, images1, meta1, _), (_, images2, meta2, _) in zip(alone, ahead):
        assert images1.shape == (13, 32, 32, 3) and np.array_equal(images1, images2)
        assert np.array_equal(meta1, meta2)


@pytest.mark.timing
def test_a_worker_crash_in_the_slice_ahead_names_that_slices_image(monkeypatch):
    """Position 2 x 8 + 3 (the third slice's img3) kills its worker while it is made ahead."""
    from enspipe.engine.worker import FAULT_KEY

    monkeypatch.setenv(FAULT_KEY, str(2 * 8 + 3))
    with pytest.raises(DataError) as e:
        _drain(PillowEngine("inception", 32, False, "uint8", 0, 2, False), _Slices(4, 8))
    assert "killed by SIGSEGV" in str(e.value) and "s2img3.jpg" in str(e.value), e.value
    take = _Slices(4, 8)
    got = _drain(PillowEngine("inception", 32, False, "uint8", 0, 2, True), take)
    kept = [k.decode() for item, _, meta, _ in got for k, i in zip(item["key"], item["id"]) if i in meta[:, 0]]
    assert kept == [f"s{j}img{i}.jpg" for j in range(4) for i in range(8) if (j, i) != (2, 3)]


@pytest.mark.timing
def test_an_undecodable_image_is_named_or_skipped_and_counted_on_workers():
    item = _slice(12, bad=(4,))
    with pytest.raises(DataError, match="img4.jpg: undecodable image"):
        _one_run(PillowEngine("inception", 32, False, "uint8", 0, 2, False), item)
    _, images, meta, _ = _one_run(PillowEngine("inception", 32, False, "uint8", 0, 2, True), item)
    assert len(images) == 11 and 104 not in meta[:, 0].tolist()


@pytest.mark.timing
def test_an_image_that_crashes_its_worker_fails_the_member_or_is_skipped_alone(monkeypatch):
    """The worker that preprocesses position 5 kills itself with SIGSEGV, as a decoder's crash would."""
    from enspipe.engine.worker import FAULT_KEY

    monkeypatch.setenv(FAULT_KEY, "5")
    item = _slice(20)
    with pytest.raises(DataError) as e:
        _one_run(PillowEngine("inception", 32, False, "uint8", 0, 2, False), item)
    assert "killed by SIGSEGV" in str(e.value) and "img5.jpg" in str(e.value), e.value
    engine = PillowEngine("inception", 32, False, "uint8", 0, 2, True)
    _, images, meta, _ = _one_run(engine, item)
    assert sorted(meta[:, 0].tolist()) == [100 + i for i in range(20) if i != 5] and len(images) == 19


@pytest.mark.timing
def test_a_worker_killed_from_outside_fails_the_member_naming_it():
    engine = PillowEngine("inception", 32, False, "uint8", 0, 2, False)
    it = engine.run(lambda: _slice(8))
    try:
        next(it)
        victim = engine.workers.pids[1]
        os.kill(victim, signal.SIGKILL)
        with pytest.raises(DataError, match=f"preprocessing worker {victim} killed by SIGKILL"):
            next(it)
    finally:
        engine.close()


@pytest.mark.timing
def test_workers_run_on_the_members_cores_and_their_cpu_is_the_members():
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        engine = PillowEngine("inception", 64, False, "uint8", 0, 2, False)
        it = engine.run(lambda: _slice(16))
        next(it)
    finally:
        os.sched_setaffinity(0, before)
    try:
        assert [os.sched_getaffinity(p) for p in engine.workers.pids] == [{min(before)}] * 2
        snap0, cpu0 = threadcpu.snapshot(), threadcpu.process_cpu()
        for _ in range(3):
            next(it)
        worker_cpu = threadcpu.by_group(snap0, threadcpu.snapshot()).get("enspipe-worker", 0.0)
        assert worker_cpu > 0 and threadcpu.process_cpu() - cpu0 >= worker_cpu
        maps = "".join(open(f"/proc/{p}/maps").read() for p in engine.workers.pids)
        assert "memfd:enspipe-slots" in maps and "/dev/shm" not in maps
    finally:
        cpu_open = threadcpu.process_cpu()
        engine.close()
    assert threadcpu.process_cpu() >= cpu_open - 0.05  # an ended worker's CPU stays the member's


@pytest.mark.timing
def test_workers_never_outlive_a_member_killed_by_sigkill(tmp_path):
    code = ("import sys, time; sys.path.insert(0, %r); from test_engine import _slice; "
            "from enspipe.engine.backends.pillow import PillowEngine; "
            "e = PillowEngine('inception', 32, False, 'uint8', 0, 3, False); next(e.run(lambda: _slice(6))); "
            "print(*e.workers.pids, flush=True); time.sleep(600)") % HERE
    member = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in member.stdout.readline().split()]
        assert len(pids) == 3
    finally:
        member.kill()
        member.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
