"""A long search against one ``enspipe serve``: short trials that come and go (a third of them
SIGKILLed at a random moment, many during their attach) beside steady consumers, for minutes.

    python benchmarks/soak.py [--minutes 10] [--trials-per-minute 200] [--at-once 8] [--steady 2]
                              [--images 512] [--size 32] [--sample-s 30] [--json out.json]

The server is one process (the pillow backend, its default pool) over synthetic images. Every
consumer is a process forked from one that imported enspipe beforehand (multiprocessing's
forkserver), so that a trial costs its attach and its batches, not an interpreter's start.

* the steady consumers read epochs back to back until the end; each epoch's ledger must be exact
  (every sample once);
* trials: at most ``--at-once`` at a time, started at ``--trials-per-minute``; each attaches and
  takes 1-20 batches, and one in three is SIGKILLed 0-0.5 s after it starts;
* every ``--sample-s`` seconds: the server's RSS outside its pool (``RssAnon``: its heap and its
  threads' stacks), its whole ``VmRSS`` and the pool's part of it (``RssShmem``: the /dev/shm
  file's pages touched so far, which grows as the pool fills, up to ``--memory``), the pool's
  cached bytes, its worker processes' ``RssAnon``, the consumers its status lists, the ghosts among them (listed, but their process is
  gone) and the slots in use.

At the end (every trial ended and the steady consumers closed): the ghosts still listed and the
slots still in use (both must be 0), whether every steady epoch was exact, and the server's
``RssAnon`` from the sample after minute 2 to the last (goal: within 5%).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ALIVE_S = 0.5  # a killed trial dies this long after its start, at most
NOTICE_S = 1.0  # s: a status written this long after a consumer's death no longer lists it


def steady(sock: str, out: str, stop_file: str) -> None:
    """A consumer that reads whole epochs until ``stop_file`` exists; its ledger to ``out``."""
    import enspipe

    stream = enspipe.attach(sock, name=f"steady-{os.getpid()}", timeout=60)
    while not os.path.exists(stop_file):
        for _ in stream:
            pass
    epochs = stream.epochs()
    stream.close()
    with open(out, "w") as f:
        json.dump(epochs, f)


def trial(sock: str, batches: int) -> None:
    """A short trial: attach, take ``batches`` batches, leave."""
    import enspipe

    stream = enspipe.attach(sock, name="trial", timeout=60)
    for _, _ in zip(range(batches), stream):
        pass
    stream.close()


def memory(pid: int) -> dict:
    """The process's ``VmRSS``, ``RssAnon`` and ``RssShmem`` in MiB (zeros where it is gone)."""
    got = {"VmRSS": 0.0, "RssAnon": 0.0, "RssShmem": 0.0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in got:
                    got[key] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return got


def children(pid: int) -> list[int]:
    """The process's children, whichever of its threads started them."""
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def ghosts(listed: list[dict], written_at: float, dead_at: dict) -> int:
    """The consumers a status lists whose process had died over :data:`NOTICE_S` before the status
    was written (the server sees a closed socket at once)."""
    return sum(written_at - dead_at.get(c.get("pid"), written_at) > NOTICE_S for c in listed)


def read_status(sock: str) -> dict:
    with open(sock + ".status.json") as f:
        return json.load(f)


def sample(server: subprocess.Popen, sock: str, t0: float, trials: dict, dead_at: dict) -> dict:
    written_at = os.stat(sock + ".status.json").st_mtime
    status = read_status(sock)
    listed = status["consumers"]
    mem = memory(server.pid)
    return {"minute": round((time.monotonic() - t0) / 60, 2), "rss_anon_mb": mem["RssAnon"],
            "rss_mb": mem["VmRSS"], "rss_shmem_mb": mem["RssShmem"],
            "cached_mb": status["memory"]["cached_bytes"] / 2 ** 20,
            "workers_rss_anon_mb": sum(memory(c)["RssAnon"] for c in children(server.pid)),
            "listed": len(listed), "ghosts": ghosts(listed, written_at, dead_at),
            "slots_in_use": status["memory"]["slots_in_use"], "trials": trials["started"]}


def run(a: argparse.Namespace, tmp: str) -> dict:
    from enspipe.data.synthetic import make_dataset
    from enspipe.serve.wire import live_server

    data, sock = os.path.join(tmp, "data"), os.path.join(tmp, "s.sock")
    make_dataset(data, a.images, seed=1, num_classes=10, images_per_shard=128)
    server = subprocess.Popen([sys.executable, "-m", "enspipe", "serve", "--data", data, "--batch-size", "16",
                               "--image-size", str(a.size), "--socket", sock, "--status-interval", "1"],
                              stdout=open(os.path.join(tmp, "server.log"), "w"), stderr=subprocess.STDOUT)
    while not (os.path.exists(sock) and live_server(sock)):
        if server.poll() is not None:
            raise RuntimeError(open(os.path.join(tmp, "server.log")).read())
        time.sleep(0.05)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["enspipe", "enspipe.api.attach"])
    stop_file = os.path.join(tmp, "stop")
    steadies = [ctx.Process(target=steady, args=(sock, os.path.join(tmp, f"steady{k}.json"), stop_file))
                for k in range(a.steady)]
    for p in steadies:
        p.start()
    trials = {"started": 0, "killed": 0, "failed": 0, "exit codes": {}}
    live: list[tuple[mp.Process, float | None]] = []
    samples, rng, dead_at = [], random.Random(1), {}  # dead_at: a trial's pid -> the wall clock it died by
    t0 = time.monotonic()
    end, next_sample, gap = t0 + 60 * a.minutes, t0, 60 / a.trials_per_minute
    next_start = t0
    while (now := time.monotonic()) < end:
        if now >= next_sample:
            samples.append(sample(server, sock, t0, trials, dead_at))
            print(json.dumps(samples[-1]), flush=True)
            next_sample += a.sample_s
        for p, kill_at in list(live):
            if kill_at is not None and now >= kill_at and p.exitcode is None:
                try:  # the forkserver, its parent, may have reaped it already
                    os.kill(p.pid, signal.SIGKILL)
                    dead_at[p.pid] = time.time()
                    trials["killed"] += 1
                except ProcessLookupError:
                    pass
                live.remove((p, kill_at))
                live.append((p, None))
            elif p.exitcode is not None:
                p.join()
                dead_at.setdefault(p.pid, time.time())
                if p.exitcode != 0 and p.exitcode != -signal.SIGKILL:
                    trials["failed"] += 1
                    trials["exit codes"][str(p.exitcode)] = trials["exit codes"].get(str(p.exitcode), 0) + 1
                live.remove((p, kill_at))
        if server.poll() is not None:
            raise RuntimeError("the server died:\n" + open(os.path.join(tmp, "server.log")).read()[-3000:])
        if now >= next_start and len(live) < a.at_once:
            p = ctx.Process(target=trial, args=(sock, rng.randint(1, 20)))
            p.start()
            dead_at.pop(p.pid, None)  # a pid the kernel gave again
            trials["started"] += 1
            live.append((p, now + rng.uniform(0, ALIVE_S) if rng.random() < 1 / 3 else None))
            next_start += gap
        time.sleep(0.005)
    for p, _ in live:
        p.join(60)
    open(stop_file, "w").close()
    for p in steadies:
        p.join(120)
    time.sleep(2.5)  # the server's next status
    last = sample(server, sock, t0, trials, dead_at)
    samples.append(last)
    status = read_status(sock)
    server.send_signal(signal.SIGTERM)
    server.wait(60)
    epochs = [e for k in range(a.steady) for e in json.load(open(os.path.join(tmp, f"steady{k}.json")))]
    return {"samples": samples, "trials": trials, "ghosts_after": len(status["consumers"]),
            "slots_in_use_after": status["memory"]["slots_in_use"], "consumers_left": status.get("consumers_left"),
            "steady_epochs": len(epochs), "steady_exact": all(e["missing"] == 0 for e in epochs) and bool(epochs)}


def report(r: dict, a: argparse.Namespace) -> None:
    print(f"\n{a.minutes:g} min, {r['trials']['started']} trials ({r['trials']['killed']} SIGKILLed, "
          f"{r['trials']['failed']} failed {r['trials']['exit codes'] or ''}), {a.steady} steady consumers, "
          f"{os.cpu_count()} cores\n")
    print("| minute | server RssAnon MiB | its VmRSS | of which the pool (RssShmem) | pool cached | "
          "its workers' RssAnon | consumers listed | ghosts | slots in use | trials |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in r["samples"]:
        print(f"| {s['minute']:.1f} | {s['rss_anon_mb']:.1f} | {s['rss_mb']:.1f} | {s['rss_shmem_mb']:.1f} | "
              f"{s['cached_mb']:.1f} | {s['workers_rss_anon_mb']:.1f} | {s['listed']} | {s['ghosts']} | "
              f"{s['slots_in_use']} | {s['trials']} |")
    after2 = [s for s in r["samples"] if s["minute"] >= 2]
    growth = (after2[-1]["rss_anon_mb"] / after2[0]["rss_anon_mb"] - 1) * 100 if len(after2) > 1 else None
    print(f"\nafter the end: ghosts {r['ghosts_after']} (goal 0), slots in use {r['slots_in_use_after']} (goal 0); "
          f"{r['steady_epochs']} steady epochs, every one exact: {'yes' if r['steady_exact'] else 'NO'}")
    print("server RssAnon from minute 2 to the end: "
          + (f"{growth:+.1f}% (goal within 5%)" if growth is not None else "not measured (the run is under 2 minutes)"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--trials-per-minute", type=float, default=200)
    p.add_argument("--at-once", type=int, default=8)
    p.add_argument("--steady", type=int, default=2)
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--sample-s", type=float, default=30)
    p.add_argument("--json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = run(a, tmp)
    report(r, a)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
