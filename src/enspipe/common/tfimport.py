"""TensorFlow's and Keras's imports in a process of enspipe's own (a cell's rank, the data
commands, a profile): only what the process uses.

Measured here (2.2 GHz vCPU, TensorFlow 2.21, Keras 3.15): ``import tensorflow`` took 3.3-4.0 s of
CPU, of which Keras 3, pandas and matplotlib were 1.3 s: TensorFlow loads Keras at once, and
Keras loads pandas and matplotlib where they are installed (the workflow's report needs them).
A rank that trains no model needs none of them; one that trains needs Keras, not pandas (its
DataFrame inputs) or matplotlib (its plots): its Keras imported without them took 0.2 s, not 1.1 s.
"""
from __future__ import annotations

import importlib.util
import os
import sys

KERAS_EXTRAS = ("pandas", "matplotlib")  # what Keras loads only to accept or draw them, where installed


def import_tensorflow(trains: bool) -> None:
    """Import TensorFlow without Keras, and where this process ``trains`` a model Keras without
    pandas and matplotlib. TensorFlow loads Keras at its import unless told that it uses
    ``tf_keras``; told so for the import alone, where ``tf_keras`` is not installed, it loads none,
    and ``tf.keras`` is still Keras 3 when first used (its loader reads the setting then). Keras
    looks for pandas and matplotlib once, at its import; hidden for that import, they stay
    importable afterwards, for the process's own use."""
    if "tensorflow" not in sys.modules:
        tell = "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is None
        if tell:
            os.environ["TF_USE_LEGACY_KERAS"] = "1"
        try:
            import tensorflow  # noqa: F401
        finally:
            if tell:
                del os.environ["TF_USE_LEGACY_KERAS"]
    if trains and "keras" not in sys.modules:
        hidden = [m for m in KERAS_EXTRAS if m not in sys.modules]
        for m in hidden:
            sys.modules[m] = None  # an import of it raises ImportError: Keras goes on without it
        try:
            import keras  # noqa: F401
        finally:
            for m in hidden:
                del sys.modules[m]
