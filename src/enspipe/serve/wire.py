"""What the attach server and its consumers agree on: the server's options (:class:`ServeOptions`,
validated when made), where its socket is, and the messages on it.

The socket carries only small JSON messages (length-prefixed): a consumer's ``hello`` (what it
expects of the stream), its ``next`` (a batch, please, releasing the slots of the batch before,
copied out by now) and ``bye``; the server's answers name slots of the pool, node-shared memory
that both map. Pixels never cross the socket.
"""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import tempfile
from dataclasses import dataclass

import numpy as np

from enspipe.common.plugins import FUNCTION_NAME, NotLoadable, load_function
from enspipe.engine.backends import AUTO as AUTO_BACKEND
from enspipe.engine.backends import BACKENDS, served
from enspipe.engine.config import BUILTIN_PREPROCESSING, MALLOC_POLICIES, SampleConfig
from enspipe.plan.errors import ConfigError, require
from enspipe.plan.options import parse_size

PREPROCESSING = BUILTIN_PREPROCESSING  # the built-ins, the pillow backend's
HEADER = struct.Struct("!I")
MAX_MESSAGE = 1 << 20  # the largest message (a batch's slot list) is a few kB
# the hello fields a consumer may state; where stated they must be the server's
MATCHED = ("batch_size", "image_size", "preprocess", "wire_dtype", "seed")
# every hello field and the types it may have (None: not stated)
HELLO_FIELDS = {"batch_size": int, "image_size": int, "preprocess": str, "wire_dtype": str, "seed": int, "pid": int,
                "name": str, "data": str, "digest": str}
OPS = ("next", "bye")  # what an attached consumer may send


class Malformed(ValueError):
    """A message that is not what the protocol allows: the connection that sent it is closed."""


class ServerGone(RuntimeError):
    """The attach server ended (or stopped answering) while a consumer read from it: raised by the
    attached stream's iteration as soon as the server's socket closes, or after ``timeout``.

    Example::

        try:
            for images, labels in stream:
                ...
        except enspipe.ServerGone as e:
            print(f"no more batches: {e}")   # restart the server, then attach again
    """


def default_socket(data: str) -> str:
    """The socket of the server for a dataset directory, where ``--socket`` is not given: one per
    dataset and user, in ``$XDG_RUNTIME_DIR`` (else the temporary directory)."""
    import hashlib

    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    where = os.path.abspath(str(data))
    tag = hashlib.sha1(where.encode()).hexdigest()[:10]
    return os.path.join(base, f"enspipe-{os.getuid()}-{os.path.basename(where)[:24]}-{tag}.sock")


DEFAULT_CONSUMERS = 8  # consumers the pool holds when no --memory is given


@dataclass(frozen=True)
class ServeOptions(SampleConfig):
    """One attach server's stream: its samples (a :class:`~enspipe.engine.config.SampleConfig`:
    the same fields, defaults and checks as a :class:`~enspipe.StreamConfig`'s, keywords after
    ``data`` and ``batch_size``) and what the server may hold.

    Example::

        ServeOptions(data="data/train", batch_size=64, image_size=224, memory="2GB")

    ``preprocess``: a built-in's name, or the user's augmentation named ``package.module:function``
    (a torchvision v2 or kornia pipeline, or a function of one decoded image, seeded per sample).
    ``backend``: ``pillow`` (worker processes on the CPU; the pool in /dev/shm) or ``gpu`` (nvJPEG
    and torch ops on ``device``, default the GPU of this process's local rank; the pool's images
    in that GPU's memory, mapped by every consumer through CUDA IPC, ``memory`` counting them);
    ``auto`` (the default): the first backend that serves (pillow). ``device="cpu"`` runs the gpu
    backend's ops on CPU tensors into a /dev/shm pool.

    ``memory``: the pool's budget (bytes or a size such as ``"2GB"``), every preprocessed sample
    held for a consumer counted (None, the default: what ``max_consumers`` consumers need, for at
    most :data:`DEFAULT_CONSUMERS` of them: each ``batch_size x (2 + ahead)`` samples;
    ``wire_dtype="uint8"`` holds four times as many in the same bytes); ``ahead``: batches made
    ahead for each consumer; ``workers``: preprocessing threads (default: this host's cores);
    ``status_interval``: seconds between the status file's updates (``SOCKET.status.json``), each
    a window of the rates it shows; ``max_consumers``: consumers attached at once; ``malloc``: the
    server's and its workers' malloc policy, a member's (:mod:`enspipe.engine.memory`: ``keep``
    reuses freed images' pages; with ``system``, one worker serving 224 px float32 inception images
    on this project's 2-vCPU VM spent 2.9-3.1 ms of CPU per image against 1.6-1.8 with ``keep``, at
    about half the rate).

    Access: the socket, the pool and the status file are the server's user's alone (modes 0600,
    whatever the umask), and the server refuses a peer of another user. ``group`` (a group name
    or id that this user is in) lets that group's members attach on purpose: socket 0660, pool and
    status 0640, all of that group.
    """

    workers: int | None = None
    socket: str | None = None
    memory: int | str | None = None
    ahead: int = 2
    status_interval: float = 2.0
    max_consumers: int = 64
    group: str | int | None = None
    device: str | None = None
    malloc: str = "keep"

    def __post_init__(self) -> None:
        self._check_samples()
        if self.backend == AUTO_BACKEND:
            object.__setattr__(self, "backend", served()[0])
        try:
            if self.memory is not None:
                object.__setattr__(self, "memory", parse_size(self.memory))
        except ValueError as e:
            raise ConfigError("memory", str(e), "pass e.g. memory='2GB'") from None
        for name in ("ahead", "max_consumers"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= (0 if name == "ahead" else 1), name,
                    f"must be a positive integer, got {value!r}", f"pass {name}=N")
        require(self.workers is None or (isinstance(self.workers, int) and self.workers >= 1), "workers",
                f"must be >= 1, got {self.workers!r}", "pass workers=K, or leave it out (this host's cores)")
        require(self.preprocess in PREPROCESSING or bool(FUNCTION_NAME.match(str(self.preprocess))), "preprocess",
                f"unknown preprocessing {self.preprocess!r}", f"choose one of {', '.join(PREPROCESSING)}, or name "
                "your own augmentation package.module:function (see enspipe.data.transforms)")
        object.__setattr__(self, "_transform", None)
        names = served()
        arrays = next(name for name in names if BACKENDS[name].runs_user_arrays)
        gpu = next(name for name in names if BACKENDS[name].on_gpu)
        require(self.backend_row.runs_user_arrays or not self.own_preprocess, "preprocess", f"the {self.backend} "
                f"backend runs its own preprocessings, not {self.preprocess}",
                f"pass a built-in --preprocess, or --backend {arrays} for your augmentation")
        fix = f"pass --backend {gpu} with --device cuda, cuda:K or cpu, or leave --device out"
        require(self.device is None or self.backend_row.on_gpu, "device", f"the {self.backend} backend makes its "
                f"samples on the CPU into host memory, not on {self.device!r}", fix)
        require(self.device is None or bool(re.fullmatch(r"cpu|cuda(:\d+)?", str(self.device))), "device",
                f"{self.device!r} is not a device the {self.backend} backend serves from", fix)
        require(self.malloc in MALLOC_POLICIES, "malloc", f"unknown malloc policy {self.malloc!r}",
                f"choose one of {', '.join(MALLOC_POLICIES)}")
        require(self.status_interval > 0, "status_interval", f"must be > 0, got {self.status_interval!r}",
                "pass e.g. 2")
        if self.socket is None:
            object.__setattr__(self, "socket", default_socket(self.data))
        require(len(os.fsencode(self.socket)) < 100, "socket", f"{self.socket!r} is too long for a Unix socket",
                "pass a shorter --socket path")
        if self.group is not None:
            _check_group(self.group)

    @classmethod
    def backend_names(cls) -> tuple[str, ...]:
        """The backends that serve (:func:`enspipe.engine.backends.served`)."""
        return served()

    @property
    def gid(self) -> int | None:
        """The group let in (``group``), or None: the server's user alone."""
        return None if self.group is None else _group_id(self.group)

    @property
    def socket_mode(self) -> int:
        return 0o600 if self.group is None else 0o660

    @property
    def file_mode(self) -> int:
        """The pool's and the status file's mode: consumers only read them."""
        return 0o600 if self.group is None else 0o640

    @property
    def own_preprocess(self) -> bool:
        """Whether ``preprocess`` names a user's augmentation (``package.module:function``)."""
        return self.preprocess not in PREPROCESSING

    @property
    def preprocessing(self):
        """A built-in's name, or the user's augmentation as :meth:`load_transform` found it."""
        if not self.own_preprocess:
            return self.preprocess
        require(self._transform is not None, "preprocess", f"{self.preprocess} was not loaded",
                "call load_transform(manifest) first")
        return self._transform

    def load_transform(self, manifest) -> None:
        """Import the user's augmentation and try it on the dataset's first samples (its output's
        shape and dtype); raises :class:`ConfigError` naming what failed."""
        from enspipe.data.transforms import PreprocessError, probe

        try:
            object.__setattr__(self, "_transform", probe(load_function(self.preprocess, "preprocess"), manifest,
                                                         self.seed))
        except (NotLoadable, PreprocessError) as e:
            raise ConfigError("preprocess", e.problem, e.fix) from None

    @property
    def on_gpu(self) -> bool:
        """Whether the samples are made, and the pool held, on a GPU."""
        return self.backend_row.on_gpu and self.device != "cpu"

    def prep_spec(self, manifest):
        """The backend's spec of the samples this server makes (each on its own, seeded by its
        stream position; an undecodable one fails alone)."""
        from enspipe.data.pixels import output_spec
        from enspipe.engine.backends.base import PrepSpec

        shape, dtype = output_spec(self.preprocessing, self.image_size, self.wire_dtype)
        return PrepSpec(manifest=manifest, preprocessing=self.preprocessing, size=self.image_size,
                        fast_mode=self.fast_mode, wire_dtype=self.wire_dtype, impl="crop-first", order_seed=self.seed,
                        prep_seed=self.seed, shuffle_buffer=0, skip_corrupt=True, batch=self.batch_size,
                        share=(0, self.batch_size), unit=1, threads=1, depth=1, image_shape=shape, image_dtype=dtype,
                        device=self.device)

    @property
    def sample_bytes(self) -> int:
        from enspipe.data.pixels import output_spec

        shape, dtype = output_spec(self.preprocessing, self.image_size, self.wire_dtype)
        return int(np.prod(shape)) * dtype.itemsize

    @property
    def per_consumer(self) -> int:
        """Samples one attached consumer holds at most: a batch copied out while the next
        ``1 + ahead`` are made."""
        return self.batch_size * (2 + self.ahead)

    @property
    def slots(self) -> int:
        """The pool's samples: ``memory``'s worth, or (no budget given) what ``sized_for`` consumers need."""
        if self.memory is not None:
            return self.memory // self.sample_bytes
        return max(self.sized_for * self.per_consumer, self.least_slots)

    @property
    def least_slots(self) -> int:
        """The fewest samples a pool may hold: one consumer's, 3 x batch_size x (1 + ahead)."""
        return 3 * self.batch_size * (1 + self.ahead)

    @property
    def capacity(self) -> int:
        """Consumers the pool holds at once: each may copy one batch out while its next ones are made."""
        return min(self.max_consumers, max(1, self.slots // self.per_consumer))

    @property
    def sized_for(self) -> int:
        """Consumers the default pool is sized for: ``max_consumers``, at most :data:`DEFAULT_CONSUMERS`."""
        return min(self.max_consumers, DEFAULT_CONSUMERS)

    @property
    def pool_bytes(self) -> int:
        return self.slots * self.sample_bytes

    def sizing(self) -> str:
        """How the pool was sized, and how to size it otherwise (said at start)."""
        how = (f"--memory {self.memory} bytes" if self.memory is not None else
               f"sized for {self.sized_for} consumers, each batch_size x (2 + ahead) = {self.per_consumer} samples")
        return (f"pool {self.slots} samples of {self.sample_bytes} bytes ({self.pool_bytes / 2**20:.1f} MiB; {how}): "
                f"room for {self.capacity} consumers at once; --memory SIZE or --max-consumers N sizes it")

    def slots_problem(self) -> str | None:
        """Why the budget cannot hold even one consumer's batches, or None."""
        need = self.least_slots
        if self.slots < need:
            return (f"{self.pool_bytes} bytes hold {self.slots} samples of {self.sample_bytes} bytes; one consumer "
                    f"needs at least {need} (3 x batch_size x (1 + ahead))")
        return None

    def hello(self) -> dict:
        return {name: getattr(self, name) for name in MATCHED}


def _group_id(group: str | int) -> int:
    """A group's id, by name or number; KeyError where there is none."""
    import grp

    if isinstance(group, str):
        try:
            return grp.getgrnam(group).gr_gid
        except KeyError:
            if not group.isdigit():
                raise
    return grp.getgrgid(int(group)).gr_gid


def _check_group(group: str | int) -> None:
    """The group must exist and be this user's (one of its groups), or the user root."""
    import grp

    try:
        gid = _group_id(group)
    except (KeyError, OverflowError):
        raise ConfigError("group", f"no group {group!r} on this host", "pass a group that exists (getent group "
                          "lists them)") from None
    mine = {os.getegid(), *os.getgroups()}
    require(gid in mine or os.geteuid() == 0, "group", f"this user is not in group {grp.getgrgid(gid).gr_name} "
            f"({gid}), so it cannot give the server's files to it", "pass one of this user's groups (id -Gn "
            "lists them)")


def check_hello(msg) -> dict:
    """A consumer's first message, checked: a hello whose fields have their types; raises
    :class:`Malformed` naming what is wrong."""
    if not isinstance(msg, dict) or msg.get("op") != "hello":
        got = f"op {msg.get('op')!r}" if isinstance(msg, dict) else f"a JSON {type(msg).__name__}"
        raise Malformed(f"the first message must be a hello, got {got}")
    for name, kind in HELLO_FIELDS.items():
        value = msg.get(name)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise Malformed(f"hello field {name!r} must be {kind.__name__} or null, got {value!r:.60}")
    return msg


def check_request(msg, slots: int) -> tuple[str, list[int]]:
    """An attached consumer's message, checked: ``(op, slots released)``; raises
    :class:`Malformed` naming what is wrong."""
    if not isinstance(msg, dict):
        raise Malformed(f"a message must be a JSON object, got a JSON {type(msg).__name__}")
    op = msg.get("op")
    if op not in OPS:
        raise Malformed(f"unknown op {op!r:.60} (an attached consumer sends {' or '.join(OPS)})")
    release = msg.get("release", [])
    if not isinstance(release, list) or not all(type(x) is int and 0 <= x < slots for x in release):
        raise Malformed(f"release must be a list of slot numbers below {slots}, got {release!r:.60}")
    return op, release


def differences(server: dict, asked: dict) -> list[str]:
    """What a consumer's hello asks for that the server does not make, one phrase each."""
    out = []
    if asked.get("digest") not in (None, server["digest"]):
        out.append(f"dataset: the server serves {server['data']} (digest {server['digest']}), not "
                   f"{asked.get('data')} (digest {asked['digest']})")
    for name in MATCHED:
        if asked.get(name) is not None and asked[name] != server[name]:
            out.append(f"{name}: the server makes {server[name]!r}, not {asked[name]!r}")
    return out


def send(sock: socket.socket, message: dict) -> None:
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(HEADER.pack(len(body)) + body)


def _exactly(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise EOFError("the other end closed the socket")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket):
    """The next message (decoded JSON, of any type: the reader checks it); EOFError where the other
    end is gone, socket.timeout where it is silent, :class:`Malformed` where a frame is too long
    or not JSON."""
    (n,) = HEADER.unpack(_exactly(sock, HEADER.size))
    if n > MAX_MESSAGE:
        raise Malformed(f"a frame of {n} bytes announced, more than the {MAX_MESSAGE} an enspipe message may have")
    try:
        return json.loads(_exactly(sock, n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Malformed(f"a frame of {n} bytes that is not JSON ({e})") from None


def live_server(path: str, timeout: float = 2.0) -> bool:
    """Whether a server answers on the socket ``path`` (a connection is accepted)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()
