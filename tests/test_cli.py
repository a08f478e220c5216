"""The `octo-dist` dispatcher: a mistyped flag is reported by the subcommand that owns it, with the closest flag."""

import os
import subprocess
import sys

import pytest

from helpers import HANG_S, REPO, clean_env


def octo_dist(*argv):
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", *argv],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "argv, usage, error",
    [
        (
            ["check-env", "--profle", "cpu"],
            "usage: octo-dist check-env ",
            "octo-dist check-env: error: unrecognized argument --profle; did you mean --profile?",
        ),
        (
            ["detect", "--jsn"],
            "usage: octo-dist detect ",
            "octo-dist detect: error: unrecognized argument --jsn; did you mean --json?",
        ),
        (
            ["launch", "pbs", "--nodse", "2", "--", "smoke"],
            "usage: octo-dist launch pbs ",
            "octo-dist launch pbs: error: unrecognized argument --nodse; did you mean --nodes?",
        ),
        (
            ["smoke", "--stepz=3"],
            "usage: octo-dist smoke ",
            "octo-dist smoke: error: unrecognized argument --stepz=3; did you mean --steps?",
        ),
        (
            # A training flag before the "--" that hands the rest to the training command.
            ["launch", "pbs", "--nodes", "2", "--group", "g", "finetune", "--config.num_steps=5"],
            "usage: octo-dist launch pbs ",
            "octo-dist launch pbs: error: unrecognized argument --config.num_steps=5; training flags go after "
            "--: octo-dist launch pbs [options] -- finetune --config.num_steps=5",
        ),
        (
            ["check-env", "stray"],
            "usage: octo-dist check-env ",
            "octo-dist check-env: error: unrecognized argument stray",
        ),
    ],
)
def test_an_unknown_flag_names_the_subcommand_and_the_closest_flag(argv, usage, error):
    proc = octo_dist(*argv)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(usage), proc.stderr
    assert proc.stderr.splitlines()[-1] == error
    assert proc.stdout == ""


def test_check_env_script_on_a_python_without_packaging_says_so_in_one_line():
    # `python -S` leaves site-packages out: the interpreter a login node has before any environment is set up.
    proc = subprocess.run(
        [sys.executable, "-S", str(REPO / "scripts" / "check_env.py"), "--profile", "cpu"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"check_env.py: error: {sys.executable} (Python ")
    assert "has no 'packaging' module" in proc.stderr and "Fix: run it with" in proc.stderr


def test_weights_is_a_subcommand_that_refuses_a_bad_source_in_one_line():
    proc = octo_dist("weights", "ftp://example/octo-small")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "octo-dist weights: error: source 'ftp://example/octo-small'; expected hf://<owner>/<name>. "
        "Fix: octo-dist weights hf://rail-berkeley/octo-small"
    )


@pytest.mark.parametrize(
    "source",
    ["hf://a/b/c", "hf://../../etc", "hf://$(touch x)/x", "hf://a/b c", "hf://-a/b", "hf://a/"],
)
def test_weights_refuses_a_source_that_is_no_hub_name_in_one_line(source, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "weights", source],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert (
        "Traceback" not in proc.stderr
        and f"source {source!r}; expected hf://<owner>/<name>, each of" in (proc.stderr)
    )
    assert (
        list(tmp_path.iterdir()) == []
    )  # nothing downloaded, no weights/ directory, no file called x


def test_an_older_python_gets_one_line_from_octo_dist_not_a_syntax_error():
    code = (
        "import sys, runpy; sys.version_info = (3, 8, 10, 'final', 0); "
        "runpy.run_module('octo_dist', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "launch", "pbs"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=REPO,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "octo-dist: error: Python 3.8 ("
    ) and "expected Python 3.9 or newer" in (proc.stderr)


def test_no_help_shows_docstring_markup():
    """`--help` is read on a terminal: a description lifted from a docstring showed ``--cores`` and :mod:`.measure`."""
    import argparse

    from octo_dist import cli

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    marked = {
        name: line
        for name, parser in sub.choices.items()
        for line in parser.format_help().splitlines()
        if "``" in line or ":mod:" in line or ":func:" in line
    }
    assert sub.choices and not marked, marked


DESCRIBED_BY_THEIR_DOCSTRING = (
    "check-env",
    "env",
    "smoke",
    "jobs",
    "job-runtime",
    "weights",
    "validate",
    "detect",
)


@pytest.mark.parametrize("name", DESCRIBED_BY_THEIR_DOCSTRING)
def test_a_command_is_described_once_by_its_module_docstring(name):
    """`octo-dist NAME --help` shows its module's docstring as written (octo_dist/subcommand.py): the first example
    line keeps its indentation ("    octo-dist env --json ..."), and no second description string drifts from it."""
    import argparse
    import importlib

    from octo_dist import cli

    doc = importlib.import_module(cli.SUBCOMMANDS[name]).__doc__
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[name]
    example = next(line for line in doc.splitlines() if line.startswith("    "))
    assert parser.description == doc
    assert example.rstrip() in parser.format_help().splitlines(), (name, example)
    assert callable(parser.get_default("func")), name
