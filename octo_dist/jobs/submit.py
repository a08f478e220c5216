"""``octo-dist launch --submit`` / ``--chain N``: hand the written script to the scheduler, each job of a chain held
until the one before it has ended.

A chained job gets the previous job's id as ``OCTO_DIST_AFTER``; the script reads the exit status the previous job
left in the save directory and trains only when it did not fail (stopping for the wall time exits 0).
The scheduler's command runs through ``run`` (``subprocess.run`` by default), so tests give it fake executables.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from typing import Callable, List, Optional

AFTER_ENV = "OCTO_DIST_AFTER"


class SubmitError(RuntimeError):
    """The scheduler refused the job, or answered in a way we cannot read."""


@dataclasses.dataclass(frozen=True)
class Submitted:
    job_id: str  # "12345.pbs1" (PBS), "12345" (Grid Engine, SLURM)
    log: str  # where the job's output goes
    argv: tuple  # the command that submitted it


def command(scheduler: str, script: str, group: Optional[str], after: Optional[str]) -> List[str]:
    """The submission command; ``after``: the job this one waits for (any end) and checks.

    >>> command("pbs", "job.sh", "gxx00000", "12.pbs1")
    ['qsub', '-W', 'depend=afterany:12.pbs1', '-v', 'OCTO_DIST_AFTER=12.pbs1', 'job.sh']
    """
    if scheduler == "pbs":
        extra = ["-W", f"depend=afterany:{after}", "-v", f"{AFTER_ENV}={after}"] if after else []
        return ["qsub", *extra, script]
    if scheduler == "sge":
        extra = ["-hold_jid", after, "-v", f"{AFTER_ENV}={after}"] if after else []
        return ["qsub", "-terse", *extra, script]  # the project (-P) and queue are in the script
    if scheduler == "slurm":
        extra = (
            [f"--dependency=afterany:{after}", f"--export=ALL,{AFTER_ENV}={after}"] if after else []
        )
        return ["sbatch", "--parsable", *extra, script]
    raise ValueError(scheduler)


# What each prints: PBS `qsub` "12345.pbs1"; Grid Engine `qsub -terse` "12345" (an array job "12345.1-10:1");
# `sbatch --parsable` "12345" or "12345;cluster".
JOB_ID = {
    "pbs": re.compile(r"(\d+(?:\.[\w.-]+)?)"),
    "sge": re.compile(r"(\d+)(?:\.\S*)?"),
    "slurm": re.compile(r"(\d+)(?:;\S+)?"),
}


def job_id(scheduler: str, stdout: str) -> str:
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    m = JOB_ID[scheduler].fullmatch(lines[-1]) if lines else None
    if not m:
        raise SubmitError(
            f"cannot read a job id from the scheduler's answer {stdout.strip()!r}; expected e.g. "
            f"'12345{'.pbs1' if scheduler == 'pbs' else ''}'. Fix: check the job with qstat/squeue"
        )
    return m.group(1)


def log_path(scheduler: str, name: str, job: str, submit_dir: str, home: str) -> str:
    """Where the job's output lands: PBS -k oe keeps it in your home as NAME.oNUMBER while it runs; Grid Engine's -cwd
    puts NAME.oID in the submit directory; the SLURM script asks for NAME-ID.out there."""
    if scheduler == "pbs":
        return os.path.join(home, f"{name}.o{job.split('.')[0]}")
    if scheduler == "sge":
        return os.path.join(submit_dir, f"{name}.o{job}")
    return os.path.join(submit_dir, f"{name}-{job}.out")


def submit(
    scheduler: str,
    script: str,
    *,
    name: str,
    group: Optional[str],
    chain: int = 1,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    submit_dir: Optional[str] = None,
    home: Optional[str] = None,
) -> List[Submitted]:
    """Submit ``script`` ``chain`` times, each job after the previous one; stops at the first refusal."""
    submit_dir = submit_dir or os.getcwd()
    home = home or os.path.expanduser("~")
    out: List[Submitted] = []
    after = None
    for _ in range(chain):
        argv = command(scheduler, script, group, after)
        try:
            proc = run(argv, capture_output=True, text=True)
        except FileNotFoundError:
            raise SubmitError(
                f"no {argv[0]} here; expected to run on the cluster's login node. Fix: submit the "
                f"written script there ({' '.join(argv)})"
            ) from None
        if proc.returncode != 0:
            raise SubmitError(
                f"{' '.join(argv)} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
                + (f"; submitted before it: {', '.join(s.job_id for s in out)}" if out else "")
            )
        after = job_id(scheduler, proc.stdout)
        out.append(
            Submitted(after, log_path(scheduler, name, after, submit_dir, home), tuple(argv))
        )
    return out
