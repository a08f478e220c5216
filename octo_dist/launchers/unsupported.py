"""Launchers octo-dist does not start from, refused by name rather than run as N lone processes.

Without this, each process of a torchrun/DeepSpeed/jsrun/horovodrun job would find no launcher it knows, train
alone on the full batch, and pass the ``process_count()`` check (1 == 1).

* torchrun (``torch/distributed/run.py``, elastic agent) and the DeepSpeed launcher set RANK, WORLD_SIZE,
  LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun also TORCHELASTIC_RUN_ID, GROUP_RANK).
  Job scripts also export RANK/WORLD_SIZE themselves from a real launcher (``export RANK=$OMPI_COMM_WORLD_RANK``):
  that is fine when the numbers agree, and refused when they do not (:func:`check_agrees`).
* IBM LSF ``jsrun`` (JSM) sets JSM_NAMESPACE_RANK, JSM_NAMESPACE_SIZE, JSM_NAMESPACE_LOCAL_RANK,
  JSM_NAMESPACE_LOCAL_SIZE (with Spectrum MPI it also sets OMPI_COMM_WORLD_*, which is then detected as Open MPI).
* ``horovodrun`` with its gloo controller sets HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE
  (``horovod/runner/gloo_run.py``); with ``--mpi`` it runs mpirun, which is detected as such.
* A PMIx launcher that sets only PMIX_RANK and PMIX_NAMESPACE (MPICH built with PMIx under ``prterun``, or PRRTE
  without Open MPI's variables): PMIx gives the world size only through its API, not the environment.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from octo_dist.launchers.base import Launch, refuse, shown

TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "GROUP_RANK",
)
JSRUN_VARS = (
    "JSM_NAMESPACE_RANK",
    "JSM_NAMESPACE_SIZE",
    "JSM_NAMESPACE_LOCAL_RANK",
    "JSM_NAMESPACE_LOCAL_SIZE",
)
HOROVOD_VARS = (
    "HOROVOD_RANK",
    "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",
    "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CONTROLLER",
)
PMIX_VARS = ("PMIX_RANK", "PMIX_NAMESPACE")

START = (
    "start the ranks with mpirun (mpirun -np N --npernode <GPUs per node> octo-dist ...) or srun "
    "(srun --ntasks-per-node=<GPUs per node> octo-dist ...)"
)


def _several(environ: Mapping[str, str], size_var: str) -> bool:
    """The launcher says more than one process (a WORLD_SIZE of 1 is a single process whatever started it)."""
    raw = environ.get(size_var, "").strip()
    return not (re.fullmatch(r"[0-9]{1,9}", raw) and int(raw) <= 1)


def refuse_unsupported(environ: Mapping[str, str]) -> None:
    """Raise a LauncherError naming the unsupported launcher whose variables are set, if any."""
    if "RANK" in environ and "WORLD_SIZE" in environ and _several(environ, "WORLD_SIZE"):
        raise refuse(
            f"torchrun or DeepSpeed launcher variables found ({', '.join(shown(environ, *TORCHRUN_VARS))}) "
            f"and no MPI or Slurm launcher",
            "ranks started by mpirun, mpiexec or srun (octo-dist starts JAX "
            "from their variables, not torchrun's)",
            f"{START}; unset RANK and WORLD_SIZE in a plain shell",
        )
    if "JSM_NAMESPACE_RANK" in environ or "JSM_NAMESPACE_SIZE" in environ:
        raise refuse(
            f"IBM LSF jsrun variables found ({', '.join(shown(environ, *JSRUN_VARS))}) without Open MPI's",
            "ranks started by mpirun, mpiexec or srun",
            f"{START}; under LSF, run mpirun inside the job",
        )
    if "HOROVOD_RANK" in environ or "HOROVOD_SIZE" in environ:
        raise refuse(
            f"horovodrun variables found ({', '.join(shown(environ, *HOROVOD_VARS))})",
            "ranks started by mpirun, mpiexec or srun (horovodrun --mpi runs mpirun, which works)",
            START,
        )
    if "PMIX_RANK" in environ:
        raise refuse(
            f"a PMIx launcher's variables found ({', '.join(shown(environ, *PMIX_VARS))}) but no world size "
            "(PMIx publishes it through its API only, e.g. MPICH under prterun)",
            "Open MPI's mpirun (OMPI_COMM_WORLD_*), Hydra's mpiexec (PMI_RANK/PMI_SIZE) or srun",
            f"{START}; with MPICH, use its own mpiexec (Hydra)",
        )


def check_agrees(environ: Mapping[str, str], launch: Launch) -> Optional[Launch]:
    """RANK/WORLD_SIZE exported next to a real launcher must say the same; else two launchers disagree."""
    pairs = (
        ("RANK", launch.rank),
        ("WORLD_SIZE", launch.world_size),
        ("LOCAL_RANK", launch.local_rank),
    )
    wrong = [
        f"{var}={environ[var]}"
        for var, want in pairs
        if var in environ and environ[var].strip() != str(want)
    ]
    if wrong and "WORLD_SIZE" in environ:
        raise refuse(
            f"{launch.launcher} says rank {launch.rank} of {launch.world_size} (local {launch.local_rank}) "
            f"but {', '.join(wrong)} is also set: two launchers nested (torchrun under srun?) or a stale export",
            "one launcher starting every rank",
            f"{START} alone, and unset RANK, WORLD_SIZE and LOCAL_RANK",
        )
    return launch
