"""Around each rank, on its node: pass the stop signals on, and leave a note in the job's directory (the save
directory, which every node sees): ``failed/rank-N`` when the rank exits non-zero, ``done/rank-N`` when it exits 0.

The supervisor reads the notes: the first failure names the rank and node, and a launcher that exits 0 while some
rank left no ``done`` note (its node was lost) fails the job.

A rank stopped on its node (SIGSTOP, a debugger's attach gone wrong) holds every other rank in its next collective
until JAX's coordination service gives up (about 100 s, and it names rank 0, which hosts the service). The guard
looks at its rank's processes once a second (the rank, or under ``singularity exec`` the runtime's starter and the
training process below it): one stopped for ``STOPPED_LIMIT`` checks in a row while the guard itself ran, they are
all ended and the rank noted as hung, naming its node, so the job ends within a minute naming the right rank.
``OCTO_DIST_STOPPED_RANK_LIMIT_S`` in the job's environment sets that limit in seconds (one check a second, default
20): raise it where a debugger is attached to a rank on purpose, lower it to end a stopped rank sooner. A
scheduler's suspend (qmod -s, scontrol suspend) stops the guard too: its checks do not run meanwhile and are not
counted.

The guard unblocks the stop signals the supervisor blocked in the launcher (``ranks.SHIELDED``: a qdel's SIGTERM
must not make mpirun kill the ranks), so the guard and its rank see them again. It watches its parent too (the
launcher, or the launcher's daemon on another node): once that is gone (``kill -9`` of mpirun), the rank is ended
and noted, instead of training on without a job. The rank itself is started with Linux's parent-death signal
(SIGKILL when the guard dies), so no rank outlives its guard.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from octo_dist import savelayout

# Forwarded to the rank as they come; each rank treats them as "checkpoint and stop".
FORWARDED = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOPPED_LIMIT = 20  # checks, one a second, that find the rank stopped before it is ended as hung
STOPPED_LIMIT_ENV = "OCTO_DIST_STOPPED_RANK_LIMIT_S"  # the job's own limit in seconds: "60"
CHECK_S = 1.0
RESCAN_CHECKS = 10  # a full scan of /proc for the rank's processes every this many checks
HUNG_STATUS = 137  # as a SIGKILLed rank reports it
ORPHANED_STATUS = 137  # a rank ended because its launcher is gone
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent exits

# The launcher's rank variables, first found wins: Open MPI 4/5, PMIx, SLURM, MPICH. "3"
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK")


def rank_of(env: Mapping[str, str]) -> str:
    """The rank this guard runs, from the launcher's variables; "unknown" when none is set."""
    return next((env[v] for v in RANK_VARS if env.get(v)), "unknown")


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell gives it: -15 (killed by SIGTERM) -> 143."""
    return 128 - returncode if returncode < 0 else returncode


def write_note(job_dir: str, rank: str, status: int, host: str, hung: str = "") -> None:
    """The rank's note: ``failed/rank-1`` "rank 1 on g0001 exited with status 2" ("rank 1 on g0001 hung: stopped
    (SIGSTOP) for 20 s, ended with status 137"), or ``done/rank-1``. The status ends it: the supervisor reads it
    there."""
    text = f"rank {rank} on {host}"
    if status:
        text += f" {hung} with status {status}" if hung else f" exited with status {status}"
    note = savelayout.rank_note(job_dir, bool(status), rank)
    try:
        # Only inside the job's directory as the job made it: after the job ended (its launcher killed, the
        # directory removed) a late note must not make a new, unmarked one that no later job removes.
        os.mkdir(os.path.dirname(note))
    except FileExistsError:
        pass
    except OSError:
        return  # the job's directory is gone: the note is a courtesy, the rank's status still reaches the launcher
    try:
        with open(note, "w") as f:
            f.write(text + "\n")
    except OSError:
        pass


def _stat(pid: int, proc_root: str = "/proc") -> Optional[Tuple[str, int]]:
    """(state, ppid) of ``pid`` from ``/proc/PID/stat`` ("4243 (python3) T 4242 ..." -> ("T", 4242)); None when it
    is gone. The command name may hold spaces and parentheses: the fields follow the last ")"."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat")) as f:
            text = f.read()
    except OSError:
        return None
    rest = text[text.rfind(")") + 1 :].split()
    return (
        (rest[0], int(rest[1]))
        if len(rest) >= 2 and rest[1].isascii() and rest[1].isdigit()
        else None
    )


def process_tree(pid: int, proc_root: str = "/proc") -> List[Tuple[int, str, int]]:
    """``[(pid, state, ppid), ...]`` of ``pid`` and every process below it, ``pid`` first; [] once it is gone. A
    scan of /proc: the kernel's per-task children lists are not everywhere."""
    try:
        names = [int(n) for n in os.listdir(proc_root) if n.isdigit()]
    except OSError:
        names = []
    table = {n: st for n in names for st in [_stat(n, proc_root)] if st}
    if pid not in table:
        return []
    tree, todo = [], [pid]
    while todo:
        here = todo.pop()
        tree.append((here, *table[here]))
        todo += [p for p, (_, ppid) in table.items() if ppid == here and p != here]
    return tree


def recheck(
    tree: List[Tuple[int, str, int]], proc_root: str = "/proc"
) -> List[Tuple[int, str, int]]:
    """The same processes' states read again (their stat files only); one gone, or whose parent changed (a pid
    taken by another process), is left out."""
    out = []
    for pid, _, ppid in tree:
        st = _stat(pid, proc_root)
        if st and st[1] == ppid:
            out.append((pid, *st))
    return out


def end_tree(proc: subprocess.Popen, tree: List[Tuple[int, str, int]]) -> None:
    """SIGKILLs every process of ``tree`` below the rank's own, then the rank by its Popen, and reaps it."""
    for pid, _, _ in reversed(tree):
        if pid != proc.pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    try:
        proc.kill()
    except OSError:
        pass
    proc.wait()


def die_with_parent(parent: int) -> Callable[[], None]:
    """The rank's ``preexec_fn``: SIGKILL when ``parent`` (the guard) exits, from Linux's ``prctl``; a guard gone
    already (the race the man page warns of) ends it at once. Elsewhere (no prctl) nothing is set."""

    def preexec() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def stopped_limit(env: Mapping[str, str]) -> Tuple[int, str]:
    """(checks a rank may be found stopped in a row, "" or a warning): ``$OCTO_DIST_STOPPED_RANK_LIMIT_S`` ("60" ->
    60), else ``STOPPED_LIMIT``. A value that is not a whole number of seconds >= 1 keeps the default and says so:
    the guard never stops a rank from starting over its own setting."""
    raw = env.get(STOPPED_LIMIT_ENV)
    if raw is None:
        return STOPPED_LIMIT, ""
    if raw.strip().isascii() and raw.strip().isdigit() and int(raw) >= 1:
        return int(raw), ""
    return STOPPED_LIMIT, (
        f"octo-dist job: {STOPPED_LIMIT_ENV}={raw!r}; expected a whole number of seconds >= 1; the rank guard "
        f"ends a rank stopped for {STOPPED_LIMIT} s. Fix: export {STOPPED_LIMIT_ENV}={STOPPED_LIMIT * 3}"
    )


def wait_watching(
    proc: subprocess.Popen,
    rank: str,
    host: str,
    parent: Optional[int] = None,
    limit: Optional[int] = None,
) -> Tuple[int, str]:
    """(the rank's exit status, "" or why it was ended as hung): a rank one of whose processes is found stopped
    (state T or t) ``limit`` (default ``STOPPED_LIMIT``) checks in a row is killed, every process of it
    (``HUNG_STATUS``).

    A check reads the stat files of the processes found last time; /proc is scanned again every
    ``RESCAN_CHECKS`` checks, and whenever one looks stopped (a scan costs about 20 us per process of the node).

    ``parent``: the launcher's pid (the guard's parent when it started); once the guard's parent is another (the
    launcher died, the guard was handed to init), every process of the rank is killed (``ORPHANED_STATUS``)."""
    limit = STOPPED_LIMIT if limit is None else limit
    stopped, checks, tree = 0, 0, []
    while True:
        try:
            return exit_status(proc.wait(CHECK_S)), ""
        except subprocess.TimeoutExpired:
            pass
        if parent is not None and os.getppid() != parent:
            end_tree(proc, process_tree(proc.pid))
            return ORPHANED_STATUS, f"lost its launcher (pid {parent}): ended"
        checks += 1
        tree = recheck(tree) if tree and checks % RESCAN_CHECKS else []
        if not tree or any(state in ("T", "t") for _, state, _ in tree):
            tree = process_tree(proc.pid)
        stopped = stopped + 1 if any(state in ("T", "t") for _, state, _ in tree) else 0
        if stopped < limit:
            continue
        end_tree(proc, tree)
        return HUNG_STATUS, f"hung: stopped (SIGSTOP) for {stopped} s, ended"


def cpus_for_rank(env: Mapping[str, str], cpus: int) -> dict:
    """What the rank's environment must say of its CPUs, given the ``cpus`` it may run on (its affinity, which the
    launcher's binding set). PBS sets NCPUS and OMP_NUM_THREADS to a chunk's ncpus, 1 for a chunk that asks for
    none (``select=2:mpiprocs=1``): a rank given 12 cores would run 1 thread. Raised to ``cpus`` only where PBS's
    pair says less (NCPUS=1, OMP_NUM_THREADS=1 -> 12); a value the user chose (the two differ) stays."""
    ncpus = env.get("NCPUS", "")
    if (
        not (ncpus.isascii() and ncpus.isdigit())
        or env.get("OMP_NUM_THREADS") != ncpus
        or int(ncpus) >= cpus
    ):
        return {}
    return {"NCPUS": str(cpus), "OMP_NUM_THREADS": str(cpus)}


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
    # Blocked in the launcher (ranks.SHIELDED), inherited here: this guard and its rank stop on them.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    parent = os.getppid()
    try:
        cpus = cpus_for_rank(os.environ, len(os.sched_getaffinity(0)))
        # The job's directory for the rank's own notes (rank 0: the step a stop saved), absolute: the rank may
        # start elsewhere (in an image, in the submit directory).
        env = {**os.environ, **cpus, savelayout.JOB_DIR_ENV: os.path.abspath(job_dir)}
        procs.append(
            subprocess.Popen(list(command), env=env, preexec_fn=die_with_parent(os.getpid()))
        )
    except OSError as e:
        print(f"octo-dist job: cannot start {command[0]} ({e.strerror})", file=sys.stderr)
        write_note(job_dir, rank_of(os.environ), 127, socket.gethostname())
        return 127
    for signum in pending:
        forward(signum, None)
    rank, host = rank_of(os.environ), socket.gethostname()
    limit, warning = stopped_limit(os.environ)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    status, hung = wait_watching(procs[0], rank, host, parent, limit)
    if status == ORPHANED_STATUS and hung.startswith("lost"):
        # The supervisor may have ended too (its launcher killed): the job's log is this one's stderr as well.
        try:
            os.write(
                2, f"octo-dist job: rank {rank} on {host} {hung} with status {status}\n".encode()
            )
        except OSError:
            pass  # its stderr went through the launcher that is gone: the note below stays
    write_note(job_dir, rank, status, host, hung)
    return status
