"""Chains that fit the run: ``octo-dist jobs extend`` adds jobs to a chain still queued or running, and ``octo-dist
jobs`` estimates how many more jobs the training needs, from the step reached, the steps the job trains to and the
step time the run measured (``summary.json``, which each job of the run writes when it ends)::

    estimate: step 1200 of 5000; 0.82 s a step (measured), 55:00 of training a job: about 2 more jobs, 3 queued
      or running; the last 1 will find nothing left to train (the job that finishes cancels them)

The job that trains the last step cancels the rest of its chain (``supervisor/chainend.py``), so a chain longer
than needed costs no node time; one too short is extended. Standard library only (a login node's bare Python).
"""

from __future__ import annotations

import json
import math
from typing import List, Mapping, Optional, Sequence

from octo_dist import savelayout
from octo_dist.jobs import commands, jobrecord, submit
from octo_dist.launchers import outside

SUMMARY_LIMIT = 8 << 20  # bytes: summary.json holds the run's losses by step, ~40 bytes a step
STEP_FLAGS = tuple(
    c.flags["steps"] for c in commands.COMMANDS.values()
)  # "--steps", "--config.num_steps"


class ExtendError(jobrecord.JobsError):
    """Nothing submitted: the chain cannot be extended as asked (exit 2)."""


def _script_settings(submission: Mapping) -> Optional[dict]:
    try:
        with open(str(submission["script"]), "rb") as f:
            text = outside.decode(f.read(submit.RECORD_SCRIPT_LIMIT))
    except OSError:
        return None
    return jobrecord.settings_of_script(text)


def extend(chains: Sequence[tuple], add: int, **submit_kwargs) -> List[submit.Submitted]:
    """Submits ``add`` jobs after the last job of the newest chain (``chains``: ``[(submission, [JobState])]``),
    from the script it was submitted with, recorded as its extension.

    Raises:
      ExtendError: the chain has ended, or its script is gone or no longer the one submitted.
      submit.SubmitError: the scheduler refused (the jobs submitted before are named).
    """
    submission, jobs = chains[-1]
    last = jobs[-1]
    if not last.active:
        raise ExtendError(
            f"the chain's last job {last.job_id} is {last.state}, not queued or running",
            "a chain still queued or running to add jobs to",
            "octo-dist launch ... --submit --chain N, for a new chain",
        )
    settings = _script_settings(submission)
    saved = str(((settings or {}).get("storage") or {}).get("save_dir", ""))
    if saved != submission["save_dir"]:
        raise ExtendError(
            f"the chain's script {submission['script']} is gone or no longer the one submitted (save dir "
            f"{saved or 'none'}, not {submission['save_dir']})",
            "the job script the chain was submitted with",
            "octo-dist launch ... -o SCRIPT --submit --chain N, after the chain has ended",
        )
    return submit.submit(
        submission["scheduler"],
        submission["script"],
        name=str(submission.get("name") or "octo-dist"),
        group=None,
        chain=add,
        submit_dir=submission["submit_dir"],
        beside_running=True,  # the chain it extends is running: that is the point
        after=last.job_id,
        **submit_kwargs,
    )


def target_steps(train: Sequence[str]) -> Optional[int]:
    """The steps the training command trains to: its last ``--steps N`` / ``--config.num_steps=N``
    (``["octo-dist", "smoke", "--steps", "500", "--resume"]`` -> 500); None when it gives none."""
    found = None
    for i, arg in enumerate(train):
        flag, eq, value = str(arg).partition("=")
        if flag in STEP_FLAGS:
            value = value if eq else (str(train[i + 1]) if i + 1 < len(train) else "")
            found = int(value) if value.isascii() and value.isdigit() else found
    return found


def measured(save_dir: str, step: int) -> Optional[dict]:
    """The figures of the run whose checkpoint is ``step`` (its ``summary.json``, bounded): ``{"median_step_s":
    0.82, "time_to_first_step_s": 95.0, ...}``; None when no job of it has ended yet."""
    for layout in savelayout.RunLayout.found_in(save_dir):
        if step not in layout.saved_steps():
            continue
        try:
            data = json.loads(outside.read_text(layout.summary, SUMMARY_LIMIT, "", ""))
        except (OSError, ValueError, RecursionError, outside.InputError):
            return None
        return data if isinstance(data, dict) else None
    return None


def estimate(chains: Sequence[tuple], save_dir: str, step: int) -> str:
    """One line: the jobs still needed to reach the training's last step from ``step`` (the newest verified
    checkpoint), next to the jobs still queued or running; "" when it cannot be said (no step target, no
    measured step time yet)."""
    submission, jobs = chains[-1]
    settings = _script_settings(submission) or {}
    target = target_steps(((settings.get("commands") or {}).get("train")) or [])
    timing = settings.get("timing") or {}
    figures = measured(save_dir, step) or {}
    step_s, first_s = figures.get("median_step_s"), figures.get("time_to_first_step_s") or 0.0
    walltime_s, margin_s = timing.get("walltime_s"), timing.get("stop_margin_s") or 0
    numbers = (target, step_s, first_s, walltime_s, margin_s)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
        return ""
    if step_s <= 0 or target <= 0:
        return ""
    active = sum(1 for _, js in chains for j in js if j.active)
    left = max(target - step, 0)
    per_job_s = max(walltime_s - margin_s - first_s, 0.0)
    per_job = int(per_job_s // step_s)
    head = (
        f"estimate: step {step} of {target}; {step_s:.3g} s a step (measured), "
        f"{int(per_job_s) // 3600}:{int(per_job_s) % 3600 // 60:02d} of training a job"
    )
    if left == 0:
        return f"{head}: training done"
    if per_job <= 0:
        return f"{head}: a job's wall time holds no step after its start-up; render with a longer --walltime"
    needed = math.ceil(left / per_job)
    said = (
        f"{head}: about {needed} more job{'s' if needed != 1 else ''}, {active} queued or running"
    )
    if needed > active:
        more = needed - active
        return f"{said}; add {more}: octo-dist jobs --save-dir {submission['save_dir']} extend --add {more}"
    if needed < active:
        return (
            f"{said}; the last {active - needed} will find nothing left to train (the job that finishes "
            "cancels them)"
        )
    return said
