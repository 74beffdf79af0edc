"""benchmarks/overhead.py: a short cell's wall time split by rank 0's phase stamps (phases.json):
every phase present, in order, from mpiexec's start to its exit."""
import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
overhead = pytest.importorskip("overhead")


@pytest.mark.mpi
@pytest.mark.slow
def test_a_cell_stamps_every_phase_in_order_and_the_benchmark_adds_them_up(dataset):
    a = argparse.Namespace(n=2, scheme="all_shared", batch=8, steps=3, warmup=1)
    times = overhead.one(dataset, a)
    assert list(times) == [name for name, _, _ in overhead.PHASES]
    assert all(t >= -0.02 for t in times.values()), times  # stamps in order (10 ms process-start ticks)
    assert times["window"] > 0 and sum(times.values()) < 120
