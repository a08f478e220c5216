"""The batch scheduler around the launch: its job id, and what a job script without a launcher is.

A PBS, Grid Engine or LSF job script runs once, on the first node; only a launcher (mpirun, mpiexec, srun) started
inside it makes ranks. So a process that sees a scheduler's variables but no launcher's is one process, and says so.
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist import savelayout
from octo_dist.launchers.single import one_process
from octo_dist.launchers.base import Launch, shown

# Slurm's batch script or salloc shell is slurm.allocation's: it knows the tasks asked for.
OUTSIDE_SLURM = tuple(v for v in savelayout.SCHEDULER_JOB_ID_VARS if v != "SLURM_JOB_ID")


def job_id(environ: Mapping[str, str], launch: Optional[Launch] = None) -> Optional[str]:
    """The job's id as the job runtime exported it (``OCTO_DIST_JOB_ID``, checked there), else the scheduler's own
    variable (checked here: ``savelayout.JobIdError``), else the launcher's own (Open MPI's job family, PRRTE's
    namespace), else None."""
    found = savelayout.job_id(environ)
    if found:
        return found
    return launch.job_id if launch is not None else None


def allocation(environ: Mapping[str, str]) -> Optional[Launch]:
    """A PBS, Grid Engine or LSF job script without a launcher: one process (Slurm's is ``slurm.allocation``)."""
    var = savelayout.scheduler_job_var(environ, OUTSIDE_SLURM)
    if var is None:
        return None
    name = savelayout.SCHEDULER_JOB_ID_VARS[var]
    return one_process(
        job_id=environ[var],
        detail=f"{name} job {environ[var]} without a launcher (the job script itself)",
        variables=shown(environ, var, "PBS_NODEFILE", "PE_HOSTFILE", "SGE_JOB_HOSTLIST", "NSLOTS"),
    )
