"""A cell's report: each rank's numbers from its measured window, gathered on rank 0 with the
nodes' CPU and energy into ``summary.json``, written last and atomically (or, where an epoch lost
samples, ``summary.failed.json``)."""
from __future__ import annotations

import collections
import os
import platform
import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from enspipe import __version__
from enspipe.common import keys, phases
from enspipe.common.atomic import write_json_atomic
from enspipe.data.approximation import fused_colour_error
from enspipe.data.keys import sample_ids
from enspipe.data.manifest import expected_keys
from enspipe.data.order import effective_shuffle_buffer
from enspipe.engine.backends import BACKENDS
from enspipe.engine.config import BUILTIN_PREPROCESSING
from enspipe.engine.decode_cache import cache_summary
from enspipe.measure import cpumon, stages
from enspipe.measure.node import cpu_model, job_fields, write_power_table
from enspipe.plan.schemes import AUTO
from enspipe.run.config import RunConfig
from enspipe.run.grid import Cell

if TYPE_CHECKING:
    from enspipe.run.context import Job
    from enspipe.run.window import Warmup, Window


SUMMARY = "summary.json"


FAILED_SUMMARY = "summary.failed.json"  # a finished cell that broke its exactly-once promise
PHASES = "phases.json"  # rank 0's phase time stamps (enspipe.common.phases), after the summary


def say(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"enspipe: {msg}", flush=True)


def percentile(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


def rank_report(job: Job, w: Window, warmup_steps: int, discarded: int) -> dict:
    """This rank's part of the summary: its rate and CPU, stages, queues, epochs and exchange."""
    cfg, member, rank, where = job.cfg, job.member, job.rank, job.where
    epochs = member.ledger.completed()
    for e in epochs:
        job.events.log(keys.EPOCH, **e)
    skipped = job.pipeline.skipped(warmup_steps + w.steps)
    short: dict[int, list[str] | None] = dict.fromkeys(member.ledger.short() if job.scheme.exactly_once else ())
    wanted = expected_keys(job.manifest) if short else None
    if wanted:  # an epoch short of the manifest: the keys it lacks tell skipped from lost
        expected = dict(zip(sample_ids(wanted).tolist(), wanted))
        short = {e: member.ledger.lacking(e, expected) for e in short}
    images, seconds, cpu_seconds = member.images, w.seconds, w.cpu_seconds
    return {
        "rank": rank, "host": where.host, "role": job.scheme.role(rank), "host_rank": where.host_rank,
        "mpi_node": where.mpi_node, "cores": job.affinity, "sharing_cores": where.sharing_cores,
        "threads": where.threads, "share": list(job.scheme.share(rank, cfg.global_batch)),
        "member": cfg.member_of(rank), "members": cfg.rank_members(rank),
        "max_rss_bytes": max_rss_bytes(),
        "learning_rate": cfg.lr_for(cfg.member_of(rank)) if cfg.training.consumer == "train" else None,
        "images": images, "images_preprocessed": w.preprocessed, "seconds": seconds,
        "images_per_second": images / seconds if seconds > 0 else None,
        "cpu_seconds": cpu_seconds, "cpu_seconds_per_image": cpu_seconds / images if images else None,
        "cpu_seconds_ticks": w.tick_cpu_seconds,  # the same CPU on the kernel's tick clock (mpstat's)
        "thread_cpu_seconds": w.thread_cpu,
        "stages": stages.breakdown(*w.clocks, w.thread_cpu, w.exchange, cpu_seconds),
        "step_time_p50": percentile(member.step_times, 50), "step_time_p95": percentile(member.step_times, 95),
        "wait_time_mean": float(np.mean(member.waits)) if member.waits else None,
        "starved_fraction": member.starved / w.steps,
        "queue_occupancy": job.pipeline.occupancy_stats(*w.wall),
        "epochs": epochs, "partial_epoch": member.ledger.partial(),
        "skipped": [k for ks in skipped.values() for k in ks], "skipped_by_epoch": skipped,
        "short_epochs": short,
        "trained_images": member.trained, "accelerator_busy_seconds": member.busy_seconds,
        "member_name": cfg.name_of(cfg.member_of(rank)),
        "network": cfg.network_for(cfg.member_of(rank)) if cfg.training.consumer == "train" else None,
        "epochs_trained": member.epochs_trained,
        "member_state": member.life.state.as_dict() if member.life else None,
        "steps_measured": w.steps, "stopped_early": w.stopped_early,
        "loss_first": member.losses[0] if member.losses else None,
        "loss_last": member.losses[-1] if member.losses else None,
        "device": getattr(job.consumer, "device", None),
        "measured_window": {"start": w.wall[0], "end": w.wall[1]}, "started": job.started,
        "warmup_steps": warmup_steps, "discarded_batches": discarded,
        "exchange_paths": {",".join(map(str, g)): p for g, p in job.transport.paths.items()},
        # collectives in the measured window (the exchange stage runs up to a queue ahead of it)
        **w.exchange,
        "delivery": member.delivery.summary(),
        "gradient_exchange": _exchange_report(job) if max(cfg.training.data_parallel) > 1 else None,
        "decode_cache": job.pipeline.cache.report() if getattr(job.pipeline, "cache", None) else None,
        "decodes": job.pipeline.decodes(),  # e.g. the images the region decode passed to the whole decode, by reason
    }


def _exchange_report(job: Job) -> dict | None:
    """A data-parallel rank's gradient exchange in the measured window: what it is, the bytes it
    sends a step, and for blocks the share done before backpropagation ended and the wait after it."""
    spec, recs = job.cfg.gradient_spec, job.member.exchanges
    if job.cfg.training.consumer != "train":
        return None
    out = {"kind": spec.kind, "label": spec.label(),
           "bytes_per_step": float(np.mean([r["bytes_per_step"] for r in recs])) if recs else None}
    if recs and "blocks" in recs[0]:
        out.update(blocks=recs[0]["blocks"],
                   done_before_backward_end=float(np.mean([r["done_before_backward_end"] for r in recs])),
                   exposed_seconds_mean=float(np.mean([r["exposed_s"] for r in recs])),
                   backward_seconds_mean=float(np.mean([r["backward_s"] for r in recs])))
    return out


def job_report(job: Job, report: dict, w: Window, warm: "Warmup") -> int:
    """Gather the ranks' reports and the nodes' CPU and power on rank 0, agree on whether every
    epoch was whole, and only then, with every member alive and done, write the summary."""
    from mpi4py import MPI

    cfg, comm, rank = job.cfg, job.comm, job.rank
    # the job's window: from the first member's measurement start to the last one's end
    job_t0, job_t1 = comm.allreduce(w.wall[0], op=MPI.MIN), comm.allreduce(w.wall[1], op=MPI.MAX)
    node = job.monitor.finish(job_t0, job_t1) if job.monitor else None
    phases.mark("monitor_closed")
    gathered = comm.gather((report, node), root=0)
    summary = failure = None
    if rank == 0:
        reports, nodes = [g[0] for g in gathered], [g[1] for g in gathered if g[1] is not None]
        summary = cell_summary(job, reports, nodes, (job_t0, job_t1), w, warm)
        failure = short_epochs(reports, job.manifest.num_images)
    failure = comm.bcast(failure, root=0)
    job.events.log(keys.END, **({"failure": failure} if failure else {}))
    job.events.close()
    job.heartbeat.finish(comm.Barrier)  # every member is alive and done: only now does the cell's summary appear
    if rank == 0:
        summary_path = os.path.join(cfg.out, SUMMARY)
        phases.mark("summarized")
        write_json_atomic(summary_path if not failure else os.path.join(cfg.out, FAILED_SUMMARY),
                          summary | ({"failure": failure} if failure else {}))
        phases.mark("summary_written")
        write_json_atomic(os.path.join(cfg.out, PHASES), phases.stamps())
        if failure:
            print(f"enspipe: error: {failure}; the cell's numbers are in {FAILED_SUMMARY}", file=sys.stderr, flush=True)
        else:
            say(rank, f"{summary['images_per_second_per_member']:.1f} images/s per member, "
                      f"{summary['cpu_seconds_total']:.2f} CPU-s in the measured window; {summary_path}")
    return 1 if failure else 0


def cell_summary(job: Job, reports: list[dict], nodes: list[dict], window: tuple[float, float], w: Window,
             warm: "Warmup") -> dict:
    """The cell's summary (rank 0): its identity and settings, the ranks' reports, the nodes'
    CPU and energy over the job's window; also writes the cell's cpu.csv and power.csv."""
    from mpi4py import MPI

    cfg, scheme, n, manifest = job.cfg, job.scheme, job.n, job.manifest
    t, m, e = cfg.training, cfg.measure, cfg.energy
    slurm_j0, slurm_j1 = w.slurm_joules
    measured, power_rows = job_fields(
        nodes, *window, e.power, idle_watts=e.idle_watts, watts_per_core=e.watts_per_core,
        idle_file=e.idle_power, power_csv=e.power_csv,
        slurm_joules=slurm_j1 - slurm_j0 if slurm_j0 is not None and slurm_j1 is not None else None,
        slurm_why=None if job.slurm else "not inside a Slurm job step with energy accounting")
    cpumon.write_table(os.path.join(cfg.out, "cpu.csv"), [r for nd in nodes for r in nd["cpu_rows"]])
    write_power_table(os.path.join(cfg.out, "power.csv"), power_rows)
    return {
        "cell": Cell.of({"network": t.network, "scheme": AUTO if cfg.planned else scheme.name, "n": n,
                         "p": n if cfg.planned else scheme.p, "cores": m.cores,  # an auto cell: P = N, as the grid
                         "consumer": t.consumer, "rep": cfg.rep}).as_dict(),
        "planned": cfg.planned,  # --scheme auto: the plan's choice and prediction; the scheme that ran is below
        "network": t.network, "consumer": t.consumer, "emulated": t.consumer == "emulated",
        "accelerator": "emulated" if t.consumer == "emulated" else ("none" if t.consumer == "peak" else "measured"),
        "rate": t.rate, "rate_source": cfg.rate_source, "batch_size": cfg.global_batch, "steps": m.steps,
        "warmup": m.warmup, "cores": m.cores, "image_size": cfg.stream.image_size, "scheme": scheme.name, "n": n,
        "p": scheme.p, "wire_dtype": cfg.stream.wire_dtype, "transport": job.transport.name, "backend": cfg.backend,
        "trainer": cfg.trainer,
        "unit_batches": None if scheme.service else job.pipeline.unit,  # batches per read/preprocess/exchange
        "malloc": job.malloc,  # how the members' malloc returned freed images (--malloc)
        "members_per_rank": cfg.training.members_per_rank,
        # a data-parallel member's gradient exchange; ako's replicas differ (its label says so)
        "gradient_exchange": cfg.gradient_spec.label() if max(t.data_parallel) > 1 and t.consumer == "train" else None,
        **_preprocessing(cfg, job.preprocessing, reports, manifest), "seed": cfg.stream.seed,
        "dataset": {"path": os.path.abspath(cfg.data), "num_images": manifest.num_images,
                    "digest": manifest.digest, "synthetic": manifest.synthetic,
                    "shuffle_buffer": effective_shuffle_buffer(manifest, cfg.stream.shuffle_buffer,
                                                               BACKENDS[cfg.backend].permutes),
                    "accounting": manifest.accounting},
        "images_per_second_per_member": float(np.mean([r["images_per_second"] for r in reports])),
        "cpu_seconds_total": float(sum(r["cpu_seconds"] for r in reports)),
        "cpu_seconds_ticks_total": _total(r.get("cpu_seconds_ticks") for r in reports),
        "stages_per_image": stages.mean_per_image(reports),
        "window": window_summary(scheme, reports, warm),
        "delivery": delivery_summary(scheme, reports, cfg),
        "service": job.transport.describe() if scheme.service else None,
        "placement": job.where.as_dict(),
        **measured,
        "ranks": reports,
        "machine": machine(),
        "slurm": {k.lower()[6:]: os.environ[k] for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NTASKS",
                                                          "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION")
                  if k in os.environ} or None,
        "versions": {"enspipe": version(), "tensorflow": _tf_version(), "python": platform.python_version(),
                     "mpi": MPI.Get_library_version().splitlines()[0].strip()},
        "finished": time.time(),
    }


def _total(values) -> float | None:
    """The sum, or None where any rank lacks the reading."""
    values = list(values)
    return None if any(v is None for v in values) else float(sum(values))


def _preprocessing(cfg: RunConfig, preprocessing: str, reports: list[dict], manifest) -> dict:
    """The summary's preprocessing: which, on which path, the decode cache and an approximation's error."""
    return {"preprocessing": preprocessing, "fast_mode": cfg.preprocess.fast_mode,
            "preprocess_impl": _impl(cfg, preprocessing), "decode_cache": cache_summary(reports),
            "approximation": _approximation(cfg, preprocessing, manifest)}


def _impl(cfg: RunConfig, preprocessing: str) -> str:
    """Which implementation preprocessed: the tf backend's crop-first, reference or fused-colour
    (inception's; vgg has one), the pillow backend's (or its fused-colour), or a user's function."""
    if preprocessing not in BUILTIN_PREPROCESSING:
        return "user"
    return BACKENDS[cfg.backend].label(cfg.preprocess.preprocess_impl)


def _approximation(cfg: RunConfig, preprocessing: str, manifest) -> dict | None:
    """An approximate path's error against the exact one, measured (after the window) on the
    dataset's first images; None for an exact path."""
    if cfg.preprocess.preprocess_impl != "fused-colour" or preprocessing != "inception":
        return None

    return fused_colour_error(manifest, BACKENDS[cfg.backend].needs_tensorflow, cfg.stream.image_size,
                              cfg.preprocess.fast_mode)


def short_epochs(reports: list[dict], num_images: int) -> str | None:
    """Why the cell failed its exactly-once promise, or None: a member's completed epoch lacks
    samples that no member skipped (and counted), i.e. data vanished under the manifest."""
    skipped: dict[int, set[str]] = {}
    for r in reports:
        for epoch, ks in r["skipped_by_epoch"].items():
            skipped.setdefault(epoch, set()).update(ks)
    for r in reports:
        counts = {e["epoch"]: e["count"] for e in r["epochs"]}
        for epoch, lacking in r["short_epochs"].items():
            gone = skipped.get(epoch, set())
            where = f"rank {r['rank']}, epoch {epoch}: "
            if lacking is None:  # the manifest does not count its shards' records
                lost = num_images - counts[epoch] - len(gone)
                if lost > 0:
                    return (where + f"{counts[epoch]} of the manifest's {num_images} samples delivered and {lost} not "
                            "skipped (the manifest does not count its shards' records, so they cannot be named; "
                            "re-index with `enspipe index`)")
            elif lost := [k for k in lacking if k not in gone]:
                shards = collections.Counter(k.rsplit(":", 1)[0] for k in lost)
                return (where + f"{len(lost)} of the manifest's {num_images} samples never arrived and were not "
                        f"skipped, from {', '.join(f'{s} ({k})' for s, k in sorted(shards.items()))}; the data "
                        "changed under its manifest: re-create or re-index it")
    return None


def delivery_summary(scheme, reports: list[dict], cfg: RunConfig) -> dict:
    """What the members saw, side by side for every arm (see :class:`enspipe.data.ledger.DeliveryCounter`)."""
    d = [r["delivery"] for r in reports]
    distinct = [x["distinct_min"] for x in d if x["distinct_min"] is not None]
    return {"exactly_once": scheme.exactly_once, "window_samples": d[0]["window_samples"],
            "distinct_min": min(distinct) if distinct else None,
            "skipped_samples": sum(x["skipped_samples"] for x in d),
            "skipped_by_member": [x["skipped_samples"] for x in d],
            "slow_member": list(cfg.training.slow_member) if cfg.training.slow_member else None}


def window_summary(scheme, reports: list[dict], warm: "Warmup") -> dict:
    """Whether the window's CPU and its images describe the same work: the images the members
    preprocessed inside it against those they had to (every member's own batches for the
    baseline; one copy of each shared batch otherwise)."""
    delivered = [r["images"] for r in reports]
    needed = sum(delivered) if not scheme.shared else max(delivered)
    made = [r["images_preprocessed"] for r in reports]
    made = None if None in made else sum(made)  # None: the tf.data service's workers do not say
    return {"warmup_steps": warm.steps, "steady": warm.steady, "drain_steps": warm.drain_steps,
            "images_preprocessed": made, "images_needed": needed,
            "balance": made / needed if needed and made is not None else None,
            "starved_fraction": float(np.mean([r["starved_fraction"] for r in reports]))}


def machine() -> dict:
    """What the numbers were measured on (rank 0's node)."""
    tf = sys.modules.get("tensorflow")  # a cell without TensorFlow: its consumers name their devices
    gpus = [] if tf is None else [tf.config.experimental.get_device_details(d).get("device_name", "GPU")
                                  for d in tf.config.list_physical_devices("GPU")]
    return {"node": platform.node(), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
            "gpus": f"{len(gpus)}x {gpus[0]}" if gpus else None}


def max_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def version() -> str:
    return __version__


def _tf_version() -> str | None:
    """TensorFlow's version where this process imported it (None: the cell ran without it)."""
    tf = sys.modules.get("tensorflow")
    return None if tf is None else tf.__version__
