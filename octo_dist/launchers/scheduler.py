"""The batch scheduler around the launch: its job id, and what a job script without a launcher is.

A PBS, Grid Engine or LSF job script runs once, on the first node; only a launcher (mpirun, mpiexec, srun) started
inside it makes ranks. So a process that sees a scheduler's variables but no launcher's is one process, and says so.
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist import savelayout
from octo_dist.launchers.single import one_process
from octo_dist.launchers.base import Launch, shown

SCHEDULERS = {
    "PBS_JOBID": "PBS",
    "JOB_ID": "Grid Engine",
    "SLURM_JOB_ID": "Slurm",
    "LSB_JOBID": "LSF",
}
# Grid Engine's JOB_ID is a common name; only count it as a job with Grid Engine's own variables beside it.
SGE_MARKERS = ("SGE_ROOT", "PE_HOSTFILE", "SGE_JOB_HOSTLIST", "SGE_TASK_ID", "NSLOTS")


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
    for var in ("PBS_JOBID", "JOB_ID", "LSB_JOBID"):
        if not environ.get(var):
            continue
        if var == "JOB_ID" and not any(m in environ for m in SGE_MARKERS):
            continue
        name = SCHEDULERS[var]
        return one_process(
            job_id=environ[var],
            detail=f"{name} job {environ[var]} without a launcher (the job script itself)",
            variables=shown(
                environ, var, "PBS_NODEFILE", "PE_HOSTFILE", "SGE_JOB_HOSTLIST", "NSLOTS"
            ),
        )
    return None
