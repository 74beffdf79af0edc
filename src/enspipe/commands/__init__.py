"""The command line's subcommands, a module per concern; :mod:`enspipe.cli` gathers them."""
