"""Members on one GPU fed seven ways, side by side: what each member trains at, how busy the GPU
is, and what the feeding costs in CPU and GPU energy.

    python benchmarks/feed.py --out DIR [--ns 8,4,2,1] [--network alexnet_v2] [--extra inception_v1@4,vgg_a@4]
                              [--feeds ...] [--steps 40] [--warmup 5] [--repeats 1] [--budget 480] [--device cuda]

At each n, n members each train ``--network`` (enspipe's torch.nn definitions) on the one device
with SGD, batch ``--batch-size``, torchvision's ``standard`` augmentation, uint8 batches, fed:

* ``synthetic``: one random batch already on the device, no input pipeline: the GPU-bound rate
  (rc / n per member) the others are measured against;
* ``enspipe-cpu``: ``SharedStream(scheme="all_shared", backend="pillow")``, each member on its
  share of the cores, batches copied to the device by ``stream.torch(device=...)``;
* ``enspipe-gpu``: ``SharedStream(backend="gpu", transport="torch", device="cuda")``: each
  member decodes its share on the GPU and the batch is assembled in the group's ring there
  (CUDA IPC);
* ``enspipe-serve``: ``enspipe serve --backend gpu`` and n attached trials (the pool on the GPU,
  each trial's batch copied out of it there);
* ``dataloader``: each member's own ``DataLoader`` with ``cores / n`` worker processes and the same
  transform on the CPU (the status quo);
* ``gpu-decode``: each member reads its own batches (a ``DataLoader`` of 2 readers) and decodes and
  augments all of them on the GPU itself (nvJPEG and the gpu backend's ops; no sharing);
* ``tensorsocket``: TensorSocket, one producer ``DataLoader`` of ``min(14, cores)`` workers and
  n consumers (where it is installed; its row says why not).

Per run (one launch of n members): images/s per member (median over members, each over its own
window after ``--warmup`` steps); then over the window all members were measuring in: the job's
process CPU (every process of the job, its workers and the attach server included, sampled with
psutil) per delivered image, the node's busy cores, the GPU's busy fraction (NVML utilisation)
and its energy above idle per delivered image (NVML's counter, the idle power measured first).
The runs are interleaved (each repeat's order reversed in the next); a run that fails or does not
fit the time ``--budget`` gets a row that says why. Writes DIR/feed.json; prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from cells import MPIEXEC, dataset, schedule

FEEDS = ("synthetic", "enspipe-cpu", "enspipe-gpu", "enspipe-serve", "dataloader", "gpu-decode", "tensorsocket")
HERE = os.path.dirname(os.path.abspath(__file__))


# -- one member ---------------------------------------------------------------------------------
def member(a: argparse.Namespace) -> None:
    """One member of a run: its feed's batches, its network trained on them, its steps' times."""
    import torch

    rank, n = int(os.environ.get("PMI_RANK", 0)), int(os.environ.get("PMI_SIZE", 1))
    if a.feed == "tensorsocket" and rank == 0:
        return _produce(a)
    me, members = (rank - 1, n - 1) if a.feed == "tensorsocket" else (rank, n)
    _pin(me, members, a.feed)
    torch.manual_seed(me)
    device = torch.device(a.device)
    from enspipe.data.build import load_manifest
    from enspipe.data.pixels import OUTPUT_RANGE
    from enspipe.models.torch_architectures import TORCH_NETWORKS

    classes = load_manifest(a.data).num_classes
    net = TORCH_NETWORKS[a.network](classes, a.image_size, seed=me).to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    lo, hi = OUTPUT_RANGE["standard"]
    batches, close = _batches(a, me, members, device, classes)
    ends, sizes = [], []
    for images, labels in batches:
        x = images.to(device, non_blocking=True).permute(0, 3, 1, 2).float() * ((hi - lo) / 255) + lo
        loss = torch.nn.functional.cross_entropy(net(x), labels.to(device).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ends.append(time.time())
        sizes.append(len(labels))
        if len(ends) == a.warmup + a.steps:
            break
    close()
    with open(os.path.join(a.out, f"member{me}.json"), "w") as f:
        json.dump({"ends": ends, "sizes": sizes, "warmup": a.warmup}, f)


def _pin(me: int, members: int, feed: str) -> None:
    """Each member on its share of the cores (the attach server and TensorSocket's producer run
    on all of them)."""
    from enspipe.engine.affinity import assign_cores, available_cores, pin_process

    if feed not in ("enspipe-serve", "tensorsocket"):
        pin_process(assign_cores(available_cores(), max(1, len(available_cores()) // members), me, members)[0])


def _endless(epoch_of):
    """``epoch_of(e)``'s batches for e = 0, 1, 2, ..."""
    e = 0
    while True:
        yield from epoch_of(e)
        e += 1


def _batches(a, me: int, members: int, device, classes: int):
    """This member's batches by its feed, and how to end them."""
    import torch

    if a.feed == "synthetic":
        images = torch.randint(0, 256, (a.batch_size, a.image_size, a.image_size, 3), dtype=torch.uint8, device=device)
        labels = torch.randint(0, classes, (a.batch_size,), device=device)
        return _endless(lambda e: [(images, labels)]), lambda: None
    if a.feed in ("enspipe-cpu", "enspipe-gpu", "enspipe-serve"):
        import enspipe

        if a.feed == "enspipe-serve":
            stream = enspipe.attach(a.socket, timeout=300)
        else:
            on_gpu = a.feed == "enspipe-gpu"
            stream = enspipe.SharedStream(a.data, a.batch_size, scheme="all_shared", image_size=a.image_size,
                                          preprocess="standard", wire_dtype="uint8",
                                          backend="gpu" if on_gpu else "pillow",
                                          **({"transport": "torch", "device": str(device)} if on_gpu else {}))
        return _endless(lambda e: stream.torch(device=device)), stream.close
    if a.feed == "dataloader":
        from torch_ways import _loader

        loader = _loader(a.data, a.batch_size, a.image_size, me, max(1, len(os.sched_getaffinity(0))), "standard")

        def epoch(e):
            loader.dataset.epoch = e
            return loader
        return _endless(epoch), lambda: None
    if a.feed == "gpu-decode":
        return _decoded_here(a, me, device), lambda: None
    from tensorsocket.consumer import TensorConsumer

    from torch_ways import PORTS

    consumer = TensorConsumer(*PORTS[:2], heart_ports=PORTS[2], batch_size=a.batch_size)
    return _endless(lambda e: consumer), lambda: None


def _decoded_here(a, me: int, device):
    """Every batch read by 2 reader processes and decoded and augmented on ``device`` by this
    member alone: nvJPEG and the gpu backend's ops (the CPU decoder on a CPU device)."""
    import torch

    from enspipe.engine.backends.gpu import tensor_engine

    engine = tensor_engine("standard", a.image_size, "uint8", me, True, str(device))
    reader = torch.utils.data.DataLoader(Encoded(a.data), batch_size=a.batch_size, shuffle=True, drop_last=True,
                                         num_workers=2, persistent_workers=True, collate_fn=list,
                                         generator=torch.Generator().manual_seed(me))
    position = 0
    for e in range(1 << 30):
        for batch in reader:
            images, failed = engine.augment([x for x, _ in batch], list(range(position, position + len(batch))))
            position += len(batch)
            yield images, torch.tensor([y for i, (_, y) in enumerate(batch) if i not in failed])


class Encoded:
    """The dataset's records as ``(JPEG bytes, label)``, read by their offsets."""

    def __init__(self, data: str):
        from enspipe.data.build import load_manifest

        self.m, self._reader = load_manifest(data), None
        self.numbers = [(s, r) for s, c in enumerate(self.m.counts) for r in range(c)]

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, i: int):
        from enspipe.data.order import RecordReader
        from enspipe.data.records import parse_slim

        if self._reader is None:
            self._reader = RecordReader(self.m, False)
        return parse_slim(self._reader.read(*self.numbers[i]))


def _produce(a: argparse.Namespace) -> None:
    """TensorSocket's producer: one DataLoader of min(14, cores) workers; the consumers' steps."""
    from tensorsocket.producer import TensorProducer

    from torch_ways import PORTS, _loader

    workers = min(14, len(os.sched_getaffinity(0)))
    producer = TensorProducer(_loader(a.data, a.batch_size, a.image_size, 0, workers, "standard"), *PORTS[:2],
                              heart_ports=PORTS[2])  # (its defaults: producer_batch_size=1 failed in 0.0.5)
    for _ in range(1 << 30):
        for _ in producer:
            pass


# -- the parent: runs, samplers, rows -------------------------------------------------------------
class Sampler:
    """Every 0.1 s: the CPU-seconds of a job's processes (the launcher's tree, and ``extra`` pids'
    trees), the node's busy CPU-seconds, and where NVML is, the GPU's energy counter (J) and
    utilisation (%)."""

    def __init__(self, roots: list[int], nvml):
        self.roots, self.nvml, self.rows, self._stop = roots, nvml, [], threading.Event()
        self._seen: dict[int, float] = {}  # a process's last CPU, kept once it exits
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree_cpu(self) -> float:
        import psutil

        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    t = p.cpu_times()  # (its children are in the tree: their own times, not the reaped ones')
                    self._seen[p.pid] = t.user + t.system
            except psutil.Error:
                pass
        return sum(self._seen.values())

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.1):
            node = psutil.cpu_times()
            busy = sum(node) - node.idle - getattr(node, "iowait", 0.0)
            gpu = self.nvml() if self.nvml else (None, None)
            self.rows.append((time.time(), self._tree_cpu(), busy, *gpu))

    def stop(self) -> np.ndarray:
        self._stop.set()
        self._thread.join()
        return np.array(self.rows, dtype=float)


def nvml_reader():
    """``() -> (energy J, utilisation %)`` of GPU 0, or None where NVML is not here."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - no driver, no GPU, no package
        return None
    return lambda: (pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000, pynvml.nvmlDeviceGetUtilizationRates(h).gpu)


def idle_watts(nvml, seconds: float = 3.0) -> float | None:
    if nvml is None:
        return None
    e0, t0 = nvml()[0], time.time()
    time.sleep(seconds)
    return (nvml()[0] - e0) / (time.time() - t0)


def run(a: argparse.Namespace, feed: str, n: int, network: str, nvml, idle: float | None) -> dict:
    """One launch of n members fed by ``feed``; its row."""
    with tempfile.TemporaryDirectory() as out:
        server, extra = None, []
        if feed == "enspipe-serve":
            server = _server(a, n, out)
            extra = [server.pid]
        ranks = n + (feed == "tensorsocket")
        cmd = [MPIEXEC, "-n", str(ranks), sys.executable, os.path.abspath(__file__), "--member", feed, "--out", out,
               "--data", a.data, "--network", network, "--steps", str(a.steps), "--warmup", str(a.warmup),
               "--image-size", str(a.image_size), "--batch-size", str(a.batch_size), "--device", a.device,
               "--socket", os.path.join(out, "s.sock")]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        sampler = Sampler([proc.pid, *extra], nvml)
        try:
            text = _wait_members(proc, out, n, a.timeout)
        finally:
            samples = sampler.stop()
            for p in filter(None, (proc, server)):
                _end(p)
        if text is not None:
            return {"failed": text}
        members = [json.load(open(os.path.join(out, f"member{k}.json"))) for k in range(n)]
    return measured(members, samples, idle)


def _server(a, n: int, out: str) -> subprocess.Popen:
    from enspipe.serve.wire import live_server

    per = a.image_size * a.image_size * 3
    memory = max(64 << 20, n * a.batch_size * 6 * per)
    sock = os.path.join(out, "s.sock")
    server = subprocess.Popen([sys.executable, "-m", "enspipe", "serve", "--data", a.data, "--batch-size",
                               str(a.batch_size), "--image-size", str(a.image_size), "--preprocess", "standard",
                               "--wire-dtype", "uint8", "--backend", "gpu", "--device", a.device, "--socket", sock,
                               "--memory", str(memory), "--max-consumers", str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    end = time.monotonic() + 120
    while not live_server(sock) and server.poll() is None and time.monotonic() < end:
        time.sleep(0.1)
    return server


def _wait_members(proc, out: str, n: int, timeout: float) -> str | None:
    """None once every member has written its steps; else why not (the job's last words)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(os.path.exists(os.path.join(out, f"member{k}.json")) for k in range(n)):
            return None
        if proc.poll() is not None:
            said = (proc.stdout.read() or "").strip().splitlines()
            why = [x for x in said if "Error" in x or "error" in x] or said
            return f"exit {proc.returncode}: {why[-1][:240] if why else ''}"
        time.sleep(0.2)
    return f"did not finish in {timeout:g} s"


def _end(p: subprocess.Popen) -> None:
    """The process's session ended: SIGTERM, then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if p.poll() is not None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            pass


def measured(members: list[dict], samples: np.ndarray, idle: float | None) -> dict:
    """A run's row from its members' step times and the samples (time, job CPU, node CPU, GPU J, GPU %)."""
    rates, starts, stops = [], [], []
    for m in members:
        ends, w = np.array(m["ends"]), m["warmup"]
        t0 = ends[w - 1] if w else ends[0]
        rates.append(sum(m["sizes"][w:]) / (ends[-1] - t0))
        starts.append(t0)
        stops.append(ends[-1])
    w0, w1 = max(starts), min(stops)
    row = {"images_per_s_per_member": float(np.median(rates)), "slowest_member": float(min(rates)),
           "window_s": max(0.0, w1 - w0)}
    inside = samples[(samples[:, 0] >= w0) & (samples[:, 0] <= w1)] if len(samples) else samples
    if w1 - w0 < 0.5 or len(inside) < 2:
        return {**row, "why": "the members' common window is under 0.5 s or holds under two samples: "
                "no CPU or GPU figures (raise --steps)"}
    s0, s1 = inside[0, 0], inside[-1, 0]
    span = s1 - s0
    delivered = sum(s for m in members for s, t in zip(m["sizes"], m["ends"]) if s0 < t <= s1)  # (in the samples' span)
    if not delivered:
        return {**row, "why": "no step ended between the window's first and last samples (raise --steps)"}
    row.update(cpu_ms_per_image=1000 * (inside[-1, 1] - inside[0, 1]) / delivered,
               node_busy_cores=(inside[-1, 2] - inside[0, 2]) / span)
    if samples.shape[1] > 3 and not np.isnan(inside[:, 3]).any():
        joules = inside[-1, 3] - inside[0, 3]
        row.update(gpu_busy=float(np.mean(inside[:, 4])) / 100,
                   gpu_joules_per_image_above_idle=(joules - (idle or 0.0) * span) / delivered)
    return row


def plan(a) -> list[tuple[str, int, str]]:
    todo = [(feed, n, a.network) for n in a.ns for feed in a.feeds]
    for spec in filter(None, a.extra.split(",")):
        network, _, at = spec.partition("@")
        todo += [(feed, int(at or 4), network) for feed in a.feeds]
    return todo


def main() -> None:
    a = parse()
    if a.feed:
        return member(a)
    a.data = dataset(a.images)
    nvml = nvml_reader()
    idle = idle_watts(nvml)
    started, rows = time.monotonic(), []
    for rep, (feed, n, network) in schedule(plan(a), a.repeats):
        row = {"feed": feed, "n": n, "network": network, "repeat": rep, "device": a.device}
        if time.monotonic() - started > a.budget:
            row["failed"] = f"not run: the --budget of {a.budget:g} s was spent"
        else:
            row.update(run(a, feed, n, network, nvml, idle))
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"device": a.device, "nvml": nvml is not None, "idle_watts": idle, "cores": len(os.sched_getaffinity(0)),
              "batch_size": a.batch_size, "image_size": a.image_size, "steps": a.steps, "warmup": a.warmup,
              "images": a.images, "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "feed.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(table(result))


def table(result: dict) -> str:
    """The rows as a markdown table, each rate also as a share of the synthetic feed's at its n."""
    bound = {(r["n"], r["network"]): r["images_per_s_per_member"] for r in result["rows"]
             if r["feed"] == "synthetic" and "images_per_s_per_member" in r}
    lines = [f"device {result['device']}, {result['cores']} cores, batch {result['batch_size']}, "
             f"{result['image_size']} px, {result['steps']} steps after {result['warmup']}",
             "", "| network | n | feed | img/s per member | of GPU-bound | CPU ms/img | node busy cores | GPU busy | "
             "GPU J/img above idle | note |", "|---|---|---|---|---|---|---|---|---|---|"]

    def fmt(x, digits=1):
        return "" if x is None else f"{x:.{digits}f}"
    for r in result["rows"]:
        if "images_per_s_per_member" not in r:
            lines.append(f"| {r['network']} | {r['n']} | {r['feed']} | | | | | | | {r.get('failed', '')} |")
            continue
        of = bound.get((r["n"], r["network"]))
        lines.append(f"| {r['network']} | {r['n']} | {r['feed']} | {fmt(r['images_per_s_per_member'])} | "
                     f"{fmt(r['images_per_s_per_member'] / of * 100, 0) + ' %' if of else ''} | "
                     f"{fmt(r.get('cpu_ms_per_image'), 2)} | {fmt(r.get('node_busy_cores'))} | "
                     f"{fmt(r.get('gpu_busy', None) and 100 * r['gpu_busy'], 0)} | "
                     f"{fmt(r.get('gpu_joules_per_image_above_idle'), 3)} | {r.get('why', '')} |")
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ns", type=lambda s: [int(x) for x in s.split(",")], default=[8, 4, 2, 1],
                    help="members per run, in this order (the largest first: the budget may end the rest)")
    ap.add_argument("--network", default="alexnet_v2")
    ap.add_argument("--extra", default="inception_v1@4,vgg_a@4", help="NETWORK@N runs beside (every feed)")
    ap.add_argument("--feeds", type=lambda s: s.split(","), default=list(FEEDS))
    ap.add_argument("--images", type=int, default=2048, help="the synthetic dataset's size")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=40, help="measured steps per member")
    ap.add_argument("--warmup", type=int, default=5, help="steps per member before its window")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (the toy-size check without a GPU)")
    ap.add_argument("--budget", type=float, default=480, help="seconds: runs not started by then are listed")
    ap.add_argument("--timeout", type=float, default=60, help="seconds one run may take")
    ap.add_argument("--member", dest="feed", choices=FEEDS, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    a = ap.parse_args()
    unknown = set(a.feeds) - set(FEEDS)
    if unknown:
        ap.error(f"--feeds: unknown {', '.join(sorted(unknown))}; choose from {', '.join(FEEDS)}")
    return a


if __name__ == "__main__":
    main()
