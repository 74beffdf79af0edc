"""The CPU monitor's parsers and the paper's CPU integral, on recorded logs and known series."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from enspipe.measure import cpumon

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def _recorded() -> str:
    with open(os.path.join(FIXTURES, "mpstat.vm.json")) as f:
        return f.read()


def test_recorded_mpstat_log_parses_to_tidy_rows():
    rows = cpumon.parse_mpstat_json(_recorded())
    assert {r["cpu"] for r in rows} == {"all", "0", "1"}
    assert len(rows) == 9 and all(r["source"] == "mpstat" and r["host"] == "vm" for r in rows)
    core0 = [r for r in rows if r["cpu"] == "0"]
    # recorded while a busy loop ran on core 0
    assert all(r["busy"] > 95 for r in core0)
    assert all(r["busy"] < 5 for r in rows if r["cpu"] == "1")
    ts = [r["t"] for r in core0]
    assert np.diff(ts).tolist() == [1.0, 1.0]
    assert time.strftime("%H:%M:%S", time.gmtime(ts[0])) == "06:18:18"


def test_a_log_cut_short_by_a_crash_still_parses():
    text = _recorded()
    cut = text[: text.rindex('{"cpu": "1"') + 30]  # the last record is half written
    rows = cpumon.parse_mpstat_json(cut)
    assert len(rows) == 8 and rows[-1]["cpu"] == "0"


def test_launch_time_refines_whole_second_timestamps():
    rows = cpumon.parse_mpstat_json(_recorded())
    t0 = rows[0]["t"]
    precise = cpumon.parse_mpstat_json(_recorded(), launch=t0 - 1 + 0.37, interval=1)
    assert [r["t"] - t0 for r in precise if r["cpu"] == "0"] == pytest.approx([0.37, 1.37, 2.37])
    far = cpumon.parse_mpstat_json(_recorded(), launch=t0 - 100, interval=1)  # disagrees: keep mpstat's
    assert [r["t"] for r in far] == [r["t"] for r in rows]


def test_midnight_and_12_hour_clocks():
    text = ('"nodename": "n1",\n"date": "11/21/2026",\n"timestamp": "11:59:59 PM",\n'
            '{"cpu": "0", "usr": 10.0, "idle": 90.0},\n"timestamp": "12:00:00 AM",\n{"cpu": "0", "usr": 20.0, "idle": 80.0}\n')
    rows = cpumon.parse_mpstat_json(text)
    assert rows[1]["t"] - rows[0]["t"] == 1.0
    assert [r["busy"] for r in rows] == [10.0, 20.0]


def test_not_an_mpstat_log_is_an_error():
    with pytest.raises(cpumon.CpuMonitorError, match="date"):
        cpumon.parse_mpstat_json("hello")


def test_integral_of_known_series():
    t = np.arange(0.0, 11.0)
    assert cpumon.integrate(t, np.full(11, 50.0), 0, 10) == pytest.approx(500.0)
    assert cpumon.integrate(t, t * 10, 0, 10) == pytest.approx(500.0)  # linear ramp: exact
    assert cpumon.integrate(t, t * 10, 2.5, 4.5) == pytest.approx(70.0)  # edges interpolated
    assert cpumon.integrate(t, np.full(11, 30.0), -5, 0) == pytest.approx(150.0)  # held beyond
    assert cpumon.integrate(t, t, 3, 3) == 0.0


def test_window_cpu_sums_cores_in_cpu_seconds():
    rows = []
    for k in range(1, 21):  # 20 one-second samples: core 0 fully busy, core 1 a quarter busy
        rows += [{"host": "a", "cpu": "0", "t": float(k), "busy": 100.0},
                 {"host": "a", "cpu": "1", "t": float(k), "busy": 25.0},
                 {"host": "a", "cpu": "all", "t": float(k), "busy": 62.5}]
    w = cpumon.window_cpu(rows, 1.0, 5.0, 15.0)
    assert w["node_cpu_seconds"] == {"a": pytest.approx(12.5)}
    assert w["per_core_busy_percent"]["a"] == {"0": pytest.approx(100.0), "1": pytest.approx(25.0)}


@pytest.mark.timing
def test_psutil_sampler_writes_the_same_rows(tmp_path):
    out = tmp_path / "psutil-cpu.h.jsonl"
    with open(out, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "enspipe.measure.cpusampler", "1"], stdout=f)
        time.sleep(2.6)
        t = time.monotonic()
        p.send_signal(2)
        assert p.wait(10) == 0
        # it stops mid-interval at once (a cell's close waits for it), not at its next tick 0.4 s on
        assert time.monotonic() - t < 0.3
    rows = cpumon.parse_psutil_jsonl(out.read_text())
    import psutil

    ncpu = psutil.cpu_count()
    assert len(rows) >= 2 * ncpu and {r["cpu"] for r in rows} == {str(i) for i in range(ncpu)}
    assert all(r["source"] == "psutil" and 0 <= r["busy"] <= 100 for r in rows)
    assert set(cpumon.COLUMNS) <= set(rows[0])


@pytest.mark.timing
@pytest.mark.skipif(shutil.which("mpstat") is None, reason="sysstat is not installed (CI installs it)")
def test_real_mpstat_monitor_sees_a_busy_core(tmp_path):
    mon = cpumon.CpuMonitor(str(tmp_path), "h", "mpstat", 1)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    t0 = time.time()
    busy.wait()
    t1 = time.time()
    mon.mark("window_end", t1)
    mon.stop()
    rows, marks = cpumon.read_node_log(str(tmp_path), "h")
    assert marks["source"] == "mpstat" and "launch" in marks and marks["window_end"] == t1
    w = cpumon.window_cpu(rows, 1, t0 + 1, t1)
    # one core's worth of busy loop (plus whatever else runs), within the sampling error
    assert 0.6 * (t1 - t0 - 1) <= w["node_cpu_seconds"]["h"] <= os.cpu_count() * (t1 - t0)
    assert json.loads((tmp_path / "mpstat.h.json").read_text())["sysstat"]["hosts"][0]["statistics"]


@pytest.mark.timing
def test_the_psutil_sampler_stops_when_its_parent_is_gone(tmp_path):
    """A rank that dies before its sampler asked for a death signal leaves no sampler running."""
    out = tmp_path / "log.jsonl"
    with open(out, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "enspipe.measure.cpusampler", "0.2", repr(time.time()), "1"],
                             stdout=f)  # its parent, as it says, is pid 1: not its own
        assert p.wait(10) == 0


def test_a_monitor_that_stopped_inside_the_window_reports_no_node_cpu():
    """Samples that end 6.6 s before a 10 s window does (as a killed sampler's did): the host's
    coverage says how much was seen, and no node CPU is extrapolated over the rest."""
    rows = [{"host": "a", "cpu": c, "t": float(k), "busy": 90.0} for k in range(1, 5) for c in ("0", "1", "all")]
    w = cpumon.window_cpu(rows, 1.0, 0.6, 10.6)
    assert w["coverage"] == {"a": pytest.approx(0.34)}
    assert w["node_cpu_seconds"] == {"a": None} and w["node_cpu_seconds_total"] is None
    whole = cpumon.window_cpu(rows + [{"host": "a", "cpu": "0", "t": float(k), "busy": 90.0} for k in range(5, 12)],
                              1.0, 0.6, 10.6)
    assert whole["coverage"] == {"a": 1.0} and whole["node_cpu_seconds_total"] is not None


@pytest.mark.timing
@pytest.mark.parametrize("source", ["psutil", pytest.param("mpstat", marks=[pytest.mark.slow, pytest.mark.skipif(
    shutil.which("mpstat") is None, reason="sysstat is not installed (CI installs it)")])])
def test_a_cell_whose_cpu_monitor_is_killed_mid_window_says_node_cpu_is_missing(dataset, tmp_path, source):
    import psutil

    from conftest import summary

    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "enspipe", "run", "--data", dataset, "--out", str(out), "--network", "tiny",
           "--consumer", "emulated", "--rate", "40", "--batch-size", "8", "--steps", "25", "--warmup", "0",
           "--image-size", "32", "--cpu-monitor", source, "--backend", "pillow"]
    cell = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = out / "events.rank0000.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (events.exists() and events.read_text().count('"event": "step"') >= 5):
        time.sleep(0.05)
    name = "mpstat" if source == "mpstat" else "enspipe.measure.cpusampler"
    monitors = [p for p in psutil.Process(cell.pid).children(recursive=True) if name in " ".join(p.cmdline())]
    assert monitors, "no CPU monitor to kill"
    for p in monitors:
        p.kill()
    _, err = cell.communicate(timeout=120)
    assert cell.returncode == 0, err[-2000:]
    s = summary(out)
    host = next(iter(s["node_cpu_coverage"]))
    assert s["node_cpu_seconds_total"] is None and s["node_cpu_seconds"][host] is None
    assert 0 < s["node_cpu_coverage"][host] < 0.9 and "stopped before the window ended" in s["node_cpu_missing"][host]
    assert s["energy_source"] != "modelled" and "node CPU is missing" in s["energy_unavailable"]["modelled"]
    from enspipe.report.collect import cell_row

    s["cell"] = {"network": "tiny", "scheme": "baseline", "n": 1, "p": 1, "cores": "all", "consumer": "emulated",
                 "rep": 0}
    assert "stopped before the window ended" in cell_row(s)["node_cpu_missing"]


def test_a_process_reads_its_cpu_on_the_tick_clock_too():
    """/proc/self/stat's ticks count the same CPU as process_time, to a tick or two."""
    import time

    from enspipe.measure.threadcpu import process_ticks

    t0, c0 = process_ticks(), time.process_time()
    x = 0
    while time.process_time() - c0 < 0.3:
        x += 1
    t1, c1 = process_ticks(), time.process_time()
    assert t1 - t0 == pytest.approx(c1 - c0, abs=0.03)
