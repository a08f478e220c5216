"""What lies in a save directory, and under which names: the one place that knows.

A job's ``--save-dir`` (``runs/octo-small-ft``), as the job runtime and the ranks leave it::

    runs/octo-small-ft/
      .octo-dist.lock                 the run that uses it now (engine/savedir.py): host, pid, job id, heartbeat
      .octo-dist-exit-12345.pbs1      job 12345.pbs1's exit status, "0\\n": the next job of a chain reads it
      .octo-dist-job-12345.pbs1/      while job 12345.pbs1 runs, removed at its end:
        nodes                           the scheduler's node list, where every node and the image see it
        octo-dist-runtime.pyz           the job runtime the other nodes' ranks start from (a zipapp's copy)
        done/rank-3                     rank 3 exited 0 ("rank 3 on g0002")
        failed/rank-1                   rank 1 failed ("rank 1 on g0001 exited with status 2")
        stopped                         rank 0 stopped for a signal and saved step 1200 ("1200\\n")
      <checkpoints>                   the training program's (smoke: <step>/ here; finetune: <run name>/<step>/)

Standard library only: the job runtime's zipapp carries it, and a login node's bare Python reads it.
"""

from __future__ import annotations

import os
from typing import Optional

LOCK = ".octo-dist.lock"
NODE_LIST = "nodes"
RUNTIME_COPY = "octo-dist-runtime.pyz"
DONE = "done"
FAILED = "failed"
STOPPED = "stopped"
# The job's directory, absolute, as the rank guard passes it to the training program
# ("/groups/gxx00000/runs/a/.octo-dist-job-12345.pbs1"); unset outside a job, where nothing is noted.
JOB_DIR_ENV = "OCTO_DIST_JOB_DIR"


def job_dir(save_dir: str, job: str) -> str:
    """``("runs/x", "12345.pbs1")`` -> ``"runs/x/.octo-dist-job-12345.pbs1"``: one job's notes and copies."""
    return os.path.join(save_dir, f".octo-dist-job-{job}")


def exit_file(save_dir: str, job: str) -> str:
    """``("runs/x", "12345.pbs1")`` -> ``"runs/x/.octo-dist-exit-12345.pbs1"``: that job's exit status."""
    return os.path.join(save_dir, f".octo-dist-exit-{job}")


def rank_note(job_dir_path: str, failed: bool, rank: str) -> str:
    """Where rank ``rank`` leaves its note in a job's directory: ``.../failed/rank-1`` or ``.../done/rank-1``."""
    return os.path.join(job_dir_path, FAILED if failed else DONE, f"rank-{rank}")


def stop_note(job_dir_path: str) -> str:
    """Where rank 0 says which step it saved when a stop signal ended the training: ``.../stopped``."""
    return os.path.join(job_dir_path, STOPPED)


def stopped_step(job_dir_path: str) -> Optional[int]:
    """The step rank 0 saved when it stopped for a signal (``stopped`` holds "1200\\n" -> 1200); None when no rank
    stopped for one, or the note is not a step."""
    try:
        with open(stop_note(job_dir_path)) as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
