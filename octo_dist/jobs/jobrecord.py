"""The record of what ``octo-dist launch --submit`` / ``--chain N`` submitted, which ``octo-dist jobs`` reads.

One record in each save directory (``RECORD``), one entry per submission (a chain's jobs in order, each with its
log); and the user's own index of those records (``~/.octo-dist/jobs.json``), so ``octo-dist jobs`` works from any
directory::

    runs/ft/.octo-dist-jobs.json
      [{"scheduler": "slurm", "script": "/home/u/proj/job.sh", "name": "octo-dist", "submit_dir": "/home/u/proj",
        "save_dir": "runs/ft", "submitted": "2026-12-06T04:20:00Z",
        "jobs": [{"id": "100", "log": "/home/u/proj/octo-dist-100.out"}, {"id": "101", ...}]}]

Both are read bounded and checked field by field (a save directory is shared: what lies there may be anything),
and written to a new file renamed into place. Standard library only (a login node's bare Python).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import List, Optional, Sequence, Tuple

from octo_dist import savelayout
from octo_dist.jobs.filereplace import replacing
from octo_dist.launchers import outside
from octo_dist.problems import Refusal

RECORD = savelayout.JOBS_RECORD
RECORD_LIMIT = 1 << 20  # bytes: a record of 50-job chains is a few kB per submission
SCHEDULERS = ("pbs", "slurm", "sge")  # status.QUERIES' keys: the schedulers octo-dist jobs can ask


class JobsError(Refusal, ValueError):
    """Nothing to show: no record in the save directory, or one that cannot be read (exit 2)."""


def settings_of_script(text: str) -> Optional[dict]:
    """The job's settings a rendered job script passes its runtime (the single-quoted JSON after ``supervise``):
    ``{"storage": {"save_dir": "runs/ft", ...}, "timing": {"walltime_s": 3600, ...}, ...}``; None when the text
    holds none (not a script octo-dist wrote)."""
    at = text.find(" supervise '")
    if at < 0:
        return None
    words = shlex.shlex(text[at + len(" supervise ") :], posix=True)
    words.whitespace_split = True
    try:
        settings = json.loads(next(words))
    except (ValueError, StopIteration, RecursionError):
        return None
    return settings if isinstance(settings, dict) else None


def save_dir_of_script(text: str) -> Optional[str]:
    """The save directory a rendered job script uses (its settings' ``storage.save_dir``): ``"runs/ft"``; None when
    the text holds no settings (not a script octo-dist wrote)."""
    try:
        return str((settings_of_script(text) or {})["storage"]["save_dir"]) or None
    except (KeyError, TypeError):
        return None


def record_path(save_dir: str, submit_dir: str) -> str:
    """``("runs/ft", "/home/u/proj")`` -> ``"/home/u/proj/runs/ft/.octo-dist-jobs.json"``."""
    return savelayout.jobs_record(savelayout.submitted_save_dir(submit_dir, save_dir))


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
    except (
        ValueError,
        RecursionError,
    ) as e:  # RecursionError: "[[[[...": nesting deeper than Python's stack
        why = str(e) if isinstance(e, ValueError) else "nested too deep"
        raise JobsError(
            f"{path} is not JSON ({outside.shown(why, 120)})",
            "the record octo-dist launch --submit writes",
            fix,
        ) from None
    problem = damage(records)
    if problem:
        raise JobsError(
            f"{path} is not a list of submissions: {problem}",
            "the record octo-dist launch --submit writes",
            fix,
        )
    return records


# A submission's fields and their types, as ``record`` writes them.
FIELDS = {"scheduler": str, "script": str, "submit_dir": str, "save_dir": str, "jobs": list}


def damage(records: object) -> str:
    """What makes ``records`` (parsed JSON) other than what ``record`` writes, in a few words (``"submission 1:
    job id '-x' is not a job id"``); "" when nothing does. Every value a reader uses is checked here, once: the
    ids become arguments of qstat/qdel and parts of file names, the paths are opened."""
    if not isinstance(records, list):
        return f"a JSON {type(records).__name__}, not a list"
    for n, r in enumerate(records, 1):
        if not isinstance(r, dict):
            return f"submission {n} is a JSON {type(r).__name__}"
        for field, kind in FIELDS.items():
            if not isinstance(r.get(field), kind):
                return f"submission {n} has no {field} ({kind.__name__})"
            if kind is str and "\0" in r[field]:
                return f"submission {n}'s {field} holds a NUL"
        if r["scheduler"] not in SCHEDULERS:
            return f"submission {n}'s scheduler {outside.shown(r['scheduler'], 40)!r} is none of {list(SCHEDULERS)}"
        if not r["jobs"]:
            return f"submission {n} lists no jobs"
        if not isinstance(r.get("name", ""), str) or not isinstance(r.get("after", ""), str):
            return f"submission {n}'s name or after is not text"
        for job in r["jobs"]:
            if not isinstance(job, dict) or not isinstance(job.get("id"), str):
                return f"submission {n} has a job without an id (text)"
            if not isinstance(job.get("log", ""), str) or "\0" in job.get("log", ""):
                return (
                    f"submission {n}'s job {outside.shown(job['id'], 40)} has a log that is no path"
                )
            try:
                savelayout.checked_job_id("id", job["id"])
            except savelayout.JobIdError:
                return f"submission {n}: {outside.shown(job['id'], 40)!r} is not a job id"
    return ""


def record(
    scheduler: str,
    script: str,
    save_dir: str,
    submit_dir: str,
    jobs: Sequence[Tuple[str, str]],
    name: str = "",
    after: Optional[str] = None,
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
            "name": name,
            "submit_dir": submit_dir,
            "save_dir": save_dir,
            "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "jobs": [{"id": job_id, "log": log} for job_id, log in jobs],
            **(
                {"after": after} if after else {}
            ),  # extends a chain: its first job waits for this one
        }
    )
    write_json(path, records)
    remember(path, save_dir, submit_dir)
    return path


def write_json(path: str, data: object) -> None:
    """Replaces ``path`` with ``data`` as JSON, whole (``filereplace.replacing``: a planted link there is replaced,
    never written through), readable by the user's group."""
    with replacing(path, 0o644) as f:
        json.dump(data, f, indent=1)
        f.write("\n")


# --- the user's own list of records, so `octo-dist jobs` works from any directory ----------------------------------

INDEX = os.path.join(
    ".octo-dist", "jobs.json"
)  # under $HOME: [{"record": "/abs/runs/ft/.octo-dist-jobs.json", ...}]
INDEX_KEEP = (
    500  # save directories remembered; the oldest are forgotten (their records stay where they are)
)


def index_path(home: Optional[str] = None) -> str:
    """``~/.octo-dist/jobs.json``: every save directory this user submitted jobs for, newest last."""
    return os.path.join(home or os.path.expanduser("~"), INDEX)


def remembered(home: Optional[str] = None) -> List[dict]:
    """The user's index (``index_path``): ``[{"record": ABS, "save_dir": "runs/ft", "submit_dir": "/w"}]``; [] when
    there is none or it cannot be read (it is only a convenience: each record stays in its save directory)."""
    try:
        entries = json.loads(outside.read_text(index_path(home), RECORD_LIMIT, "", ""))
    except (OSError, ValueError, RecursionError):
        return []
    if not isinstance(entries, list):
        return []
    return [
        e
        for e in entries
        if isinstance(e, dict)
        and all(isinstance(e.get(k), str) for k in ("record", "save_dir", "submit_dir"))
    ]


def remember(record_file: str, save_dir: str, submit_dir: str, home: Optional[str] = None) -> None:
    """Adds a save directory's record to the user's index; a failure to write it is no failure of the submission
    (``octo-dist jobs --save-dir`` from the submit directory still finds the record)."""
    entry = {"record": os.path.abspath(record_file), "save_dir": save_dir, "submit_dir": submit_dir}
    entries = [e for e in remembered(home) if e["record"] != entry["record"]] + [entry]
    try:
        os.makedirs(os.path.dirname(index_path(home)), exist_ok=True)
        write_json(index_path(home), entries[-INDEX_KEEP:])
    except OSError:
        pass


def find(save_dir: str, home: Optional[str] = None) -> str:
    """The record for ``--save-dir save_dir`` as the user gives it: in ``save_dir`` from here, else the one the
    user's index holds for that save directory (as launch was given it, or absolute).

    Raises:
      JobsError: none is found, or the index holds several for that name (each is named, with its absolute path).
    """
    here = savelayout.jobs_record(save_dir)
    if os.path.lexists(here):
        return here
    wanted = os.path.abspath(save_dir)
    matches = []
    for e in remembered(home):
        absolute = os.path.dirname(e["record"])
        if (e["save_dir"] == save_dir or absolute == wanted) and absolute not in matches:
            if os.path.lexists(e["record"]):
                matches.append(absolute)
    if len(matches) == 1:
        return savelayout.jobs_record(matches[0])
    if matches:
        raise JobsError(
            f"--save-dir {save_dir} names {len(matches)} save directories you submitted jobs for: "
            + ", ".join(matches),
            "one save directory",
            f"octo-dist jobs --save-dir {matches[-1]}",
        )
    known = [os.path.dirname(e["record"]) for e in remembered(home)][-3:]
    also = f" (yours: {', '.join(known)})" if known else ""
    raise JobsError(
        f"no jobs recorded for --save-dir {save_dir} (no {here}, and none in {index_path(home)}){also}",
        "the save directory of a launch --submit or --chain run",
        "octo-dist jobs --save-dir DIR, with the --save-dir you gave launch",
    )
