"""Executing a scheme's plan: the batch and its accounting (``base``), the engine and its mpi4py
transport (``engine``), the node-shared-memory window (``shm``) and the Horovod transport."""
