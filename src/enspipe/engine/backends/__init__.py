"""The preprocessing backends, by name: one module each (see :mod:`enspipe.engine.backends.base`
for what a module provides). Adding a backend is one module, one line here, and its capabilities
(a :class:`~enspipe.plan.stream.BackendSpec`) in :data:`enspipe.plan.stream.BACKENDS`, whose
names a test holds equal to these.

* ``tf``: tf.data and Slim's TensorFlow preprocessing (:mod:`enspipe.engine.backends.tf`);
* ``pillow``: Pillow, OpenCV and numpy, no TensorFlow, on worker processes that write into shared
  memory, one per core of the member (:mod:`enspipe.engine.backends.pillow`);
* ``gpu``: nvJPEG and torch ops on the member's GPU (:mod:`enspipe.engine.backends.gpu`).
"""
from __future__ import annotations

import importlib
from types import ModuleType

REGISTRY = {
    "tf": "enspipe.engine.backends.tf",
    "pillow": "enspipe.engine.backends.pillow",
    "gpu": "enspipe.engine.backends.gpu",
}


def backend(name: str) -> ModuleType:
    """The backend module called ``name`` (imported on first use: ``tf`` imports TensorFlow)."""
    try:
        return importlib.import_module(REGISTRY[name])
    except KeyError:
        raise ValueError(f"backend: no backend {name!r}; one of {', '.join(REGISTRY)}") from None
