"""The command line's building blocks for configs: a dataclass field that is also an option
(:func:`option`), the parsers that turn an option's text into its value, and the checks of names
and paths that several configs share."""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import field

from enspipe.plan.errors import require

MAX_SAMPLE_INTERVAL = 60.0  # seconds


def rank_factor(s: str) -> tuple[int, float]:
    """``RANK:FACTOR``: member RANK's emulated accelerator runs FACTOR times slower."""
    try:
        rank, factor = s.split(":")
        return int(rank), float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:FACTOR (e.g. 1:3), got {s!r}") from None



_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text) -> int:
    """Bytes of a size such as ``8GB``, ``512MiB``, ``1.5G``, ``1000000`` or ``0`` (off); raises
    ``ValueError`` naming what it takes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"{text} is negative: give a size such as 8GB, or 0 (off)")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?I?B?)\s*", str(text).upper())
    unit = "B" if m and not m.group(2) else m and (m.group(2) if m.group(2).endswith("B") else m.group(2) + "B")
    if not m or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write e.g. 8GB, 512MB, 2GiB or 0 (off)")
    return int(float(m.group(1)) * _UNITS[unit])


def size_bytes(s: str) -> int:
    """An option's size in bytes (:func:`parse_size`)."""
    try:
        return parse_size(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_int(s: str) -> int:
    """An option's integer >= 0 (the config's checks set each one's own lower bound)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v}")
    return v


def numbers(s: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def counts(s: str) -> tuple[int, ...]:
    """Comma-separated integers >= 0 (``2`` or ``1,2,1``; the config's checks set the bound)."""
    return tuple(positive_int(x) for x in s.split(","))


def names(s: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in s.split(",") if x.strip())


def option(default, help: str, *, parse=None, choices=None, flag: str | None = None, metavar: str | None = None):
    """A config field that is also an ``enspipe run`` option: its default, its help,
    how the command line's text becomes its value (``parse``; booleans are switches) and its
    choices (a tuple, or a function returning one, read when the parser is built). ``flag``
    overrides ``--field-name`` (``--no-node-shm`` turns ``node_shm`` off)."""
    meta = {"help": help, "parse": parse, "choices": choices, "flag": flag, "metavar": metavar}
    return field(default=default, metadata={"option": meta})


def network_problem(name: str) -> tuple[str, str] | None:
    """Why ``name`` is neither a registered network nor an importable ``package.module:function``
    factory (``(problem, fix)``), or None."""
    from enspipe.models.networks import NetworkError, network_spec

    try:
        network_spec(name)
    except NetworkError as e:
        return e.problem, e.fix
    return None


def network_name(s: str) -> str:
    """An argparse type: a registered network or an importable factory (exit 2 naming why not)."""
    problem = network_problem(s)
    if problem:
        raise argparse.ArgumentTypeError("; ".join(problem))
    return s


def plain_name(name: str) -> bool:
    """Whether ``name`` may name a member's directory: letters, digits, '-', '_' and '.' only."""
    return name.replace("-", "").replace("_", "").replace(".", "").isalnum()


def unwritable(path: str) -> str | None:
    """Why the output directory ``path`` could not be created or written (None: it can), without
    creating anything: an existing directory must be writable, an existing file is refused, and a
    new directory's nearest existing ancestor must be a writable directory."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            return f"{path!r} exists and is not a directory"
        return None if os.access(path, os.W_OK | os.X_OK) else f"{path!r} is not writable"
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"{parent!r}, on the way to {path!r}, is not a directory"
    return None if os.access(parent, os.W_OK | os.X_OK) else f"{path!r} cannot be created: {parent!r} is not writable"


def choices_of(f: dataclasses.Field) -> tuple | None:
    """An option field's choices (None: any value its parser gives)."""
    choices = f.metadata["option"]["choices"]
    return tuple(choices() if callable(choices) else choices) if choices else None


def check_choices(config) -> None:
    """Every option of ``config`` (a dataclass) that has choices holds one of them: one check, one message."""
    for f in dataclasses.fields(config):
        if "option" in f.metadata:
            choices, value = choices_of(f), getattr(config, f.name)
            require(choices is None or value in choices, f.name, f"unknown {f.name.replace('_', ' ')} {value!r}",
                    f"choose one of {', '.join(choices or ())}")
