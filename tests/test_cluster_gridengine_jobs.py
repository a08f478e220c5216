"""``octo-dist jobs`` against real Grid Engine on the two-node namespace cluster: a chain of two submitted on node001
as a user does it, its states (the first running, the second held for it), the running job's log, and cancelling the
rest of the chain with qdel; from the record launch --submit left in the save directory."""

from __future__ import annotations

import pytest

import test_cluster_gridengine as grid
from helpers import chain_running, wait_until
from test_cluster_gridengine import ge_one_per_node  # noqa: F401  (a pytest fixture, used by name)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def jobs(ge, work, *argv):
    argv = [str(grid.VENV / "bin" / "octo-dist"), "jobs", "--save-dir", "runs/smoke", *argv]
    return ge.run(argv, cwd=work, check=False)


def test_a_chains_status_log_and_cancel_under_real_grid_engine(ge_one_per_node, tmp_path):  # noqa: F811
    ge, work = ge_one_per_node, grid.workdir(tmp_path)
    first, second = grid.launch(
        ge,
        work,
        steps=grid.LONG_STEPS,
        chain=2,
        step_time=grid.LONG_STEP_TIME,
        ranks_per_node=1,
        save_every=grid.LONG_SAVE_EVERY,
    )
    out, rows = chain_running(
        lambda: jobs(ge, work),
        first,
        work / "runs" / "smoke" / str(grid.LONG_SAVE_EVERY),
        [work],
        lambda: grid.log(work, first)[-4000:],
    )
    assert out.startswith("chain of 2 (sge, submitted "), out
    assert rows[second] == "held" and "waits for the job before it" in out
    tail = jobs(ge, work, "log")
    assert tail.returncode == 0 and tail.stdout.startswith(
        f"job {first} (running), {work / f'octo-dist.o{first}'}:"
    )
    cancel = jobs(ge, work, "cancel")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"cancelled {first}, {second} (qdel {first} {second})\n"
    grid.ended(ge, work, first)
    wait_until(
        lambda: ge.job_state(second) is None, what=f"job {second} to leave the queue after qdel"
    )
    assert (
        jobs(ge, work, "cancel").stdout
        == "nothing to cancel: no job of the chain is queued or running\n"
    )
