"""The scheduler's launcher over every rank, one run at a time (the preflight, then the training).

A rank that fails leaves a note (``rankguard``); a launcher still running ``FAILED_GRACE_S`` after the first one
(mpirun waiting for a node it lost) is ended, so a dead job never holds its nodes until the wall time; a launcher
that exits 0 while some rank never said it finished fails the job, naming the ranks that are missing. Where the
scheduler has a node probe (SLURM: srun has no keepalive), a node it cannot reach ends the launcher, named; a probe
that hangs itself (its node lost while it ran) is killed after ``PROBE_TIMEOUT_S`` and run again at once.

The launcher runs in a process group of its own inside the job's session: a signal for the job's process group
(Grid Engine's -notify, Ctrl-C) reaches the ranks once, through the supervisor, while PBS, which tracks a job by its
session, still sees, accounts and signals mpirun and the ranks. After a stop, a launcher still running
``DONE_GRACE_S`` after every rank said it finished (Open MPI 4's mpirun, told to wait for the site's kill delay
before it kills ranks, waits that long even for ranks that already exited) is ended: the job ends with its ranks.

Under PBS, ``mpirun`` starts with SIGTERM blocked (``SHIELDED``). A qdel sends SIGTERM to every process of the
job's session at once, mpirun included, and each MPI's launcher answers it by ending the ranks (measured on one
host: Open MPI 5's prterun SIGKILLs them 0.5 s later, Open MPI 4.1's mpirun 2 s later, or the kill delay told
through ``odls_base_sigkill_timeout``), which lost the stop checkpoint. Ignoring it is not enough (prterun installs
its own handler); a blocked signal stays blocked through exec, and the launchers do not unblock it. The rank guard
unblocks it again for itself and its rank, which stop on it with a checkpoint; the launcher runs on until they
exited, and the queue's SIGKILL after the kill delay still ends everything. MPICH's Hydra (measured: 4.0.2) forwards
SIGTERM and keeps running, so blocked or not its ranks stop on it; note that its proxy and every rank call setsid,
so PBS's qdel reaches only mpiexec, and the launcher's process group holds only mpiexec: once mpiexec is gone (its
``kill -9``, the kill delay's SIGKILL) its proxy SIGKILLs the guards it started, and their ranks die with them.
The supervisor's own SIGTERM to a launcher that outlives a failed rank is blocked too: its SIGKILL ``END_WAIT_S``
later ends it. On the other nodes of a job, Open MPI's daemons (orted,
prted) are started by PBS's task manager or ssh, not from here: they are not shielded (not measured yet).

A launcher killed by a signal (``kill -9``, the out-of-memory killer) leaves its ranks running on without it, still
writing checkpoints: the supervisor says what killed it and SIGKILLs its process group (on this node the ranks and
their guards are in it), and each guard watches its parent (the launcher, or its daemon on another node) and ends
its rank when that is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from typing import Callable, List, Optional

from octo_dist import savelayout

FAILED_GRACE_S = 20  # a launcher still running this long after a rank failed is ended
END_WAIT_S = 10  # after SIGTERM to the launcher's group, this long before SIGKILL
# After a stop, a launcher still running this long after every rank finished is ended.
DONE_GRACE_S = 3
NODE_PROBE_S = (
    15  # between two probes of the nodes (schedulers without a launcher keepalive: SLURM)
)
# A probe still running this long is killed and the next starts at once: srun, the probe too, has no keepalive and
# waits for ever for its task on a node whose link was cut while it ran (measured under real Slurm 22.05: over 200
# s; a probe started after the cut failed naming the node in 12 s, MessageTimeout 10 s). The next such probe gets
# twice as long, up to PROBE_TIMEOUT_MAX_S, for a site whose MessageTimeout makes a failing probe slower.
PROBE_TIMEOUT_S = 30
PROBE_TIMEOUT_MAX_S = 120
POLL_S = 0.5
# Blocked in the launcher where the scheduler's stop reaches every process of the job (the scheduler's
# stop_reaches_every_process: PBS's qdel), see the module's docstring.
SHIELDED = (signal.SIGTERM,)


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell gives it: -9 (SIGKILL) -> 137."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(returncode: int) -> str:
    """The signal that ended a process, from Popen's returncode: -9 -> "SIGKILL"; "" when it exited."""
    if returncode >= 0:
        return ""
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def launcher_preexec(shielded) -> Callable[[], None]:
    """The launcher's ``preexec_fn``: a process group of its own, ``shielded`` signals blocked (inherited through
    exec by the launcher and whatever it starts; the rank guard unblocks them)."""

    def preexec() -> None:
        os.setpgrp()
        if shielded:
            signal.pthread_sigmask(signal.SIG_BLOCK, shielded)

    return preexec


def first_failure(job_dir: str) -> str:
    """The oldest note: the rank that failed first, not one the launcher ended after it."""
    try:
        notes = list(savelayout.rank_notes(job_dir, failed=True).values())
        notes.sort(key=lambda p: (os.stat(p).st_mtime_ns, p))
        with open(notes[0]) as f:
            return f.read().strip()
    except (OSError, IndexError):
        return ""


def missing_ranks(job_dir: str, ranks: int) -> List[int]:
    """The ranks of ``range(ranks)`` that left no note saying they finished."""
    finished = savelayout.rank_notes(job_dir, failed=False)
    return [r for r in range(ranks) if str(r) not in finished]


class Launcher:
    """Runs commands on every rank under the scheduler's launcher; ``job`` is the supervisor (its ``env``,
    ``note``, ``scheduler``, settings ``s``, ``job_dir``, ``clock`` and ``stop``)."""

    def __init__(self, job):
        self.job = job
        self.proc: Optional[subprocess.Popen] = None  # the launcher, while it runs
        self.argv0 = "mpirun"  # the launcher's program, as the note on its death names it
        self.rank_failure = ""  # "rank 1 on g0001 exited with status 2": the first rank that failed
        # "rank(s) 0 ended without a note: killed ...": a rank killed with its guard, the others ended after it
        self.rank_killed = ""
        self.launcher_status = 0  # what the launcher itself exited with
        # "SIGKILL": the signal that killed the launcher while its ranks ran, when the supervisor did not send it
        self.launcher_killed = ""
        self.ending = False  # the supervisor is ending the launcher itself

    def signal(self, sig) -> None:
        """Sends ``sig`` to the launcher while it runs (mpirun and srun forward SIGUSR1 to every rank)."""
        proc = self.proc
        # Until it is reaped the launcher's pid cannot be reused: kill is safe while returncode is None.
        if proc is not None and proc.returncode is None:
            try:
                os.kill(proc.pid, sig)
            except OSError:
                pass

    def _end(self) -> None:
        """A rank failed and the launcher has not ended the others by itself: TERM its group, then KILL."""
        self.job.note(
            f"the launcher is still running {FAILED_GRACE_S}s after a rank failed: ending it"
        )
        pid = self.proc.pid
        self.ending = True
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            self.proc.wait(END_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    def _end_after_stop(self) -> None:
        """Every rank stopped, checkpointed and exited 0; the launcher outlives them: end its group."""
        self.job.note(
            f"every rank stopped and finished; the launcher is still running {DONE_GRACE_S}s later: ending it"
        )
        self.ending = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()

    def _end_orphans(self) -> None:
        """The launcher died of a signal: its ranks and their guards on this node (its process group) run on
        without it, writing checkpoints into a job that has ended. Says what killed it, unless the supervisor
        did, and SIGKILLs the group: a checkpoint being written is left unfinished, never damaging the ones
        before it (a resume takes the newest that verifies)."""
        name = signal_name(self.proc.returncode)
        if not self.ending:
            self.launcher_killed = name
            self.job.note(
                f"the launcher ({os.path.basename(self.argv0)}, pid {self.proc.pid}) was killed by {name} after "
                f"{self.job.seconds()}s: ending every rank it started (its process group on this node; a rank on "
                "another node ends when its launcher daemon is gone)"
            )
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def _probe_nodes(self, finished: threading.Event) -> None:
        """While the launcher runs: a probe that fails naming a node ends the launcher, naming the node; one that
        fails naming none (a busy controller) only leaves a note."""
        scheduler, note = self.job.scheduler, self.job.note
        probe = scheduler.node_probe(self.job.s.allocation.nodes)
        pause, timeout = NODE_PROBE_S, PROBE_TIMEOUT_S
        while probe and not finished.wait(pause):
            pause = NODE_PROBE_S
            try:
                done = subprocess.run(
                    list(probe),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=self.job.env,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                # run() has killed it: a node may have stopped answering while it ran. Probe again now, unless the
                # launcher has ended meanwhile (nothing is left to probe for).
                if finished.is_set():
                    return
                note(
                    f"a node probe had no answer after {timeout:g}s (a node that stopped answering while it ran?): "
                    "probing again"
                )
                pause, timeout = 0, min(2 * timeout, PROBE_TIMEOUT_MAX_S)
                continue
            except (OSError, subprocess.SubprocessError) as e:
                note(f"a node probe failed, not ending the job: {e}")
                continue
            timeout = PROBE_TIMEOUT_S
            if done.returncode == 0 or finished.is_set():
                continue
            said = " ".join(done.stderr.split("\n")).strip()
            node = scheduler.lost_node(said)
            if not node:
                note(f"a node probe failed, not ending the job: {said}")
                continue
            note(
                f"node {node} cannot be reached by {scheduler.title}: ending the job step ({said})"
            )
            self.ending = True
            self.signal(signal.SIGTERM)
            if finished.wait(END_WAIT_S):
                return
            self.signal(signal.SIGKILL)
            return

    def run(self, argv: List[str], tick: Callable[[], None]) -> int:
        """Runs ``argv`` (the launcher's line) once; its status, the first failed rank's when one failed.
        ``tick`` is called every ``POLL_S`` while it runs (the supervisor's own timer)."""
        job = self.job
        for failed in (True, False):
            shutil.rmtree(savelayout.rank_notes_dir(job.job_dir, failed), ignore_errors=True)
        # Its own process group in the job's session, SIGTERM blocked under mpirun (see the module's docstring).
        self.argv0 = argv[0]
        shielded = SHIELDED if job.scheduler.stop_reaches_every_process else ()
        self.ending, self.launcher_killed = False, ""
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, env=job.env, preexec_fn=launcher_preexec(shielded)
        )
        if job.stop:  # a stop that came while it was starting has not reached it yet
            self.signal(signal.SIGUSR1)
        finished = threading.Event()
        threading.Thread(target=self._probe_nodes, args=(finished,), daemon=True).start()
        failed_at, failure, all_done_at, ended_after_stop = None, "", None, False
        try:
            while self.proc.poll() is None:
                try:
                    self.proc.wait(POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                tick()
                if failed_at is None:
                    failure = first_failure(job.job_dir)
                    if failure:
                        failed_at = job.clock()
                        job.note(failure)
                if (
                    failed_at is not None
                    and job.clock() - failed_at >= FAILED_GRACE_S
                    and self.proc.poll() is None
                ):
                    self._end()
                    break
                if job.stop and failed_at is None and all_done_at is None:
                    if not missing_ranks(job.job_dir, job.s.ranks):
                        all_done_at = job.clock()
                if all_done_at is not None and job.clock() - all_done_at >= DONE_GRACE_S:
                    if self.proc.poll() is None:
                        self._end_after_stop()
                        ended_after_stop = True
                    break
            # Ended after every rank finished: the ranks' status (0), not the SIGKILL's.
            status = 0 if ended_after_stop else exit_status(self.proc.wait())
            if self.proc.returncode < 0:
                self._end_orphans()
        finally:
            finished.set()
        if (
            failed_at is None and status != 0
        ):  # the launcher ended them itself: say which rank it was
            failure = first_failure(job.job_dir)
            if failure:
                job.note(failure)
        self.proc = None
        return self._verdict(status, failure, failed_at is not None)

    def _verdict(self, status: int, failure: str, failed: bool) -> int:
        # The rank that failed first decides the job's status and final line, not what the launcher exits with
        # after it: Open MPI 5.0.8's prterun may abort itself (134) while it ends a job whose rank refused to
        # start (2).
        self.launcher_status = status
        self.rank_failure = failure
        self.rank_killed = self._killed_without_note(status, failure)
        if self.rank_killed:
            self.rank_failure = self.rank_killed
            self.job.note(self.rank_killed)
            return status
        last = failure.rsplit(" ", 1)[-1] if failure else ""
        if last.isascii() and last.isdigit():
            status = int(last)
        if failed and status == 0:
            status = 1
        if status == 0:
            missing = missing_ranks(self.job.job_dir, self.job.s.ranks)
            if missing:
                self.job.note(
                    f"the launcher exited 0 but rank(s) {' '.join(map(str, missing))} never finished (their "
                    "node was lost, or they were killed): failing the job"
                )
                status = 1
        return status

    def _killed_without_note(self, status: int, failure: str) -> str:
        """When the launcher failed and some rank left no note at all while every note of a failure says a
        signal ended it (status 128 + N: the launcher ending the others), the rank without a note died first and
        unnoted: its guard was killed (``kill -9``, the out-of-memory killer), and its rank with it. Says so
        ("rank 0 ended without a note ..."), else "". The rank that was only ended after it is not blamed."""
        if (
            status == 0 or self.launcher_killed
        ):  # the launcher's own death is said as such (_end_orphans)
            return ""
        job_dir = self.job.job_dir
        noted = {**savelayout.rank_notes(job_dir, False), **savelayout.rank_notes(job_dir, True)}
        silent = [r for r in range(self.job.s.ranks) if str(r) not in noted]
        last = failure.rsplit(" ", 1)[-1] if failure else str(status)
        # A signal's status: a rank's note ("... exited with status 137") or, where no rank noted anything, the
        # launcher's own. A launcher that failed with none (a preflight's exit 3) and no notes at all may never have
        # started its ranks: nothing says they were killed.
        if not silent or not (last.isascii() and last.isdigit() and int(last) > 128):
            return ""
        after = f"; then {failure}" if failure else ""
        return (
            f"rank(s) {' '.join(map(str, silent))} ended without a note: killed from outside with their guard "
            f"(kill -9, the out-of-memory killer?){after}"
        )

    def outcome(self, status: int) -> str:
        """ ": rank 1 on g0001 exited with status 2 (the launcher then exited with status 134)"; " (exit 1)"."""
        if not self.rank_failure:
            return f" (exit {status})"
        then = (
            ""
            if self.launcher_status == status
            else f" (the launcher then exited with status {self.launcher_status})"
        )
        return f": {self.rank_failure}{then}"
