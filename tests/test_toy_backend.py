"""A backend of another package (tests/fixtures/toy_backend: one module and its row, named by an
entry point) is in the table wherever that package is installed: `SharedStream`, `enspipe run`
and `enspipe serve` take it by name, and it delivers every sample exactly once with its own
values."""
import json
import os
import subprocess
import sys

import pytest

from conftest import MPIEXEC, enspipe, said, summary
from serve_helpers import ServerProcess

TOY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "toy_backend")
ENV = {"PYTHONPATH": TOY + os.pathsep + os.environ.get("PYTHONPATH", "")}
MEMBER = r'''
import json, sys
import numpy as np
import enspipe
from enspipe_toy_backend import value

data, out = sys.argv[1:]
with enspipe.SharedStream(data, 8, backend="toy", image_size=16, scheme="all_shared") as stream:
    seen, constant = [], True
    for _ in range(2 * len(stream)):
        images, meta, _ = stream._next(keep=True)
        seen += [[int(m[0]), int(m[1])] for m in meta]
        want = value(meta[:, 0]).reshape(-1, 1, 1, 1)
        constant &= bool((np.asarray(images) == want).all())
    with open(f"{out}.{stream.member}.json", "w") as f:
        json.dump({"seen": seen, "constant": constant, "shape": list(images.shape[1:])}, f)
'''


def test_an_installed_backend_is_in_the_table_and_the_command_lines_choices():
    code = "from enspipe.engine.backends import BACKENDS; print(BACKENDS['toy'].module)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **ENV})
    assert r.returncode == 0 and r.stdout.strip() == "enspipe_toy_backend", said(r)
    r = enspipe("run", "--help", env=ENV)
    assert "{auto,tf,pillow,gpu,toy}" in r.stdout, r.stdout
    r = enspipe("run", "--help")
    assert "{auto,tf,pillow,gpu}" in r.stdout, r.stdout


@pytest.mark.mpi
def test_shared_stream_runs_an_installed_backend_each_sample_once_with_its_values(dataset, tmp_path):
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(script), dataset, str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **ENV})
    assert r.returncode == 0, said(r)
    for k in range(2):
        res = json.loads((tmp_path / f"m.{k}.json").read_text())
        assert res["constant"] and res["shape"] == [16, 16, 3]
        epochs = [sorted(i for i, e in res["seen"] if e == epoch) for epoch in (0, 1)]
        assert len(set(epochs[0])) == len(epochs[0]) == 50 and epochs[0] == epochs[1]  # each sample once


@pytest.mark.mpi
def test_a_cell_runs_an_installed_backend_and_names_it(dataset, tmp_path):
    out = tmp_path / "cell"
    r = enspipe("run", "--data", dataset, "--out", out, "--backend", "toy", "--network", "tiny", "--consumer",
                "peak", "--batch-size", 8, "--steps", 14, "--warmup", 0, "--image-size", 32, "--cores", 1,
                "--cpu-monitor", "none", n=2, env=ENV)
    assert r.returncode == 0, said(r)
    from enspipe.report.collect import cell_row

    s = summary(out)  # 14 global batches of 8: two whole epochs of the 50 samples
    assert s["backend"] == "toy" and s["preprocess_impl"] == "toy", s
    assert cell_row(s, str(out))["epochs_exact"] is True


@pytest.mark.mpi
def test_enspipe_serve_makes_an_installed_backends_samples_for_attach(dataset, tmp_path, monkeypatch):
    import numpy as np

    import enspipe

    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])  # the server's process has the package
    sys.path.insert(0, TOY)
    from enspipe_toy_backend import value

    server = ServerProcess(tmp_path, dataset, "--backend", "toy")
    try:
        with enspipe.attach(server.sock, data=dataset) as stream:
            seen = []
            for _ in range(2 * len(stream)):
                images, meta, _ = stream._next()
                assert (np.asarray(images) == value(meta[:, 0]).reshape(-1, 1, 1, 1)).all()
                seen += meta[:, 0].tolist()
    finally:
        server.stop()
    assert len(seen) == 100 and sorted(seen[:50]) == sorted(seen[50:]) and len(set(seen)) == 50, server.output()
