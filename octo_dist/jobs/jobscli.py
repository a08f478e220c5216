"""octo-dist jobs [status|log|cancel|extend]: the jobs octo-dist launch --submit or --chain N submitted for a save
directory, read from what launch recorded there at submission.

    $ octo-dist jobs --save-dir runs/ft
    chain of 3 (slurm, submitted 2026-12-06T04:20:00Z, job.sh):
      100  done     exit 0                       log octo-dist-100.out
      101  running                               log octo-dist-101.out
      102  held     waits for the job before it  log octo-dist-102.out
    newest checkpoint: step 1200 (runs/ft/1200)

status (the default) lists each job's state, the step reached and the newest saved checkpoint; log shows the end of
the running job's log; cancel ends every job of the chain still queued or running that the scheduler says is yours
and carries the recorded job name (the record is a file in a shared directory: the scheduler's word decides);
extend adds --add N jobs after the chain's last one.
"""

from __future__ import annotations

import argparse
import os
import sys

from octo_dist import EXIT_USAGE, savelayout, subcommand
from octo_dist.jobs import chains as chains_mod
from octo_dist.jobs import jobrecord, probesite
from octo_dist.jobs import submit as submit_mod
from octo_dist.jobs import status as st
from octo_dist.launchers import outside
from octo_dist.problems import Problem

DEFAULT_SAVE_DIR = "runs/octo-dist"  # launch's --save-dir default
HELP = "status, log and cancel of the jobs launch --submit/--chain started"


def add_parser(sub) -> argparse.ArgumentParser:
    p = subcommand.parser(sub, "jobs", HELP, __doc__, run)
    p.add_argument(
        "action",
        nargs="?",
        choices=("status", "log", "cancel", "extend"),
        default="status",
        help="what to do (default: %(default)s)",
    )
    p.add_argument(
        "--save-dir",
        default=DEFAULT_SAVE_DIR,
        help="the save directory the jobs were submitted with, as launch was given it (from the directory launch "
        "ran in, or from anywhere: your submissions are listed in ~/.octo-dist/jobs.json) or absolute "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--lines",
        type=int,
        default=40,
        help="log: lines from the end of the log (default: %(default)s)",
    )
    p.add_argument(
        "--add",
        type=int,
        default=1,
        metavar="N",
        help="extend: jobs to add after the last job of the chain, which must be queued or running "
        "(default: %(default)s)",
    )
    return p


def _chains(save_dir: str) -> list:
    """Every submission recorded for ``save_dir`` (``jobrecord.find``: here, else from the user's index), oldest
    first, each with its jobs' states: ``[(submission, [JobState, ...]), ...]``."""
    path = jobrecord.find(save_dir)
    records = jobrecord.read_records(path)
    if not records:
        raise jobrecord.JobsError(
            f"no jobs recorded for --save-dir {save_dir} ({path} lists none)",
            "the save directory of a launch --submit or --chain run",
            "octo-dist jobs --save-dir DIR, with the --save-dir you gave launch",
        )
    return [(r, st.states(r)) for r in records]


def _table(submission: dict, jobs: list) -> str:
    n = len(jobs)
    head = (
        f"{'chain of ' + str(n) if n > 1 else 'one job'} ({submission['scheduler']}, submitted "
        f"{submission.get('submitted', '?')}, {os.path.basename(str(submission.get('script', '')))}):"
    )
    width = max(len(j.job_id) for j in jobs)
    detail = max(len(j.detail) for j in jobs)
    rows = [
        f"  {j.job_id:<{width}}  {j.state:<8} {j.detail:<{detail}}  log {j.log}".rstrip()
        for j in jobs
    ]
    return "\n".join(outside.escape(line) for line in [head, *rows])


def _unknown(jobs: list) -> int:
    """One line for jobs whose state the scheduler could not give (its query failed): they may still run, so
    nothing is resubmitted or cancelled on a guess; exit 1."""
    print(
        f"octo-dist jobs: error: the state of {', '.join(j.job_id for j in jobs)} is unknown ({jobs[0].detail}); "
        "expected the scheduler to answer. Fix: retry where the scheduler answers (the cluster's login node); "
        "do not resubmit until it says the jobs ended",
        file=sys.stderr,
    )
    return 1


def run(args: argparse.Namespace) -> int:
    try:
        chains = _chains(args.save_dir)
    except Problem as e:
        print(f"octo-dist jobs: error: {e}", file=sys.stderr)
        return e.exit_status
    unknown = [j for _, jobs in chains for j in jobs if j.unknown]
    if args.action == "status":
        return _status(chains, unknown)
    if args.action == "extend":
        return _extend(chains, args.add)
    if unknown and args.action == "cancel":
        return _unknown(unknown)
    if args.action == "log":
        return _log([j for _, jobs in chains for j in jobs], args.lines)
    return _cancel(chains)


def _status(chains: list, unknown: list) -> int:
    """Every recorded chain's table, the newest checkpoint, the jobs still needed and a probe report's findings."""
    for submission, jobs in chains:
        print(_table(submission, jobs))
    submission = chains[-1][0]
    save_dir = savelayout.submitted_save_dir(submission["submit_dir"], submission["save_dir"])
    found = st.newest_checkpoint(save_dir)
    print(
        f"newest checkpoint: step {found[0]} ({found[1]})"
        if found
        else "newest checkpoint: none yet"
    )
    estimate = chains_mod.estimate(chains, save_dir, found[0] if found else 0)
    if estimate:
        print(outside.escape(estimate))
    # A probe job's report, where `octo-dist probe` wrote one: how the site differs from what launch assumes.
    for line in probesite.status_lines(save_dir):
        print(outside.escape(line))
    return _unknown(unknown) if unknown else 0


def _extend(chains: list, add: int) -> int:
    """Submits ``add`` jobs after the chain's last one (``chains.extend``), each line as launch --submit says it."""
    if not 1 <= add <= submit_mod.MAX_CHAIN:
        print(
            f"octo-dist jobs: error: --add {add}; expected 1 to {submit_mod.MAX_CHAIN} jobs. Fix: --add 1",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        added = chains_mod.extend(chains, add)
    except Problem as e:
        print(f"octo-dist jobs: error: {e}", file=sys.stderr)
        return e.exit_status
    after = chains[-1][1][-1].job_id
    for s in added:
        print(f"submitted job {s.job_id}, after {after}: log {s.log}")
        after = s.job_id
    return 0


def _log(jobs: list, lines: int) -> int:
    """The end of the running job's log (the first running, of every chain), else of the last that ran."""
    running = [j for j in jobs if j.state in ("running", "exiting")]
    started = running or [
        j for j in jobs if j.state in ("done", "failed", "stopped") and os.path.isfile(j.log)
    ]
    if not started:
        print(
            "octo-dist jobs: error: no job of the chain has run yet; expected a running or ended job. "
            "Fix: octo-dist jobs status, and wait for the first to start",
            file=sys.stderr,
        )
        return EXIT_USAGE
    job = started[0] if running else started[-1]
    try:
        text = st.log_tail(job.log, max(lines, 1))
    except jobrecord.JobsError as e:
        print(f"octo-dist jobs: error: {e}", file=sys.stderr)
        return e.exit_status
    except OSError as e:
        print(
            f"octo-dist jobs: error: cannot read job {job.job_id}'s log {job.log} ({e.strerror}); expected "
            f"the scheduler to write it there. Fix: look where your site puts job logs",
            file=sys.stderr,
        )
        return 1
    print(f"job {job.job_id} ({job.state}), {job.log}:\n{text}")
    return 0


def _cancel(chains: list) -> int:
    """Ends the jobs of every recorded chain still queued or running that the scheduler says are the caller's and
    carry the chain's recorded job name; names each one left alone and why (exit 1 then)."""
    user, status, cancelled = st.caller(), 0, False
    for submission, jobs in chains:
        argv, skipped = st.cancel_command(
            submission["scheduler"], jobs, user, str(submission.get("name") or "")
        )
        for job_id, why in skipped:
            status = 1
            print(
                f"octo-dist jobs: not cancelling {outside.shown(job_id, 80)}: {why}; expected a job you "
                f"submitted as {submission.get('name') or 'the recorded name'}. Fix: check it with "
                f"{'squeue' if submission['scheduler'] == 'slurm' else 'qstat'}; cancel it by hand if it is "
                "yours",
                file=sys.stderr,
            )
        if argv is not None:
            cancelled = True
            status = max(status, _run_cancel(argv))
    if not cancelled and status == 0:
        print("nothing to cancel: no job of the chain is queued or running")
    return status


def _run_cancel(argv: list) -> int:
    try:
        proc = outside.run_command(argv, st.QUERY_TIMEOUT_S)
    except (OSError, outside.CommandTimeout) as e:
        print(
            f"octo-dist jobs: error: {' '.join(argv)} did not run ({e}); the jobs are as they were",
            file=sys.stderr,
        )
        return 1
    if proc.returncode != 0:
        said = outside.shown(proc.stderr) or outside.shown(proc.stdout)
        print(
            f"octo-dist jobs: error: {' '.join(argv)} failed (exit {proc.returncode}): {said}",
            file=sys.stderr,
        )
        return 1
    print(f"cancelled {', '.join(argv[1:])} ({' '.join(argv)})")
    return 0
