"""A job whose training finished (every step trained, no stop asked) ends the rest of its chain: the jobs queued
after it would each start their nodes only to find nothing left to train.

Which jobs come after it is read from the save directory's record of submissions (``savelayout.JOBS_RECORD``,
written by ``launch --submit`` and ``octo-dist jobs extend``)::

    [{"scheduler": "pbs", "jobs": [{"id": "100.pbs1"}, {"id": "101.pbs1"}, {"id": "102.pbs1"}]},
     {"scheduler": "pbs", "after": "102.pbs1", "jobs": [{"id": "103.pbs1"}]}]

Job 101.pbs1 finishing ends 102.pbs1 (later in its submission) and 103.pbs1 (a submission that extends the chain
after one of its jobs). The record is read bounded and without blocking (the save directory is shared); only ids
that are job ids (``savelayout.checked_job_id``) become arguments, and the scheduler only lets a user cancel their
own jobs. Standard library only: the job runtime's zipapp carries it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from typing import Callable, List, Sequence

from octo_dist import savelayout

CANCEL = {
    "pbs": ("qdel",),
    "slurm": ("scancel",),
    "sge": ("qdel",),
}  # each scheduler's cancel command
RECORD_LIMIT = 1 << 20  # bytes: a record of 50-job chains is a few kB per submission
CANCEL_TIMEOUT_S = 60


def read_record(save_dir: str) -> list:
    """The submissions recorded in ``save_dir``; [] when there is none or it is not a regular file of JSON."""
    try:
        fd = os.open(savelayout.jobs_record(save_dir), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return []
        data = os.read(fd, RECORD_LIMIT + 1)
    except OSError:
        return []
    finally:
        os.close(fd)
    try:
        records = json.loads(data) if len(data) <= RECORD_LIMIT else []
    except (ValueError, RecursionError):
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def _ids(submission: dict) -> List[str]:
    jobs = submission.get("jobs")
    return [str(j.get("id")) for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []


def queued_after(records: Sequence[dict], job_id: str, scheduler: str) -> List[str]:
    """The ids of ``job_id``'s chain after it: later in its own submission, then every submission of the same
    scheduler whose ``after`` is a job of the chain (an extension), in record order."""
    chain: List[str] = []
    later: List[str] = []
    for r in records:
        if r.get("scheduler") != scheduler:
            continue
        ids = _ids(r)
        if job_id in ids:
            chain = ids
            later = ids[ids.index(job_id) + 1 :]
        elif chain and r.get("after") in chain:
            chain += ids
            later += ids
    out = []
    for i in later:
        try:
            out.append(savelayout.checked_job_id("a recorded job id", i))
        except savelayout.JobIdError:
            continue
    return out


def end_chain(
    save_dir: str,
    job_id: str,
    scheduler: str,
    note: Callable[[str], None],
    env: dict,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> List[str]:
    """Cancels the jobs of ``job_id``'s chain queued after it (``queued_after``), saying so in one line; returns
    the ids asked for. A cancel that fails is said and left (those jobs start with nothing left to train)."""
    ids = queued_after(read_record(save_dir), job_id, scheduler)
    if not ids or scheduler not in CANCEL:
        return []
    argv = [*CANCEL[scheduler], *ids]
    try:
        done = run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            env=env,
            timeout=CANCEL_TIMEOUT_S,
        )
        said = " ".join((done.stderr or done.stdout or "").split())[:200]
        failed = f"exit {done.returncode}: {said}" if done.returncode else ""
    except (OSError, subprocess.SubprocessError) as e:
        failed = str(e)
    if failed:
        note(
            f"training finished; cancelling the rest of the chain ({' '.join(argv)}) failed ({failed}): they "
            "will start with nothing left to train. Fix: octo-dist jobs cancel, from the login node"
        )
    else:
        note(
            f"training finished: cancelled the rest of the chain, nothing left for them ({' '.join(argv)})"
        )
    return ids
