"""How an ``octo-dist`` subcommand's parser is made, the same way for each (``cli.SUBCOMMANDS`` lists them).

A subcommand's module gives its line in ``octo-dist --help``, its own docstring (what ``octo-dist COMMAND --help``
shows above the flags, as written: its examples are indented command lines) and the function the command runs::

    def add_parser(sub):
        p = subcommand.parser(sub, "env", HELP, __doc__, main)   # HELP: "a report of this environment ..."
        p.add_argument("--json", action="store_true", help="machine-readable output (default: text)")
        return p

so the command is described once, in its module's docstring, and not again in a description string beside it.
Standard library only: ``octo-dist launch`` and ``octo-dist jobs`` run on a login node's bare Python.
"""

from __future__ import annotations

import argparse
from typing import Callable, Optional


def parser(sub, name: str, help: str, doc: Optional[str], run: Callable) -> argparse.ArgumentParser:
    """``octo-dist NAME``'s parser, added to ``sub`` (the ``add_subparsers()`` of ``octo-dist``): ``help`` is its
    line in ``octo-dist --help``, ``doc`` (its module's ``__doc__``) its description, ``run(args)`` what it runs."""
    p = sub.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.set_defaults(func=run)
    return p
