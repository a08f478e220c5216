"""Launcher detection: who started this process, and what it says about the job.

Pure functions over a ``Mapping[str, str]`` (tests pass dicts). Tried in this order; the first that
recognises the environment wins, and ``detect(environ, name)`` selects one by name (``--launcher``):

1. ``openmpi``  Open MPI 4 (HPC-X on ABCI, sets OMPI_MCA_orte_hnp_uri) and Open MPI 5 / PRRTE (does not)
2. ``pmi``      MPICH, Intel MPI and other PMI launchers
3. ``slurm``    an ``srun`` step
4. ``single``   nothing detected: one process

The coordinator host comes from an explicit COORDINATOR_ADDRESS / JAX_COORDINATOR_ADDRESS (always wins),
else the scheduler's node list (SGE_JOB_HOSTLIST, PBS_NODEFILE, SLURM_JOB_NODELIST): see hostlists.py.
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers import openmpi, pmi, single, slurm
from octo_dist.launchers.base import Launch, LauncherError

ORDER = {"openmpi": openmpi.detect, "pmi": pmi.detect, "slurm": slurm.detect, "single": single.detect}


def detect(environ: Mapping[str, str], name: str = "auto") -> Launch:
    """The job as the launcher describes it; ``name`` forces one launcher (``"auto"`` tries ORDER)."""
    if name != "auto":
        if name not in ORDER:
            raise LauncherError(f"unknown launcher {name!r}; expected auto or one of: {', '.join(ORDER)}")
        found: Optional[Launch] = ORDER[name](environ)
        if found is None:
            raise LauncherError(f"--launcher {name} was asked for, but its environment variables are not set in this process")
        return found
    for fn in ORDER.values():
        found = fn(environ)
        if found is not None:
            return found
    raise AssertionError("single.detect always answers")
