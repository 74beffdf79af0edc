"""A user's own augmentation on the TF-free backend (``backend="pillow"``): a torchvision
``transforms.v2`` pipeline, a kornia one, or any callable, run on each decoded image in the
member's worker processes, seeded per sample.

* **What it gets.** A ``torch.nn.Module`` (a torchvision v2 pipeline, kornia's augmentations) gets
  the decoded image as a ``torch.uint8`` tensor ``(3, H, W)``, as ``torchvision.io.decode_image``
  gives it; any other callable gets a ``numpy.uint8`` array ``(H, W, 3)``, as Pillow, OpenCV and
  albumentations take it. It returns a tensor or array of one shape and dtype for every sample;
  that is what travels, stacked into batches.
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

MAX_PICKLE = 128 * 1024  # bytes: a pipeline travels to each worker in its first message


class PreprocessError(ValueError):
    """A user's preprocessing failed its probe (this module's, or the tf backend's in
    :mod:`enspipe.data.probe`): ``problem`` says how, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}; {fix}")


@dataclass(frozen=True)
class ArrayPreprocess:
    """A user's augmentation on decoded images (see the module's docstring), with the shape and
    dtype of its output, found by :func:`probe`."""

    fn: Callable
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def name(self) -> str:
        return name_of(self.fn)

    def worker_kwargs(self) -> dict:
        """What a worker needs to run it: the pickle, the script to run as ``__mp_main__`` and the
        member's import path."""
        main = getattr(sys.modules.get("__main__"), "__file__", None)
        return {"pickled": base64.b64encode(pickle.dumps(self.fn)).decode(), "main": main, "path": list(sys.path),
                "shape": list(self.shape), "dtype": str(self.dtype)}


def name_of(fn) -> str:
    kind = fn if callable(fn) and hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(fn))}"


def takes_tensor(fn) -> bool:
    """Whether ``fn`` is a torch module (it gets a ``(3, H, W)`` uint8 tensor, not an array)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(fn, torch.nn.Module)


def sample_seed(seed: int, position: int) -> int:
    """A sample's seed for the global generators: from Philox keyed by ``(seed, position)``, as the
    built-ins' draws are."""
    from enspipe.data.pixels import generator

    return int(generator(seed, position).integers(2 ** 32))


def apply(fn, image: np.ndarray, seed: int, tensor: bool) -> np.ndarray:
    """``fn`` on one decoded image (uint8, H x W x 3) with the generators seeded by ``seed``; its
    output as a numpy array."""
    if not image.flags.writeable:  # the decoder's buffer: the function may write to what it gets
        image = image.copy()
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    out = fn(torch.from_numpy(image).permute(2, 0, 1) if tensor else image)
    if torch is not None and isinstance(out, torch.Tensor):
        return out.detach().cpu().contiguous().numpy()
    return np.ascontiguousarray(out)


def probe(fn, m: Manifest, seed: int) -> ArrayPreprocess:
    """``fn`` tried on the dataset's first samples (the generators' states kept as they were);
    returns it with its output's shape and dtype, or raises :class:`PreprocessError` naming it."""
    from enspipe.data.decoding import decode
    from enspipe.data.parse import first_images

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
    tensor, outs = takes_tensor(fn), []
    with _generators_kept():
        for position, encoded in enumerate(first_images(m)):
            try:
                outs.append(apply(fn, decode(encoded), sample_seed(seed, position), tensor))
            except Exception as e:  # noqa: BLE001 - whatever the user's code raised, named
                given = "a uint8 tensor (3, H, W)" if tensor else "a uint8 array (H, W, 3)"
                raise PreprocessError(f"preprocess {name} failed on the dataset's sample {position}: "
                                     f"{type(e).__name__}: {e}", f"fix the function: it gets {given}") from None
    kinds = sorted({(tuple(x.shape), str(x.dtype)) for x in outs})
    if len(kinds) > 1:
        raise PreprocessError(f"preprocess {name} returned {kinds} for the dataset's first {len(outs)} samples",
                             "return one shape and dtype for every sample (resize or crop to a fixed size)")
    if outs[0].dtype.kind not in "biuf" or outs[0].ndim == 0:
        raise PreprocessError(f"preprocess {name} returned {outs[0].dtype} of shape {outs[0].shape}",
                             "return a numeric tensor or array per image")
    return ArrayPreprocess(fn, tuple(outs[0].shape), outs[0].dtype)


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
