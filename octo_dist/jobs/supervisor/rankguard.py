"""Around each rank, on its node: pass the stop signals on, and leave a note in the job's directory (the save
directory, which every node sees): ``failed/rank-N`` when the rank exits non-zero, ``done/rank-N`` when it exits 0.

The supervisor reads the notes: the first failure names the rank and node, and a launcher that exits 0 while some
rank left no ``done`` note (its node was lost) fails the job.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Mapping, Sequence

# Forwarded to the rank as they come; each rank treats them as "checkpoint and stop".
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# The launcher's rank variables, first found wins: Open MPI 4/5, PMIx, SLURM, MPICH. "3"
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK")


def rank_of(env: Mapping[str, str]) -> str:
    """The rank this guard runs, from the launcher's variables; "unknown" when none is set."""
    return next((env[v] for v in RANK_VARS if env.get(v)), "unknown")


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell gives it: -15 (killed by SIGTERM) -> 143."""
    return 128 - returncode if returncode < 0 else returncode


def write_note(job_dir: str, rank: str, status: int, host: str) -> None:
    """The rank's note: ``failed/rank-1`` "rank 1 on g0001 exited with status 2", or ``done/rank-1``."""
    sub, text = (
        ("failed", f"rank {rank} on {host} exited with status {status}")
        if status
        else ("done", f"rank {rank} on {host}")
    )
    try:
        os.makedirs(os.path.join(job_dir, sub), exist_ok=True)
        with open(os.path.join(job_dir, sub, f"rank-{rank}"), "w") as f:
            f.write(text + "\n")
    except OSError:
        pass  # the note is a courtesy: the rank's own status still reaches the launcher


def main(job_dir: str, command: Sequence[str]) -> int:
    procs = []
    pending = []  # signals that came before the rank started: sent to it once it has

    def forward(signum, _frame):
        if not procs:
            pending.append(signum)
            return
        try:
            procs[0].send_signal(signum)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        procs.append(subprocess.Popen(list(command)))
    except OSError as e:
        print(f"octo-dist job: cannot start {command[0]} ({e.strerror})", file=sys.stderr)
        write_note(job_dir, rank_of(os.environ), 127, socket.gethostname())
        return 127
    for signum in pending:
        forward(signum, None)
    status = exit_status(procs[0].wait())
    write_note(job_dir, rank_of(os.environ), status, socket.gethostname())
    return status
