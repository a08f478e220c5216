"""``octo-dist launch --submit`` / ``--chain N``: hand the written script to the scheduler, each job of a chain held
until the one before it has ended.

A chained job gets the previous job's id as ``OCTO_DIST_AFTER``; the script reads the exit status the previous job
left in the save directory and trains only when it did not fail (stopping for the wall time exits 0).
The scheduler's command runs through ``run`` (``outside.run_command`` by default: at most ``SUBMIT_TIMEOUT_S``,
its output bounded and shown escaped), so tests give it fake executables on PATH. A chain is at most ``MAX_CHAIN``
jobs: a typo (``--chain 100000``) must not fill the queue.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from typing import Callable, List, Optional

from octo_dist import savelayout
from octo_dist.jobs import schedulers
from octo_dist.jobs import spec as spec_mod
from octo_dist.jobs import walltime
from octo_dist.jobs import jobrecord, status
from octo_dist.problems import Problem, Refusal
from octo_dist.launchers import outside

AFTER_ENV = schedulers.base.AFTER_ENV
MAX_CHAIN = spec_mod.MAX_CHAIN  # jobs in one --chain: 50 wall times of 24 h are 50 days of training
SUBMIT_TIMEOUT_S = (
    120  # a qsub/sbatch answers in seconds; a hung scheduler server must not hang launch
)


RECORD_SCRIPT_LIMIT = (
    1 << 20
)  # bytes of the written script read back for its save directory (a script is ~10 kB)


class SubmitError(Problem, RuntimeError):
    """The scheduler refused the job, or answered in a way we cannot read."""


class SubmitRefused(Refusal, SubmitError):
    """Nothing submitted: the save directory cannot take the jobs (exit 2)."""


@dataclasses.dataclass(frozen=True)
class Submitted:
    job_id: str  # "12345.pbs1" (PBS), "12345" (Grid Engine, SLURM)
    log: str  # where the job's output goes
    argv: tuple  # the command that submitted it


def chain_summary(job: spec_mod.Job, chain: int) -> str:
    """The one line said before anything is queued: ``"submitting 3 jobs x 2 nodes x 12:00:00 = at most 72
    node-hours"`` (a single job: ``"submitting 1 job x 2 nodes x 12:00:00 = at most 24 node-hours"``)."""
    jobs = f"{chain} job{'' if chain == 1 else 's'}"
    n, walltime_s = job.settings.allocation.nodes, job.settings.timing.walltime_s
    nodes = f"{n} node{'' if n == 1 else 's'}"
    total = walltime.node_hours(chain * n, walltime_s)
    return f"submitting {jobs} x {nodes} x {walltime.format_walltime(walltime_s)} = at most {total}"


QSUB_KINDS = {"pbs": "PBS Professional's", "sge": "Grid Engine's"}
VERSION_TIMEOUT_S = 30  # `qsub --version` answers at once, even where no server is configured


def qsub_kind(text: str) -> Optional[str]:
    """Which scheduler a ``qsub --version`` answer is from: ``"pbs_version = 22.05.11"`` -> ``"pbs"``;
    ``"GE 8.1.9"`` or Grid Engine's "unable to read qmaster name" -> ``"sge"``; anything else -> None."""
    if re.search(r"pbs_version", text):
        return "pbs"
    if re.search(r"(?i)\b(?:s?ge \d|grid ?engine|son of grid engine|qmaster|sge_root)", text):
        return "sge"
    return None


def wrong_qsub(scheduler: str, run: Callable[..., outside.Finished]) -> str:
    """After a failed submission for PBS or Grid Engine (both name their command ``qsub``): when the ``qsub`` on
    PATH is the other scheduler's, the sentence that says so (``"; the qsub on PATH (/usr/bin/qsub) is Grid
    Engine's, ..."``); else ``""``. Asked only after a failure, so a working submission runs nothing more."""
    if scheduler not in QSUB_KINDS:
        return ""
    try:
        proc = run(["qsub", "--version"], VERSION_TIMEOUT_S)
    except (OSError, outside.CommandTimeout):
        return ""
    kind = qsub_kind(proc.stdout + proc.stderr)
    if kind is None or kind == scheduler:
        return ""
    where = shutil.which("qsub") or "qsub"
    return (
        f"; the qsub on PATH ({where}) is {QSUB_KINDS[kind]}, not {QSUB_KINDS[scheduler]} that octo-dist launch "
        f"{scheduler} writes for. Fix: put {QSUB_KINDS[scheduler]} qsub first on PATH (on the cluster's login node), "
        f"or render for the scheduler you have: octo-dist launch {kind} ..."
    )


def command(scheduler: str, script: str, group: Optional[str], after: Optional[str]) -> List[str]:
    """The submission command; ``after``: the job this one waits for (any end) and checks.

    >>> command("pbs", "job.sh", "gxx00000", "12.pbs1")
    ['qsub', '-W', 'depend=afterany:12.pbs1', '-v', 'OCTO_DIST_AFTER=12.pbs1', 'job.sh']
    """
    return schedulers.get(scheduler).submit_command(script, after)


def job_id(scheduler: str, stdout: str) -> str:
    """The job id the scheduler's submit command printed: PBS `qsub` "12345.pbs1"; Grid Engine `qsub -terse`
    "12345" (an array job "12345.1-10:1"); `sbatch --parsable` "12345" or "12345;cluster"."""
    s = schedulers.get(scheduler)
    found = s.parse_job_id(stdout)
    if not found:
        raise SubmitError(
            f"cannot read a job id from the scheduler's answer '{outside.shown(stdout)}'; expected e.g. "
            f"'{s.job_id_example}'. Fix: check the job with qstat/squeue"
        )
    return found


def log_path(scheduler: str, name: str, job: str, submit_dir: str, home: str) -> str:
    """Where the job's output lands (each scheduler's header decides it)."""
    return schedulers.get(scheduler).log_path(name, job, submit_dir, home)


def submit(
    scheduler: str,
    script: str,
    *,
    name: str,
    group: Optional[str],
    chain: int = 1,
    run: Callable[..., outside.Finished] = outside.run_command,
    submit_dir: Optional[str] = None,
    home: Optional[str] = None,
    timeout_s: Optional[float] = None,
    beside_running: bool = False,
    after: Optional[str] = None,
) -> List[Submitted]:
    """Submit ``script`` ``chain`` times, each job after the previous one (the first after ``after``, a job of a
    running chain this extends); stops at the first refusal. Each submission may take ``timeout_s`` (default
    ``SUBMIT_TIMEOUT_S``).

    Before the first, the script's save directory is checked: one that cannot hold the record (a file) is
    refused, and so is one with recorded jobs still queued or running unless ``beside_running``.

    Raises:
      SubmitRefused: nothing was submitted (exit 2).
      SubmitError: one line: the command that failed, timed out or answered without a job id, what the scheduler
        said (escaped), and the jobs submitted before it, which are queued and must not be forgotten.
    """
    if not 1 <= chain <= MAX_CHAIN:
        raise SubmitError(
            f"a chain of {chain} jobs; expected 1 to {MAX_CHAIN}. Fix: --chain {min(max(chain, 1), MAX_CHAIN)}"
        )
    submit_dir = submit_dir or os.getcwd()
    home = home or os.path.expanduser("~")
    timeout_s = SUBMIT_TIMEOUT_S if timeout_s is None else timeout_s
    save_dir = _save_dir(script)
    if save_dir is not None:
        _check_save_dir(save_dir, submit_dir)
        if not beside_running:
            _check_running(save_dir, submit_dir, run)
    out: List[Submitted] = []
    extends = after

    def failed(what: str) -> SubmitError:
        before = f"; submitted before it: {', '.join(s.job_id for s in out)}" if out else ""
        _record(scheduler, script, submit_dir, out, (name, extends))
        return SubmitError(what + before + wrong_qsub(scheduler, run))

    for _ in range(chain):
        argv = command(scheduler, script, group, after)
        try:
            after = _job_id_of(scheduler, argv, run, timeout_s)
        except SubmitError as e:
            raise failed(str(e)) from None
        out.append(
            Submitted(after, log_path(scheduler, name, after, submit_dir, home), tuple(argv))
        )
    _record(scheduler, script, submit_dir, out, (name, extends))
    return out


def _job_id_of(
    scheduler: str, argv: List[str], run: Callable[..., outside.Finished], timeout_s: float
) -> str:
    """Runs one submission (``["qsub", "-W", "depend=afterany:12344.pbs1", "job.sh"]``) and returns the job id
    the scheduler answered; SubmitError in one line when it is missing, hangs, fails or answers without an id
    (``submit`` adds the jobs submitted before it)."""
    try:
        proc = run(argv, timeout_s)
    except FileNotFoundError:
        raise SubmitError(
            f"no {argv[0]} here; expected to run on the cluster's login node. Fix: submit the "
            f"written script there ({' '.join(argv)})"
        ) from None
    except outside.CommandTimeout as e:
        said = f" (it said: {status.one_line(e.stderr, 500)})" if e.stderr.strip() else ""
        raise SubmitError(
            f"{' '.join(argv)} did not answer within {timeout_s:g} s and was stopped{said}; expected a job "
            f"id in seconds. Fix: check the scheduler (qstat/squeue), then submit the written script by hand"
        ) from None
    if proc.returncode != 0:
        raise SubmitError(
            f"{' '.join(argv)} failed (exit {proc.returncode}): "
            f"{status.one_line(proc.stderr.strip() or proc.stdout, 500)}"
        )
    return job_id(scheduler, proc.stdout)


def _save_dir(script: str) -> Optional[str]:
    """The save directory the written ``script`` uses (``jobrecord.save_dir_of_script``); None when it names none
    or cannot be read."""
    try:
        with open(script, "rb") as f:
            return jobrecord.save_dir_of_script(outside.decode(f.read(RECORD_SCRIPT_LIMIT)))
    except OSError:
        return None


def _check_save_dir(save_dir: str, submit_dir: str) -> None:
    """The save directory exists as a directory (made here when missing), so the jobs can be recorded in it; a
    file of that name would make every job fail at its start and leave them unrecorded."""
    path = savelayout.submitted_save_dir(submit_dir, save_dir)
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.isdir(path):
            raise NotADirectoryError(20, "not a directory")
    except OSError as e:
        raise SubmitRefused(
            f"--save-dir {save_dir} cannot be made in {submit_dir} ({e.strerror or e}): nothing submitted",
            "a directory the jobs can write their checkpoints in",
            "octo-dist launch ... --save-dir DIR, a directory or a name not taken",
        ) from None


def _check_running(save_dir: str, submit_dir: str, run: Callable[..., outside.Finished]) -> None:
    """Refuses a second chain into a save directory whose recorded jobs are still queued or running (or whose
    state the scheduler cannot give): both would train the same run, and the older would keep holding nodes."""
    try:
        records = jobrecord.read_records(jobrecord.record_path(save_dir, submit_dir))
    except jobrecord.JobsError:
        return  # a damaged record lists nothing that can be asked about; the new one replaces it
    busy = []
    for record in records:
        try:
            busy += [j for j in status.states(record, run) if j.active or j.unknown]
        except Problem:
            return  # no scheduler command here: the submission itself says so
    if busy:
        shown = ", ".join(f"{j.job_id} {j.state}" for j in busy[:5]) + (
            " ..." if len(busy) > 5 else ""
        )
        raise SubmitRefused(
            f"jobs recorded for --save-dir {save_dir} are still queued or running ({shown}): nothing submitted",
            "one chain training into a save directory at a time",
            f"octo-dist jobs --save-dir {save_dir} (cancel, or wait for them to end); or add --beside-running",
        )


def _record(
    scheduler: str, script: str, submit_dir: str, jobs: List[Submitted], named: tuple
) -> Optional[str]:
    """The jobs submitted, added to the record in the script's save directory (``jobrecord.RECORD``) that
    ``octo-dist jobs`` reads (``named``: their job name, and the job the first waits for, or None); None when
    nothing was submitted, or the record cannot be written (the jobs are queued
    all the same, and launch has printed their ids)."""
    save_dir = _save_dir(script) if jobs else None
    if save_dir is None:
        return None
    try:
        return jobrecord.record(
            scheduler, script, save_dir, submit_dir, [(s.job_id, s.log) for s in jobs], *named
        )
    except OSError:
        return None
