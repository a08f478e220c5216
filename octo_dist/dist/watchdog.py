"""A start-up deadline that holds even while a C call keeps the interpreter busy.

    with watchdog.Watchdog(300, "octo-dist: error: rank 1/2: start-up did not complete within 300 s (stuck {stage})") as dog:
        dog.stage("in MPI_Init")          # the message names the last stage set
        from mpi4py import MPI            # may block forever with the GIL held

A thread cannot be the watchdog: ``from mpi4py import MPI`` runs MPI_Init inside the import with the GIL held, so a
``threading.Timer`` never gets to run while a rank waits there for a peer that is not coming. The watchdog is a
small child process instead. It reads stage names from a pipe; when the deadline passes it prints the message and
SIGKILLs this process (``os._exit`` from elsewhere is impossible; SIGTERM may be caught by JAX's preemption
handler). mpirun then sees a rank die and ends the others. Closing the pipe (``cancel``, or this process ending
for any reason) stops the child at once, so it never outlives the rank it guards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

# The child: stdin is the pipe of stage names; argv: pid, seconds, message with a {stage} field.
_CHILD = r"""
import os, select, signal, sys, time
pid, deadline, message = int(sys.argv[1]), time.monotonic() + float(sys.argv[2]), sys.argv[3]
stage, buf = "starting", b""
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
    """Kills this process with ``message`` (``{stage}`` replaced by the last :meth:`stage`) after ``seconds``."""

    def __init__(self, seconds: float, message: str, python: str = sys.executable):
        self.seconds = seconds
        self._child: Optional[subprocess.Popen] = subprocess.Popen(
            [python, "-c", _CHILD, str(os.getpid()), repr(float(seconds)), message],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, close_fds=True)

    def stage(self, what: str) -> None:
        """Name what this process is about to wait for (one line)."""
        if self._child is not None:
            self._child.stdin.write(what.replace("\n", " ").encode() + b"\n")
            self._child.stdin.flush()

    def cancel(self) -> None:
        if self._child is not None:
            self._child.stdin.close()
            self._child.wait()
            self._child = None

    def __enter__(self) -> "Watchdog":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


class NoWatchdog:
    """A single process waits for nobody."""

    def stage(self, what: str) -> None:
        pass

    def cancel(self) -> None:
        pass
