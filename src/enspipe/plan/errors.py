"""The one error every invalid option or config value raises, before any MPI or TensorFlow work."""
from __future__ import annotations

from enspipe.common import spelling


class ConfigError(ValueError):
    """A configuration value is invalid. ``field`` is the option's name, ``fix`` says what to do.
    Its message names the option as the caller spells it (:mod:`enspipe.common.spelling`):
    ``--wire-dtype: ...`` from the command line, ``wire_dtype=: ...`` from Python."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(field, problem, fix)

    def __str__(self) -> str:
        return f"{spelling.field(self.field)}: {self.problem}; {self.fix}"


def require(ok: bool, field_name: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field_name, problem, fix)


def unknown_keywords(given, known, where: str, aliases: dict | None = None) -> None:
    """Raise :class:`ConfigError` for the first name in ``given`` that is not in ``known``, listing
    the valid names and suggesting the nearest (``aliases``: another library's name for one of
    ours, e.g. a DataLoader's ``num_workers`` for ``threads``)."""
    import difflib

    known = sorted(known)
    for name in given:
        if name in known:
            continue
        near = (aliases or {}).get(name) or next(iter(difflib.get_close_matches(name, known, 1, 0.6)), None)
        hint = f"did you mean {near}=? " if near else ""
        raise ConfigError(name, f"{where} takes no keyword {name!r}", f"{hint}its keywords are {', '.join(known)}")
