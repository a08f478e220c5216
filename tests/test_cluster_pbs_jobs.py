"""``octo-dist jobs`` against the PBS imitation (tests/cluster/pbs.py) on the two-node namespace cluster: a chain of
two submitted on node001 by the jobs' user as a user does it, its states (the first running, the second held for
it, as ``qstat -x -f -F json`` reports them), the running job's log, and cancelling the rest of the chain with qdel;
from the record ``launch --submit`` left in the save directory."""

from __future__ import annotations


import pytest

from helpers import chain_running
from test_cluster_pbs import (  # noqa: F401  (pytest fixtures, used by name)
    LONG,
    LONG_SAVE_EVERY,
    LONG_STEP_TIME,
    VENV,
    compile_cache,
    launch,
    pbs,
    workdir,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def jobs(p, work, *argv):
    """``octo-dist jobs --save-dir runs/smoke ...`` by the jobs' user on node001, in the submit directory."""
    argv = [str(VENV / "bin" / "octo-dist"), "jobs", "--save-dir", "runs/smoke", *argv]
    return p.run(argv, user=True, cwd=work, check=False)


def test_a_chains_status_log_and_cancel_under_pbs(pbs, compile_cache):  # noqa: F811
    work = workdir(pbs, "jobs-chain")
    job = launch(
        pbs,
        compile_cache,
        work,
        chain=2,
        steps=LONG,
        step_time=LONG_STEP_TIME,
        save_every=LONG_SAVE_EVERY,
    )
    first, second = job.ids
    checkpoint = work / "runs" / "smoke" / str(LONG_SAVE_EVERY)
    out, rows = chain_running(
        lambda: jobs(pbs, work), first, checkpoint, [work, *job.logs], job.tail
    )
    assert out.startswith("chain of 2 (pbs, submitted "), out
    assert rows[second] == "held" and f"{second}  held" in out, out
    log = jobs(pbs, work, "log", "--lines", "200")
    assert log.returncode == 0 and log.stdout.startswith(f"job {first} (running), "), log.stderr
    cancel = jobs(pbs, work, "cancel")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"cancelled {first}, {second} (qdel {first} {second})\n", cancel.stdout
    for job_id in (first, second):
        assert job.wait(job.ids.index(job_id))["job_state"] == "F", job.tail()
    after = jobs(pbs, work)
    states = [ln.split()[1] for ln in after.stdout.splitlines()[1:3]]
    assert "running" not in states and "held" not in states, after.stdout
    assert (
        jobs(pbs, work, "cancel").stdout
        == "nothing to cancel: no job of the chain is queued or running\n"
    )
