"""The preprocessing backends: one table, :data:`BACKENDS`, a :class:`Backend` row each, read by
every check, the pipeline, the attach server, the command line's choices and the summaries.
Adding a backend is one module (see :mod:`enspipe.engine.backends.base` for what it provides) and
one row here; no code outside this package compares a backend's name.

A backend of another package is the same module and row, the row named by an entry point of the
group ``enspipe.backends`` in that package's metadata (``[project.entry-points."enspipe.backends"]
mine = "mypkg.backend:ROW"``): it is in the table of every process where that package is
installed, the command line's choices included.

* ``tf``: tf.data and Slim's TensorFlow preprocessing (:mod:`enspipe.engine.backends.tf`);
* ``pillow``: Pillow, OpenCV and numpy, no TensorFlow, on worker processes that write into shared
  memory, one per core of the member (:mod:`enspipe.engine.backends.pillow`);
* ``gpu``: nvJPEG and torch ops on the member's GPU (:mod:`enspipe.engine.backends.gpu`).

``auto`` (:func:`resolve`) is ``tf`` where TensorFlow is installed, else ``pillow``; a torch
pipeline (torchvision's, kornia's) always runs on ``pillow``.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType

AUTO = "auto"
# the built-ins' implementations (enspipe.data.preprocessing.IMPLEMENTATIONS): crop-first (inception's crop
# window decoded alone) and reference (Slim's functions as written), the same values; fused-colour (crop-first
# with the colour distortion as one affine map in YIQ): an approximation
IMPLEMENTATIONS = ("crop-first", "reference", "fused-colour")


@dataclass(frozen=True)
class Backend:
    """One preprocessing backend: its engine's module and what it can do, for the checks made
    before any work and for every path that builds on it."""

    name: str
    module: str                  # its engine module's dotted path
    needs_tensorflow: bool
    # what a user's preprocess function is given and runs in: "tensorflow" (fn(image, seed) of TensorFlow
    # tensors, in tf.data's graph) or "arrays" (a torchvision/kornia pipeline or callable on decoded images,
    # in worker processes, seeded per sample: enspipe.data.transforms), or "none"
    user_functions: str
    implementations: tuple       # the preprocess_impl values it runs
    horovod: bool                # Horovod's transport (its TensorFlow build) may carry its batches
    tfdata_service: bool         # its preprocessing is the graph the tf.data service's workers run
    on_gpu: bool                 # it decodes on a GPU (CUDA, torch and torchvision's nvJPEG checked first)
    # its reader shuffles records by a full permutation of the dataset (enspipe.data.order.NumpyOrder),
    # not by tf.data's shuffle buffer
    permutes: bool
    # the attach server's: whether `enspipe serve` makes its samples, how many per task (None: a
    # batch) and on how many threads by default (None: one per core the server may use)
    serves: bool = False
    serve_chunk: int | None = None
    serve_threads: int | None = None

    @property
    def runs_user_arrays(self) -> bool:
        """A user's pipeline on decoded arrays (torchvision, kornia, a callable) runs on it."""
        return self.user_functions == "arrays"

    def label(self, impl: str) -> str:
        """The summary's name of what preprocessed a built-in with ``impl``: the tf backend's
        implementation, else the backend (and the approximation where there is one)."""
        if self.needs_tensorflow:
            return impl
        return f"{self.name} fused-colour" if impl == "fused-colour" else self.name

    def engine_module(self) -> ModuleType:
        """Its engine module (imported on first use: ``tf`` imports TensorFlow)."""
        return importlib.import_module(self.module)


_BUILT_IN = {b.name: b for b in (
    Backend("tf", "enspipe.engine.backends.tf", needs_tensorflow=True, user_functions="tensorflow",
            implementations=IMPLEMENTATIONS,
            horovod=True, tfdata_service=True, on_gpu=False, permutes=False),
    Backend("pillow", "enspipe.engine.backends.pillow", needs_tensorflow=False, user_functions="arrays",
            implementations=("crop-first", "fused-colour"), horovod=False, tfdata_service=False, on_gpu=False,
            permutes=True, serves=True, serve_chunk=4),
    Backend("gpu", "enspipe.engine.backends.gpu", needs_tensorflow=False, user_functions="none",
            implementations=("crop-first", "fused-colour"),
            horovod=False, tfdata_service=False, on_gpu=True, permutes=True, serves=True, serve_threads=2),
)}
ENTRY_POINTS = "enspipe.backends"


class _Table(Mapping):
    """The built-in rows, then those other packages declare (entry points of
    :data:`ENTRY_POINTS`), read on first use (so a backend's own module, which imports this
    package, is whole by then). One that does not load, is not a :class:`Backend` or takes a name
    already there is left out, saying why on stderr."""

    def __init__(self, rows: dict):
        self._rows, self._loaded = dict(rows), False

    def _all(self) -> dict:
        if not self._loaded:
            self._loaded = True
            for ep in entry_points(group=ENTRY_POINTS):
                self._add(ep)
        return self._rows

    def _add(self, ep) -> None:
        try:
            row = ep.load()
            problem = (None if isinstance(row, Backend) else f"is a {type(row).__name__}, not an "
                       "enspipe.engine.backends.Backend") or (f"names {row.name!r}, a backend already in the table"
                                                            if row.name in self._rows else None)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not stop enspipe
            problem = f"does not load ({type(e).__name__}: {e})"
        if problem:
            print(f"enspipe: warning: the backend entry point {ep.name} = {ep.value} {problem}; left out",
                  file=sys.stderr)
        else:
            self._rows[row.name] = row

    def __getitem__(self, name: str) -> Backend:
        return self._all()[name]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


BACKENDS = _Table(_BUILT_IN)


def served() -> tuple[str, ...]:
    """The backends `enspipe serve` makes samples with, in the table's order (the first is its default)."""
    return tuple(name for name, b in BACKENDS.items() if b.serves)  # the first is `enspipe serve`'s default


def resolve(name: str, tensorflow: bool, torch_pipeline: bool = False) -> Backend:
    """The row of ``name``; ``auto`` is the first TensorFlow backend where ``tensorflow`` is
    installed (and the pipeline is not torch's), else the first that runs users' arrays. An
    unknown name raises ``KeyError``."""
    if name != AUTO:
        return BACKENDS[name]
    if tensorflow and not torch_pipeline:
        return next(b for b in BACKENDS.values() if b.needs_tensorflow)
    return next(b for b in BACKENDS.values() if b.runs_user_arrays)


def backend(name: str) -> ModuleType:
    """The backend module called ``name``."""
    try:
        return BACKENDS[name].engine_module()
    except KeyError:
        raise ValueError(f"backend: no backend {name!r}; one of {', '.join(BACKENDS)}") from None
