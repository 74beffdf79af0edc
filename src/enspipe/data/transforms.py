"""A user's own augmentation on the TF-free backend (``backend="pillow"``): a torchvision
``transforms.v2`` pipeline, a kornia one, or any callable, run on each decoded image in the
member's worker processes, seeded per sample.

* **What it gets**, by what the pipeline is (:func:`input_kind`), never by trying: a torchvision
  v1 pipeline (a ``transforms.Compose`` of PIL transforms, ``ToTensor``, ``Normalize``) gets a PIL
  image, as ``ImageFolder`` gives it (one that starts with ``ToPILImage`` gets the array that
  takes); any other ``torch.nn.Module`` (a torchvision v2 pipeline, kornia's augmentations) gets
  a ``torch.uint8`` tensor ``(3, H, W)``, as ``torchvision.io.decode_image`` gives it; any other
  callable gets a ``numpy.uint8`` array ``(H, W, 3)``, as Pillow, OpenCV and albumentations take
  it. It returns a tensor, array or PIL image of one shape and dtype for every sample; that is
  what travels, stacked into batches.
* **Its layout** is read from what it returns (:func:`sample_layout`): ``(C, H, W)`` is
  channels-first, ``(H, W, C)`` channels-last (C at most 4, the sides larger), so
  ``stream.torch(layout=...)`` can yield what is asked; an image whose channel axis cannot be
  told apart is refused before any work. A sample that is not 3-D has no layout.
* **Seeded per sample.** Before each image, Python's, numpy's and torch's global generators are
  seeded from ``(seed, stream position)``, so a sample is augmented the same on any member, any
  number of members and any run. The function runs only in worker processes (one per core of
  the member, at least one), so seeding them never touches the training loop's generators.
* **How it reaches the workers.** Pickled, as PyTorch's ``DataLoader`` sends a dataset to spawned
  workers: a pipeline object, or a function defined at a module's top level. One defined in the
  script itself is found by running the script as ``__mp_main__`` in the worker, so its top
  level must be guarded by ``if __name__ == "__main__":`` (as ``DataLoader`` under spawn asks).
* **Tried first.** :func:`probe` runs it on the dataset's first samples before any member starts
  (the generators' states restored after): one that raises, cannot be pickled, or returns
  changing shapes is named in a :class:`PreprocessError`.
"""
from __future__ import annotations

import base64
import pickle
import random
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from enspipe.data.manifest import Manifest
from enspipe.data.parse import first_keyed

MAX_PICKLE = 128 * 1024  # bytes: a pipeline travels to each worker in its first message


class PreprocessError(ValueError):
    """A user's preprocessing failed its probe (this module's, or the tf backend's in
    :mod:`enspipe.data.probe`): ``problem`` says how, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}; {fix}")


@dataclass(frozen=True)
class ArrayPreprocess:
    """A user's augmentation on decoded images (see the module's docstring), with the shape, dtype
    and layout of its output and what it is given, found by :func:`probe`."""

    fn: Callable
    shape: tuple[int, ...]
    dtype: np.dtype
    layout: str | None = "HWC"
    given: str = "array"

    @property
    def name(self) -> str:
        return name_of(self.fn)

    def worker_kwargs(self) -> dict:
        """What a worker needs to run it: the pickle, the script to run as ``__mp_main__`` and the
        member's import path."""
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        return {"pickled": base64.b64encode(pickle.dumps(self.fn)).decode(), "main": main, "path": list(sys.path),
                "shape": list(self.shape), "dtype": str(self.dtype), "given": self.given}


def name_of(fn) -> str:
    kind = fn if callable(fn) and hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(fn))}"


INPUTS = {"pil": "a PIL image (RGB)", "tensor": "a uint8 tensor (3, H, W)", "array": "a uint8 array (H, W, 3)"}
V1 = "torchvision.transforms.transforms"  # torchvision's v1 transforms' module (v2's: torchvision.transforms.v2)


def input_kind(fn) -> str:
    """What ``fn`` is given (:data:`INPUTS`), by what it is: ``pil`` for a torchvision v1 transform
    or ``Compose`` (one starting with ``ToPILImage``: ``array``, what that takes), ``tensor`` for
    any other torch module (torchvision v2, kornia), ``array`` for any other callable."""
    first = fn
    while type(first).__module__ == V1 and type(first).__name__ in ("Compose", "RandomOrder", "RandomChoice",
                                                                      "RandomApply") and first.transforms:
        first = first.transforms[0]
    if type(first).__module__ == V1:
        return "array" if type(first).__name__ == "ToPILImage" else "pil"
    torch = sys.modules.get("torch")
    return "tensor" if torch is not None and isinstance(fn, torch.nn.Module) else "array"


def is_torch_pipeline(fn) -> bool:
    """Whether ``fn`` is a torch pipeline (torchvision's v1 or v2, kornia's): it runs on decoded
    images in worker processes, never in a tf.data graph."""
    return input_kind(fn) != "array" or type(fn).__module__.startswith(("torchvision.", "kornia."))


def sample_layout(shape: tuple[int, ...]) -> str | None:
    """``CHW`` or ``HWC`` for a 3-D sample whose channel axis is first or last (at most 4 channels,
    the other two sides larger), None for a sample that is not 3-D; raises :class:`PreprocessError`
    for a 3-D one whose channel axis cannot be told apart."""
    if len(shape) != 3:
        return None
    first, last = shape[0] <= 4 < min(shape[1:]), shape[2] <= 4 < min(shape[:2])
    if first != last:
        return "CHW" if first else "HWC"
    raise PreprocessError(f"its output of shape {tuple(shape)} has no channel axis that can be told apart (first "
                          "or last, at most 4 channels, both sides larger)", "return (C, H, W) as torchvision does "
                          "or (H, W, C) as numpy does, with sides over 4 pixels")


def sample_seed(seed: int, position: int) -> int:
    """A sample's seed for the global generators: from Philox keyed by ``(seed, position)``, as the
    built-ins' draws are."""
    from enspipe.data.pixels import generator

    return int(generator(seed, position).integers(2 ** 32))


def given(image: np.ndarray, kind: str):
    """A decoded image (uint8, H x W x 3) as a pipeline of ``kind`` takes it (:data:`INPUTS`)."""
    if kind == "pil":
        from PIL import Image

        return Image.fromarray(image, "RGB")
    if kind == "tensor":
        return sys.modules["torch"].from_numpy(image).permute(2, 0, 1)
    return image


def apply(fn, image: np.ndarray, seed: int, kind: str) -> np.ndarray:
    """``fn`` on one decoded image (uint8, H x W x 3), given as ``kind`` takes it, with the
    generators seeded by ``seed``; its output as a numpy array."""
    if not image.flags.writeable:  # the decoder's buffer: the function may write to what it gets
        image = image.copy()
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    out = fn(given(image, kind))
    if torch is not None and isinstance(out, torch.Tensor):
        return out.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(out)  # an array, or a PIL image (H, W[, C])


def probe(fn, m: Manifest, seed: int) -> ArrayPreprocess:
    """``fn`` tried on the dataset's first samples (the generators' states kept as they were);
    returns it with its output's shape, dtype and layout, or raises :class:`PreprocessError` naming
    it, and the sample and its file where it failed there."""
    from enspipe.data.decoding import decode

    name = name_of(fn)
    try:
        pickled = pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - pickle raises several kinds
        raise PreprocessError(f"preprocess {name} cannot be sent to the worker processes ({type(e).__name__}: {e})",
                             "define it at a module's top level (not a lambda or a nested function), or pass a "
                             "transforms pipeline object") from None
    if len(pickled) > MAX_PICKLE:
        raise PreprocessError(f"preprocess {name} pickles to {len(pickled)} bytes, more than {MAX_PICKLE}",
                             "keep large tables out of it: load them in the function from a file")
    kind, outs = input_kind(fn), []
    with _generators_kept():
        for position, (key, encoded) in enumerate(first_keyed(m)):
            try:
                outs.append(apply(fn, decode(encoded), sample_seed(seed, position), kind))
            except Exception as e:  # noqa: BLE001 - whatever the user's code raised, named
                raise PreprocessError(f"preprocess {name} failed on the dataset's sample {position} ({key}): "
                                     f"{type(e).__name__}: {e}", f"fix the function: it gets {INPUTS[kind]}") from None
    kinds = sorted({(tuple(x.shape), str(x.dtype)) for x in outs})
    if len(kinds) > 1:
        raise PreprocessError(f"preprocess {name} returned {kinds} for the dataset's first {len(outs)} samples",
                             "return one shape and dtype for every sample (resize or crop to a fixed size)")
    if outs[0].dtype.kind not in "biuf" or outs[0].ndim == 0 or outs[0].size == 0:
        raise PreprocessError(f"preprocess {name} returned {outs[0].dtype} of shape {outs[0].shape}",
                             "return a numeric tensor or array per image")
    try:
        layout = sample_layout(outs[0].shape)
    except PreprocessError as e:
        raise PreprocessError(f"preprocess {name}: {e.problem}", e.fix) from None
    return ArrayPreprocess(fn, tuple(outs[0].shape), outs[0].dtype, layout, kind)


def layout_of(preprocessing) -> str | None:
    """The layout of one sample (:func:`sample_layout`): a built-in's is ``HWC``."""
    return "HWC" if isinstance(preprocessing, str) else getattr(preprocessing, "layout", None)


class _generators_kept:
    """Python's, numpy's and torch's global generator states, restored on exit."""

    def __enter__(self):
        torch = sys.modules.get("torch")
        self.states = random.getstate(), np.random.get_state(), torch.random.get_rng_state() if torch else None
        return self

    def __exit__(self, *exc) -> None:
        random.setstate(self.states[0])
        np.random.set_state(self.states[1])
        if self.states[2] is not None:
            sys.modules["torch"].random.set_rng_state(self.states[2])


def load(kwargs: dict) -> Callable:
    """In a worker: the user's function from :meth:`ArrayPreprocess.worker_kwargs` (the member's
    import path first, its script run as ``__mp_main__`` where the pickle refers to it)."""
    for entry in reversed(kwargs["path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    pickled = base64.b64decode(kwargs["pickled"])
    if b"__main__" in pickled and kwargs.get("main"):
        import runpy

        main = sys.modules["__main__"]
        module = type(sys)("__mp_main__")
        module.__dict__.update(runpy.run_path(kwargs["main"], run_name="__mp_main__"))
        sys.modules["__mp_main__"] = sys.modules["__main__"] = module
        try:
            return pickle.loads(pickled)
        finally:
            sys.modules["__main__"] = main
    return pickle.loads(pickled)
