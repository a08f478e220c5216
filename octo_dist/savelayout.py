"""What lies in a save directory, and under which names: the one place that knows.

A job's ``--save-dir`` (``runs/octo-small-ft``), as the job runtime and the ranks leave it::

    runs/octo-small-ft/
      .octo-dist.lock                 the run that uses it now (engine/savedir.py): host, pid, job id, heartbeat
      .octo-dist-exit-12345.pbs1      job 12345.pbs1's exit status for the next job of a chain (jobs/supervisor/
                                      exitfile.py): "0", a status ("3": it does not train), "stopping SIGTERM: ..."
                                      (a stop cut short) or "143 resumable: ..." (checkpoints intact: it resumes)
      .octo-dist-job-12345.pbs1/      while job 12345.pbs1 runs, removed at its end:
        .octo-dist-job                  "12345.pbs1\n": made by this job, the mark its removal checks
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
import re
import shutil
from typing import Mapping, Optional

from octo_dist.problems import Refusal

LOCK = ".octo-dist.lock"
NODE_LIST = "nodes"
RUNTIME_COPY = "octo-dist-runtime.pyz"
DONE = "done"
FAILED = "failed"
STOPPED = "stopped"
# The job's directory, absolute, as the rank guard passes it to the training program
# ("/groups/gxx00000/runs/a/.octo-dist-job-12345.pbs1"); unset outside a job, where nothing is noted.
JOB_DIR_ENV = "OCTO_DIST_JOB_DIR"


JOB_MARK = ".octo-dist-job"  # in a job's directory: the job id that made it ("12345.pbs1\n")

# A job id becomes part of a file name (the job's directory, its exit file): only the characters schedulers use.
# PBS "12345.pbs1" and array "123[4].pbs1", Grid Engine "9876543", SLURM "123456" and array "123_4", LSF "4242" and
# "4242[3]". Never "/", "..", NUL, a leading "." or "-" ("1/../.." would name the save directory's parent).
JOB_ID = re.compile(r"[A-Za-z0-9_\[\]][A-Za-z0-9_.\[\]-]*")
JOB_ID_MAX = 128  # PBS's longest is a few dozen characters; a file name may have 255 bytes
JOB_ID_SAYS = (
    f"a scheduler's job id: letters, digits and _.[]- (not first: . or -), no '..', at most {JOB_ID_MAX} "
    "characters, e.g. 12345.pbs1, 123[4].pbs1, 123456, 123_4"
)


# The job's id as the job runtime read it from its scheduler and checked, exported to every rank: "12345.pbs1". Every
# module but the scheduler's own reads this one (``job_id``).
JOB_ID_ENV = "OCTO_DIST_JOB_ID"
# Outside the job runtime (a user's own mpirun in a job script) no one exported it: the schedulers' own variables,
# first set wins. Each scheduler's module names its own (``Scheduler.job_id_var``); this is the same list for the
# layers that may not import the schedulers (launchers, engine), and a test keeps the two alike.
SCHEDULER_JOB_ID_VARS = (
    "PBS_JOBID",  # "12345.pbs1" (PBS Professional, ABCI 3.0)
    "SLURM_JOB_ID",  # "123456"
    "JOB_ID",  # "9876543" (Grid Engine; a common name, so after Slurm's)
    "LSB_JOBID",  # "4242" (IBM LSF)
)


class JobIdError(Refusal):
    """A job id that cannot be part of a file name: one line naming the variable and its value, exit 2."""


def checked_job_id(var: str, value: str) -> str:
    """``value`` of the variable ``var`` (``"PBS_JOBID"``, ``"12345.pbs1"``) when it is a job id that is safe as
    part of a file name, else ``JobIdError``. Every scheduler's job id goes through here before it names a path."""
    if not JOB_ID.fullmatch(value) or ".." in value or len(value) > JOB_ID_MAX:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise JobIdError(
            f"{var}={shown!r} is not a job id octo-dist can use in a file name",
            JOB_ID_SAYS,
            f"run the job script under its scheduler (qsub/sbatch), or unset {var} when running it by hand",
        )
    return value


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The job's id, checked (``checked_job_id``): ``OCTO_DIST_JOB_ID`` (the job runtime's), else the first of the
    schedulers' own variables that is set (``LSB_JOBID=4242`` -> ``"4242"``); None outside a job."""
    var = next((v for v in (JOB_ID_ENV, *SCHEDULER_JOB_ID_VARS) if environ.get(v)), None)
    return checked_job_id(var, environ[var]) if var else None


def job_dir(save_dir: str, job: str) -> str:
    """``("runs/x", "12345.pbs1")`` -> ``"runs/x/.octo-dist-job-12345.pbs1"``: one job's notes and copies."""
    return os.path.join(save_dir, f".octo-dist-job-{checked_job_id('the job id', job)}")


def make_job_dir(save_dir: str, job: str) -> str:
    """Makes the job's directory in ``save_dir`` and marks it as this job's (``JOB_MARK`` holds the id); returns
    its path. A directory of that name with this job's mark is taken again (a job the scheduler started again keeps
    its id); one without it is refused (``OSError``): it is not this job's to fill and remove."""
    path = job_dir(save_dir, job)
    mark = os.path.join(path, JOB_MARK)
    try:
        os.mkdir(path)
    except FileExistsError:
        if _mark_of(path) != job:
            raise FileExistsError(17, f"{path} exists and was not made by job {job}") from None
        return path
    try:
        with open(mark, "w") as f:
            f.write(f"{job}\n")
    except OSError:
        # A full disk: the directory just made, empty, goes again rather than stay unmarked.
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def _mark_of(path: str) -> Optional[str]:
    """The job id in ``path``'s mark, None when it has none (or ``path`` is a link, not a directory)."""
    if os.path.islink(path) or not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, JOB_MARK), "rb") as f:
            return f.read(JOB_ID_MAX + 2).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def remove_job_dir(save_dir: str, path: str, job: str) -> Optional[str]:
    """Removes the job's directory ``path`` when it is what ``make_job_dir(save_dir, job)`` made: the real path a
    direct child of ``save_dir``'s, named for ``job``, a directory (not a link) holding ``job``'s mark. None when
    removed (or never made), else why it was left alone: nothing outside a directory the job made is removed."""
    if not path or not os.path.lexists(path):
        return None
    real_save = os.path.realpath(save_dir)
    if (
        os.path.dirname(os.path.realpath(path)) != real_save
        or os.path.basename(path) != f".octo-dist-job-{job}"
        or _mark_of(path) != job
    ):
        return (
            f"left {path} in place: it is not the directory job {job} made in {real_save} "
            f"(expected a directory .octo-dist-job-{job} there holding the mark {JOB_MARK})"
        )
    shutil.rmtree(path, ignore_errors=True)
    return None


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
    return (
        int(text) if re.fullmatch(r"[0-9]{1,18}", text) else None
    )  # not "²", which isdigit() passes
