"""The per-cell program: one ensemble member per MPI rank, run under ``mpiexec``/``srun``.

Each rank pins itself to its cores, builds its pipeline and consumer, consumes ``warmup + steps``
batches and reports. Rank 0 gathers the per-rank reports and writes ``summary.json`` last and
atomically. Any failure on any rank aborts the whole job (``MPI_Abort``) after logging it, so a
job never hangs and never leaves a summary that looks complete.
"""
from __future__ import annotations

import os
import platform
import sys
import time
import traceback

import numpy as np

from enspipe.config import ConfigError, RunConfig
from enspipe.schemes import make_scheme

SUMMARY = "summary.json"


def _say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"enspipe: {msg}", flush=True)


def _percentile(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def run(cfg: RunConfig) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    try:
        scheme = make_scheme(cfg.scheme, n, cfg.preprocessors, cfg.global_batch)
    except ConfigError as e:  # every rank reaches the same verdict: no collective needed
        if rank == 0:
            print(f"enspipe run: error: {e}", file=sys.stderr, flush=True)
        return 2

    try:
        return _run_member(cfg, comm, scheme)
    except BaseException as e:  # noqa: BLE001 - a failed rank takes the job down, fast
        msg = f"rank {rank} failed: {type(e).__name__}: {e}"
        print(f"enspipe: error: {msg}", file=sys.stderr, flush=True)
        _write_error(cfg.out, rank, msg, traceback.format_exc())
        comm.Abort(1)
        return 1


def _write_error(out: str, rank: int, message: str, tb: str) -> None:
    """Leave the failure next to the event logs (``error.rankNNNN.txt``)."""
    try:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"error.rank{rank:04d}.txt"), "w") as f:
            f.write(message + "\n\n" + tb)
    except OSError:
        pass


def _run_member(cfg: RunConfig, comm, scheme) -> int:
    from mpi4py import MPI

    from enspipe.affinity import assign_cores, available_cores, configure_tensorflow_threads, pin_process

    rank, n = comm.Get_rank(), comm.Get_size()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    host = MPI.Get_processor_name()
    os.makedirs(cfg.out, exist_ok=True)
    monitor = _start_node_monitor(cfg, host) if local_rank == 0 else None  # before pinning: not on our cores
    cores, sharing_cores = assign_cores(available_cores(), cfg.cores, local_rank, local_size)
    affinity = pin_process(cores)
    threads = cfg.cores or len(cores)
    configure_tensorflow_threads(threads)

    import tensorflow as tf

    from enspipe.accounting import EpochLedger
    from enspipe.consumers import make_consumer
    from enspipe.data import batch_checksum, digest_of, load_manifest, write_json_atomic
    from enspipe.events import EventLog
    from enspipe.exchange import ExchangeEngine, Mpi4pyTransport
    from enspipe.networks import NETWORKS
    from enspipe.pipeline import Pipeline, quantizer
    from enspipe import cpumon, threadcpu
    from enspipe.measure import job_fields, write_power_table

    summary_path = os.path.join(cfg.out, SUMMARY)
    if rank == 0 and os.path.exists(summary_path):
        os.remove(summary_path)  # a rerun must not leave the old summary looking like its result
    events = EventLog(cfg.out, rank)
    preprocessing = NETWORKS[cfg.network].preprocessing
    manifest = load_manifest(cfg.data)
    role = scheme.role(rank)
    events.log("config", config=cfg.to_dict(), scheme=scheme.name, n=n, p=scheme.p, role=role, host=host,
               local_rank=local_rank, cores=affinity, sharing_cores=sharing_cores, threads=threads,
               preprocessing=preprocessing, share=scheme.share(rank, cfg.global_batch),
               dataset={"path": os.path.abspath(cfg.data), "num_images": manifest.num_images,
                        "digest": manifest.digest, "synthetic": manifest.synthetic})
    _say(rank, f"{scheme.name} n={n} p={scheme.p} {cfg.network} batch={cfg.global_batch} "
               f"{cfg.consumer}{' (emulated accelerator)' if cfg.consumer == 'emulated' else ''} "
               f"steps={cfg.warmup}+{cfg.steps} cores={cfg.cores or 'all'} {cfg.image_size}px -> {cfg.out}")

    size = cfg.image_size
    wire = np.uint8 if cfg.wire_dtype == "uint8" else np.float32
    common = (comm, scheme.groups(), (size, size, 3), wire)
    if cfg.transport == "horovod":
        from enspipe.horovod_transport import HorovodTransport

        transport = HorovodTransport(*common, events=events)
    else:
        transport = Mpi4pyTransport(*common, max_batch=cfg.global_batch, queue_depth=cfg.queue_depth,
                                    node_shm=cfg.node_shm, events=events)
    engine = ExchangeEngine(scheme, rank, transport, cfg.global_batch, fixed_blocks=not cfg.skip_corrupt)
    dequantize = quantizer(preprocessing)[1] if cfg.wire_dtype == "uint8" else None
    consumer = make_consumer(cfg, manifest.num_classes, rank, dequantize=dequantize)
    seed_offset = 0 if scheme.shared else rank  # baseline members each have their own stream
    pipeline = Pipeline(manifest=manifest, engine=engine, rank=rank, batch=cfg.global_batch, steps=cfg.total_steps,
                        preprocessing=preprocessing, image_size=size, threads=threads,
                        order_seed=cfg.seed + seed_offset, prep_seed=cfg.seed + seed_offset,
                        shuffle_buffer=cfg.shuffle_buffer, queue_depth=cfg.queue_depth,
                        skip_corrupt=cfg.skip_corrupt, fast_mode=cfg.fast_mode, wire_dtype=cfg.wire_dtype,
                        sample_interval=cfg.sample_interval, events=events)

    ledger = EpochLedger(manifest.num_images)
    fault = _injected_fault(rank)
    step_times, waits, losses = [], [], []
    images = 0
    slurm = _slurm_counter(cfg) if rank == 0 else None
    t_start = time.time()
    if monitor:
        monitor.mark("warmup_start", t_start)
    pipeline.start()
    t0 = cpu0 = None
    for step in range(cfg.total_steps):
        if step == cfg.warmup:
            slurm_j0 = _read_slurm(slurm)  # an sstat subprocess: before the window opens
            t0, cpu0, wall0, threads0 = time.perf_counter(), time.process_time(), time.time(), threadcpu.snapshot()
            comm0 = transport.stats.as_dict()
            if monitor:
                monitor.mark("measure_start", wall0)
            events.log("measure_start", step=step)
        if fault and fault[0] == step:
            _inject(fault[1], rank, step)
        t_req = time.perf_counter()
        batch = pipeline.next_batch()
        t_got = time.perf_counter()
        out = consumer.step(batch.images, batch.meta[:, 3])
        t_done = time.perf_counter()
        ledger.add(batch.meta[:, 0], batch.meta[:, 1])
        if step >= cfg.warmup:
            images += len(batch)
            step_times.append(t_done - t_req)
            waits.append(t_got - t_req)
        if "loss" in out:
            losses.append(out["loss"])
        events.log("step", step=step, images=len(batch), wait_s=t_got - t_req, compute_s=t_done - t_got,
                   measured=step >= cfg.warmup, queues=pipeline.occupancy(),
                   batch_digest=digest_of(batch.meta[:, 0]),
                   **({"batch_checksum": batch_checksum(batch)} if cfg.batch_checksums else {}), **out)
    seconds, cpu_seconds, wall1 = time.perf_counter() - t0, time.process_time() - cpu0, time.time()
    thread_cpu = threadcpu.by_group(threads0, threadcpu.snapshot())
    slurm_j1 = _read_slurm(slurm)
    events.log("measure_end", step=cfg.total_steps)
    if monitor:
        monitor.mark("measure_end", wall1)
    pipeline.close()
    transport.close()

    epochs = ledger.completed()
    for e in epochs:
        events.log("epoch", **e)
    report = {
        "rank": rank, "host": host, "role": role, "local_rank": local_rank, "cores": affinity,
        "sharing_cores": sharing_cores, "threads": threads, "share": list(scheme.share(rank, cfg.global_batch)),
        "learning_rate": cfg.lr_for(rank) if cfg.consumer == "train" else None,
        "images": images, "seconds": seconds, "images_per_second": images / seconds if seconds > 0 else None,
        "cpu_seconds": cpu_seconds, "cpu_seconds_per_image": cpu_seconds / images if images else None,
        "thread_cpu_seconds": thread_cpu,
        "step_time_p50": _percentile(step_times, 50), "step_time_p95": _percentile(step_times, 95),
        "wait_time_mean": float(np.mean(waits)) if waits else None,
        "queue_occupancy": pipeline.occupancy_stats(wall0, wall1),
        "epochs": epochs, "partial_epoch": ledger.partial(), "skipped": pipeline.skipped,
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "device": getattr(consumer, "device", None),
        "measured_window": {"start": wall0, "end": wall1}, "started": t_start,
        "exchange_paths": {",".join(map(str, g)): p for g, p in transport.paths.items()},
        # collectives in the measured window (the exchange stage runs up to a queue ahead of it)
        **{k: v - comm0[k] for k, v in transport.stats.as_dict().items()},
    }
    # the job's window: from the first member's measurement start to the last one's end
    job_t0, job_t1 = comm.allreduce(wall0, op=MPI.MIN), comm.allreduce(wall1, op=MPI.MAX)
    node = monitor.finish(job_t0, job_t1) if monitor else None
    gathered = comm.gather((report, node), root=0)
    if rank == 0:
        reports, nodes = [g[0] for g in gathered], [g[1] for g in gathered if g[1] is not None]
        measured, power_rows = job_fields(
            nodes, job_t0, job_t1, cfg.power, idle_watts=cfg.idle_watts, watts_per_core=cfg.watts_per_core,
            idle_file=cfg.idle_power, power_csv=cfg.power_csv,
            slurm_joules=slurm_j1 - slurm_j0 if slurm_j0 is not None and slurm_j1 is not None else None,
            slurm_why=None if slurm else "not inside a Slurm job step with energy accounting")
        cpumon.write_table(os.path.join(cfg.out, "cpu.csv"), [r for nd in nodes for r in nd["cpu_rows"]])
        write_power_table(os.path.join(cfg.out, "power.csv"), power_rows)
        summary = {
            "network": cfg.network, "consumer": cfg.consumer, "emulated": cfg.consumer == "emulated",
            "accelerator": "emulated" if cfg.consumer == "emulated" else ("none" if cfg.consumer == "peak" else "measured"),
            "rate": cfg.rate, "rate_source": cfg.rate_source, "batch_size": cfg.global_batch, "steps": cfg.steps,
            "warmup": cfg.warmup, "cores": cfg.cores, "image_size": size, "scheme": scheme.name, "n": n, "p": scheme.p,
            "wire_dtype": cfg.wire_dtype, "transport": transport.name, "preprocessing": preprocessing,
            "fast_mode": cfg.fast_mode, "seed": cfg.seed,
            "dataset": {"path": os.path.abspath(cfg.data), "num_images": manifest.num_images,
                        "digest": manifest.digest, "synthetic": manifest.synthetic},
            "images_per_second_per_member": float(np.mean([r["images_per_second"] for r in reports])),
            "cpu_seconds_total": float(sum(r["cpu_seconds"] for r in reports)),
            **measured,
            "ranks": reports,
            "machine": _machine(tf),
            "slurm": {k.lower()[6:]: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS",
                                                              "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION")
                      if k in os.environ} or None,
            "versions": {"enspipe": _version(), "tensorflow": tf.__version__, "python": platform.python_version(),
                         "mpi": MPI.Get_library_version().splitlines()[0].strip()},
            "finished": time.time(),
        }
        write_json_atomic(summary_path, summary)
        _say(rank, f"{summary['images_per_second_per_member']:.1f} images/s per member, "
                   f"{summary['cpu_seconds_total']:.2f} CPU-s in the measured window; {summary_path}")
    events.log("end")
    events.close()
    comm.Barrier()
    return 0


def _start_node_monitor(cfg: RunConfig, host: str):
    from enspipe.cpumon import resolve_source
    from enspipe.measure import NodeMonitor

    return NodeMonitor(cfg.out, host, resolve_source(cfg.cpu_monitor), cfg.power, cfg.monitor_interval)


def _slurm_counter(cfg: RunConfig):
    from enspipe.power import PowerUnavailable, SlurmStepCounter

    if cfg.power != ("auto",) and "slurm" not in cfg.power:
        return None
    try:
        return SlurmStepCounter()
    except (PowerUnavailable, OSError) as e:
        if "slurm" in cfg.power:
            raise PowerUnavailable(f"--power slurm: {e}") from None
        return None


def _read_slurm(counter) -> float | None:
    return counter.read()["step"] if counter else None


def _injected_fault(rank: int) -> tuple[int, str] | None:
    """Fault injection for the fault-tolerance tests: ``ENSPIPE_INJECT_FAULT=rank:step:raise|kill``."""
    spec = os.environ.get("ENSPIPE_INJECT_FAULT")
    if not spec:
        return None
    r, step, kind = spec.split(":")
    return (int(step), kind) if int(r) == rank else None


def _inject(kind: str, rank: int, step: int) -> None:
    if kind == "kill":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault at step {step}")


def _machine(tf) -> dict:
    """What the numbers were measured on (rank 0's node)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    gpus = [tf.config.experimental.get_device_details(d).get("device_name", "GPU")
            for d in tf.config.list_physical_devices("GPU")]
    return {"node": platform.node(), "cpu_model": model, "cpus": os.cpu_count(),
            "gpus": f"{len(gpus)}x {gpus[0]}" if gpus else None}


def _version() -> str:
    from enspipe import __version__

    return __version__
