"""benchmarks/preprocessing.py's layouts: P processes of T threads at once, each preprocessing its
share as a member does, started together; the node's rate and the CPU per image of them all."""
import argparse
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks"))
preprocessing = pytest.importorskip("preprocessing")


@pytest.mark.slow
def test_a_layout_of_two_processes_preprocesses_their_shares_and_reports_the_node(capsys):
    a = argparse.Namespace(images=32, size=64, passes=4, repeats=1, layouts="1x1,2x1")
    preprocessing.layouts(a)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit() and "x" in line.split()[0]}
    assert set(rows) == {"1x1", "2x1"}, out
    assert "1.00 (1.00-1.00)" in rows["1x1"]  # the first layout against itself


@pytest.mark.slow
def test_a_worker_that_cannot_start_fails_the_layout_with_its_exit_status():
    a = argparse.Namespace(images=32, size=-1, passes=1)  # no image of -1 px
    with pytest.raises(RuntimeError, match="1x1 worker failed to start"):
        preprocessing.run_layout(1, 1, a)
