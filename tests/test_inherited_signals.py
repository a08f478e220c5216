"""The signal tests pass whatever dispositions the test run inherits: a child pytest started with SIGINT and SIGTERM
ignored, as `pytest &` from a script, cron and some CI runners start it (an ignore survives fork and exec).

helpers.restore_signals gives every job script, mpirun and rank a test starts the default dispositions back; without
it the job script inherits the ignore, cannot trap SIGINT, and the SIGINT case of the launcher test waits forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

import helpers
import test_stop_signals
from helpers import HANG_S, REPO

# The 2-rank smoke job runs here and only here (test_stop_signals.JOB_RUN_ENV), as test_stop_signals.py's one case,
# INT: SIGINT is the signal an inherited ignore keeps (the runtime leaves it ignored), so that case is the one the
# job's start through helpers fixes. The SIGTERM-first case (test_smoke.py's first stop) starts the same job the same
# way; the TERM is re-armed by the runtime, which the re-arming tests run here check. Two child runs: the job's case
# (JAX start-ups) and the rest (seconds), each a test.
JOB_CASE = "tests/test_stop_signals.py::test_a_second_signal_while_the_smoke_job_stops_keeps_the_clean_stop"
SIGNAL_TESTS = {
    "launcher-and-program": (
        "tests/test_launch.py::test_a_stop_signal_reaches_the_launcher_as_sigusr1",
        "tests/test_launch.py::test_a_stop_signal_ignored_on_entry_still_stops_the_job",
        "tests/test_stop_signals.py",
        f"--deselect={JOB_CASE}",
    ),
    "smoke-job": (JOB_CASE,),
}
# What each child run must have run (not skipped) and passed: the case that failed under an inherited ignore, the
# re-arming test; the smoke job's INT case.
MUST_RUN = {
    "launcher-and-program": ("sigusr1[SIGINT]", "rearmed_and_named_once[TERM]"),
    "smoke-job": ("clean_stop[INT]",),
}
IGNORED = (signal.SIGINT, signal.SIGTERM)


def test_helpers_give_the_defaults_back_under_a_parent_that_ignores_them():
    """The fabricated input (a process started with SIGINT and SIGTERM ignored) is what it says, and a process that
    helpers.run starts from such a parent has every signal of helpers.DEFAULT_SIGNALS at its default again."""
    status = ["cat", "/proc/self/status"]
    ignoring = subprocess.run(
        status, capture_output=True, text=True, preexec_fn=helpers.ignoring(*IGNORED)
    )
    assert helpers.signal_set(ignoring.stdout, "SigIgn") >= set(IGNORED), ignoring.stdout
    nested = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import helpers; print(helpers.run({status!r}, capture_output=True, text=True).stdout)",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO / "tests")),
        preexec_fn=helpers.ignoring(*IGNORED),
    )
    assert nested.returncode == 0, nested.stderr
    ignored = helpers.signal_set(nested.stdout, "SigIgn")
    assert not ignored & set(helpers.DEFAULT_SIGNALS), sorted(ignored)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("group", sorted(SIGNAL_TESTS))
def test_the_signal_tests_pass_with_sigint_and_sigterm_ignored_on_entry(tmp_path, group):
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env[test_stop_signals.JOB_RUN_ENV] = (
        "1"  # the 2-rank job runs here, under the inherited ignore, and only here
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={tmp_path / 'child'}",
            f"--junitxml={report}",
            *SIGNAL_TESTS[group],
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        # only ends a hang: the child waits HANG_S at most for each of its steps
        timeout=2 * HANG_S,
        preexec_fn=helpers.ignoring(*IGNORED),
    )
    assert proc.returncode == 0, helpers.tail(proc.stdout, 6000) + helpers.tail(proc.stderr)
    cases = {
        f"{c.get('classname')}.{c.get('name')}": c
        for c in ET.parse(report).getroot().iter("testcase")
    }
    ran = [name for name, c in cases.items() if c.find("skipped") is None]
    for case in MUST_RUN[group]:
        assert any(case in name for name in ran), (case, sorted(cases))
