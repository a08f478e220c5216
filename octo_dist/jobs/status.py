"""What ``octo-dist launch --submit`` / ``--chain N`` started, and where it stands: ``octo-dist jobs``.

At submission the jobs are recorded in the save directory (``RECORD``), one entry per ``--submit`` (a chain's jobs
in order, each with its log)::

    runs/ft/.octo-dist-jobs.json
      [{"scheduler": "slurm", "script": "/home/u/proj/job.sh", "submit_dir": "/home/u/proj",
        "save_dir": "runs/ft", "submitted": "2026-12-06T04:20:00Z",
        "jobs": [{"id": "100", "log": "/home/u/proj/octo-dist-100.out"}, {"id": "101", ...}]}]

A job's state comes from the scheduler while it knows the job (PBS ``qstat -x -f -F json``, SLURM ``squeue``,
Grid Engine ``qstat``), then from the exit status the job runtime left in the save directory
(``.octo-dist-exit-<id>``, ``savelayout.exit_file``), parsed as the next job of a chain parses it
(``supervisor/exitfile.py``): 0 is done (a stop for the wall time included), a stop cut short is stopped (the
chain resumes), a status is failed. The step reached is the newest checkpoint with its checksums record
(``<step>/checksums.json``, written last when a step is saved and verified in full when a job resumes from it).

Standard library only (a login node's bare Python); the scheduler's commands run through ``run``
(``outside.run_command``), so tests give it fake or real schedulers on PATH.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from octo_dist import savelayout
from octo_dist.jobs.supervisor import exitfile
from octo_dist.launchers import outside
from octo_dist.problems import Problem, Refusal

RECORD = ".octo-dist-jobs.json"
RECORD_LIMIT = 1 << 20  # bytes: a record of 50-job chains is a few kB per submission
QUERY_TIMEOUT_S = 60  # qstat/squeue answer in seconds; a hung server must not hang `octo-dist jobs`
CHECKSUMS = (
    "checksums.json"  # engine/checkpoint.py's MANIFEST: written last, once a step is complete
)
LOG_TAIL_BYTES = 64 << 10

Runner = Callable[..., outside.Finished]


class JobsError(Refusal, ValueError):
    """Nothing to show: no record in the save directory, or one that cannot be read (exit 2)."""


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

    @property
    def unknown(self) -> bool:
        """The scheduler could not be asked (its command failed): the job may be queued, running or ended."""
        return self.state == "unknown"

    @property
    def active(self) -> bool:
        """Still in the queue or running: what ``cancel`` ends."""
        return self.state in ("queued", "held", "running", "exiting", "suspended")


# --- the record, written at submission ----------------------------------------------------------------------------


def save_dir_of_script(text: str) -> Optional[str]:
    """The save directory a rendered job script uses (its settings' ``storage.save_dir``, the single-quoted JSON
    after ``supervise``): ``"runs/ft"``; None when the text holds no settings (not a script octo-dist wrote)."""
    at = text.find(" supervise '")
    if at < 0:
        return None
    words = shlex.shlex(text[at + len(" supervise ") :], posix=True)
    words.whitespace_split = True
    try:
        settings = json.loads(next(words))
        return str(settings["storage"]["save_dir"]) or None
    except (ValueError, KeyError, TypeError, StopIteration):
        return None


def record_path(save_dir: str, submit_dir: str) -> str:
    """``("runs/ft", "/home/u/proj")`` -> ``"/home/u/proj/runs/ft/.octo-dist-jobs.json"``."""
    return os.path.join(submit_dir, save_dir, RECORD)


def read_records(path: str) -> List[dict]:
    """The submissions recorded in ``path``, oldest first; [] when there is none.

    Raises:
      JobsError: a record that is not one (binary, too long, not the JSON written here).
    """
    fix = f"remove {path} (it only lists submitted jobs), then use qstat/squeue"
    try:
        text = outside.read_text(path, RECORD_LIMIT, "", fix)
    except FileNotFoundError:
        return []
    except outside.InputError as e:
        raise JobsError(str(e)) from None
    try:
        records = json.loads(text)
    except ValueError as e:
        raise JobsError(
            f"{path} is not JSON ({e})", "the record octo-dist launch --submit writes", fix
        ) from None
    if not isinstance(records, list) or not all(
        isinstance(r, dict) and isinstance(r.get("jobs"), list) and r.get("scheduler")
        for r in records
    ):
        raise JobsError(
            f"{path} is not a list of submissions",
            "the record octo-dist launch --submit writes",
            fix,
        )
    return records


def record(
    scheduler: str, script: str, save_dir: str, submit_dir: str, jobs: Sequence[Tuple[str, str]]
) -> str:
    """Add one submission (``jobs``: (id, log) in chain order) to the save directory's record, creating the
    directory; written to a temporary file and renamed, so a reader never sees half of it. Returns its path."""
    path = record_path(save_dir, submit_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        records = read_records(path)
    except JobsError:
        records = []  # a damaged record is replaced: the new jobs must not go unrecorded
    records.append(
        {
            "scheduler": scheduler,
            "script": os.path.abspath(script),
            "submit_dir": submit_dir,
            "save_dir": save_dir,
            "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "jobs": [{"id": job_id, "log": log} for job_id, log in jobs],
        }
    )
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


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


def _failed(argv: Sequence[str], proc: outside.Finished) -> Tuple[str, str]:
    """What a scheduler's failed query says, as a job's state: ``("unknown", "qstat failed (exit 1): cannot
    connect to server")``. The jobs may run all the same: never read as "ended"."""
    return (
        "unknown",
        f"{argv[0]} failed (exit {proc.returncode}): {one_line(proc.stderr or proc.stdout)}",
    )


def one_line(text: str, limit: int = 200) -> str:
    """A command's message on one line, its lines joined: ``"Connection refused\\nqstat: cannot connect"`` ->
    ``"Connection refused; qstat: cannot connect"`` (escaped, cut to ``limit``); ``"no message"`` for none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return outside.shown("; ".join(lines), limit) or "no message"


# What the schedulers say of a job they no longer know (purged from their history): its exit file tells.
# PBS: "qstat: Unknown Job Id 555.pbs1"; SLURM: "slurm_load_jobs error: Invalid job id specified".
GONE = re.compile(r"(?i)unknown job id|invalid job id")


def _pbs(ids: Sequence[str], run: Runner) -> Dict[str, Tuple[str, str]]:
    out = {}
    for job_id in ids:
        argv = ["qstat", "-x", "-f", "-F", "json", job_id]
        proc = _query(run, argv)
        if proc.returncode != 0:
            if not GONE.search(proc.stderr + proc.stdout):
                out[job_id] = _failed(argv, proc)
            continue
        try:
            job = json.loads(proc.stdout)["Jobs"][job_id]
        except (ValueError, KeyError, TypeError):
            continue
        state = job.get("job_state", "")
        if state == "F":
            status = job.get("Exit_status")
            out[job_id] = ("finished", f"Exit_status {status}" if status is not None else "")
        else:
            held = "waits for the job before it" if state == "H" else ""
            out[job_id] = (PBS_STATES.get(state, state), held)
    return out


def _slurm(ids: Sequence[str], run: Runner) -> Dict[str, Tuple[str, str]]:
    argv = ["squeue", "-h", "-o", "%i|%T|%r", "-j", ",".join(ids)]
    proc = _query(run, argv)
    if proc.returncode != 0:
        return (
            {}
            if GONE.search(proc.stderr + proc.stdout)
            else dict.fromkeys(ids, _failed(argv, proc))
        )
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in ids:
            job_id, state, reason = parts
            if state == "PENDING" and reason == "Dependency":
                out[job_id] = ("held", "waits for the job before it")
            else:
                out[job_id] = (SLURM_STATES.get(state, state.lower()), "")
    return out


def _sge(ids: Sequence[str], run: Runner) -> Dict[str, Tuple[str, str]]:
    proc = _query(run, ["qstat"])
    if proc.returncode != 0:
        return dict.fromkeys(ids, _failed(["qstat"], proc))
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        # job-ID prior name user state submit/start-date time [queue] slots [ja-task-ID]
        if len(parts) >= 5 and parts[0] in ids:
            state = parts[4]
            held = "waits for the job before it" if state.startswith("h") else ""
            out[parts[0]] = (SGE_STATES.get(state, state), held)
    return out


QUERIES = {"pbs": _pbs, "slurm": _slurm, "sge": _sge}
CANCEL = {"pbs": ["qdel"], "slurm": ["scancel"], "sge": ["qdel"]}


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
    save_dir = os.path.join(submission.get("submit_dir", ""), submission.get("save_dir", ""))
    out = []
    for job in submission["jobs"]:
        job_id, log = str(job["id"]), str(job.get("log", ""))
        state, detail = known.get(job_id, ("", ""))
        if state and state != "finished":  # "unknown" included: the scheduler could not say
            out.append(JobState(job_id, state, detail, log))
            continue
        out.append(ended(job_id, log, exit_line(save_dir, job_id), detail))
    return out


def newest_checkpoint(save_dir: str, depth: int = 3) -> Optional[Tuple[int, str]]:
    """The newest step saved whole under ``save_dir`` (smoke: ``<step>/``; finetune: ``<run>/<step>/``):
    ``(1200, "runs/ft/octo/ft_run/1200")``, or None. A step counts once its ``checksums.json`` exists (written last)."""
    best: Optional[Tuple[int, str]] = None
    frontier = [(save_dir, 0)]
    while frontier:
        directory, level = frontier.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for e in entries:
            if not e.is_dir(follow_symlinks=False) or e.name.startswith("."):
                continue
            if e.name.isdigit() and os.path.isfile(os.path.join(e.path, CHECKSUMS)):
                if best is None or int(e.name) > best[0]:
                    best = (int(e.name), e.path)
            elif level + 1 < depth and not e.name.isdigit():
                frontier.append((e.path, level + 1))
    return best


def cancel_command(scheduler: str, jobs: Sequence[JobState]) -> Optional[List[str]]:
    """The command that ends every job still queued or running (``["scancel", "101", "102"]``); None if none is."""
    active = [j.job_id for j in jobs if j.active]
    return [*CANCEL[scheduler], *active] if active and scheduler in CANCEL else None


def log_tail(path: str, lines: int) -> str:
    """The last ``lines`` lines of a job's log (read from its last ``LOG_TAIL_BYTES``), escaped for the terminal."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - LOG_TAIL_BYTES))
        text = outside.decode(f.read())
    # A progress bar redraws with carriage returns: its last drawing is what a terminal would show.
    shown = [ln.rsplit("\r", 1)[-1] for ln in text.splitlines()]
    return "\n".join(outside.escape(ln) for ln in shown[-lines:])
