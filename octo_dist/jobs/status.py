"""What ``octo-dist launch --submit`` / ``--chain N`` started, and where it stands: ``octo-dist jobs``.

The jobs are those recorded at submission (``jobrecord``: in the save directory, and listed in the user's index).

A job's state comes from the scheduler while it knows the job (PBS ``qstat -x -f -F json``, SLURM ``squeue``,
Grid Engine ``qstat``), then from the exit status the job runtime left in the save directory
(``.octo-dist-exit-<id>``, ``savelayout.exit_file``), parsed as the next job of a chain parses it
(``supervisor/exitfile.py``): 0 is done (a stop for the wall time included), a stop cut short is stopped (the
chain resumes), a status is failed. The step reached is the newest checkpoint with its checksums record
(``<step>/checksums.json``, written last when a step is saved and verified in full when a job resumes from it), in
the run layout the training program writes (``savelayout.RunLayout``).

Standard library only (a login node's bare Python); the scheduler's commands run through ``run``
(``outside.run_command``), so tests give it fake or real schedulers on PATH.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import re
import stat
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from octo_dist import problems, savelayout
from octo_dist.jobs.supervisor import chainend, exitfile
from octo_dist.launchers import outside
from octo_dist.jobs.jobrecord import JobsError
from octo_dist.problems import Problem

QUERY_TIMEOUT_S = 60  # qstat/squeue answer in seconds; a hung server must not hang `octo-dist jobs`
LOG_TAIL_BYTES = 64 << 10

Runner = Callable[..., outside.Finished]


class QueryError(Problem, RuntimeError):
    """The scheduler's command failed or did not answer (exit 1)."""


@dataclasses.dataclass(frozen=True)
class JobState:
    job_id: str
    # "queued", "held", "running", "done", "failed", "ended", "unknown" (the scheduler's query failed), or the
    # scheduler's own word
    state: str
    detail: str = (
        ""  # "exit 1", "waits for 100", "no exit status left (cancelled before it started?)"
    )
    log: str = ""
    owner: str = ""  # whose job the scheduler says it is: "alice" (PBS's Job_Owner "alice@login1", cut at "@")
    name: str = ""  # the job's name as the scheduler shows it: "octo-dist" (Grid Engine's qstat: 10 characters)

    @property
    def unknown(self) -> bool:
        """The scheduler could not be asked (its command failed): the job may be queued, running or ended."""
        return self.state == "unknown"

    @property
    def active(self) -> bool:
        """Still in the queue or running: what ``cancel`` ends."""
        return self.state in ("queued", "held", "running", "exiting", "suspended")


# --- the scheduler's view -----------------------------------------------------------------------------------------

PBS_STATES = {
    "Q": "queued",
    "H": "held",
    "W": "queued",
    "R": "running",
    "E": "exiting",
    "S": "suspended",
}
SLURM_STATES = {
    "PENDING": "queued",
    "RUNNING": "running",
    "COMPLETING": "exiting",
    "SUSPENDED": "suspended",
    "REQUEUED": "queued",
}
# Grid Engine's state letters (qstat): r running, t transferring, Rr restarted, qw waiting, hqw held (a dependency),
# dr/dt being deleted, s suspended; others (Eqw: an error) are shown as they are.
SGE_STATES = {
    "r": "running",
    "t": "running",
    "Rr": "running",
    "qw": "queued",
    "Rq": "queued",
    "hqw": "held",
    "hRwq": "held",
    "dr": "exiting",
    "dt": "exiting",
    "s": "suspended",
}


def _query(run: Runner, argv: List[str]) -> outside.Finished:
    try:
        return run(argv, QUERY_TIMEOUT_S)
    except FileNotFoundError:
        raise QueryError(
            f"no {argv[0]} here; expected to run where the jobs were submitted (the cluster's login node). "
            f"Fix: run octo-dist jobs there"
        ) from None
    except outside.CommandTimeout:
        raise QueryError(
            f"{' '.join(argv)} did not answer within {QUERY_TIMEOUT_S} s; expected an answer in seconds. "
            f"Fix: retry later; the jobs are not affected"
        ) from None


# What a scheduler says of one job: (state, detail, owner, name): ("running", "", "alice", "octo-dist").
Seen = Tuple[str, str, str, str]


def _failed(argv: Sequence[str], proc: outside.Finished) -> Seen:
    """What a scheduler's failed query says, as a job's state: ``("unknown", "qstat failed (exit 1): cannot
    connect to server")``. The jobs may run all the same: never read as "ended"."""
    said = one_line(proc.stderr or proc.stdout)
    return ("unknown", f"{argv[0]} failed (exit {proc.returncode}): {said}", "", "")


def one_line(text: str, limit: int = 200) -> str:
    """A command's message on one line, its lines joined: ``"Connection refused\\nqstat: cannot connect"`` ->
    ``"Connection refused; qstat: cannot connect"`` (escaped, cut to ``limit``); ``"no message"`` for none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return outside.shown("; ".join(lines), limit) or "no message"


# What the schedulers say of a job they no longer know (purged from their history): its exit file tells.
# PBS: "qstat: Unknown Job Id 555.pbs1"; SLURM: "slurm_load_jobs error: Invalid job id specified".
GONE = re.compile(r"(?i)unknown job id|invalid job id")


def _pbs_job(text: str, job_id: str) -> Optional[dict]:
    """The job's attributes in ``qstat -x -f -F json ID``'s answer (``{"Jobs": {"555.pbs1": {"job_state": "R",
    ...}}}``), or None when the answer has another shape."""
    try:
        job = json.loads(text)["Jobs"][job_id]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return None
    return job if isinstance(job, dict) else None


def _pbs(ids: Sequence[str], run: Runner) -> Dict[str, Seen]:
    out = {}
    for job_id in ids:
        argv = ["qstat", "-x", "-f", "-F", "json", job_id]
        proc = _query(run, argv)
        if proc.returncode != 0:
            if not GONE.search(proc.stderr + proc.stdout):
                out[job_id] = _failed(argv, proc)
            continue
        job = _pbs_job(proc.stdout, job_id)
        if job is None:
            said = f"qstat's answer is not the JSON expected ({one_line(proc.stdout, 80)})"
            out[job_id] = ("unknown", said, "", "")
            continue
        state = job.get("job_state", "")
        if not isinstance(state, str):
            out[job_id] = ("unknown", f"qstat's job_state is {one_line(repr(state), 40)}", "", "")
            continue
        # {"Job_Owner": "alice@login1", "Job_Name": "octo-dist", "job_state": "R", ...}
        owner, name = str(job.get("Job_Owner", "")).split("@")[0], str(job.get("Job_Name", ""))
        if state == "F":
            status = job.get("Exit_status")
            said = f"Exit_status {status}" if status is not None else ""
            out[job_id] = ("finished", said, owner, name)
        else:
            held = "waits for the job before it" if state == "H" else ""
            out[job_id] = (PBS_STATES.get(state, state), held, owner, name)
    return out


def _slurm(ids: Sequence[str], run: Runner) -> Dict[str, Seen]:
    argv = ["squeue", "-h", "-o", "%i|%T|%r|%u|%j", "-j", ",".join(ids)]
    proc = _query(run, argv)
    if proc.returncode != 0:
        return (
            {}
            if GONE.search(proc.stderr + proc.stdout)
            else dict.fromkeys(ids, _failed(argv, proc))
        )
    out = {}
    for line in proc.stdout.splitlines():
        # "101|PENDING|Dependency|alice|octo-dist": the name last, as it may hold "|"
        parts = line.strip().split("|", 4)
        if len(parts) == 5 and parts[0] in ids:
            job_id, state, reason, owner, name = parts
            if state == "PENDING" and reason == "Dependency":
                out[job_id] = ("held", "waits for the job before it", owner, name)
            else:
                out[job_id] = (SLURM_STATES.get(state, state.lower()), "", owner, name)
    return out


def _sge(ids: Sequence[str], run: Runner) -> Dict[str, Seen]:
    proc = _query(run, ["qstat"])
    if proc.returncode != 0:
        return dict.fromkeys(ids, _failed(["qstat"], proc))
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        # job-ID prior name user state submit/start-date time [queue] slots [ja-task-ID]
        # "77 0.50000 octo-dist alice r 12/06/2026 04:20:00 gpu@g0001 2"
        if len(parts) >= 5 and parts[0] in ids:
            state = parts[4]
            held = "waits for the job before it" if state.startswith("h") else ""
            out[parts[0]] = (SGE_STATES.get(state, state), held, parts[3], parts[2])
    return out


QUERIES = {"pbs": _pbs, "slurm": _slurm, "sge": _sge}
CANCEL = chainend.CANCEL


def exit_line(save_dir: str, job_id: str) -> Optional[exitfile.ExitLine]:
    """What job ``job_id`` left in ``save_dir``'s exit file, parsed as the next job of its chain parses it
    (``exitfile.load``); None when it left none."""
    try:
        return exitfile.load(savelayout.exit_file(save_dir, job_id))
    except OSError as e:
        return exitfile.ExitLine(exitfile.FOREIGN, None, f"unreadable ({e.strerror or e})")


def ended(job_id: str, log: str, found: Optional[exitfile.ExitLine], detail: str) -> JobState:
    """A job the scheduler no longer lists, from its exit file: ``"143 resumable: ..."`` -> stopped, exit 143,
    resumable; ``"2"`` -> failed, exit 2; none -> ended (``detail``: what the scheduler said of it, if anything)."""
    if found is None:
        why = detail or "no exit status left: cancelled or ended before its first step"
        return JobState(job_id, "ended", why, log)
    if found.kind == exitfile.DONE:
        return JobState(job_id, "done", "exit 0", log)
    if found.kind == exitfile.STOPPING:
        why = "ended during a stop, before it said how the stop went; the next job resumes"
        return JobState(job_id, "stopped", why, log)
    if found.kind == exitfile.RESUMABLE:
        return JobState(job_id, "stopped", f"exit {found.status}, resumable", log)
    if found.kind == exitfile.FAILED:
        return JobState(job_id, "failed", f"exit {found.status}", log)
    if found.kind == exitfile.EMPTY:
        return JobState(job_id, "failed", "empty exit status (its file system was full?)", log)
    return JobState(job_id, "ended", f"exit file {found.said}", log)


def states(submission: Mapping, run: Runner = outside.run_command) -> List[JobState]:
    """Each job of one recorded submission, in chain order."""
    ids = [str(j["id"]) for j in submission["jobs"]]
    scheduler = submission["scheduler"]
    known = QUERIES[scheduler](ids, run) if scheduler in QUERIES and ids else {}
    save_dir = savelayout.submitted_save_dir(
        submission.get("submit_dir", ""), submission.get("save_dir", "")
    )
    out = []
    for job in submission["jobs"]:
        job_id, log = str(job["id"]), str(job.get("log", ""))
        state, detail, owner, name = known.get(job_id, ("", "", "", ""))
        if state and state != "finished":  # "unknown" included: the scheduler could not say
            out.append(JobState(job_id, state, detail, log, owner, name))
            continue
        out.append(ended(job_id, log, exit_line(save_dir, job_id), detail))
    return out


def newest_checkpoint(save_dir: str) -> Optional[Tuple[int, str]]:
    """The newest step saved whole in ``save_dir``, found where the training program lays its runs out
    (``savelayout.RunLayout.found_in``: smoke ``<step>/``, finetune ``<project>/[<group>/]<name>/train_state/
    <step>/``): ``(1200, "runs/ft/octo_finetune/ft_256/train_state/1200")``, or None. A step counts once its
    ``checksums.json`` exists (written last)."""
    best: Optional[Tuple[int, str]] = None
    for layout in savelayout.RunLayout.found_in(save_dir):
        steps = layout.saved_steps()
        if steps and (best is None or steps[-1] > best[0]):
            best = (steps[-1], layout.checkpoint(steps[-1]))
    return best


# Grid Engine's plain qstat shows a job's name cut to this many characters ("octo-dist-finetune" as "octo-dist-").
SHOWN_NAME = 10


def same_name(shown: str, recorded: str) -> bool:
    """Whether the scheduler's ``shown`` name is the ``recorded`` one, or Grid Engine's cut of it."""
    return shown == recorded or (len(shown) >= SHOWN_NAME and recorded.startswith(shown))


def why_not_cancel(job: JobState, user: str, name: str) -> str:
    """Why ``job``, still queued or running, is not to be cancelled by ``user`` for a submission recorded with job
    name ``name``; "" when it is the caller's job of that name. The record is only a file in a shared directory:
    the scheduler's word on whose job an id is decides."""
    try:
        savelayout.checked_job_id("the recorded job id", job.job_id)
    except savelayout.JobIdError:
        return "its recorded id is not a job id"
    if not job.owner:
        return "the scheduler did not say whose job it is"
    if job.owner != user:
        return f"it is {outside.shown(job.owner, 40)}'s job, not yours ({user})"
    if not name:
        return "the record names no job name to compare (written by an older octo-dist)"
    if not same_name(job.name, name):
        return f"its name is {outside.shown(job.name, 40)!r}, not the recorded {outside.shown(name, 40)!r}"
    return ""


def cancel_command(
    scheduler: str, jobs: Sequence[JobState], user: str, name: str
) -> Tuple[Optional[List[str]], List[Tuple[str, str]]]:
    """(the command that ends every job still queued or running that is ``user``'s and named ``name``, or None
    when there is none: ``["scancel", "101", "102"]``; the active jobs left alone, and why: ``[("555.pbs1", "it is
    bob's job, not yours (alice)")]``)."""
    ours, skipped = [], []
    for job in (j for j in jobs if j.active):
        why = why_not_cancel(job, user, name)
        if why:
            skipped.append((job.job_id, why))
        else:
            ours.append(job.job_id)
    argv = [*CANCEL[scheduler], *ours] if ours and scheduler in CANCEL else None
    return argv, skipped


def caller() -> str:
    """The user running ``octo-dist jobs`` ("alice"): whose jobs it may cancel."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def log_tail(path: str, lines: int) -> str:
    """The last ``lines`` lines of a job's log (read from its last ``LOG_TAIL_BYTES``), escaped for the terminal.

    Raises:
      OSError: it cannot be opened (missing, permissions).
      JobsError: it is not a regular file: a FIFO (whose open would wait for a writer) or a device (``/dev/zero``
        reads without end) is named, never read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise JobsError(
                f"the job's log {outside.shown(path, 200)} is a {problems.file_kind(mode)}, not a file",
                "the file the scheduler writes the job's output to",
                "look where your site puts job logs",
            )
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - LOG_TAIL_BYTES), os.SEEK_SET)
        data = b""
        while len(data) < LOG_TAIL_BYTES:
            chunk = os.read(fd, LOG_TAIL_BYTES - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    text = outside.decode(data)
    # A progress bar redraws with carriage returns: its last drawing is what a terminal would show.
    shown = [ln.rsplit("\r", 1)[-1] for ln in text.splitlines()]
    return "\n".join(outside.escape(ln) for ln in shown[-lines:])
