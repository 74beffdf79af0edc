"""The gpu backend (enspipe.engine.backends.gpu) on a machine without a GPU.

Its torch ops run here on CPU tensors:

- they cut, flip and jitter each sample with the pillow backend's draws;
- their values are compared with Pillow's resize of the same decoded image, and with the pillow
  backend itself, whose DCT-scaled decode accounts for most of the difference;
- nvJPEG's refusals go to the CPU decoder and are counted;
- an undecodable image fails the slice, or is skipped and counted;
- without CUDA the backend is refused before any work, by the library and by ``enspipe run``
  (exit 2).

nvJPEG itself runs on the GPU machine only (benchmarks/gpu.sh)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import said

torch = pytest.importorskip("torch", reason="pip install 'enspipe[torch]' (or torch==2.13.0+cpu) to test the gpu "
                                            "backend's torch ops")

from PIL import Image  # noqa: E402

from enspipe.data import pixels as px  # noqa: E402
from enspipe.data.decoding import decode  # noqa: E402
from enspipe.data.manifest import DataError  # noqa: E402
from enspipe.data import tensor_pixels  # noqa: E402
from enspipe.data.tensor_pixels import standard_train, train  # noqa: E402
from enspipe.engine.backends import gpu, pillow  # noqa: E402
from enspipe.engine.backends.base import PrepSpec  # noqa: E402
from enspipe.plan.errors import ConfigError  # noqa: E402
from enspipe.engine.config import StreamConfig, checked_manifest  # noqa: E402

SIZE = 64


def _slice(dataset, preprocessing="standard", wire_dtype="float32"):
    spec = PrepSpec(manifest=checked_manifest(dataset), preprocessing=preprocessing, size=SIZE, fast_mode=False,
                    wire_dtype=wire_dtype, impl="crop-first", order_seed=0, prep_seed=0, shuffle_buffer=0,
                    skip_corrupt=False, batch=10, share=(0, 10), unit=1, threads=1, depth=2,
                    image_shape=(SIZE, SIZE, 3), image_dtype=np.float32)
    return next(pillow.slices(spec))


def _pillow_whole(encoded: bytes, position: int, jitter: bool) -> np.ndarray:
    """torchvision's PIL path, the pillow backend's draws: the whole image decoded, the box resized
    by Pillow's antialiased bilinear, flipped, jittered."""
    whole, rng = decode(encoded), px.generator(0, position)
    left, top, w, h = px.resized_crop_box(rng, whole.shape[1], whole.shape[0])
    im = Image.fromarray(whole).resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(px._jitter(im, rng) if jitter else im)


@pytest.mark.parametrize("preprocessing, inner_bound", [("standard", 1), ("standard-jitter", 4)])
def test_the_torch_ops_cut_flip_and_jitter_each_sample_as_pillow_does(dataset, preprocessing, inner_bound):
    """The same box, flip and jitter draws as the pillow backend. Against Pillow's resize of the
    same whole image (torchvision's PIL path) the values are within 0.5 levels of 255 on average.
    Away from the edges they are within 1 level, or 4 after the jitter's steps. At the edges the
    resize differs: the crop is cut before it is resized, where Pillow reads beyond the box."""
    item, jitter = _slice(dataset), preprocessing == "standard-jitter"
    for encoded, position in zip(item["encoded"], item["position"].tolist()):
        image = torch.from_numpy(decode(encoded).copy()).permute(2, 0, 1)
        mine = standard_train(image, SIZE, px.generator(0, position), jitter).permute(1, 2, 0).numpy()
        theirs = _pillow_whole(encoded, position, jitter).astype(np.float32)
        diff = np.abs(mine - theirs)
        assert diff.mean() < 0.5, (position, diff.mean())
        assert diff[2:-2, 2:-2].max() <= inner_bound, (position, diff[2:-2, 2:-2].max())


@pytest.mark.parametrize("preprocessing, fast_mode, fused", [("inception", False, False), ("inception", True, False),
                                                             ("inception", False, True), ("vgg", False, False)])
def test_slims_preprocessings_give_the_pillow_backends_values_on_the_whole_image(dataset, preprocessing, fast_mode,
                                                                                 fused):
    """Slim's inception (its four resize methods, its colour orders; fast mode; the fused colour
    map) and vgg, against the pillow backend's values for the same whole decoded image (its
    decode-cache path): the same draws, within 0.5 levels of 255 on average per image and 3 away
    from the edges (OpenCV's 8-bit fixed-point bilinear against torch's float kernel)."""
    item = _slice(dataset, preprocessing)
    fn, methods = train(preprocessing, fast_mode, fused), set()
    for encoded, position in zip(item["encoded"], item["position"].tolist()):
        whole = decode(encoded)
        if preprocessing == "inception":  # the resize method drawn, after the box
            rng = px.generator(0, position)
            px.sample_crop(rng, whole.shape[1], whole.shape[0])
            methods.add(int(rng.integers(0, 4)))
        options = {"fused": fused} if preprocessing == "inception" else {}
        theirs = px.PREPROCESSING[preprocessing](whole, SIZE, px.generator(0, position), fast_mode, **options)
        image = torch.from_numpy(whole.copy()).permute(2, 0, 1)
        diff = np.abs(fn(image, SIZE, px.generator(0, position)).permute(1, 2, 0).numpy() - theirs)
        assert diff.mean() < 0.5, (position, diff.mean())
        assert diff[2:-2, 2:-2].max() <= 3, (position, diff[2:-2, 2:-2].max())
    assert preprocessing != "inception" or fast_mode or methods == {0, 1, 2, 3}  # every resize method was drawn


@pytest.mark.parametrize("preprocessing", px.PREPROCESSING)
@pytest.mark.parametrize("wire_dtype", ["float32", "uint8"])
def test_a_batch_travels_in_the_pillow_backends_units(preprocessing, wire_dtype):
    """The same 8-bit images made ready for the wire by both backends: float32 within float
    rounding, uint8 within one quantisation step (a value on a rounding edge)."""
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    mine = tensor_pixels.to_wire(preprocessing, torch.from_numpy(images).permute(0, 3, 1, 2).float(), wire_dtype)
    theirs = np.stack([px.to_wire(preprocessing, x, wire_dtype) for x in images])
    assert mine.dtype == getattr(torch, wire_dtype) and tuple(mine.shape) == theirs.shape
    diff = np.abs(mine.numpy().astype(np.float64) - theirs)
    assert diff.max() <= (1e-5 * 255 if wire_dtype == "float32" else 1), diff.max()


def _run(engine, item):
    return next(engine.run(lambda: item))


@pytest.mark.parametrize("wire_dtype, mean_bound", [("float32", 0.1), ("uint8", 6.0)])
def test_the_engine_gives_the_pillow_backends_batches_within_its_dct_scaled_decode(dataset, wire_dtype, mean_bound):
    """The whole slice, as the exchange gets it: the same shape, dtype and meta rows as the pillow
    backend's. The values differ by the pillow backend's DCT-scaled decode: on average under 0.1
    in Normalize's units (float32), or 6 levels of 255 (uint8)."""
    item = _slice(dataset, wire_dtype=wire_dtype)
    _, theirs, their_meta, _ = _run(pillow.PillowEngine("standard", SIZE, False, wire_dtype, 0, 1, False), item)
    engine = gpu.TensorEngine("standard", SIZE, wire_dtype, 0, False, "cpu", gpu.CpuDecoder("cpu"))
    _, mine, meta, _ = _run(engine, item)
    assert isinstance(mine, torch.Tensor) and mine.dtype == getattr(torch, wire_dtype)
    assert tuple(mine.shape) == theirs.shape and np.array_equal(meta, their_meta)
    diff = np.abs(mine.numpy().astype(np.float64) - theirs.astype(np.float64))
    assert diff.mean() < mean_bound, diff.mean()
    assert engine.decodes == {"device": "cpu", "on_device": 0, "on_cpu": 10}


class _FakeNvJpeg(gpu.NvJpeg):
    """nvJPEG's interface over the CPU decoder (recorded behaviour: a batch fails as a whole where
    one image fails; a PNG is not offered), to test what the backend does with its refusals."""

    def __init__(self, refuse: set):
        self.device, self.rgb, self.refuse = torch.device("cpu"), None, refuse
        self.cpu, self.cpu_decoded, self.offered = gpu.CpuDecoder(self.device), 0, 0

    def decode_jpeg(self, data, mode, device):
        batch = data if isinstance(data, list) else [data]
        self.offered += len(batch) if isinstance(data, list) else 0
        if any(bytes(d.numpy()) in self.refuse for d in batch):
            raise RuntimeError("nvjpeg: unsupported")
        out = self.cpu([bytes(d.numpy()) for d in batch])
        return out if isinstance(data, list) else out[0]


def test_images_nvjpeg_refuses_are_decoded_on_the_cpu_and_counted(dataset):
    """A PNG (never offered to nvJPEG) and a JPEG it refuses: decoded on the CPU, in their places,
    with the same values; the rest decoded in one batch."""
    item = _slice(dataset)
    encoded = list(item["encoded"])
    import io

    png = io.BytesIO()
    Image.fromarray(decode(encoded[3])).save(png, format="PNG")
    encoded[3] = png.getvalue()
    fake = _FakeNvJpeg(refuse={encoded[5]})
    out = fake(encoded)
    assert fake.offered == 9 and fake.cpu_decoded == 2
    for x, e in zip(out, encoded):
        assert np.array_equal(x.permute(1, 2, 0).numpy(), decode(e))


def test_an_undecodable_image_fails_the_slice_naming_it_or_is_skipped(dataset):
    item = _slice(dataset)
    item["encoded"] = list(item["encoded"])
    item["encoded"][2] = b"\xff\xd8 not a jpeg"
    with pytest.raises(DataError, match="undecodable image"):
        _run(gpu.TensorEngine("standard", SIZE, "uint8", 0, False, "cpu", gpu.CpuDecoder("cpu")), item)
    engine = gpu.TensorEngine("standard", SIZE, "uint8", 0, True, "cpu", gpu.CpuDecoder("cpu"))
    _, images, meta, _ = _run(engine, item)
    assert len(images) == len(meta) == 9 and item["id"][2] not in meta[:, 0]
    assert engine.decodes["on_cpu"] == 9


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("options, says", [
    ({}, "backend=: the gpu backend decodes on a GPU, and CUDA is not available here"),
    ({"preprocess": lambda image: image}, "preprocess=: the gpu backend runs its own preprocessings on the GPU")])
def test_the_gpu_backend_is_refused_before_any_work(dataset, options, says):
    with pytest.raises(ConfigError) as e:
        StreamConfig(data=dataset, batch_size=10, backend="gpu", **{"preprocess": "standard", **options})
    assert says in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_enspipe_run_with_the_gpu_backend_exits_2_without_cuda(dataset, tmp_path):
    cli = shutil.which("enspipe", path=os.path.dirname(sys.executable))
    r = subprocess.run([cli, "run", "--data", dataset, "--out", str(tmp_path / "cell"), "--backend", "gpu",
                        "--preprocess", "standard", "--consumer", "peak", "--cpu-monitor", "none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, said(r)
    assert "--backend: the gpu backend decodes on a GPU, and CUDA is not available here" in r.stderr, said(r)
    assert not (tmp_path / "cell").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_enspipe_serve_with_the_gpu_backend_exits_2_without_cuda(dataset, tmp_path):
    cli = shutil.which("enspipe", path=os.path.dirname(sys.executable))
    r = subprocess.run([cli, "serve", "--data", dataset, "--batch-size", "8", "--backend", "gpu", "--socket",
                        str(tmp_path / "s.sock")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, said(r)
    assert "--backend: the gpu backend decodes on a GPU, and CUDA is not available here" in r.stderr, said(r)
    assert not (tmp_path / "s.sock").exists()


def test_a_gpu_pools_handle_travels_as_json(monkeypatch):
    """The CUDA IPC handle of a GPU pool crosses the server's socket as JSON: the fields torch's
    ``reduce_tensor`` gives come back to ``rebuild_cuda_tensor`` as they were (recorded here with
    stand-ins for torch's two calls; the mapping itself runs on a GPU, below)."""
    import json

    from torch.multiprocessing import reductions

    from enspipe.exchange import ipc

    fields = (torch.Tensor, torch.Size([4, 8, 8, 3]), (192, 24, 3, 1), 0, torch.storage.TypedStorage, torch.uint8, 0,
              b"\x00\x01handle\xff", 768, 512, False, b"/torch_123_456", 3, b"\x07event", True)
    monkeypatch.setattr(reductions, "reduce_tensor", lambda t: (reductions.rebuild_cuda_tensor, fields))
    got = []
    monkeypatch.setattr(reductions, "rebuild_cuda_tensor", lambda *args: got.append(args))
    ipc.mapped_cuda(json.loads(json.dumps(ipc.cuda_handle(None))))
    assert got == [fields]


def test_a_gpu_allocation_that_does_not_fit_names_what_was_asked(monkeypatch):
    """CUDA's out-of-memory at start, as the ring and the serve pool report it (torch's two calls
    stood in for): what was asked for, in MiB, and what the GPU had free."""
    from enspipe.exchange import ipc

    def empty(shape, dtype=None, device=None):
        if device is not None:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return torch.zeros(shape, dtype=dtype)

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (512 << 20, 80 << 30))
    with pytest.raises(ipc.OutOfDeviceMemory) as e:
        ipc.gpu_allocation(torch, (4096, 224, 224, 3), torch.uint8, "cuda:0", "the pool of 4096 samples")
    assert str(e.value) == "the pool of 4096 samples: 588 MiB asked on cuda:0, which has 512 MiB free of 81920"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu.sh runs these there)")


@cuda
def test_attached_trials_read_a_gpu_pool_through_cuda_ipc(dataset, tmp_path):
    """``enspipe serve --backend gpu``: the samples made on the GPU into a pool there; two
    consumers map it through CUDA IPC, each gets exact epochs as CUDA tensors of its own."""
    pytest.importorskip("torchvision", reason="nvJPEG is torchvision's decode_jpeg")
    from serve_helpers import ServerProcess, _consumer, _result

    s = ServerProcess(tmp_path, dataset, "--backend", "gpu", "--preprocess", "standard")
    try:
        runs = [_consumer(s, tmp_path, dataset, name, epochs=2, as_torch=True) for name in "ab"]
        for r in (_result(*run) for run in runs):
            assert [e["count"] for e in r["epochs"]] == [50, 50] and all(e["missing"] == 0 for e in r["epochs"]), r
            assert r["devices"] == ["cuda:0"], r
        status = s.stop()
        assert status["memory"]["pool_on"].startswith("cuda") and status["decodes"]["on_device"] >= 50, status
    finally:
        s.proc.kill()


@cuda
def test_nvjpeg_decodes_as_the_cpu_does(dataset):
    """nvJPEG's IDCT differs from libjpeg's a little: within 1 level of 255 on average."""
    pytest.importorskip("torchvision", reason="nvJPEG is torchvision's decode_jpeg")
    encoded = list(_slice(dataset)["encoded"])
    on_gpu, on_cpu = gpu.NvJpeg(torch.device("cuda"))(encoded), gpu.CpuDecoder("cpu")(encoded)
    for a, b in zip(on_gpu, on_cpu):
        assert a.shape == b.shape and (a.cpu().float() - b.float()).abs().mean() < 1.0


@cuda
@pytest.mark.parametrize("preprocessing", ["standard", "inception"])
@pytest.mark.parametrize("wire_dtype, mean_bound", [("float32", 0.02), ("uint8", 1.0)])
def test_the_engine_on_the_gpu_gives_its_cpu_tensors_values(dataset, preprocessing, wire_dtype, mean_bound):
    pytest.importorskip("torchvision", reason="nvJPEG is torchvision's decode_jpeg")
    item = _slice(dataset, preprocessing, wire_dtype)
    device = torch.device("cuda")
    _, mine, meta, _ = _run(gpu.TensorEngine(preprocessing, SIZE, wire_dtype, 0, False, device, gpu.NvJpeg(device)),
                            item)
    _, ref, ref_meta, _ = _run(gpu.TensorEngine(preprocessing, SIZE, wire_dtype, 0, False, "cpu",
                                                gpu.CpuDecoder("cpu")), item)
    assert mine.is_cuda and np.array_equal(meta, ref_meta)
    assert (mine.cpu().double() - ref.double()).abs().mean() < mean_bound
