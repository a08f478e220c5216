"""One shape for every problem (``octo_dist.problems``): found / expected / fix and its exit status, mapped by type.

The end-to-end case is the reason for the type: a refusal class the harness has never heard of, raised below it on
every rank of a real 2-rank mpirun, still ends the job with exit 2 and one line, not a traceback and an abort.
"""

import pytest

from helpers import PROGRAMS, tail
from octo_dist import EXIT_FAILED, EXIT_USAGE
from octo_dist.problems import Problem, Refusal, exit_status


def test_a_problem_is_one_line_naming_found_expected_and_fix():
    p = Refusal("--nodes=0", "a number >= 1", "--nodes 2")
    assert str(p) == "--nodes=0; expected a number >= 1. Fix: --nodes 2"
    assert p.exit_status == EXIT_USAGE and p.same_on_every_rank
    # A message already worded one way stays as it was.
    assert str(Problem("the disk is full")) == "the disk is full"
    assert exit_status(Problem("x")) == EXIT_FAILED and exit_status(ValueError("x")) is None
    assert Problem("x", exit_status=EXIT_USAGE).exit_status == EXIT_USAGE


def test_every_error_class_of_the_package_is_a_problem_with_its_exit_status():
    from octo_dist.engine.checkpoint import CheckpointError, CheckpointWriteError
    from octo_dist.engine.data import BatchSizeError
    from octo_dist.launchers import LauncherError
    from octo_dist.launchers.coordinator import CoordinatorError
    from octo_dist.runtime.runtime import SettingError, StartupError
    from octo_dist.stack.manifest import ManifestError

    for refused in (LauncherError, CoordinatorError, SettingError, BatchSizeError, ManifestError):
        assert refused("x").exit_status == EXIT_USAGE and refused("x").same_on_every_rank
    assert StartupError("x").exit_status == EXIT_FAILED
    assert CheckpointError("x").exit_status == EXIT_USAGE
    # A full disk is met by the rank whose write failed, maybe alone: that rank reports it and ends the job.
    assert not CheckpointWriteError("x").same_on_every_rank
    # Callers that catch the standard types still do.
    assert isinstance(LauncherError("x"), ValueError) and isinstance(
        StartupError("x"), RuntimeError
    )


def test_a_failed_check_or_validation_step_is_a_problem():
    from octo_dist.apps.validate import report
    from octo_dist.envcheck.result import FAIL, Check

    check = Check(
        "cudnn.version", FAIL, "9.1.1.17", "8.x with minor >= 6", "pip install nvidia-cudnn"
    )
    assert str(check.problem()) == (
        "cudnn.version: 9.1.1.17; expected 8.x with minor >= 6. Fix: pip install nvidia-cudnn"
    )
    assert Check.from_problem("launch", Refusal("a", "b", "c")) == Check(
        "launch", FAIL, "a", "b", "c"
    )
    step = report.Step.from_problem("scaling", Problem("0.41", ">= 0.60", "check NCCL"))
    assert report.exit_code([step]) == EXIT_FAILED == step.problem().exit_status


@pytest.mark.mpi
def test_a_new_refusal_raised_below_the_harness_exits_2_with_one_line(mpirun):
    pytest.importorskip("jax")
    proc = mpirun(2, str(PROGRAMS / "new_refusal.py"))
    (out0, err0), (out1, err1) = proc.ranks
    assert proc.returncode == EXIT_USAGE, (proc.returncode, tail(err0), tail(err1))
    # The ranks' own output (mpirun may add lines of its own about the non-zero exit: not the job's).
    ranks = err0 + err1 + out0 + out1
    assert "Traceback" not in ranks and "aborting" not in ranks, tail(ranks)
    errors = [ln for ln in ranks.splitlines() if "error" in ln.lower()]
    assert errors == [
        "octo-dist telescope: error: the telescope's lens cap is on; expected an open lens. "
        "Fix: octo-dist telescope --uncap"
    ], tail(ranks)
