"""``octo-dist jobs`` against the PBS imitation (tests/cluster/pbs.py) on the two-node namespace cluster, and what a
qdel does to a running job: a chain of two submitted on node001 by the jobs' user as a user does it, into a queue
with a kill delay of its own; its states (the first running, the second held for it, as ``qstat -x -f -F json``
reports them), the running job's log, and cancelling the rest of the chain with qdel, from the record ``launch
--submit`` left in the save directory. That qdel is PBS's on a paced 2-node job that has a checkpoint: every rank
stops and checkpoints within the kill delay, and nothing of the job is left on either node."""

from __future__ import annotations

import json

import pytest

from cluster import pbs as sim_pbs
from helpers import chain_running
from test_cluster_pbs import (  # noqa: F401  (pytest fixtures, used by name)
    LONG,
    LONG_SAVE_EVERY,
    LONG_STEP_TIME,
    VENV,
    brief,
    compile_cache,
    launch,
    pbs,
    require,
    steps_in,
    verified_steps,
    workdir,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# The queue's kill delay: long enough for a stop of 0.25 s steps on a loaded machine, and not PBS's default (10 s),
# so the job's start line shows it read the queue's own.
QDEL_KILL_DELAY_S = 45


def jobs(p, work, *argv):
    """``octo-dist jobs --save-dir runs/smoke ...`` by the jobs' user on node001, in the submit directory."""
    argv = [str(VENV / "bin" / "octo-dist"), "jobs", "--save-dir", "runs/smoke", *argv]
    return p.run(argv, user=True, cwd=work, check=False)


@pytest.fixture(scope="module")
def cancelled(pbs, compile_cache):  # noqa: F811
    """The chain of 2, paced, in rt_HF with a kill delay of QDEL_KILL_DELAY_S: ``jobs`` asked while the first
    runs with a checkpoint, its log, then ``jobs cancel`` (a qdel of both); what each said, and the jobs' ends."""
    work = workdir(pbs, "jobs-chain")
    pbs.qmgr(f"set queue rt_HF kill_delay = {QDEL_KILL_DELAY_S}")
    try:
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
        # Waited for with qstat (the imitation's command: a small Python) before ``jobs`` is asked (the package and
        # its imports start each time: more CPU a poll, every 2 s of a job's start-up).
        job.wait_for(checkpoint)
        out, rows = chain_running(
            lambda: jobs(pbs, work), first, checkpoint, [work, *job.logs], job.tail
        )
        log = jobs(pbs, work, "log", "--lines", "200")
        cancel = jobs(pbs, work, "cancel")
        # A failed cancel fails the test; the chain (10**6 steps) must not run on meanwhile.
        if cancel.returncode != 0:
            for job_id in job.ids:
                job.cancel(job_id)
        finals = [job.wait(i) for i in (0, 1)]
    finally:
        pbs.qmgr("unset queue rt_HF kill_delay")
    rec = work / "record.json"
    return {
        "job": job,
        "status": (out, rows),
        "log": log,
        "cancel": cancel,
        "finals": finals,
        "left": pbs.carrying(first),
        "record": json.loads(rec.read_text()) if rec.exists() else {},
        "after": jobs(pbs, work),
        "again": jobs(pbs, work, "cancel"),
    }


def test_a_chains_status_log_and_cancel_under_pbs(cancelled):
    job = cancelled["job"]
    first, second = job.ids
    out, rows = cancelled["status"]
    assert out.startswith("chain of 2 (pbs, submitted "), out
    assert rows[second] == "held" and f"{second}  held" in out, out
    log = cancelled["log"]
    assert log.returncode == 0 and log.stdout.startswith(f"job {first} (running), "), log.stderr
    cancel = cancelled["cancel"]
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"cancelled {first}, {second} (qdel {first} {second})\n", cancel.stdout
    assert [f["job_state"] for f in cancelled["finals"]] == ["F", "F"], job.tail()
    after = cancelled["after"]
    states = [ln.split()[1] for ln in after.stdout.splitlines()[1:3]]
    assert "running" not in states and "held" not in states, after.stdout
    assert (
        cancelled["again"].stdout == "nothing to cancel: no job of the chain is queued or running\n"
    )


def test_qdel_mid_run_stops_every_rank_and_leaves_nothing_of_the_job(cancelled):
    """The cancel's qdel of the running first job, in a queue with a kill delay of its own: the job read it, every
    rank stops and checkpoints within it, nothing of the job is left on either node, PBS reports 271 and the exit
    file says 0."""
    job, final, left, rec = (cancelled[k] for k in ("job", "finals", "left", "record"))
    final = final[0]
    exit_file = job.save_dir / f".octo-dist-exit-{job.id}"
    said = (
        f"qdel: {json.dumps(brief(final))}; left: {left}; rank 0's record: "
        f"{ {k: rec.get(k) for k in ('stopped_by', 'end_step')} }; checkpoints {steps_in(job.save_dir)}; "
        f"exit file: {exit_file.read_text().strip() if exit_file.exists() else None}\n{job.tail()}"
    )
    require(final.get("job_state") == "F", said)
    assert sim_pbs.escapes(final) == [] and left == [], (
        "processes of the job that PBS could not end: " + said
    )
    assert final.get("Exit_status") == 271, said
    assert rec.get("stopped_by") and rec.get("end_step") in verified_steps(job.save_dir), said
    assert exit_file.exists() and exit_file.read_text().strip() == "0", said
    assert not (job.save_dir / ".octo-dist.lock").exists(), said
    assert (
        f"a qdel gives this job {QDEL_KILL_DELAY_S}s from SIGTERM to SIGKILL (queue rt_HF's kill_delay)"
        in job.log()
    ), said
