"""The batch scheduler's job id: groups the wandb runs of one job and seeds the coordinator port."""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers.base import Launch

# Tried in order; the first one set names the job.
JOB_ID_VARS = (
    "PBS_JOBID",      # "12345.pbs1" (ABCI 3.0, PBS Professional)
    "JOB_ID",         # "9876543" (SGE, ABCI 2.0)
    "SLURM_JOB_ID",   # "123456"
)


def job_id(environ: Mapping[str, str], launch: Optional[Launch] = None) -> Optional[str]:
    """The scheduler's job id, else the launcher's own (Open MPI's job family, PRRTE's namespace), else None."""
    for var in JOB_ID_VARS:
        if environ.get(var):
            return environ[var]
    return launch.job_id if launch is not None else None
