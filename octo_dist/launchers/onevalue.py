"""One value per flag: an argparse action for every octo-dist option that takes one value.

argparse keeps a repeated flag's last value without a word: ``octo-dist smoke --init-timeout 10 --init-timeout 20``
waited 20 s, ``launch --nodes 2 ... --nodes 4`` ran on 4 nodes. :class:`OneValue` refuses the second, different
value in one line (exit 2, through ``parser.error``); the same value twice (``--steps 3 --steps=3``) is one value.

It lives in ``launchers/``, the lowest layer the command lines of the runtime (its start-up flags), ``jobs/``
(launch) and the applications may all import. Standard library only: launch runs on a login node's bare Python.
"""

from __future__ import annotations

import argparse

from octo_dist import problems
from octo_dist.launchers import outside

# A value as a refusal shows it: escaped and cut (a --save-dir of 5,000 characters is not echoed whole).
SHOWN_VALUE_CHARS = 80


def refusal(first: tuple, second: tuple) -> str:
    """The one line for a setting given twice: ``(("--init-timeout", 10.0), ("--init-timeout", 20.0))`` ->
    ``"--init-timeout 10.0 and --init-timeout 20.0 set the same flag twice; expected one value. Fix: keep one of
    them (--init-timeout 10.0, or --init-timeout 20.0)"``. Each pair is (the flag as given, its parsed value); a
    flag given without one (absl's ``--debug``: ``""``) is shown alone."""
    one, other = (
        f"{flag} {outside.shown(str(value), SHOWN_VALUE_CHARS)}".rstrip()
        for flag, value in (first, second)
    )
    return problems.line(
        f"{one} and {other} set the same flag twice",
        "one value",
        f"keep one of them ({one}, or {other})",
    )


class OneValue(argparse.Action):
    """Stores an option's one value; a second, different value is refused with :func:`refusal`'s line (the flag as
    it was given first, then the second). Two spellings of one option count as the same flag."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "given." + self.dest, None)
        if given is not None and given[1] != values:
            parser.error(refusal(given, (option_string, values)))
        setattr(namespace, "given." + self.dest, (option_string, values))
        setattr(namespace, self.dest, values)
