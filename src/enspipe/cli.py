"""``enspipe`` command line: make-dataset, convert, index, stage, run, calibrate-rc, idle-power.

Arguments are validated before any MPI or TensorFlow work: a bad one exits 2 with a message
that names the option and the fix.
"""
from __future__ import annotations

import argparse
import sys

from enspipe.plan.errors import ConfigError
from enspipe.plan.config import (CONSUMERS, CPU_MONITORS, ON_CORRUPT, SCHEMES, TRANSPORTS, WIRE_DTYPES, RunConfig)
from enspipe.plan.schemes import SCHEME_KINDS


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v}")
    return v


def _lrs(s: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def _names(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def _add_power_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--power", type=_names, default=("auto",),
                   help="energy sources by preference: auto, or a comma list of rapl, nvml, slurm, external, modelled")
    p.add_argument("--power-csv", default=None, help="an external meter's (timestamp, watts) CSV")
    p.add_argument("--idle-watts", type=float, default=50.0, help="power model: idle watts per node")
    p.add_argument("--watts-per-core", type=float, default=10.0, help="power model: watts per fully busy core")


def build_parser() -> argparse.ArgumentParser:
    from enspipe.models.networks import NETWORKS

    p = argparse.ArgumentParser(prog="enspipe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    mk = sub.add_parser("make-dataset", help="write the embedded synthetic JPEG TFRecord dataset")
    mk.add_argument("--out", required=True, help="output directory")
    mk.add_argument("--num-images", type=_positive_int, required=True, help="number of images M (>= 1)")
    mk.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    mk.add_argument("--num-classes", type=_positive_int, default=100, help="number of classes (default 100)")
    mk.add_argument("--images-per-shard", type=_positive_int, default=256, help="records per shard (default 256)")

    cv = sub.add_parser("convert", help="convert JPEG class folders into Slim TFRecord shards")
    cv.add_argument("--jpeg-dir", required=True, help="folder with one subfolder of JPEGs per class")
    cv.add_argument("--out", required=True, help="output directory")
    cv.add_argument("--images-per-shard", type=_positive_int, default=1024)

    ix = sub.add_parser("index", help="scan a TFRecord/JPEG dataset and write its manifest.json")
    ix.add_argument("--data", required=True)

    st = sub.add_parser("stage", help="the workflow's data stage for your dataset: pack JPEG folders into "
                                      "shards, or link TFRecord shards, into --out with a manifest")
    st.add_argument("--data", required=True, help="your TF-Slim TFRecord shards or JPEG class folders")
    st.add_argument("--out", required=True, help="the staged dataset directory")

    r = sub.add_parser("run", help="run one cell: one ensemble member per MPI rank (use mpiexec -n N)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--data", required=True, help="dataset directory (TFRecord shards or JPEG class folders)")
    r.add_argument("--out", required=True, help="output directory for event logs and summary.json")
    r.add_argument("--network", default="alexnet_v2", choices=list(NETWORKS), help="network to train")
    r.add_argument("--consumer", default="peak", choices=CONSUMERS,
                   help="train: real SGD; emulated: accelerator stand-in at --rate; peak: dequeue only")
    r.add_argument("--batch-size", type=_positive_int, default=None, help="global batch (default: the network's)")
    r.add_argument("--steps", type=_positive_int, default=100, help="measured steps per member")
    r.add_argument("--warmup", type=_positive_int, default=10, help="unmeasured steps first (0 is valid)")
    r.add_argument("--cores", type=_positive_int, default=None, help="CPU cores per member (default: all)")
    r.add_argument("--image-size", type=_positive_int, default=224, help="preprocessed image side in px")
    r.add_argument("--scheme", default="baseline", choices=SCHEMES,
                   help="sharing scheme: " + "; ".join(f"{k}: {kind.summary}" for k, kind in SCHEME_KINDS.items()))
    r.add_argument("--preprocessors", type=_positive_int, default=None,
                   help="P, for " + " / ".join(k for k, kind in SCHEME_KINDS.items() if kind.takes_p)
                   + " (P = N for the others)")
    r.add_argument("--rate", type=float, default=None, help="emulated accelerator rate rc in images/s")
    r.add_argument("--rate-from", default=None,
                   help="take the network's rc from this calibration file (the workflow's rates.json)")
    r.add_argument("--seed", type=int, default=0, help="base seed for order, augmentation and initialisation")
    r.add_argument("--rep", type=int, default=0,
                   help="which repeat of its cell this run is (recorded in the summary; changes nothing else)")
    r.add_argument("--lr", type=_lrs, default=(0.01,), help="learning rates, member m uses the (m mod k)-th")
    r.add_argument("--shuffle-buffer", type=_positive_int, default=1024,
                   help="records; 0 = canonical order; at most a quarter of a TFRecord dataset is used")
    r.add_argument("--queue-depth", type=_positive_int, default=4, help="capacity of each stage queue, in batches")
    r.add_argument("--on-corrupt", default="fail", choices=ON_CORRUPT,
                   help="an undecodable image or a corrupt record: fail naming it, or skip it and count it")
    r.add_argument("--skip-corrupt", dest="on_corrupt", action="store_const", const="skip",
                   help="the same as --on-corrupt skip")
    r.add_argument("--fast-mode", action="store_true", help="Slim inception fast_mode (off in the paper)")
    r.add_argument("--wire-dtype", default="float32", choices=WIRE_DTYPES,
                   help="uint8 quantises after preprocessing: 4x less traffic, lossy by 1/255 of the range")
    r.add_argument("--transport", default="mpi4py", choices=TRANSPORTS,
                   help="collective library: mpi4py communicators, or Horovod process sets (make horovod)")
    r.add_argument("--batch-checksums", action="store_true",
                   help="log a checksum of every delivered batch's pixels and metadata (to compare transports; "
                        "costs a hash per batch)")
    r.add_argument("--no-node-shm", dest="node_shm", action="store_false",
                   help="exchange through MPI collectives only, not node-shared memory (for comparison)")
    r.add_argument("--sample-interval", type=float, default=0.1, help="seconds between queue-occupancy samples")
    r.add_argument("--peer-timeout", type=float, default=10.0,
                   help="seconds a member may go unheard before the job counts it lost and aborts")
    r.add_argument("--cpu-monitor", default="auto", choices=CPU_MONITORS,
                   help="per-node CPU monitor: mpstat (sysstat), psutil, auto (mpstat if installed) or none")
    r.add_argument("--monitor-interval", type=_positive_int, default=1, help="seconds between CPU samples")
    r.add_argument("--idle-power", default=None, help="idle-power file from `enspipe idle-power`")
    _add_power_options(r)

    rc = sub.add_parser("calibrate-rc", help="measure the accelerator's training rate rc on a fixed batch",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    rc.add_argument("--network", required=True, choices=list(NETWORKS))
    rc.add_argument("--batch-size", type=_positive_int, default=None, help="default: the network's")
    rc.add_argument("--image-size", type=_positive_int, default=224)
    rc.add_argument("--steps", type=_positive_int, default=50)
    rc.add_argument("--warmup", type=_positive_int, default=5)
    rc.add_argument("--num-classes", type=_positive_int, default=1000)
    rc.add_argument("--out", required=True, help="the JSON file to write")

    ip = sub.add_parser("idle-power", help="measure this node's idle power and store it for energy above idle",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ip.add_argument("--out", required=True, help="the idle-power JSON file to write")
    ip.add_argument("--seconds", type=float, default=30.0, help="how long to sample (keep the node idle)")
    _add_power_options(ip)
    return p


def _rate(a: argparse.Namespace) -> tuple[float | None, str | None]:
    if a.rate_from is None:
        return a.rate, ("--rate" if a.rate is not None else None)
    if a.rate is not None:
        raise ConfigError("rate_from", "--rate and --rate-from both given", "pass one of them")
    import json

    try:
        with open(a.rate_from) as f:
            net = json.load(f)["networks"][a.network]
        return float(net["rc"]), f"{a.rate_from}: {net['rc_source']}"
    except OSError as e:
        raise ConfigError("rate_from", f"cannot read {a.rate_from}: {e.strerror}", "run the calibration first") from None
    except (KeyError, ValueError, TypeError):
        raise ConfigError("rate_from", f"{a.rate_from} has no rc for {a.network}",
                          "calibrate this network, or pass --rate") from None


def config_from_args(a: argparse.Namespace) -> RunConfig:
    rate, rate_source = _rate(a)
    return RunConfig(data=a.data, out=a.out, network=a.network, consumer=a.consumer, batch_size=a.batch_size,
                     steps=a.steps, warmup=a.warmup, cores=a.cores, image_size=a.image_size, scheme=a.scheme,
                     preprocessors=a.preprocessors, rate=rate, rate_source=rate_source, seed=a.seed, rep=a.rep, lrs=a.lr,
                     shuffle_buffer=a.shuffle_buffer, queue_depth=a.queue_depth, on_corrupt=a.on_corrupt,
                     fast_mode=a.fast_mode, wire_dtype=a.wire_dtype, transport=a.transport,
                     sample_interval=a.sample_interval, peer_timeout=a.peer_timeout, node_shm=a.node_shm, batch_checksums=a.batch_checksums,
                     cpu_monitor=a.cpu_monitor,
                     monitor_interval=a.monitor_interval, power=a.power, power_csv=a.power_csv,
                     idle_power=a.idle_power, idle_watts=a.idle_watts, watts_per_core=a.watts_per_core)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.command == "make-dataset":
        if a.num_images < 1:
            parser.error("--num-images: must be >= 1; pass the number of images to generate")
        from enspipe.data.synthetic import make_dataset

        m = make_dataset(a.out, a.num_images, a.seed, max(1, a.num_classes), max(1, a.images_per_shard))
        print(f"enspipe: wrote {m.num_images} images in {len(m.files)} shards to {a.out} (digest {m.digest})")
        return 0
    if a.command == "convert":
        from enspipe.data.manifest import DataError
        from enspipe.data.shards import write_jpeg_folders_as_shards

        try:
            m = write_jpeg_folders_as_shards(a.jpeg_dir, a.out, max(1, a.images_per_shard))
        except DataError as e:
            parser.error(str(e))
        print(f"enspipe: converted {m.num_images} images into {len(m.files)} shards in {a.out}")
        return 0
    if a.command == "stage":
        from enspipe.data.manifest import DataError
        from enspipe.data.shards import stage_dataset

        try:
            m = stage_dataset(a.data, a.out)
        except DataError as e:
            parser.error(str(e))
        print(f"enspipe: staged {m.num_images} images ({m.kind}) from {a.data} in {a.out} (digest {m.digest})")
        return 0
    if a.command == "index":
        import os

        from enspipe.common.atomic import write_json_atomic
        from enspipe.data.manifest import MANIFEST, DataError, manifest_dict
        from enspipe.data.shards import scan

        try:
            m = scan(a.data)
        except DataError as e:
            parser.error(str(e))
        write_json_atomic(os.path.join(a.data, MANIFEST), manifest_dict(m))
        print(f"enspipe: {m.num_images} images, {m.num_classes} classes, digest {m.digest}")
        return 0
    if a.command == "calibrate-rc":
        if a.steps < 1 or a.batch_size == 0 or not 32 <= a.image_size <= 1024:
            parser.error("--steps, --batch-size and --image-size: need steps >= 1, a batch >= 1, 32 <= size <= 1024")
        from enspipe.run.calibration import measure_accelerator_rate
        from enspipe.common.atomic import write_json_atomic
        from enspipe.models.networks import NETWORKS

        r = measure_accelerator_rate(a.network, a.batch_size or NETWORKS[a.network].batch_size, a.image_size,
                                     a.steps, a.warmup, max(2, a.num_classes))
        write_json_atomic(a.out, r)
        print(f"enspipe: rc = {r['rc']:.1f} images/s for {a.network} on {r['device']} -> {a.out}")
        return 0
    if a.command == "idle-power":
        from enspipe.measure.node import measure_idle_power

        if a.seconds <= 0:
            parser.error("--seconds: must be > 0; pass how long to sample, e.g. 30")
        try:
            idle = measure_idle_power(a.out, a.seconds, a.power, a.power_csv, a.idle_watts)
        except ValueError as e:
            parser.error(str(e))
        print(f"enspipe: idle power {idle['watts']:.1f} W ({idle['source']}) on {idle['host']} -> {a.out}")
        return 0
    try:
        cfg = config_from_args(a)
    except ConfigError as e:
        parser.error(str(e))
    from enspipe.run.member import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
