"""The bounds around what several ranks do together before training: a watchdog and a job-wide abort.

with startup_guard(launch, 300) as dog:     # a no-op guard for a single process
    dog.stage("MPI_Init")                   # the watchdog's message names the last stage set
    ...                                     # an exception here, with MPI up, ends every rank (MPI_Abort)
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from octo_dist import EXIT_FAILED, problems
from octo_dist.launchers.base import Launch
from octo_dist.runtime import mpi, watchdog

# The watchdog is the backstop: the waits with their own timeout and a more precise message (the coordinator
# that does not answer) get to report first.
WATCHDOG_MARGIN_S = 2
EXIT_STARTUP = EXIT_FAILED  # a rank that could not start: the job failed, not the input


@contextlib.contextmanager
def startup_guard(launch: Launch, timeout_s: float) -> Iterator[watchdog.Watchdog]:
    """Around anything several ranks do together before training (mpi4py collectives, JAX start-up).

    With more than one rank: a watchdog (``watchdog.Watchdog``, a child process: it fires even inside MPI_Init)
    ends this rank with an error after ``timeout_s``, and an exception while MPI is up ends the whole job with this
    rank's error (MPI_Abort): the other ranks may be waiting in a collective this one will never join. Call
    ``.stage(what)`` on the value yielded to say what is being waited for."""
    if launch.world_size == 1:
        yield watchdog.NoWatchdog()
        return
    dog = watchdog.Watchdog(
        timeout_s + WATCHDOG_MARGIN_S,
        (
            f"octo-dist: error: rank {launch.rank}/{launch.world_size}: {{stage}} did not complete "
            f"within {timeout_s:g} s. "
            f"Every rank must start with the same world size ({launch.world_size}) and coordinator; a rank that is "
            f"missing, crashed, or was given another address keeps the others waiting. Fix: check every rank's log; "
            f"raise --init-timeout (or OCTO_DIST_INIT_TIMEOUT) if nodes start slowly"
        ),
        exit_code=EXIT_STARTUP,
    )
    try:
        dog.stage("start-up (import jax)")
        yield dog
    except Exception as e:
        if mpi.initialized():
            _fail_job(e, launch, problems.exit_status(e) or EXIT_STARTUP)
        raise
    finally:
        dog.cancel()


def _fail_job(exc: BaseException, launch: Launch, code: int) -> None:
    """One line naming this rank and its error, then MPI_Abort with ``code``: every rank of the job ends now."""
    sys.stderr.write(
        f"octo-dist: error: rank {launch.rank}/{launch.world_size}: start-up failed: {exc}\n"
    )
    sys.stderr.flush()
    mpi.abort(code)
    os._exit(code)
