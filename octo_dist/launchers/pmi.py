"""MPICH and Intel MPI, started by their Hydra ``mpiexec`` (PMI-1/PMI-2 wire protocol).

Hydra's proxy sets, for every process it starts (MPICH ``src/pm/hydra/proxy/pmip_cb.c``, ``launch_procs``):
PMI_RANK, PMI_SIZE, PMI_FD (or PMI_PORT + PMI_ID), MPI_LOCALRANKID and MPI_LOCALNRANKS. Intel MPI's ``mpiexec.hydra``
is the same Hydra and sets the same names. Other PMI launchers name the local pair differently: Cray PMI
(``PMI_LOCAL_RANK`` / ``PMI_LOCAL_SIZE``, see ``pals.py``), MVAPICH (``MV2_COMM_WORLD_LOCAL_*``).

``srun --mpi=pmi2`` also sets PMI_RANK and PMI_SIZE (Slurm ``src/plugins/mpi/pmi2/mpi_pmi2.c``); there the Slurm step
has the per-node counts and wins
(``__init__.py`` checks both name the same rank).
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers.base import Launch, first, half_pair, int_var, refuse, shown

RANK = "PMI_RANK"  # "3"
SIZE = "PMI_SIZE"  # "8"
HYDRA_LOCAL_RANK = "MPI_LOCALRANKID"  # "1": set by Hydra's proxy, never by srun
LOCAL_RANK_VARS = (
    HYDRA_LOCAL_RANK,
    "PMI_LOCAL_RANK",
    "MPI_LOCAL_RANK",
    "MV2_COMM_WORLD_LOCAL_RANK",
)  # "1"
LOCAL_SIZE_VARS = (
    "MPI_LOCALNRANKS",
    "PMI_LOCAL_SIZE",
    "MPI_LOCAL_NRANKS",
    "MV2_COMM_WORLD_LOCAL_SIZE",
)  # "4"
INTEL_MARKERS = (
    "I_MPI_ROOT",
    "I_MPI_HYDRA_BOOTSTRAP",
    "I_MPI_PIN",
)  # set by Intel MPI's env script / launcher
FIX = "start every rank with mpiexec (mpiexec -n N -ppn <GPUs per node> octo-dist ...); do not export PMI_* yourself"


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    half_pair(environ, "pmi", RANK, SIZE, FIX)
    if RANK not in environ:
        return None
    world = int_var(environ, SIZE, "pmi")
    lr, ls = first(environ, *LOCAL_RANK_VARS), first(environ, *LOCAL_SIZE_VARS)
    if (lr is None) != (ls is None) or (lr is None and world > 1):
        local = ", ".join(shown(environ, *LOCAL_RANK_VARS, *LOCAL_SIZE_VARS)) or "none set"
        raise refuse(
            f"pmi: {RANK}={environ[RANK]}, {SIZE}={world} but the local rank/size pair is "
            f"{'incomplete' if lr or ls else 'missing'} ({local})",
            f"one of {'/'.join(LOCAL_RANK_VARS)} with its size, as Hydra's mpiexec sets them "
            "(without them every rank would bind GPU 0)",
            f"{FIX}; with another PMI launcher, export MPI_LOCALRANKID and MPI_LOCALNRANKS per rank",
        )
    intel = any(m in environ for m in INTEL_MARKERS)
    return Launch(
        launcher="pmi",
        world_size=world,
        rank=int_var(environ, RANK, "pmi"),
        local_rank=int_var(environ, lr, "pmi") if lr else 0,
        local_size=int_var(environ, ls, "pmi") if ls else 1,
        detail="Intel MPI mpiexec.hydra" if intel else "MPICH Hydra mpiexec",
        variables=shown(environ, RANK, SIZE, *LOCAL_RANK_VARS, *LOCAL_SIZE_VARS),
    )
