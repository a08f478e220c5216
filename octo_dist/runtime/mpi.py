"""mpi4py, used only before JAX starts: agreeing on the coordinator and comparing the ranks' start-up records.

mpi4py is optional at run time: a host MPI that does not match the image's gives an import error, a failing
``MPI_Init`` or a singleton world. Each helper then returns None (with a warning where it matters) and the caller
falls back to what the launcher's environment says. In a container without an MPI library the job scripts say so
(``OCTO_DIST_NO_MPI4PY=1``): :func:`allowed` is then false and the callers never import mpi4py.

A world that mpi4py sees with more than one rank but another size than the launcher's environment is not a mismatch
between host and image but ranks that disagree (one was given another ``OMPI_COMM_WORLD_SIZE``): that raises
:class:`WorldMismatch`, since rank 0 would otherwise wait in a broadcast the odd rank never joins.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Mapping, Optional

from octo_dist.launchers.base import Launch
from octo_dist.launchers.coordinator import MPI_LAUNCHERS
from octo_dist.problems import Problem

log = logging.getLogger(__name__)

NO_MPI4PY_ENV = "OCTO_DIST_NO_MPI4PY"  # "1": the container has no MPI library; never import mpi4py


class WorldMismatch(Problem, RuntimeError):
    """MPI's world and the launcher's environment disagree about the number of ranks."""


def allowed(environ: Mapping[str, str]) -> bool:
    """False when ``OCTO_DIST_NO_MPI4PY`` is set to anything but "" or "0"."""
    return environ.get(NO_MPI4PY_ENV, "") in ("", "0")


def initialized() -> bool:
    """Whether this process called MPI_Init (through mpi4py), without importing mpi4py when it did not."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized()


def abort(code: int) -> None:
    """MPI_Abort over the whole job when MPI is up (mpirun then ends every rank); a no-op otherwise."""
    if initialized():
        sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(code)


def library_mismatch(library: str, launcher: str) -> Optional[str]:
    """Why the MPI library mpi4py found cannot join this launcher's job, or None when it can (or cannot tell).

    An Open MPI library of another major version than the launcher's ("Open MPI v4.1.4, package: Debian ..." under
    ``openmpi5``), or Open MPI under MPICH's Hydra and the other way round, does not return an error from MPI_Init:
    it aborts the process ("An error occurred in MPI_Init_thread ... MPI_ERRORS_ARE_FATAL"). A host library the
    image (or venv) picks up by accident is the usual cause."""
    first = library.strip().splitlines()[0] if library.strip() else ""
    if launcher in ("openmpi4", "openmpi5"):
        major = launcher[-1]
        found = first.split("Open MPI v", 1)[1].split(".", 1)[0] if "Open MPI v" in first else None
        if found is None:
            return f"the MPI library is not Open MPI ({first[:80]!r}) but the launcher is Open MPI {major}"
        if found != major:
            return f"the MPI library is Open MPI {found} ({first[:80]!r}) but the launcher is Open MPI {major}"
    elif launcher == "pmi" and "Open MPI" in first:
        return f"the MPI library is Open MPI ({first[:80]!r}) but the launcher is MPICH/Hydra (PMI)"
    return None


def _world(launch: Launch, warn: bool):
    """mpi4py's COMM_WORLD when it matches the launcher's world, else None."""
    if launch.launcher not in MPI_LAUNCHERS or launch.world_size == 1:
        return None
    try:
        import mpi4py

        # Load the library without MPI_Init first: a library of another MPI than the launcher's aborts the
        # process inside MPI_Init instead of raising, so it is recognised by its version string (which MPI allows
        # asking before MPI_Init) and left uninitialised. mpi4py then finalizes at exit what it initialised here.
        if "mpi4py.MPI" not in sys.modules:
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = True
        from mpi4py import MPI

        if not MPI.Is_initialized():
            mismatch = library_mismatch(MPI.Get_library_version(), launch.launcher)
            if mismatch:
                if warn:
                    log.warning(
                        "mpi4py not used: %s; falling back to the launcher's environment", mismatch
                    )
                return None
            MPI.Init_thread()
    except Exception as e:  # ImportError, or RuntimeError from MPI_Init when the image's MPI does not match the host's
        if warn:
            log.warning(
                "mpi4py unavailable (%s: %s); falling back to the launcher's environment",
                type(e).__name__,
                e,
            )
        return None
    comm = MPI.COMM_WORLD
    if 1 < comm.Get_size() != launch.world_size:
        raise WorldMismatch(
            f"{launch.launcher}'s environment says {launch.world_size} ranks (this is rank {launch.rank}), but MPI "
            f"started {comm.Get_size()}: the ranks disagree about the world size (a wrapper script or module that "
            f"changes OMPI_COMM_WORLD_SIZE/PMI_SIZE on some ranks?). Fix: start every rank with the same environment; "
            f"octo-dist check-env --launch compares them"
        )
    if comm.Get_size() != launch.world_size:
        # A host mpirun the image's MPI does not understand makes every rank a singleton world of 1.
        if warn:
            log.warning(
                "mpi4py sees a world of %d, the launcher %d (MPI mismatch between host and image?); "
                "falling back to the launcher's environment",
                comm.Get_size(),
                launch.world_size,
            )
        return None
    return comm


def broadcaster(launch: Launch) -> Callable[[Callable[[], str]], Optional[str]]:
    """``broadcast(pick)``: rank 0's ``pick()`` on every rank, or None when MPI cannot be used."""

    def broadcast(pick: Callable[[], str]) -> Optional[str]:
        comm = _world(launch, warn=True)
        if comm is None:
            return None
        return comm.bcast(pick() if comm.Get_rank() == 0 else None, root=0)

    return broadcast


def allgather(record: Any, launch: Launch) -> Optional[list]:
    """Every rank's ``record`` through mpi4py, before JAX starts (so disagreement is reported, not a hang)."""
    comm = _world(launch, warn=False)
    return None if comm is None else comm.allgather(record)
