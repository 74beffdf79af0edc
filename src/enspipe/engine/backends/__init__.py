"""The preprocessing backends: one table, :data:`BACKENDS`, a :class:`Backend` row each, read by
every check, the pipeline, the attach server, the command line's choices and the summaries.
Adding a backend is one module (see :mod:`enspipe.engine.backends.base` for what it provides) and
one row here; no code outside this package compares a backend's name.

* ``tf``: tf.data and Slim's TensorFlow preprocessing (:mod:`enspipe.engine.backends.tf`);
* ``pillow``: Pillow, OpenCV and numpy, no TensorFlow, on worker processes that write into shared
  memory, one per core of the member (:mod:`enspipe.engine.backends.pillow`);
* ``gpu``: nvJPEG and torch ops on the member's GPU (:mod:`enspipe.engine.backends.gpu`).

``auto`` (:func:`resolve`) is ``tf`` where TensorFlow is installed, else ``pillow``; a torch
pipeline (torchvision's, kornia's) always runs on ``pillow``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
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
    module: str                  # its engine (enspipe.engine.backends.<module>)
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
        return importlib.import_module(f"enspipe.engine.backends.{self.module}")


BACKENDS = {b.name: b for b in (
    Backend("tf", "tf", needs_tensorflow=True, user_functions="tensorflow", implementations=IMPLEMENTATIONS,
            horovod=True, tfdata_service=True, on_gpu=False, permutes=False),
    Backend("pillow", "pillow", needs_tensorflow=False, user_functions="arrays",
            implementations=("crop-first", "fused-colour"), horovod=False, tfdata_service=False, on_gpu=False,
            permutes=True, serves=True, serve_chunk=4),
    Backend("gpu", "gpu", needs_tensorflow=False, user_functions="none", implementations=("crop-first", "fused-colour"),
            horovod=False, tfdata_service=False, on_gpu=True, permutes=True, serves=True, serve_threads=2),
)}
SERVED = tuple(name for name, b in BACKENDS.items() if b.serves)  # the first is `enspipe serve`'s default


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
