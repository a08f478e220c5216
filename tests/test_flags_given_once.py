"""Every single-valued flag of every `octo-dist` subcommand given twice with two values is refused in one line
(exit 2), where argparse kept the last without a word (`bench-input D --cores 2 --cores 4` ran on 4 cores,
`detect --launcher openmpi --launcher slurm` detected Slurm); flags that add up still add up. Read from the real
parsers (`octo-dist --help`'s), each flag given the values its choices or a number allow."""

import argparse
import contextlib
import io

import pytest

from octo_dist import cli
from octo_dist.launchers.onevalue import OneValue

REFUSED = "set the same flag twice; expected one value. Fix: keep one of them"


def _parsers(parser, path):
    """(the words that reach it, the parser) for the top-level parser and every subcommand's, nested ones too."""
    yield path, parser
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    for name, inner in (sub.choices if sub else {}).items():
        yield from _parsers(inner, [*path, name])


def _single_valued():
    """(words before the flag, the flag, two different values it accepts) for every flag stored once."""
    out = []
    for path, parser in _parsers(cli.build_parser(), []):
        for a in parser._actions:
            if a.option_strings and isinstance(a, OneValue):
                values = [str(c) for c in a.choices][:2] if a.choices else ["1", "2"]
                out.append((path, a.option_strings[-1], values))
    return out


SINGLE = _single_valued()


def _refusal(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended:
        cli.build_parser().parse_known_args(argv)
    return ended.value.code, err.getvalue()


def test_every_subcommand_has_its_single_valued_flags_given_once():
    # The start-up flags, detect's, check-env's, bench-input's, convert-frames', jobs', validate's...
    commands = {path[0] for path, _, _ in SINGLE if path}
    assert {
        "detect",
        "check-env",
        "bench-input",
        "convert-frames",
        "jobs",
        "validate",
        "smoke",
    } <= commands
    # No flag of theirs is left with argparse's plain store, which keeps the last value.
    for path, parser in _parsers(cli.build_parser(), []):
        plain = [a.option_strings for a in parser._actions if type(a).__name__ == "_StoreAction"]
        assert plain == [], (path, plain)


@pytest.mark.parametrize(
    "path, flag, values", SINGLE, ids=[" ".join([*p, f]) for p, f, _ in SINGLE]
)
def test_a_second_value_is_refused_naming_both(path, flag, values):
    code, err = _refusal([*path, flag, values[0], flag, values[1]])
    assert code == 2 and REFUSED in err, err
    assert err.strip().splitlines()[-1].startswith(f"octo-dist {' '.join(path)}: error: {flag} "), (
        err
    )


def test_the_same_value_twice_is_one_value_and_flags_that_add_up_still_do():
    args, _ = cli.build_parser().parse_known_args(
        ["convert-frames", "src", "dst", "--name", "a", "--name=a"]
        + ["--size", "image_0=64", "--size", "wrist_image=32"]
    )
    assert args.name == "a" and args.size == ["image_0=64", "wrist_image=32"]
