"""``enspipe serve``: one node's preprocessing served to processes that attach (``enspipe.attach``),
and ``enspipe serve --status``: what a running server reports."""
from __future__ import annotations

import argparse
import json
import os

from enspipe.commands.base import Command, Fail, say
from enspipe.plan.options import positive_int


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", help="the dataset directory (TFRecord shards or image class folders, with a manifest)")
    p.add_argument("--batch-size", type=positive_int, help="samples per batch, for every consumer")
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--preprocess", default="inception", help="inception or vgg (Slim's training preprocessing, "
                   "in Pillow and numpy)")
    p.add_argument("--wire-dtype", default="uint8", help="uint8 (a quarter of float32's memory) or float32")
    p.add_argument("--fast-mode", action="store_true", help="Slim's fast mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=positive_int, help="preprocessing threads (default: this host's cores)")
    p.add_argument("--socket", help="the server's Unix socket (default: one per dataset and user in "
                   "$XDG_RUNTIME_DIR or the temporary directory; enspipe.attach(DATA) finds it); under mpiexec "
                   "or srun, {rank} in it is the rank's number")
    p.add_argument("--memory", default="1GB", help="the pool's budget: every preprocessed sample held counts")
    p.add_argument("--ahead", type=int, default=2, help="batches made ahead for each consumer")
    p.add_argument("--status-interval", type=float, default=2.0, help="seconds between status updates (each a "
                   "window of rates)")
    p.add_argument("--idle-exit", type=float, default=0.0, help="stop once no consumer has been attached for this "
                   "many seconds (0: serve until SIGTERM or Ctrl-C)")
    p.add_argument("--status", action="store_true", help="print the running server's status (SOCKET.status.json) "
                   "and exit")


def _serve(a: argparse.Namespace, fail: Fail) -> int:
    from enspipe.plan.errors import ConfigError
    from enspipe.serve.wire import ServeOptions, default_socket

    if a.status:
        if a.socket is None and a.data is None:
            fail("--status: pass --socket PATH or --data DIR (whose server's status to print)")
        return _print_status(a.socket or default_socket(a.data), fail)
    if a.data is None or a.batch_size is None:
        fail("--data and --batch-size are required to serve")
    from enspipe.common.host import launched

    rank, ranks = launched() or (0, 1)
    try:
        opts = ServeOptions(data=a.data, batch_size=a.batch_size, image_size=a.image_size, preprocess=a.preprocess,
                            wire_dtype=a.wire_dtype, fast_mode=a.fast_mode, seed=a.seed, workers=a.workers,
                            socket=a.socket.replace("{rank}", str(rank)) if a.socket else None, memory=a.memory,
                            ahead=a.ahead, status_interval=a.status_interval)
        from enspipe.serve.checks import prepare

        manifest = prepare(opts, say)
    except ConfigError as e:
        fail(str(e))
    comm = _ranks_agree(opts, manifest, fail) if ranks > 1 else None
    from enspipe.serve.server import Server

    Server(opts, manifest, say=say, idle_exit=a.idle_exit, comm=comm).serve()
    return 0


def _ranks_agree(opts, manifest, fail: Fail):
    """MPI_Init for a server of several ranks, then every rank's checks of the others before any
    work: one dataset (by digest), and no two ranks on one machine on one socket."""
    from mpi4py import MPI

    from enspipe.common.host import boot_id

    comm = MPI.COMM_WORLD
    mine = (boot_id(), os.path.abspath(opts.socket), manifest.digest, str(opts.data))
    every = comm.allgather(mine)
    problems = []
    for r, (machine, sock, digest, data) in enumerate(every):
        if digest != manifest.digest and comm.Get_rank() == 0:
            problems.append(f"--data: rank {r}'s {data} (digest {digest}) is not rank 0's {opts.data} "
                            f"(digest {manifest.digest}); give every rank the same dataset")
        if r != comm.Get_rank() and (machine, sock) == mine[:2]:
            problems.append(f"--socket: ranks {comm.Get_rank()} and {r} share {sock} on one machine; put {{rank}} "
                            "in --socket (e.g. --socket /tmp/enspipe-{rank}.sock), or run one rank per node")
    failed = comm.allreduce(bool(problems), op=MPI.LOR)
    if failed:
        fail("; ".join(problems) if problems else "another rank's checks failed (its message says why)")
    return comm


def _print_status(sock: str, fail: Fail) -> int:
    from enspipe.serve.server import status_path
    from enspipe.serve.wire import live_server

    path = status_path(sock)
    if not os.path.exists(path):
        fail(f"--status: {path} does not exist: no server has served on {sock}")
    with open(path) as f:
        status = json.load(f)
    if status["state"] == "serving" and not live_server(sock):
        status["state"] = "gone (the server ended without a last word)"
    print(json.dumps(status, indent=2))
    return 0


SERVE_COMMANDS: dict[str, Command] = {
    "serve": Command("serve one node's preprocessing to processes that attach at any time (enspipe.attach): "
                     "each gets its own exactly-once epochs", _serve_args, _serve),
}
