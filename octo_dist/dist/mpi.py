"""mpi4py, used only before JAX starts: agreeing on the coordinator and comparing the ranks' start-up records.

mpi4py is optional at run time: a host MPI that does not match the image's gives an import error, a failing
``MPI_Init`` or a singleton world. Each helper then returns None (with a warning where it matters) and the caller
falls back to what the launcher's environment says.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from octo_dist.launchers.base import Launch
from octo_dist.launchers.coordinator import MPI_LAUNCHERS

log = logging.getLogger(__name__)


def _world(launch: Launch, warn: bool):
    """mpi4py's COMM_WORLD when it matches the launcher's world, else None."""
    if launch.launcher not in MPI_LAUNCHERS or launch.world_size == 1:
        return None
    try:
        from mpi4py import MPI
    except Exception as e:  # ImportError, or RuntimeError from MPI_Init when the image's MPI does not match the host's
        if warn:
            log.warning("mpi4py unavailable (%s: %s); falling back to the launcher's environment", type(e).__name__, e)
        return None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != launch.world_size:
        # A host mpirun the image's MPI does not understand makes every rank a singleton world of 1.
        if warn:
            log.warning("mpi4py sees a world of %d, the launcher %d (MPI mismatch between host and image?); "
                        "falling back to the launcher's environment", comm.Get_size(), launch.world_size)
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
