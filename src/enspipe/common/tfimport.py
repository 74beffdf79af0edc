"""TensorFlow's import, without Keras where a process trains no model."""
from __future__ import annotations

import importlib.util
import os
import sys


def import_tensorflow(trains: bool) -> None:
    """Import TensorFlow, without Keras where this process trains no model. TensorFlow's import
    loads Keras 3 at once (with pandas and matplotlib: 1.3 s of CPU, 40% of the import, in every
    rank of a peak or emulated cell) unless told that it uses ``tf_keras``; told so for the
    import alone, where ``tf_keras`` is not installed, it loads no Keras, and ``tf.keras`` still
    becomes Keras 3 when first used (its loader reads the setting then)."""
    if trains or "tensorflow" in sys.modules or "TF_USE_LEGACY_KERAS" in os.environ \
            or importlib.util.find_spec("tf_keras") is not None:
        import tensorflow  # noqa: F401
        return
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    try:
        import tensorflow  # noqa: F401
    finally:
        del os.environ["TF_USE_LEGACY_KERAS"]
