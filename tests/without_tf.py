"""Run a script as in an environment without TensorFlow: ``python tests/without_tf.py SCRIPT ARGS...``.

``import tensorflow`` (and Keras, and Horovod) raise ImportError here, as where they are not
installed; the script then runs as ``__main__``.
"""
import runpy
import sys

for name in ("tensorflow", "keras", "tf_keras", "horovod"):
    sys.modules[name] = None  # an import of it raises ImportError
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
