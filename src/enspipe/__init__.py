"""enspipe: shared input pipelines for DNN ensemble training over MPI group collectives."""
import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # rank 0 alone talks to the terminal, and briefly

__version__ = "0.1.0"
