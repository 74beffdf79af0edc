"""The stream as PyTorch tensors and JAX arrays (stream.torch(), stream.jax()), without TensorFlow:
every sample once per epoch, kept batches unchanged, no warnings, the same pixels as each other."""
import pytest

from enspipe.api.frameworks import require_framework
from test_api import members


def _run(mode: str, tmp_path, n: int = 2, **options):
    out = tmp_path / f"{mode}_{options.get('layout', 'NHWC')}"
    out.mkdir()
    r, res = members(mode, n, out, without_tf=True, batch_size=10, image_size=32, backend="pillow",
                     wire_dtype="uint8", epochs=2, **options)
    assert r.returncode == 0, r.stderr[-3000:]
    assert len(res) == n
    for m in res:
        assert m["warnings"] == []
        assert [(e["count"], e["missing"]) for e in m["epochs"]][:2] == [(50, 0), (50, 0)]
        assert len(m["rows"]) == 10 and all(row["first"] == row["last"] for row in m["rows"])
        assert all(row["label_dtype"] == {"torch": "torch.int64", "jax": "int32"}[mode] for row in m["rows"])
    assert [row["first"] for row in res[0]["rows"]] == [row["first"] for row in res[1]["rows"]]
    return res


@pytest.mark.mpi
def test_torch_tensors_in_each_layout_carry_the_same_batches(dataset, tmp_path):
    pytest.importorskip("torch", reason="pip install 'enspipe[torch]' (or torch==2.13.0+cpu) to test the torch handoff")
    digests = {}
    for layout in ("NHWC", "channels_last", "NCHW"):
        res = _run("torch", tmp_path, data=dataset, layout=layout)
        row = res[0]["rows"][0]
        assert row["type"] == "torch" and row["dtype"] == "torch.uint8"
        assert row["shape"] == ([10, 32, 32, 3] if layout == "NHWC" else [10, 3, 32, 32])
        assert row["contiguous"] == (layout != "channels_last")
        if layout != "NHWC":
            assert row["channels_last"] == (layout == "channels_last")
        digests[layout] = [r["first"] for r in res[0]["rows"]]
    assert digests["NHWC"] == digests["channels_last"] == digests["NCHW"]


@pytest.mark.mpi
def test_jax_arrays_carry_the_torch_streams_batches(dataset, tmp_path):
    pytest.importorskip("jax", reason="pip install 'enspipe[jax]' to test the JAX handoff")
    pytest.importorskip("torch", reason="pip install 'enspipe[torch]' to compare with the torch handoff")
    jax = _run("jax", tmp_path, data=dataset)
    torch = _run("torch", tmp_path, data=dataset)
    assert jax[0]["rows"][0]["type"] == "jaxlib" and jax[0]["rows"][0]["shape"] == [10, 32, 32, 3]
    assert [r["first"] for r in jax[0]["rows"]] == [r["first"] for r in torch[0]["rows"]]


def test_a_missing_framework_says_what_to_install():
    with pytest.raises(ImportError, match=r"pip install 'enspipe\[torch\]'"):
        require_framework("enspipe_no_such_framework", "torch")
