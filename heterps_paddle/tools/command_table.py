"""A table of subcommands: name -> (module, one-line help), each module exposing ``add_arguments(parser)`` and
``run(args) -> int``.  ``heterps`` (tools/cli.py) and ``heterps bench`` (tools/bench/) both build their subcommands
from one, here, so that neither imports the other's module to do it: the CLI imports its subcommand modules by name
(``heterps bench`` among them), and a subcommand importing the CLI back would close a circle no import linter sees.
"""

from __future__ import annotations

import argparse
import importlib


def add_command_table(
    parser: argparse.ArgumentParser, table: dict[str, tuple[str, str]], dest: str, run_key: str
) -> None:
    """One subcommand per entry of ``table`` (name -> (module, help)); the chosen module's ``run`` is stored
    in ``args.<run_key>``.  Used for ``heterps`` itself and for ``heterps bench``."""
    sub = parser.add_subparsers(dest=dest, metavar=dest.upper())
    sub.required = True
    for name, (module_name, help_text) in table.items():
        module = importlib.import_module(module_name)
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(**{run_key: module.run})
