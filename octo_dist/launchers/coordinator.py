"""Where process 0 runs JAX's coordination service, agreed by every rank before ``jax.distributed.initialize``.

In order:

1. explicit: ``--coordinator``, else COORDINATOR_ADDRESS / JAX_COORDINATOR_ADDRESS (``g0001:23456``,
   ``10.1.0.5:23456``, ``[fd00::5]:23456``);
2. MPI: rank 0 picks its hostname and a free port and broadcasts them with mpi4py. mpi4py is optional at run
   time: a host MPI that does not match the image's gives an import error or a singleton world, and we
   fall back to what follows, with a warning;
3. every rank on this node (local size = world size): 127.0.0.1 (no node file needed, no DNS);
4. the launch's own node list, rank 0's node first (a Slurm step's SLURM_STEP_NODELIST, so a step on part of the
   allocation, or one of two concurrent steps, uses its own first node);
5. the scheduler's node list (PBS_NODEFILE, SGE_JOB_HOSTLIST, PE_HOSTFILE, LSB_DJOB_HOSTFILE, SLURM_JOB_NODELIST);
   a node file that cannot be read here (a host spool file inside a container) is skipped when a later source
   answers, and reported otherwise;
6. what the launcher publishes about its own node: Open MPI 4's OMPI_MCA_orte_hnp_uri (mpirun's address).

Steps 3-6 derive the port from the job id (and the Slurm step id), so every rank computes the same one without
talking. An address derived in 4-6 is a guess about where rank 0 runs: rank 0 verifies it names this host, and
that the port is free, before JAX starts (``coordcheck.py``). Single-process runs need no coordinator.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import socket
import zlib
from typing import Callable, Mapping, Optional

from octo_dist.launchers import hostlists, openmpi, scheduler
from octo_dist.launchers.base import Launch
from octo_dist.problems import Refusal

log = logging.getLogger(__name__)

# Derived ports fall in 20000..32767, below Linux's ephemeral range (ip_local_port_range, 32768-60999 by default):
# a port in that range can be any outgoing connection's source port on rank 0's node, and then neither this
# check nor the coordination service can listen on it (a chained job on a busy node met exactly that).
PORT_BASE, PORT_SPAN = 20000, 32768 - 20000
EPHEMERAL_DEFAULT = (32768, 60999)
DEFAULT_PORT = (
    61234  # no job id at all: every rank still agrees, but two such jobs on a node collide
)
MPI_LAUNCHERS = ("openmpi4", "openmpi5", "pmi", "pals")
EXPLICIT_SOURCES = ("--coordinator",) + hostlists.COORDINATOR_VARS
SET_IT = (
    "export COORDINATOR_ADDRESS=<rank 0's host>:<free port> for every rank (mpirun -x COORDINATOR_ADDRESS; "
    "srun passes the environment on)"
)


class CoordinatorError(Refusal, RuntimeError):
    """No coordinator address could be agreed, or the one given is unusable."""


@dataclasses.dataclass(frozen=True)
class Coordinator:
    address: str  # "g0001:23456", "[fd00::5]:23456": what jax.distributed.initialize gets
    source: str  # how it was chosen, for the start-up line: "COORDINATOR_ADDRESS", "mpi4py broadcast", ...

    @property
    def host(self) -> str:
        """The host without IPv6 brackets: ``"[::1]:23456"`` -> ``"::1"`` (what getaddrinfo takes)."""
        host = self.address.rsplit(":", 1)[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def explicit(self) -> bool:
        """Chosen by the user rather than derived (rank 0 then only warns when it names another host)."""
        return self.source in EXPLICIT_SOURCES


def _is_ipv6(text: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6, text.split("%", 1)[0])
        return True
    except (OSError, ValueError):
        return False


_HOSTNAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def parse_address(address: str, source: str) -> Coordinator:
    """``"host:port"`` or ``"[v6]:port"`` -> Coordinator; anything else is refused with the expected form.

    ``"g0001:23456"``, ``"10.1.0.5:23456"`` and ``"[::1]:23456"`` are accepted; ``"g0001:99999"`` (no such port),
    ``"::1:23456"`` (ambiguous: brackets needed), ``"g0001"`` and ``"http://g0001:1"`` are not.
    """

    def bad(why: str) -> CoordinatorError:
        return CoordinatorError(
            f"{source}={address!r} is not HOST:PORT ({why}); expected e.g. g0001:23456, 10.1.0.5:23456 or "
            f"[fd00::5]:23456 with a port from 1 to 65535. Fix: set {source} to rank 0's host and a free port"
        )

    if address.strip().startswith("[") and "]:" not in address:
        raise bad("no ':PORT' after the bracketed address")
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host:
        raise bad("no host before ':'" if sep else "no ':PORT'")
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 0 < int(port) < 65536:  # not "²" (isdigit())
        raise bad(f"port {port!r} is not a number from 1 to 65535")
    if host.startswith("["):
        if not (host.endswith("]") and _is_ipv6(host[1:-1])):
            raise bad(f"{host!r} is not a bracketed IPv6 address")
    elif ":" in host and _is_ipv6(host):
        raise bad("an IPv6 address needs brackets: [addr]:port")
    elif not _HOSTNAME.fullmatch(host):
        raise bad(f"{host!r} is not a host name or address")
    return Coordinator(address.strip(), source)


def port_for_job(job: Optional[str], step: Optional[str] = None) -> int:
    """A port every rank derives from the job id alone: ``"12345.pbs1"`` -> 20000 + crc32 % 12768.

    A Slurm step id makes two concurrent steps of one job (``"123456"`` step 0 and step 1) pick different ports.
    """
    if not job:
        return DEFAULT_PORT
    key = job if step is None else f"{job}.{step}"
    return PORT_BASE + zlib.crc32(key.encode()) % PORT_SPAN


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def from_environment(
    environ: Mapping[str, str], launch: Launch, read: hostlists.Reader = hostlists._read
) -> Optional[Coordinator]:
    """Steps 3-6: a host derived from the launch and the scheduler, and the job's port; None when none applies.

    Raises:
      CoordinatorError: a node file is named but unreadable and nothing later answers; a node list is malformed.
    """
    port = port_for_job(scheduler.job_id(environ, launch), launch.step_id)
    if launch.local_size == launch.world_size:
        return Coordinator(f"127.0.0.1:{port}", "all ranks on this node, port from the job id")
    if launch.nodes:
        return Coordinator(
            f"{_bracket(launch.nodes[0])}:{port}",
            f"first host of {launch.nodes_source}, port from the job id",
        )
    unreadable: Optional[str] = None
    try:
        nodes = hostlists.node_list(environ, read)
    except hostlists.NodeFileError as e:
        nodes, unreadable = None, str(e)
    except hostlists.NodeListError as e:
        raise CoordinatorError(str(e)) from None
    if nodes and nodes[1]:
        var, hosts = nodes
        return Coordinator(
            f"{_bracket(hosts[0])}:{port}", f"first host of {var}, port from the job id"
        )
    published = openmpi.published_host(environ)
    if published:
        host, how = published
        if unreadable:
            log.warning("%s; using %s instead", unreadable, how)
        return Coordinator(f"{_bracket(host)}:{port}", f"{how}, port from the job id")
    if unreadable:
        raise CoordinatorError(unreadable)
    return None


def free_port(pick: Callable[[], int] = lambda: PORT_BASE + random.randrange(PORT_SPAN)) -> int:
    """A port nothing on this host holds now, for rank 0 to broadcast: from ``pick`` (PORT_BASE..32767, below the
    ephemeral range, as derived ports are), the first that can be bound. A port the kernel hands out (``bind(("",
    0))``) is in the ephemeral range: any outgoing connection may be given it before the coordination service
    listens on it (a loaded test machine saw 127.0.0.1:39777 taken in that gap). After 64 held ones (a site whose
    ephemeral range covers these), the kernel's pick: free now, if not certain to stay free."""
    for _ in range(64):
        port = pick()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("", port))
            except OSError:  # EADDRINUSE: held, or another job's derived port
                continue
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def resolve(
    environ: Mapping[str, str],
    launch: Launch,
    *,
    explicit=None,
    broadcast: Optional[Callable[[Callable[[], str]], Optional[str]]] = None,
    read: hostlists.Reader = hostlists._read,
) -> Optional[Coordinator]:
    """The coordinator every rank agrees on, or None for a single process.

    Args:
      explicit: "host:port" or a Coordinator, winning over everything.
      broadcast: step 2, ``broadcast(pick)`` returning rank 0's ``pick()`` on every rank or None when it cannot
        (``octo_dist.runtime.mpi.broadcaster``); None skips step 2.
      read: reads a node file (tests pass a fake; the real one opens the path).

    Raises:
      CoordinatorError: a malformed explicit address, or several nodes and no way to find rank 0's (found/expected/fix).
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
    if (
        broadcast
        and launch.launcher in MPI_LAUNCHERS
        and environ.get("OCTO_DIST_NO_MPI4PY", "") in ("", "0")
    ):
        address = broadcast(lambda: f"{socket.gethostname()}:{free_port()}")
        if address:
            return Coordinator(address, "mpi4py broadcast from rank 0")
    found = from_environment(environ, launch, read)
    if found is None:
        raise CoordinatorError(
            f"{launch.launcher}: {launch.world_size} ranks over several nodes ({launch.local_size} on this one), "
            f"but no coordinator address: mpi4py is not usable, no node list is set (SLURM_STEP_NODELIST, "
            f"PBS_NODEFILE, SGE_JOB_HOSTLIST, PE_HOSTFILE, SLURM_JOB_NODELIST) and the launcher publishes no host "
            f"of its own (Open MPI 5 and MPICH do not); expected one of them. Fix: {SET_IT}"
        )
    return found
