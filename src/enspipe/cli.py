"""enspipe: train DNN ensembles that share one preprocessed input stream; a subcommand per step.

Each subcommand is one entry of :data:`COMMANDS` (declared in :mod:`enspipe.commands`, a module
per group): its help, the function that declares its arguments and the function that runs it.
Arguments are validated before any MPI or TensorFlow work: a bad one exits 2 with a message that
names the option and the fix.
"""
from __future__ import annotations

import argparse
import sys

from enspipe.commands.base import Command
from enspipe.commands.cells import CELL_COMMANDS
from enspipe.commands.data import DATA_COMMANDS
from enspipe.commands.measure import MEASURE_COMMANDS
from enspipe.commands.plan import PLAN_COMMANDS
from enspipe.commands.serve import SERVE_COMMANDS

# in the order `enspipe --help` lists them
COMMANDS: dict[str, Command] = {**DATA_COMMANDS, **SERVE_COMMANDS, **CELL_COMMANDS, **MEASURE_COMMANDS,
                                **PLAN_COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="enspipe", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, c in COMMANDS.items():
        c.declare(sub.add_parser(name, help=c.help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
                                 if c.show_defaults else argparse.HelpFormatter))
    return p


def main(argv: list[str] | None = None) -> int:
    from enspipe.common import spelling

    spelling.command_line()  # this process's messages name flags, not keywords
    parser = build_parser()
    a = parser.parse_args(argv)
    return COMMANDS[a.command].run(a, parser.error)


if __name__ == "__main__":
    sys.exit(main())
