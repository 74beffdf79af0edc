"""``enspipe serve``: one node's preprocessing served to processes that attach (``enspipe.attach``),
and ``enspipe serve --status``: what a running server reports."""
from __future__ import annotations

import argparse
import json
import os

import dataclasses

from enspipe.commands.base import Command, Fail, say
from enspipe.engine.backends import AUTO, served
from enspipe.engine.config import MALLOC_POLICIES, WIRE_DTYPES
from enspipe.plan.errors import ConfigError
from enspipe.plan.options import positive_int
from enspipe.serve.wire import ServeOptions, default_socket

DEFAULT = {f.name: f.default for f in dataclasses.fields(ServeOptions)}  # the options' defaults, as ServeOptions has them


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="the dataset directory (TFRecord shards or image class folders, with a manifest)")
    p.add_argument("--batch-size", type=positive_int, help="samples per batch, for every consumer")
    p.add_argument("--image-size", type=positive_int, default=DEFAULT["image_size"])
    p.add_argument("--preprocess", default=DEFAULT["preprocess"], help="inception or vgg (Slim's training preprocessing), "
                   "standard or standard-jitter (torchvision's), in Pillow and numpy; or your own augmentation, "
                   "package.module:name (a torchvision v2 or kornia pipeline, or a function of one decoded "
                   "image; seeded per sample): every trial that asks for the same name shares it")
    p.add_argument("--wire-dtype", default=DEFAULT["wire_dtype"], choices=WIRE_DTYPES, help="float32 (the "
                   "preprocessing's values, as SharedStream delivers them) or uint8 (quantised over the built-in's "
                   "range: a quarter of the memory, four times the samples in the same --memory)")
    p.add_argument("--fast-mode", action="store_true", help="Slim's fast mode")
    p.add_argument("--seed", type=int, default=DEFAULT["seed"])
    p.add_argument("--workers", type=positive_int, help="preprocessing threads (default: this host's cores)")
    p.add_argument("--socket", help="the server's Unix socket (default: one per dataset and user in "
                   "$XDG_RUNTIME_DIR or the temporary directory; enspipe.attach(DATA) finds it); under mpiexec "
                   "or srun, {rank} in it is the rank's number")
    p.add_argument("--memory", default=None, help="the pool's budget: every preprocessed sample held counts "
                   "(default: what --max-consumers consumers need, for at most 8: each batch x (2 + ahead) samples)")
    p.add_argument("--ahead", type=int, default=DEFAULT["ahead"], help="batches made ahead for each consumer")
    p.add_argument("--status-interval", type=float, default=DEFAULT["status_interval"], help="seconds between status updates (each a "
                   "window of rates)")
    p.add_argument("--max-consumers", type=positive_int, default=DEFAULT["max_consumers"], help="consumers attached at once (the pool "
                   "must also hold batch_size x (2 + ahead) samples for each)")
    p.add_argument("--group", help="let this group's members attach (socket 0660, pool and status 0640 of that "
                   "group); default: the server's user alone (0600, whatever the umask)")
    p.add_argument("--backend", default=DEFAULT["backend"], choices=(AUTO, *served()), help="auto (the default): "
                   f"{served()[0]}; pillow: worker processes on the "
                   "CPU, the pool in /dev/shm; gpu: nvJPEG and torch ops on the GPU, the pool's images in its memory, "
                   "mapped by each consumer through CUDA IPC (a built-in --preprocess; --memory is GPU memory)")
    p.add_argument("--device", help="with --backend gpu: the GPU, cuda or cuda:K (default: this rank's on its node); "
                   "cpu runs the same torch ops on the CPU")
    p.add_argument("--malloc", default=DEFAULT["malloc"], choices=MALLOC_POLICIES, help="keep (the default): malloc reuses "
                   "freed images' pages, in the server and its workers; system: malloc as the environment set it")
    p.add_argument("--idle-exit", type=float, default=0.0, help="stop once no consumer has been attached for this "
                   "many seconds (0: serve until SIGTERM or Ctrl-C)")
    p.add_argument("--status", action="store_true", help="print the running server's status (SOCKET.status.json) "
                   "and exit")


def _serve(a: argparse.Namespace, fail: Fail) -> int:
    if a.status:
        if a.socket is None and a.data is None:
            fail("--status: pass --socket PATH or --data DIR (whose server's status to print)")
        return _print_status(a.socket or default_socket(a.data), fail)
    if a.data is None or a.batch_size is None:
        fail("--data and --batch-size are required to serve")
    from enspipe.common.host import launched

    rank, ranks = launched() or (0, 1)
    try:  # the options, the same on every rank: checked before MPI_Init
        opts = ServeOptions(data=a.data, batch_size=a.batch_size, image_size=a.image_size, preprocess=a.preprocess,
                            wire_dtype=a.wire_dtype, fast_mode=a.fast_mode, seed=a.seed, workers=a.workers,
                            socket=a.socket.replace("{rank}", str(rank)) if a.socket else None, memory=a.memory,
                            ahead=a.ahead, status_interval=a.status_interval, max_consumers=a.max_consumers,
                            group=a.group, backend=a.backend, device=a.device, malloc=a.malloc)
    except ConfigError as e:
        fail(str(e))
    if a.workers and rank == 0:
        from enspipe.engine.placement import warn_oversubscribed

        warn_oversubscribed("--workers", a.workers)
    comm = None
    if ranks > 1:  # this node's dataset, memory and socket may fail on one rank alone: every rank hears of it
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    from enspipe.serve.checks import prepare

    manifest, problem = None, None
    try:
        manifest = prepare(opts, say)
    except ConfigError as e:
        problem = str(e)
    if comm is not None:
        problem = _ranks_agree(comm, opts, manifest, problem)
    if problem:
        fail(problem)
    from enspipe.exchange.ipc import OutOfDeviceMemory
    from enspipe.serve.server import Server

    try:
        server = Server(opts, manifest, say=say, idle_exit=a.idle_exit, comm=comm)
    except OutOfDeviceMemory as e:
        fail(f"--memory: {e}; pass a smaller --memory, or free the GPU")
    server.serve()
    return 0


def _ranks_agree(comm, opts, manifest, problem: str | None) -> str | None:
    """Every rank's checks, shared before any work: each rank's own problem, else another rank's
    (named), one dataset on every rank (by digest), and no two ranks on one machine on one socket."""
    from enspipe.common.host import boot_id

    me = comm.Get_rank()
    mine = (problem, boot_id(), os.path.abspath(opts.socket), manifest.digest if manifest else None, str(opts.data))
    every = comm.allgather(mine)
    problems = [problem] if problem else []
    for r, (theirs, machine, sock, digest, data) in enumerate(every):
        if theirs and r != me:
            problems.append(f"rank {r}: {theirs}")
        elif digest and mine[3] and digest != mine[3]:
            problems.append(f"--data: rank {r}'s {data} (digest {digest}) is not rank {me}'s {opts.data} "
                            f"(digest {mine[3]}); give every rank the same dataset")
        if r != me and (machine, sock) == mine[1:3]:
            problems.append(f"--socket: ranks {me} and {r} share {sock} on one machine; put {{rank}} in --socket "
                            "(e.g. --socket /tmp/enspipe-{rank}.sock), or run one rank per node")
    return "; ".join(problems) or None


def _print_status(sock: str, fail: Fail) -> int:
    from enspipe.serve.server import status_path
    from enspipe.serve.wire import live_server

    path = status_path(sock)
    if not os.path.exists(path):
        fail(f"--status: {path} does not exist: no server has served on {sock}")
    try:
        with open(path) as f:
            status = json.load(f)
    except PermissionError:
        fail(f"--status: {path}: permission denied: the status of a server is its user's (and its --group's) alone; "
             "ask as that user")
    if status["state"] == "serving" and not live_server(sock):
        status["state"] = "gone (the server ended without a last word)"
    print(json.dumps(status, indent=2))
    return 0


SERVE_COMMANDS: dict[str, Command] = {
    "serve": Command("serve one node's preprocessing to processes that attach at any time (enspipe.attach): "
                     "each gets its own exactly-once epochs", _serve_args, _serve),
}
