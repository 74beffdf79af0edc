"""enspipe: shared input pipelines for DNN ensemble training over MPI group collectives.

Under ``mpiexec -n N python train.py``, each rank is one member of the ensemble::

    import enspipe
    stream = enspipe.SharedStream("data/train", batch_size=64, scheme="all_shared")
    model.fit(stream.dataset(), epochs=5, steps_per_epoch=stream.steps_per_epoch)
    stream.close()

A process that is not one of an MPI job's ranks (a hyperparameter search's trial) attaches to the
node's server (``enspipe serve --data data/train --batch-size 64``) instead::

    stream = enspipe.attach("data/train")
    for images, labels in stream:   # one epoch of its own: every sample exactly once
        ...

The public names (imported on first use, so ``import enspipe`` stays cheap):

* :class:`SharedStream`: one member's stream of shared, preprocessed batches;
* :class:`StreamConfig`: its options, validated when made;
* :func:`validation_set`: a small dataset in memory, preprocessed for evaluation;
* :func:`attach`: a stream from this node's attach server (``enspipe serve``), for a process
  that comes and goes on its own (a search's trial): its own exactly-once epochs;
* :class:`ServerGone`: the attach server ended (or stopped answering) under an attached stream;
* :class:`ConfigError`: a bad option or input, naming the field and the fix;
* :class:`DataError`: the data broke its manifest (a corrupt record, a lost sample);
* :func:`lightning_member`: the Lightning cluster environment that makes each member's
  ``Trainer(devices=1)`` a job of its own.
"""
import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # rank 0 alone talks to the terminal, and briefly

__version__ = "0.1.0"
__all__ = ["SharedStream", "StreamConfig", "attach", "ServerGone", "validation_set", "ConfigError", "DataError",
           "lightning_member", "__version__"]

_PUBLIC = {"SharedStream": "enspipe.api.stream", "StreamConfig": "enspipe.engine.config",
           "validation_set": "enspipe.api.validation", "attach": "enspipe.api.attach",
           "ServerGone": "enspipe.serve.wire",
           "ConfigError": "enspipe.plan.errors", "DataError": "enspipe.data.manifest",
           "lightning_member": "enspipe.api.frameworks"}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'enspipe' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_PUBLIC])
