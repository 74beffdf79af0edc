"""The one error every invalid option or config value raises, before any MPI or TensorFlow work."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid. ``field`` is the option's name, ``fix`` says what to do."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"--{field.replace('_', '-')}: {problem}; {fix}")


def require(ok: bool, field_name: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(field_name, problem, fix)
