"""How an option is spelled to whoever set it: a keyword to a Python caller (``preprocess=``,
``skip_corrupt=True``), a flag on the command line (``--preprocess``, ``--on-corrupt skip``).

The library speaks Python by default; the ``enspipe`` command switches its process to flags
(:func:`command_line`) before it parses anything, so a message made deep in the engine names the
option as its reader typed it.
"""
from __future__ import annotations

# (keyword, value) -> how the command line says the same, where it is not --the-field-name VALUE
FLAGS = {("skip_corrupt", True): "--on-corrupt skip", ("skip_corrupt", False): "--on-corrupt fail"}
KEYWORDS = {("skip_corrupt", True): "skip_corrupt=True", ("skip_corrupt", False): "skip_corrupt=False"}

_mode = {"flags": False}


def command_line() -> None:
    """This process was started as the ``enspipe`` command: its messages name flags."""
    _mode["flags"] = True


def flags() -> bool:
    return _mode["flags"]


def field(name: str) -> str:
    """An option's name as its caller spells it: ``--wire-dtype`` or ``wire_dtype=``; a call
    (``attach()``) as it is."""
    if name.endswith("()"):
        return name
    return f"--{name.replace('_', '-')}" if flags() else f"{name}="


def option(name: str, value) -> str:
    """An option given a value, as its caller would write it: ``--on-corrupt skip`` or
    ``skip_corrupt=True``; ``--image-size 64`` or ``image_size=64``."""
    table = FLAGS if flags() else KEYWORDS
    if (name, value) in table:
        return table[(name, value)]
    return f"--{name.replace('_', '-')} {value}" if flags() else f"{name}={value!r}"


def skip_hint() -> str:
    """What makes a corrupt record or undecodable image skipped and counted instead of fatal."""
    return f"pass {option('skip_corrupt', True)} to skip and count it"
