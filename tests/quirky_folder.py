"""A folder of class folders with the kinds of files real collections hold (ImageNet's own quirks
among them), made with Pillow, and the verdict each file must get."""
from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image


def _photo(h: int, w: int, seed: int) -> Image.Image:
    """A smooth image (JPEG-like content), h x w."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * (i + 1) + y * (3 - i)) % 256 for i in range(3)], -1)
    return Image.fromarray((base + rng.integers(0, 20, (h, w, 3))).clip(0, 255).astype(np.uint8))


def _encoded(img: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


# file -> (its content, the verdict: None included, else the reason; at level "header" where it differs)
def quirky_files() -> dict[str, tuple[bytes | None, str | None, str | None]]:
    rgb = _photo(300, 400, 1)
    jpeg = _encoded(rgb, "JPEG", quality=90)
    files = {
        "cat/plain.jpg": (jpeg, None),
        "cat/gray.JPEG": (_encoded(rgb.convert("L"), "JPEG"), None),
        "cat/cmyk.jpg": (_encoded(rgb.convert("CMYK"), "JPEG"), None),
        "cat/progressive.jpg": (_encoded(rgb, "JPEG", progressive=True), None),
        "cat/444.jpg": (_encoded(rgb, "JPEG", subsampling=0), None),
        "cat/tiny.jpg": (_encoded(_photo(17, 23, 2), "JPEG"), None),
        "cat/wide.jpg": (_encoded(_photo(40, 1200, 3), "JPEG"), None),
        "cat/with space (1).jpg": (_encoded(_photo(64, 48, 4), "JPEG"), None),
        "cat/n02105855_2933.JPEG": (_encoded(_photo(90, 120, 5), "PNG"), None),  # ImageNet's PNG named .JPEG
        "cat/jpeg_named.png": (_encoded(_photo(50, 70, 6), "JPEG"), None),
        "cat/nested/deeper.jpg": (_encoded(_photo(60, 60, 7), "JPEG"), None),
        "dog/rgba.png": (_encoded(_photo(80, 60, 8).convert("RGBA"), "PNG"), None),
        "dog/gray.png": (_encoded(_photo(80, 60, 9).convert("L"), "PNG"), None),
        "dog/palette.gif": (_encoded(_photo(70, 50, 10).convert("P"), "GIF"), None),
        "dog/anim.gif": (_animated(), None),
        "dog/bitmap.bmp": (_encoded(_photo(30, 40, 11), "BMP"), None),
        "dog/photo.webp": (_encoded(_photo(64, 64, 12), "WEBP"), None),
        "dog/one_bit.bmp": (_encoded(_photo(30, 40, 13).convert("1"), "BMP"), "unsupported_format"),
        "dog/scan.tiff": (_encoded(_photo(30, 40, 14), "TIFF"), "unsupported_format"),
        "dog/truncated.jpg": (jpeg[: len(jpeg) // 2], "undecodable", None),  # found at training by a header check
        "dog/garbage.jpg": (b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8, "undecodable"),
        "dog/empty.jpg": (b"", "empty"),
        "dog/readme": (b"these are dogs\n", "not_an_image"),
        "dog/notes.txt": (b"labels by hand\n", "non_image"),
        "dog/.DS_Store": (b"\x00\x00\x00\x01Bud1", "hidden"),
        "dog/broken.jpg": (None, "broken_symlink"),
        "éléphant/photo.jpg": (_encoded(_photo(120, 90, 15), "JPEG"), None),
        "README.txt": (b"a quirky folder\n", "non_image"),
        "stray.jpg": (_encoded(_photo(30, 30, 16), "JPEG"), "outside_class_folder"),
    }
    return {k: (v[0], v[1], v[2] if len(v) > 2 else v[1]) for k, v in files.items()}


def _animated() -> bytes:
    frames = [_photo(40, 40, 20 + i).convert("P") for i in range(2)]
    b = io.BytesIO()
    frames[0].save(b, "GIF", save_all=True, append_images=frames[1:], duration=100)
    return b.getvalue()


def make_quirky_folder(root: str) -> dict[str, tuple[str | None, str | None]]:
    """Write the folder; returns each file's expected verdict ``(at decode, at header)``."""
    expected = {}
    for rel, (data, verdict, at_header) in quirky_files().items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if data is None:
            os.symlink(os.path.join(root, "no-such-file.jpg"), path)
        else:
            with open(path, "wb") as f:
                f.write(data)
        expected[rel] = (verdict, at_header)
    return expected
