"""One image decoded for the TensorFlow-free backend: its header read by Pillow, then the pixels the
crop needs at the smallest DCT scale (1, 1/2, 1/4 or 1/8: libjpeg-turbo's scaled decode) at which
the crop still has the output's size.

A complete JPEG of RGB or grey pixels decodes only the crop's region (and the margin its resize
reads): :mod:`enspipe.data._jpegregion`, compiled against libjpeg-turbo, takes the region's rows
through the inverse DCT and colour conversion and stops after its last row, the columns of the
iMCUs that hold it alone (``jpeg_skip_scanlines``, ``jpeg_crop_scanline``); its pixels are the
whole decode's, bit for bit. Where it is not built (no libjpeg headers at install:
:data:`REGION_DECODE` is False) or cannot take an image (libjpeg warns of corrupt data), the JPEG
decodes whole by OpenCV (``cv2.imdecode``, about a quarter cheaper than Pillow's decode on
photographs; EXIF orientation ignored, as Pillow ignores it); everything else by Pillow, as does
a JPEG OpenCV refuses. :func:`whole_decodes` counts each image decoded whole, by its reason.

A JPEG whose last scan has no end marker after it is cut short, and OpenCV would return it
grey-filled where Pillow raises: it goes to Pillow, which says it is truncated. (In a JPEG's
entropy-coded data every 0xFF byte is followed by 0x00 or a restart marker, so an end marker
after the last start-of-scan is the scan's own.)
"""
from __future__ import annotations

import collections
import io
import math

import cv2
import numpy as np
from PIL import Image

try:
    from enspipe.data import _jpegregion
except ImportError:  # built without libjpeg's headers: every JPEG decodes whole
    _jpegregion = None

REGION_DECODE = _jpegregion is not None
_WHOLE = collections.Counter()  # the images the region decode passed to the whole decode, by reason

_REDUCED = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}


class Undecodable(ValueError):
    """An image that cannot be decoded (Pillow's verdict)."""


def open_image(encoded: bytes) -> Image.Image:
    """The image's header read (nothing decoded yet); raises :class:`Undecodable`."""
    try:
        return Image.open(io.BytesIO(encoded))
    except Exception as e:  # noqa: BLE001 - Pillow's errors vary by format
        raise Undecodable(f"{type(e).__name__}: {e}") from None


def opened(source: "bytes | np.ndarray") -> Image.Image:
    """An encoded image's header read (nothing decoded yet), or a decoded ``H x W x 3`` array (the
    decode cache's) as an image: the preprocessings take either."""
    return Image.fromarray(source) if isinstance(source, np.ndarray) else open_image(source)


def decode(encoded: bytes) -> np.ndarray:
    """The whole image, uint8 ``H x W x 3`` (the first frame of an animation)."""
    return np.asarray(rgb(open_image(encoded)))


def rgb(im: Image.Image) -> Image.Image:
    """The image decoded, as 8-bit RGB; 16-bit grey scaled down (its top 8 bits, as TensorFlow's
    decoder does; Pillow's own conversion would clip it)."""
    try:
        im.load()
        if im.mode == "I" or im.mode.startswith("I;16"):
            im = Image.fromarray((np.asarray(im).astype(np.uint32) >> 8).clip(0, 255).astype(np.uint8), "L")
        return im if im.mode == "RGB" else im.convert("RGB")
    except Exception as e:  # noqa: BLE001 - a truncated or damaged image
        raise Undecodable(f"{type(e).__name__}: {e}") from None


def dct_scale(width: int, height: int, box: tuple, size: int) -> int:
    """The smallest DCT scale (1, 2, 4 or 8) at which ``box`` still holds ``size`` pixels each way."""
    bw, bh = box[2] - box[0], box[3] - box[1]
    scale = 1
    while scale < 8 and bw / (scale * 2) >= size and bh / (scale * 2) >= size:
        scale *= 2
    return scale


def drafted(im: Image.Image, box: tuple[float, float, float, float], size: int) -> tuple[Image.Image, tuple]:
    """A JPEG decoded at the smallest DCT scale (1, 1/2, 1/4, 1/8) at which ``box`` still holds
    ``size`` pixels each way; the box in the decoded image's pixels."""
    if im.format != "JPEG":
        return rgb(im), box
    w0, h0 = im.size
    scale = dct_scale(w0, h0, box, size)
    if scale > 1:
        im.draft("RGB", (math.ceil(w0 / scale), math.ceil(h0 / scale)))
    im = rgb(im)
    fx, fy = im.size[0] / w0, im.size[1] / h0
    return im, (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)


def _complete_jpeg(encoded: bytes) -> bool:
    return encoded.rfind(b"\xff\xd9") > encoded.rfind(b"\xff\xda") >= 0


def whole_decodes() -> dict[str, int]:
    """How many images this process decoded whole for a crop, by the reason the region decode
    could not take them: not a JPEG, CMYK, cut short, libjpeg's warning, or ``region decode not
    built`` for each where :data:`REGION_DECODE` is False. (The decode cache's images, decoded
    whole once, are not counted.)"""
    return dict(_WHOLE)


def decoded_box(source: "bytes | np.ndarray", im: Image.Image, box: tuple, size: int) -> tuple[np.ndarray, tuple]:
    """The uint8 RGB pixels of ``source``'s ``box`` (``im``: its header), decoded at the DCT scale
    the box allows, with a margin of pixels around it where the image has them (what a resize's
    filter reads beyond the box), and the box in them: the region alone of a complete RGB or grey
    JPEG, else its whole decode by OpenCV, else Pillow's (:func:`drafted`); a decoded array (the
    decode cache's) as it is."""
    if isinstance(source, np.ndarray):
        return _around(source, box, size, convert=None)
    whole = _not_region(im, source)
    if whole is None:
        w0, h0 = im.size
        scale = dct_scale(w0, h0, box, size)
        region = _region(source, w0, h0, scale, box, size)
        if region is not None:
            return region
        flags = _REDUCED[scale] | cv2.IMREAD_IGNORE_ORIENTATION
        pixels = cv2.imdecode(np.frombuffer(source, np.uint8), flags)
        if pixels is not None and pixels.ndim == 3:
            fx, fy = pixels.shape[1] / w0, pixels.shape[0] / h0
            return _around(pixels, (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy), size, cv2.COLOR_BGR2RGB)
    else:
        _WHOLE[whole] += 1
    image, box = drafted(im, box, size)
    return _around(np.asarray(image), box, size, convert=None)


def _not_region(im: Image.Image, encoded: bytes) -> "str | None":
    """Why an image's region cannot be decoded alone (it decodes whole by Pillow), or None."""
    if im.format != "JPEG":
        return f"not a JPEG ({im.format})"
    if im.mode not in ("RGB", "L"):
        return f"not RGB or grey ({im.mode})"
    if not _complete_jpeg(encoded):
        return "cut short (no end marker after its last scan)"
    return None


def _region(source: bytes, w0: int, h0: int, scale: int, box: tuple, size: int) -> "tuple[np.ndarray, tuple] | None":
    """What :func:`_around` cuts from the whole decode at ``scale``, decoded alone; None (counted)
    where the region decode cannot take the image."""
    if _jpegregion is None:
        _WHOLE["region decode not built"] += 1
        return None
    w, h = -(-w0 // scale), -(-h0 // scale)  # libjpeg's scaled size, rounded up
    fx, fy = w / w0, h / h0
    box = (box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)
    x0, y0, x1, y1 = _reach(box, size, w, h)
    got = _jpegregion.decode(source, scale, x0, y0, x1, y1)
    if isinstance(got, str):
        _WHOLE[got] += 1
        return None
    buf, width, height, left, top = got
    part = np.frombuffer(buf, np.uint8).reshape(height, width, 3)[:, x0 - left:x1 - left]
    return part, (box[0] - x0, box[1] - top, box[2] - x0, box[3] - top)


def _reach(box: tuple, size: int, w: int, h: int) -> tuple[int, int, int, int]:
    """The bounds in a ``w x h`` image of ``box`` and a margin of the resize's reach (its scale
    and 2 pixels)."""
    reach = math.ceil(max(box[2] - box[0], box[3] - box[1]) / size) + 2
    return (max(0, math.floor(box[0]) - reach), max(0, math.floor(box[1]) - reach),
            min(w, math.ceil(box[2]) + reach), min(h, math.ceil(box[3]) + reach))


def _around(pixels: np.ndarray, box: tuple, size: int, convert) -> tuple[np.ndarray, tuple]:
    """The part of ``pixels`` that holds ``box`` and a margin of the resize's reach (:func:`_reach`),
    converted by ``convert`` (an OpenCV colour conversion, or None); the box in it."""
    x0, y0, x1, y1 = _reach(box, size, pixels.shape[1], pixels.shape[0])
    part = pixels[y0:y1, x0:x1]
    if convert is not None:
        part = cv2.cvtColor(part, convert)
    return part, (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0)
