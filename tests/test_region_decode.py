"""The crop's region decoded alone (enspipe.data._jpegregion): the same pixels as the whole decode,
and every image it cannot take decoded whole and counted."""
from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from enspipe.data import decoding, pixels
from enspipe.data.photos import photo_jpegs

needs_region = pytest.mark.skipif(not decoding.REGION_DECODE, reason="enspipe.data._jpegregion is not built "
                                  "(no libjpeg headers at install: apt-get install libjpeg-dev, then reinstall)")


def test_the_region_decode_is_built_where_libjpegs_headers_are():
    if not os.path.exists("/usr/include/jpeglib.h"):
        pytest.skip("no /usr/include/jpeglib.h: the region decode is not built here, and every JPEG decodes whole")
    assert decoding.REGION_DECODE, "libjpeg's headers are here, yet enspipe.data._jpegregion did not build"


def _whole(monkeypatch, source, box, size):
    with monkeypatch.context() as m:
        m.setattr(decoding, "_jpegregion", None)
        return decoding.decoded_box(source, decoding.open_image(source), box, size)


def _boxes(rng, w, h):
    """torchvision's crops, the whole image and the corners: regions at every edge."""
    crops = [pixels.resized_crop_box(rng, w, h) for _ in range(3)]
    return [(l, t, l + cw, t + ch) for l, t, cw, ch in crops] + [(0, 0, w, h), (0, 0, 40, 40), (w - 41, h - 37, w, h)]


@needs_region
@pytest.mark.parametrize("size", [224, 96, 20])  # DCT scales 1 to 8 for the larger crops
def test_a_region_holds_the_whole_decodes_pixels_bit_for_bit(monkeypatch, size):
    rng = np.random.default_rng(size)
    grey = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (203, 317), np.uint8)).save(grey, "JPEG", quality=85)
    restart = io.BytesIO()  # restart markers every MCU row, an odd size and 4:2:2
    Image.fromarray(rng.integers(0, 256, (251, 189, 3), np.uint8)).save(restart, "JPEG", subsampling=1,
                                                                          restart_marker_rows=1)
    jpegs = [b for _, b in photo_jpegs(14)] + [grey.getvalue(), restart.getvalue()]
    scales, whole = set(), 0
    for b in jpegs:
        w, h = decoding.open_image(b).size
        for box in _boxes(rng, w, h):
            scales.add(decoding.dct_scale(w, h, box, size))
            before = sum(decoding.whole_decodes().values())
            part, inner = decoding.decoded_box(b, decoding.open_image(b), box, size)
            whole += sum(decoding.whole_decodes().values()) - before
            want, want_inner = _whole(monkeypatch, b, box, size)
            assert inner == pytest.approx(want_inner) and part.shape == want.shape
            np.testing.assert_array_equal(part, want)
    assert scales == ({1, 2, 4, 8} if size == 20 else scales) and whole == 0
    assert any(decoding.open_image(b).info.get("progressive") for b in jpegs)  # progressive ones among them


def test_what_the_region_decode_cannot_take_is_decoded_whole_and_counted():
    rng = np.random.default_rng(0)
    photo = photo_jpegs(1)[0][1]
    cmyk, png = io.BytesIO(), io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (64, 80, 3), np.uint8)).convert("CMYK").save(cmyk, "JPEG")
    Image.fromarray(rng.integers(0, 256, (64, 80, 3), np.uint8)).save(png, "PNG")
    corrupt = bytearray(photo)
    scan = corrupt.rfind(b"\xff\xda")
    corrupt[scan + 300:scan + 302] = b"\xff\x55"  # a marker amid the scan's data: libjpeg warns, OpenCV decodes on
    want = {"CMYK": (cmyk.getvalue(), "not RGB or grey (CMYK)"), "PNG": (png.getvalue(), "not a JPEG (PNG)")}
    if decoding.REGION_DECODE:
        want["corrupt"] = (bytes(corrupt), "Corrupt JPEG data")
    for name, (encoded, reason) in want.items():
        before = decoding.whole_decodes()
        part, _ = decoding.decoded_box(encoded, decoding.open_image(encoded), (4, 4, 60, 60), 32)
        assert part.ndim == 3 and part.shape[2] == 3, name
        grown = {k: v - before.get(k, 0) for k, v in decoding.whole_decodes().items() if v != before.get(k, 0)}
        assert list(grown.values()) == [1] and next(iter(grown)).startswith(reason), (name, grown)
    before = sum(decoding.whole_decodes().values())
    with pytest.raises(decoding.Undecodable, match="truncated"):  # named, as before: never a grey-filled image
        pixels.standard_train(photo[:len(photo) // 2], 32, pixels.generator(0, 0))
    assert sum(decoding.whole_decodes().values()) == before + 1


@needs_region
def test_the_region_decodes_own_refusals():
    from enspipe.data import _jpegregion

    photo = photo_jpegs(1)[0][1]
    w, h = decoding.open_image(photo).size
    assert _jpegregion.decode(photo, 1, 0, 0, w + 1, h) == "region outside the image"
    with pytest.raises(ValueError, match="denom"):
        _jpegregion.decode(photo, 3, 0, 0, 8, 8)
    assert isinstance(_jpegregion.decode(b"\xff\xd8not a jpeg", 1, 0, 0, 8, 8), str)
    buf, width, height, left, top = _jpegregion.decode(photo, 2, 33, 17, 60, 40)
    assert left <= 33 and left + width >= 60 and (height, top) == (23, 17) and len(buf) == width * height * 3


@pytest.mark.parametrize("threads", [1, 2])  # in the member's process; on 2 worker processes
def test_the_images_decoded_whole_are_counted_by_the_engine_wherever_they_were_decoded(threads):
    """The pillow engine's ``decodes`` (a cell's summary, the event log and the server's status
    report it) counts each image decoded whole by reason, whether the member's own thread or its
    worker processes decoded it."""
    from enspipe.engine.backends.pillow import PillowEngine

    rng = np.random.default_rng(1)
    png = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (64, 80, 3), np.uint8)).save(png, "PNG")
    encoded = [b for _, b in photo_jpegs(3)] + [png.getvalue()] * 2
    engine = PillowEngine("standard", 32, False, "uint8", 7, threads=threads, skip_corrupt=False)
    try:
        assert engine.decodes == {"decoded_whole": {}}
        n = len(encoded)
        item = {"encoded": encoded, "position": np.arange(n), "id": np.arange(n), "epoch": np.zeros(n, np.int64),
                "label": np.zeros(n, np.int64)}
        images, failed = engine._images(item)
        assert len(images) == n and failed == {}
        whole = {"not a JPEG (PNG)": 2, **({} if decoding.REGION_DECODE else {"region decode not built": 3})}
        assert engine.decodes == {"decoded_whole": whole}
        assert (engine.workers is not None) == (threads > 1)
    finally:
        engine.close()
