"""One file of a user's image folder, judged by its content: included as an image the pipeline
decodes, or left out with a reason. Needs no TensorFlow (Pillow reads the files).

The format is the file's own signature, never its name: a PNG named ``.JPEG`` (ImageNet's
``n02105855_2933.JPEG``) is a PNG, a JPEG named ``.png`` is a JPEG. The pipeline decodes with
``tf.io.decode_image``, which reads JPEG (grayscale and CMYK too), PNG, GIF (the first frame), BMP
of 8, 24 or 32 bits per pixel, and WebP; those are :data:`DECODED`. Anything else that is an image
(TIFF, HEIF/AVIF, JPEG XL, ICO, BMP of 1 or 4 bits per pixel) is an ``unsupported_format``: convert
it to PNG or JPEG first.

``level``: ``"decode"`` decodes every image once (JPEGs at 1/8 scale, which still reads every
entropy-coded byte: a truncated or damaged file is found); ``"header"`` reads only what the
format's header says (its size), for a folder given directly to a run, where every member lists
it: an image damaged past its header is then found at training time, under ``--on-corrupt``.
"""
from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass

# every reason a file is left out, and what it means (skipped.csv and the manifest's counts use these)
SKIPPED = {
    "not_an_image": "its content is no image format",
    "undecodable": "an image whose data cannot be decoded (damaged or cut short)",
    "unsupported_format": "an image in a format the pipeline does not decode",
    "empty": "an empty file",
    "unreadable": "a file that cannot be read (permissions, I/O error)",
    "broken_symlink": "a symbolic link to nothing",
    "outside_class_folder": "an image at the top of a class-folder tree, in no class",
}
IGNORED = {
    "hidden": "a hidden file or folder (a name starting with '.')",
    "non_image": "a file of a known non-image kind (by its extension and content)",
}
DECODED = ("JPEG", "PNG", "GIF", "BMP", "WEBP")
NON_IMAGE_SUFFIXES = (".txt", ".csv", ".tsv", ".json", ".xml", ".md", ".rst", ".html", ".htm", ".pdf", ".db",
                      ".ini", ".log", ".yaml", ".yml", ".py", ".sh", ".tar", ".zip", ".gz", ".tgz", ".mat",
                      ".npy", ".npz", ".pkl", ".pickle", ".h5", ".lock")
_SIGNATURES = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
               (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"\xff\x0a", "JPEG XL"),
               (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"), (b"\x00\x00\x01\x00", "ICO"))
HEAD = 32  # bytes enough to tell every format above


@dataclass(frozen=True)
class Verdict:
    """What became of one file: ``reason`` None for an included image (then ``format``, ``width``
    and ``height`` are known), else a key of :data:`SKIPPED` or :data:`IGNORED` and ``detail``."""

    reason: str | None
    detail: str = ""
    format: str = ""
    width: int = 0
    height: int = 0

    @property
    def included(self) -> bool:
        return self.reason is None

    @property
    def ignored(self) -> bool:
        return self.reason in IGNORED


def sniff(head: bytes) -> str | None:
    """The image format ``head`` (a file's first :data:`HEAD` bytes) begins, or None."""
    for magic, name in _SIGNATURES:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    if head[4:8] == b"ftyp" and head[8:12] in (b"heic", b"heix", b"mif1", b"msf1", b"avif", b"avis"):
        return "HEIF/AVIF"
    return None


def hidden(name: str) -> bool:
    return name.startswith(".")


def judge_file(path: str, level: str = "decode") -> Verdict:
    """The verdict on the file at ``path`` (see the module's docstring); never raises for the
    file's own faults."""
    return read_image(path, level)[0]


def read_image(path: str, level: str = "decode") -> tuple[Verdict, bytes]:
    """The verdict on the file at ``path`` and the bytes read (the whole file at level ``decode``)."""
    if os.path.islink(path) and not os.path.exists(path):
        return Verdict("broken_symlink", f"points to {os.readlink(path)}"), b""
    try:
        with open(path, "rb") as f:
            data = f.read() if level == "decode" else f.read(64 * 1024)
    except OSError as e:
        return Verdict("unreadable", e.strerror or type(e).__name__), b""
    return judge_bytes(data, os.path.basename(path), level), data


def judge_bytes(data: bytes, name: str, level: str = "decode") -> Verdict:
    """The verdict on a file's content ``data`` (its whole content at level ``decode``; at least
    its first 64 KiB at level ``header``) named ``name``."""
    if not data:
        return Verdict("empty")
    fmt = sniff(data[:HEAD])
    if fmt is None:
        if name.lower().endswith(NON_IMAGE_SUFFIXES):
            return Verdict("non_image", os.path.splitext(name)[1])
        return Verdict("not_an_image", f"begins {data[:8].hex()}")
    if fmt not in DECODED:
        return Verdict("unsupported_format", f"{fmt}; convert it to PNG or JPEG")
    if fmt == "BMP":
        problem = _bmp_problem(data)
        if problem:
            return Verdict("unsupported_format", problem)
    return _decoded(data, fmt, level)


def _bmp_problem(data: bytes) -> str | None:
    """Why TensorFlow's BMP decoder cannot read this BMP (it reads 8, 24 and 32 bits per pixel)."""
    if len(data) < 30:
        return None  # too short to say: the decode check names it
    bits = struct.unpack("<H", data[28:30])[0]
    return None if bits in (8, 24, 32) else f"BMP of {bits} bits per pixel (8, 24 or 32 are decoded); convert it to PNG"


def _decoded(data: bytes, fmt: str, level: str) -> Verdict:
    """Pillow opens the image (its header: the size) and, at level ``decode``, decodes it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
            if level == "decode":
                if fmt == "JPEG":
                    im.draft("RGB", (max(1, width // 8), max(1, height // 8)))  # every byte read, 1/64 the pixels
                im.load()
    except UnidentifiedImageError:
        return Verdict("undecodable", f"{fmt}: its header cannot be read")
    except (OSError, ValueError, SyntaxError, struct.error) as e:
        return Verdict("undecodable", f"{fmt}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    except Image.DecompressionBombError as e:
        return Verdict("undecodable", f"{fmt}: {e}")
    if width < 1 or height < 1:
        return Verdict("undecodable", f"{fmt} of {width}x{height} pixels")
    return Verdict(None, format=fmt, width=width, height=height)
