"""The `octo-dist` dispatcher: a mistyped flag is reported by the subcommand that owns it, with the closest flag."""

import subprocess
import sys

import pytest

from helpers import REPO, clean_env


def octo_dist(*argv):
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", *argv],
        capture_output=True,
        text=True,
        timeout=120,
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
