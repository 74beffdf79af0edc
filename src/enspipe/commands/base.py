"""What every subcommand is: its help, the function that declares its arguments and the one that
runs it; arguments are checked before any MPI or TensorFlow work (a bad one exits 2)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

Fail = Callable[[str], None]  # the parser's error(): prints the message and exits 2


@dataclass(frozen=True)
class Command:
    help: str
    declare: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, Fail], int]
    show_defaults: bool = False


def say(msg: str) -> None:
    print(f"enspipe: {msg}", flush=True)
