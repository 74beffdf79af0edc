"""``enspipe`` command line: make-dataset, convert, index, stage, run, calibrate-rc, idle-power.

Arguments are validated before any MPI or TensorFlow work: a bad one exits 2 with a message
that names the option and the fix.
"""
from __future__ import annotations

import argparse
import sys

from enspipe.plan.errors import ConfigError
from enspipe.plan.config import POWER_OPTIONS, RunConfig, add_options, from_options, positive_int


def build_parser() -> argparse.ArgumentParser:
    from enspipe.models.networks import NETWORKS

    p = argparse.ArgumentParser(prog="enspipe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    mk = sub.add_parser("make-dataset", help="write the embedded synthetic JPEG TFRecord dataset")
    mk.add_argument("--out", required=True, help="output directory")
    mk.add_argument("--num-images", type=positive_int, required=True, help="number of images M (>= 1)")
    mk.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    mk.add_argument("--num-classes", type=positive_int, default=100, help="number of classes (default 100)")
    mk.add_argument("--images-per-shard", type=positive_int, default=256, help="records per shard (default 256)")

    cv = sub.add_parser("convert", help="convert JPEG class folders into Slim TFRecord shards")
    cv.add_argument("--jpeg-dir", required=True, help="folder with one subfolder of JPEGs per class")
    cv.add_argument("--out", required=True, help="output directory")
    cv.add_argument("--images-per-shard", type=positive_int, default=1024)

    ix = sub.add_parser("index", help="scan a TFRecord/JPEG dataset and write its manifest.json")
    ix.add_argument("--data", required=True)

    st = sub.add_parser("stage", help="the workflow's data stage for your dataset: pack JPEG folders into "
                                      "shards, or link TFRecord shards, into --out with a manifest")
    st.add_argument("--data", required=True, help="your TF-Slim TFRecord shards or JPEG class folders")
    st.add_argument("--out", required=True, help="the staged dataset directory")

    r = sub.add_parser("run", help="run one cell: one ensemble member per MPI rank (use mpiexec -n N)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_options(r)  # every RunConfig field, declared there once
    r.add_argument("--rate-from", default=None,
                   help="take the network's rc from this calibration file (the workflow's rates.json)")
    r.add_argument("--skip-corrupt", dest="on_corrupt", action="store_const", const="skip",
                   help="the same as --on-corrupt skip")

    rc = sub.add_parser("calibrate-rc", help="measure the accelerator's training rate rc on a fixed batch",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    rc.add_argument("--network", required=True, choices=list(NETWORKS))
    rc.add_argument("--batch-size", type=positive_int, default=None, help="default: the network's")
    rc.add_argument("--image-size", type=positive_int, default=224)
    rc.add_argument("--steps", type=positive_int, default=50)
    rc.add_argument("--warmup", type=positive_int, default=5)
    rc.add_argument("--num-classes", type=positive_int, default=1000)
    rc.add_argument("--out", required=True, help="the JSON file to write")

    ip = sub.add_parser("idle-power", help="measure this node's idle power and store it for energy above idle",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ip.add_argument("--out", required=True, help="the idle-power JSON file to write")
    ip.add_argument("--seconds", type=float, default=30.0, help="how long to sample (keep the node idle)")
    add_options(ip, only=POWER_OPTIONS)
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
    return from_options(a, rate=rate, rate_source=rate_source)


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
