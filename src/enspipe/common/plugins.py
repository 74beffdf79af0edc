"""A user's function named as ``package.module:function`` (a model factory, a record parser),
imported where it is used: one pattern and one import for every such name."""
from __future__ import annotations

import importlib
import re
from typing import Callable

FUNCTION_NAME = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # package.module:function


class NotLoadable(ValueError):
    """``spec`` names no function that can be had: ``problem`` says why, ``fix`` what to do."""

    def __init__(self, problem: str, fix: str):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem}; {fix}")


def load_function(spec: str, what: str) -> Callable:
    """The function ``spec`` (``package.module:function``) names, imported now; ``what`` names its
    role in the messages (e.g. ``network``). Raises :class:`NotLoadable`."""
    if not isinstance(spec, str) or not FUNCTION_NAME.match(spec):
        raise NotLoadable(f"{what} {spec!r} is not package.module:function", "name your function so")
    module, function = spec.split(":")
    try:
        fn = getattr(importlib.import_module(module), function)
    except ImportError as e:
        raise NotLoadable(f"{what} {spec}: cannot import {module} ({e})",
                          "put its folder on PYTHONPATH, or install it") from None
    except AttributeError:
        raise NotLoadable(f"{what} {spec}: {module} has no {function}", "name a function the module defines") from None
    if not callable(fn):
        raise NotLoadable(f"{what} {spec}: {function} is a {type(fn).__name__}, not a function", "name a function")
    return fn
