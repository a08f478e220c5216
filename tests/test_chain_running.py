"""The cluster tests' polling of ``octo-dist jobs`` (``helpers.chain_running``): a query the scheduler failed once
(``jobs`` says the state is unknown, exit 1, as a loaded Grid Engine qmaster's qstat made it) is asked again, while
a state unknown until the wait's end, or any other failure, still fails the test."""

from __future__ import annotations

import subprocess

import pytest

from helpers import UNKNOWN_STATE, chain_running
from octo_dist.jobs import jobscli, status

# Two rows under the chain's heading, as `octo-dist jobs` prints them while the first job runs.
RUNNING = (
    "chain of 2 (sge, submitted 2026-12-06 17:40, save dir runs/smoke)\n"
    "  1  running   log /w/octo-dist.o1\n"
    "  2  held      waits for the job before it  log /w/octo-dist.o2\n"
)
# What qstat says when its qmaster does not answer in time: Grid Engine's own words for a GDI request timed out
# (its msg_gdilib.h and msg_commlistslib.h), as `jobs` reads them.
QSTAT_SAID = (
    "qstat failed (exit 1): error: failed receiving gdi request response for mid=1 "
    "(got syncron message receive timeout error)."
)


def unknown_answer(capsys) -> subprocess.CompletedProcess:
    """The product's own words for a failed query: its exit status and stderr."""
    jobs = [
        status.JobState("1", "unknown", QSTAT_SAID),
        status.JobState("2", "unknown", QSTAT_SAID),
    ]
    code = jobscli._unknown(jobs)
    return subprocess.CompletedProcess(["octo-dist", "jobs"], code, "", capsys.readouterr().err)


def answers(*results):
    """``status()`` giving ``results`` in turn, the last one for ever."""
    queue = list(results)
    return lambda: queue.pop(0) if len(queue) > 1 else queue[0]


def test_a_transient_unknown_state_is_asked_again(capsys, tmp_path):
    unknown = unknown_answer(capsys)
    assert unknown.returncode == 1 and UNKNOWN_STATE.search(unknown.stderr), unknown
    running = subprocess.CompletedProcess(["octo-dist", "jobs"], 0, RUNNING, "")
    (tmp_path / "2").mkdir()
    out, rows = chain_running(answers(unknown, running), "1", tmp_path / "2", [], lambda: "")
    assert out == RUNNING and rows == {"1": "running", "2": "held"}


def test_an_unknown_state_that_lasts_fails_with_what_jobs_said(capsys, tmp_path):
    unknown = unknown_answer(capsys)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)is unknown.*\(job log\)"):
        chain_running(answers(unknown), "1", tmp_path / "2", [], lambda: "(job log)", hang_s=0)


def test_any_other_failure_fails_at_once(tmp_path):
    broken = subprocess.CompletedProcess(
        ["octo-dist", "jobs"], 1, "", "octo-dist jobs: error: no chain recorded in runs/smoke\n"
    )
    with pytest.raises(AssertionError, match="no chain recorded"):
        chain_running(answers(broken), "1", tmp_path / "2", [], lambda: "")
