"""Where process 0 runs JAX's coordination service, agreed by every rank before ``jax.distributed.initialize``.

In order:

1. explicit: ``COORDINATOR_ADDRESS`` / ``JAX_COORDINATOR_ADDRESS`` (the seed's job file), or ``--coordinator``;
2. MPI: rank 0 picks its hostname and a free port and broadcasts them with mpi4py. mpi4py is optional at run
   time: a host MPI that does not match the image's gives an import error or a singleton world, and we
   fall back to (3) with a warning;
3. the first host of the scheduler's node list (PBS_NODEFILE, SGE_JOB_HOSTLIST, SLURM_JOB_NODELIST), else
   127.0.0.1 when every rank is on this node, with a port derived from the job id so every rank computes the
   same one without talking.

Single-process runs need no coordinator.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import zlib
from typing import Callable, Mapping, Optional

from octo_dist.launchers import hostlists, scheduler
from octo_dist.launchers.base import Launch

log = logging.getLogger(__name__)

PORT_BASE, PORT_SPAN = 20000, 20000  # derived ports fall in 20000..39999, below Linux's ephemeral range
DEFAULT_PORT = 61234                 # no job id at all: every rank still agrees, but two such jobs on a node collide
MPI_LAUNCHERS = ("openmpi4", "openmpi5", "pmi")


class CoordinatorError(RuntimeError):
    """No coordinator address could be agreed."""


@dataclasses.dataclass(frozen=True)
class Coordinator:
    address: str  # "g0001:23456"
    source: str   # how it was chosen, for the start-up line: "COORDINATOR_ADDRESS", "mpi4py broadcast", ...

    @property
    def host(self) -> str:
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])


def parse_address(address: str, source: str) -> Coordinator:
    """``"host:port"`` -> Coordinator; anything else is refused with the expected form."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise CoordinatorError(f"{source}={address!r} is not HOST:PORT (expected e.g. g0001:23456)")
    return Coordinator(address, source)


def port_for_job(job: Optional[str]) -> int:
    """A port every rank derives from the job id alone: ``"12345.pbs1"`` -> 20000 + crc32 % 20000."""
    if not job:
        return DEFAULT_PORT
    return PORT_BASE + zlib.crc32(job.encode()) % PORT_SPAN


def from_environment(environ: Mapping[str, str], launch: Launch, read: hostlists.Reader = hostlists._read) -> Optional[Coordinator]:
    """Step 3: node list host (or 127.0.0.1 on one node) + the job's port; None when neither applies."""
    port = port_for_job(scheduler.job_id(environ, launch))
    nodes = hostlists.node_list(environ, read)
    if nodes and nodes[1]:
        var, hosts = nodes
        return Coordinator(f"{hosts[0]}:{port}", f"first host of {var}, port from the job id")
    if launch.local_size == launch.world_size:
        return Coordinator(f"127.0.0.1:{port}", "all ranks on this node, port from the job id")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def resolve(environ: Mapping[str, str], launch: Launch, *, explicit=None,
            broadcast: Optional[Callable[[Callable[[], str]], Optional[str]]] = None,
            read: hostlists.Reader = hostlists._read) -> Optional[Coordinator]:
    """The coordinator every rank agrees on, or None for a single process.

    Args:
      explicit: "host:port" or a Coordinator, winning over everything.
      broadcast: step 2, ``broadcast(pick)`` returning rank 0's ``pick()`` on every rank or None when it cannot
        (``octo_dist.dist.mpi.broadcaster``); None skips step 2.
    """
    if isinstance(explicit, Coordinator):
        return explicit
    if explicit:
        return parse_address(explicit, "--coordinator")
    for var in hostlists.COORDINATOR_VARS:
        if environ.get(var):
            return parse_address(environ[var], var)
    if launch.world_size == 1:
        return None
    if broadcast and launch.launcher in MPI_LAUNCHERS and environ.get("OCTO_DIST_NO_MPI4PY", "") in ("", "0"):
        address = broadcast(lambda: f"{socket.gethostname()}:{free_port()}")
        if address:
            return Coordinator(address, "mpi4py broadcast from rank 0")
    found = from_environment(environ, launch, read)
    if found is None:
        raise CoordinatorError(
            f"{launch.launcher}: {launch.world_size} ranks over several nodes, but no coordinator address: mpi4py is not "
            f"usable and no node list (PBS_NODEFILE, SGE_JOB_HOSTLIST, SLURM_JOB_NODELIST) is set. "
            f"Fix: export COORDINATOR_ADDRESS=<first node>:<free port> for every rank (mpirun -x COORDINATOR_ADDRESS)")
    return found
