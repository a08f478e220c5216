"""Checks on a save directory before any step is trained: every rank can write to it, it has room for the run's
checkpoints, and no other run is using it.

    layout = savelayout.RunLayout("/groups/gxx00000/runs/x")
    claim = savedir.prepare(layout, state_bytes=room.state_nbytes(abstract_state))   # every rank
    try:
        ...train, save...
    finally:
        claim.release()

Without these, an unwritable directory is found at the first save (with ``--save-every 0``, after the whole run),
a full disk leaves a half-written step, and two jobs on one directory delete each other's half-written steps
(orbax removes ``*.orbax-checkpoint-tmp-*`` on start) and prune each other's checkpoints.

The lock is a file, ``<directory>/.octo-dist.lock`` (``savelayout.lock_file``: the directory is the run's
``RunLayout.train_state``, where its checkpoints go), created atomically (``link(2)`` of a complete file, which
also works on NFS) by process 0 and holding who owns it::

    {"host": "g0001", "pid": 41235, "job_id": "12345.pbs1", "started": 1733230000.0}

The holder touches it every ``HEARTBEAT_S`` seconds. A lock is *stale*, and is taken over with a warning, when its
process is gone (same host, no such pid) or when it was not touched for ``STALE_AFTER_S`` seconds (a job on
another host that died without removing it: a crashed node, SIGKILL at the end of a wall time).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from octo_dist import problems, savelayout
from octo_dist.engine import room
from octo_dist.engine.checkpoint import CheckpointError

log = logging.getLogger(__name__)

LOCK_NAME = (
    savelayout.LOCK
)  # ".octo-dist.lock": the save directory's names are in octo_dist/savelayout.py
HEARTBEAT_S = 60
STALE_AFTER_S = (
    15 * 60
)  # 15 heartbeats missed: no live holder is that late, even on a loaded file server


# A lock holds about 100 bytes of JSON; more is not a lock this code wrote, and is not read further.
LOCK_MAX_BYTES = 64 * 1024


class SaveDirError(CheckpointError):
    """A save directory a run cannot use: one line with what was found, what was expected, and the fix. A kind of
    ``CheckpointError``, so the jobs that report those in one line (exit 2) report these too."""


# --- writable ------------------------------------------------------------------------------------------------


def probe_writable(directory: Path, who: str) -> Optional[str]:
    """Create ``directory`` if needed and write, flush and remove a probe file in it. None if that worked, else the
    one-line problem (``who``: ``"rank 1 on g0002"``)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        return (
            f"save directory {directory} is a file, not a directory; expected a directory (or a path to create). "
            f"Fix: pass another --save-dir, or move the file away"
        )
    probe = Path(savelayout.write_probe(str(directory), socket.gethostname(), os.getpid()))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"octo-dist write probe\n")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as e:
        return (
            f"save directory {directory} is not writable from {who} ({e.strerror or e}); expected a directory "
            f"every rank can create files in. Fix: pass a --save-dir on a writable shared file system "
            f"(e.g. under /groups/gxx00000), or fix its permissions (chmod u+w {directory})"
        )
    return None


# --- the run lock --------------------------------------------------------------------------------------------


def job_id(environ: Mapping[str, str]) -> Optional[str]:
    """The job's id as the job runtime exported it (``OCTO_DIST_JOB_ID=12345.pbs1`` -> ``"12345.pbs1"``), else the
    scheduler's own variable (LSF's ``LSB_JOBID`` too), None outside a job; one that is not a job id (``"1/../.."``)
    is ``savelayout.JobIdError`` (exit 2), as the job runtime refuses it."""
    return savelayout.job_id(environ)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def stale_reason(
    holder: Mapping[str, Any],
    age_s: float,
    host: str,
    alive: Callable[[int], bool],
    stale_after_s: float = STALE_AFTER_S,
) -> Optional[str]:
    """Why a lock is stale (its process is gone; not refreshed for too long), or None while its holder may live.

    ``holder``: the lock's JSON; ``age_s``: seconds since it was last touched; ``host``: this host's name."""
    pid = holder.get("pid")
    if holder.get("host") == host and isinstance(pid, int) and not alive(pid):
        return f"its process (pid {pid} on this host) is gone"
    if age_s > stale_after_s:
        return f"it was last refreshed {age_s / 60:.0f} min ago (a live run refreshes it every {HEARTBEAT_S} s)"
    return None


def describe_holder(holder: Mapping[str, Any]) -> str:
    started = holder.get("started")
    since = (
        time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started))
        if isinstance(started, (int, float))
        else "?"
    )
    return (
        f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
        f"job {holder.get('job_id') or 'none'}, since {since}"
    )


def _not_a_lock(path: Path, mode: int) -> SaveDirError:
    kind = f"a {problems.file_kind(mode)}"
    if stat.S_ISLNK(mode):
        try:
            kind += f" to {os.readlink(path)}"
        except OSError:
            pass
    return SaveDirError(
        f"the run lock {path} is {kind}, not a lock file a run wrote",
        "no file there, or a regular file holding a run's JSON",
        f"remove it (rm {path}) if no run uses {path.parent}, or pass another --save-dir",
    )


def read_lock(path: Path) -> Optional[tuple]:
    """``(content, age_s)`` of the lock at ``path`` (at most LOCK_MAX_BYTES + 1 bytes; seconds since it was
    touched), None when there is none. Never follows a link and never blocks: a FIFO, a link (to ``/dev/zero``),
    a directory or a device at the lock's name is ``SaveDirError`` (exit 2), not opened or not read."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        raise _not_a_lock(path, mode)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the look and the open
            raise _not_a_lock(path, st.st_mode)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(LOCK_MAX_BYTES + 1), time.time() - st.st_mtime
    finally:
        os.close(fd)


def parse_holder(raw: bytes) -> dict:
    """The lock's JSON object (``{"host": "g0001", "pid": 41235, ...}``), or {} when it is not one: binary, not
    UTF-8, cut short, too long."""
    if len(raw) > LOCK_MAX_BYTES:
        return {}
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


class RunLock:
    """The exclusive lock of one run on one save directory (see the module docstring)."""

    def __init__(
        self,
        directory,
        job: Optional[str] = None,
        *,
        host: Optional[str] = None,
        stale_after_s: float = STALE_AFTER_S,
        heartbeat_s: float = HEARTBEAT_S,
    ):
        # savelayout.lock_file: beside the checkpoints it guards
        self.path = Path(savelayout.lock_file(str(directory)))
        self.holder = {
            "host": host or socket.gethostname(),
            "pid": os.getpid(),
            "job_id": job,
            "started": time.time(),
        }
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self.taken_over: Optional[dict] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def acquire(self) -> "RunLock":
        """Take the lock, or raise ``SaveDirError`` naming the run that holds it. Takes over a stale one."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mine = json.dumps(self.holder, sort_keys=True)
        # The complete file first, under a name no one can plant a link at in advance (O_EXCL, random).
        fd, tmp = tempfile.mkstemp(
            dir=self.path.parent, prefix=f"{LOCK_NAME}.{self.holder['host']}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(
                    f.fileno(), 0o644
                )  # others may read who holds the directory (mkstemp's is 0600)
                f.write(mine)
            for _ in range(5):
                try:
                    os.link(
                        tmp, self.path
                    )  # atomic and fails if the lock exists; the content is complete
                    break
                except FileExistsError:
                    self._take_over_if_stale()
            else:
                raise SaveDirError(
                    f"could not take the lock {self.path} in 5 tries (other runs keep taking it); "
                    f"expected one run per save directory. Fix: choose another --save-dir"
                )
        finally:
            Path(tmp).unlink(missing_ok=True)
        self._thread = threading.Thread(target=self._heartbeat, name="octo-dist-lock", daemon=True)
        self._thread.start()
        return self

    def _take_over_if_stale(self) -> None:
        found = read_lock(self.path)
        if found is None:
            return  # released meanwhile: try again
        raw, age = found
        holder = parse_holder(raw)  # {} when unreadable: only its age can make it stale
        reason = stale_reason(holder, age, self.holder["host"], pid_alive, self.stale_after_s)
        if reason is None:
            raise SaveDirError(
                f"save directory {self.path.parent} is in use by another run ({describe_holder(holder)}; lock "
                f"{self.path}); expected one run per save directory. Fix: wait for that run to end, or pass another "
                f"--save-dir; if that run is dead, remove {self.path}"
            )
        # Rename, then check it is still the lock judged stale: another run may have taken it over meanwhile.
        aside = Path(savelayout.stale_lock(str(self.path.parent), self.holder["host"], os.getpid()))
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            still = read_lock(aside)
        except SaveDirError:  # something else was renamed: not the lock judged stale
            still = None
        if still is None or still[0] != raw:
            try:
                os.link(
                    aside, self.path
                )  # put the live lock back (fails only if a third run took it)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        self.taken_over = holder
        log.warning(
            "took over the lock of save directory %s from a dead run (%s): %s",
            self.path.parent,
            describe_holder(holder),
            reason,
        )

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                os.utime(self.path)
            except OSError as e:
                log.warning(
                    "cannot refresh the lock %s (%s); another run may take this save directory over",
                    self.path,
                    e,
                )

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            try:
                found = read_lock(self.path)
            except (OSError, SaveDirError):  # replaced by something that is not ours to remove
                return
            if found is not None and parse_holder(found[0]) == self.holder:
                self.path.unlink()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class NoClaim:
    """What ranks other than 0 hold (and every rank when no save directory is configured)."""

    def release(self) -> None:
        pass


# --- every rank at once --------------------------------------------------------------------------------------


def first_problem(reports: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """From every rank's ``{"rank": r, "problem": str | None}``: the first problem, naming how many ranks share it."""
    bad = [r for r in reports if r.get("problem")]
    if not bad:
        return None
    others = [r["rank"] for r in bad[1:]]
    if not others:
        return bad[0]["problem"]
    return (
        bad[0]["problem"]
        + f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} too)"
    )


def prepare(
    layout: Optional[savelayout.RunLayout],
    state_bytes: Optional[int] = None,
    *,
    environ: Mapping[str, str] = os.environ,
    copies: int = room.COPIES,
):
    """Collective: every rank probes the run's ``layout.train_state`` (where its checkpoints and lock go); process 0
    also checks its free space (when ``state_bytes`` is given) and takes the run lock. Every rank raises the same
    ``SaveDirError`` if any check failed on any rank; None (a run without checkpoints) claims nothing.

    Returns the claim to ``release()`` at the end of the run (``RunLock`` on process 0, ``NoClaim`` elsewhere)."""
    if layout is None:
        return NoClaim()
    import jax

    from octo_dist.runtime import collectives

    rank = jax.process_index()
    directory = Path(layout.train_state).absolute()
    problem = probe_writable(directory, f"rank {rank} on {socket.gethostname()}")
    claim: Any = NoClaim()
    if rank == 0 and problem is None:
        if state_bytes is not None:
            problem = room.space_problem(directory, room.free_bytes(directory), state_bytes, copies)
        if problem is None:
            try:
                claim = RunLock(directory, job_id(environ)).acquire()
            except (
                SaveDirError,
                savelayout.JobIdError,
            ) as e:  # every rank hears of it: none waits alone
                problem = str(e)
            except OSError as e:
                problem = (
                    f"cannot take the lock {savelayout.lock_file(str(directory))} ({e}); expected a writable save "
                    "directory. Fix: pass another --save-dir"
                )
    verdict = first_problem(collectives.allgather_json({"rank": rank, "problem": problem}))
    if verdict is not None:
        claim.release()
        raise SaveDirError(verdict)
    return claim


def check_space(
    directory: Optional[str], state_bytes: int, copies: int = room.COPIES, kept_now: int = 0
) -> None:
    """Collective: process 0 checks the free space for ``copies`` more checkpoints (:func:`room.copies_needed`); every
    rank raises if it is short."""
    if not directory or copies <= 0:
        return
    import jax

    from octo_dist.runtime import collectives

    problem = None
    if jax.process_index() == 0:
        problem = room.space_problem(
            Path(directory).absolute(),
            room.free_bytes(Path(directory)),
            state_bytes,
            copies,
            kept_now,
        )
    verdict = first_problem(
        collectives.allgather_json({"rank": jax.process_index(), "problem": problem})
    )
    if verdict is not None:
        raise SaveDirError(verdict)
