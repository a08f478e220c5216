"""A start-up deadline that holds even while a C call keeps the interpreter busy.

    message = "octo-dist: error: rank 1/2: {stage} did not complete within 300 s"
    with watchdog.Watchdog(300, message, exit_code=1) as dog:
        dog.stage("MPI_Init")             # the message names the last stage set
        from mpi4py import MPI            # may block forever with the GIL held

At the deadline a thread prints the message and exits with ``exit_code`` (``os._exit``: mpirun then sees a rank
fail and ends the others). A thread alone is not enough: ``from mpi4py import MPI`` runs MPI_Init inside the import
with the GIL held, and no Python thread runs while a rank waits there for a peer that is not coming. So a small
child process stands behind it: it reads the stages from a pipe and, ``GRACE_S`` after the deadline, prints the
message and SIGKILLs this process (SIGTERM may be caught by JAX's preemption handler). Closing the pipe
(``cancel``, or this process ending for any reason) stops the child at once: it never outlives the rank it guards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Optional

GRACE_S = 5.0  # the child's SIGKILL comes this long after the thread's exit, which it only backs up

# The child: stdin is the pipe of stage names; argv: pid, seconds, message with a {stage} field.
_CHILD = r"""
import os, select, signal, sys, time
# A stop signal for the whole job step or session (Slurm's, PBS's qdel) reaches this child too: it is the rank's to
# handle; this child ends when the rank's pipe closes.
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(s, signal.SIG_IGN)
pid, deadline, message = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), sys.argv[3]
stage, buf = "start-up", b""
while True:
    left = deadline - time.monotonic()
    if left <= 0:
        sys.stderr.write(message.replace("{stage}", stage) + "\n")
        sys.stderr.flush()
        os.kill(pid, signal.SIGKILL)
        break
    if select.select([0], [], [], left)[0]:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        if lines:
            stage = lines[-1].decode(errors="replace")
"""


class Watchdog:
    """Ends this process with ``message`` (``{stage}`` replaced by the last :meth:`stage`) after ``seconds``."""

    def __init__(
        self, seconds: float, message: str, exit_code: int = 1, python: str = sys.executable
    ):
        self.message, self.exit_code, self._stage = message, exit_code, "start-up"
        self.deadline: Optional[float] = (
            time.monotonic() + seconds
        )  # when it fires (time.monotonic())
        self._child: Optional[subprocess.Popen] = subprocess.Popen(
            [python, "-c", _CHILD, str(os.getpid()), repr(float(seconds) + GRACE_S), message],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        sys.stderr.write(self.message.replace("{stage}", self._stage) + "\n")
        sys.stderr.flush()
        os._exit(self.exit_code)

    def stage(self, what: str) -> None:
        """Name what this process is about to wait for (one line)."""
        self._stage = what.replace("\n", " ")
        if self._child is not None:
            try:
                self._child.stdin.write(self._stage.encode() + b"\n")
                self._child.stdin.flush()
            except BrokenPipeError:
                # The child is gone (killed from outside): the thread still keeps the deadline; only its backup
                # for a C call that holds the GIL is lost. Not a reason to end the rank with a traceback.
                self._drop_child()

    def cancel(self) -> None:
        self._timer.cancel()
        self._drop_child()

    def _drop_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        try:
            child.stdin.close()
        except BrokenPipeError:  # a stage written but not read: the child is gone
            pass
        child.wait()

    def __enter__(self) -> "Watchdog":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class NoWatchdog:
    """A single process waits for nobody."""

    deadline: Optional[float] = None

    def stage(self, what: str) -> None:
        pass

    def cancel(self) -> None:
        pass
