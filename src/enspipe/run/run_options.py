"""``enspipe run``'s command line, built from :class:`enspipe.run.config.RunConfig`'s option
fields: one argument group per concern, and the checked config of a parsed command line.

Example::

    parser = argparse.ArgumentParser()
    add_options(parser)
    cfg = from_options(parser.parse_args(["--data", "d", "--out", "o"]))   # checked: files and machine
"""
from __future__ import annotations

import argparse
import dataclasses

from enspipe.run.concerns import CONCERNS
from enspipe.run.config import RunConfig
from enspipe.plan.errors import ConfigError
from enspipe.plan.options import choices_of

REQUIRED = ("data", "out")


def option_fields(only: tuple[str, ...] | None = None) -> list[dataclasses.Field]:
    """Every option field, RunConfig's own first, then each concern's in :data:`CONCERNS` order (or those of
    the concerns named in ``only``)."""
    groups = [RunConfig, *CONCERNS.values()] if only is None else [CONCERNS[c] for c in only]
    return [f for g in groups for f in dataclasses.fields(g) if "option" in f.metadata]


def default(name: str):
    """A run option's default, for whoever must spell it out (the grid's arguments, the schema test)."""
    return next(f.default for f in option_fields() if f.name == name)


def add_options(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Declare :class:`RunConfig`'s options on ``parser`` (or only those of the concerns named in
    ``only``), one argument group per concern; each lands on the namespace under its field's name."""
    groups = [(None, RunConfig)] * (only is None) + [(c, CONCERNS[c]) for c in (only or CONCERNS)]
    for name, config in groups:
        doc = (config.__doc__ or "").strip().split("\n")[0]
        target = parser if name is None else parser.add_argument_group(name, doc)
        for f in dataclasses.fields(config):
            if "option" in f.metadata:
                _add_option(target, f)


def _add_option(parser, f: dataclasses.Field) -> None:
    o = f.metadata["option"]
    flag = o["flag"] or "--" + f.name.replace("_", "-")
    kw = {"dest": f.name, "help": o["help"]}
    if isinstance(f.default, bool):
        kw["action"] = "store_false" if f.default else "store_true"
    else:
        choices = choices_of(f)
        kw.update(default=f.default, type=o["parse"], choices=list(choices) if choices else None,
                  metavar=o["metavar"], required=f.name in REQUIRED)
    parser.add_argument(flag, **kw)


def from_options(namespace, **overrides) -> RunConfig:
    """The validated and checked config of a parsed command line (``overrides`` win: e.g. a rate read
    from a file)."""
    values = {f.name: getattr(namespace, f.name) for f in option_fields() if hasattr(namespace, f.name)}
    cfg = RunConfig.of(**{**values, **overrides})
    cfg.check()
    return cfg


def parse_run_args(argv: list[str]) -> RunConfig:
    """The validated config of ``enspipe run``'s options (``argv`` without the ``run`` itself), for
    a caller that starts a cell inside its own job (``enspipe ensemble --in-job``); raises
    :class:`ConfigError`, and on an argument that does not parse, :class:`ConfigError` too."""

    parser = raising_parser("fix the round's enspipe run options")
    add_options(parser)
    return from_options(parser.parse_args(argv))


def raising_parser(fix: str) -> argparse.ArgumentParser:
    """An ``enspipe run`` parser for options given in a file or a plan rather than typed: an
    argument that does not parse raises :class:`ConfigError` (with ``fix``) instead of exiting."""

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise ConfigError("run", message, fix)

    return Parser(prog="enspipe run", add_help=False)
