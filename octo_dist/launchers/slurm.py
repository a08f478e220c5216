"""A SLURM ``srun`` step (``sbatch`` alone sets SLURM_JOB_ID but no SLURM_PROCID)."""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers.base import Launch, int_var

PROCID = "SLURM_PROCID"                  # "5"
NTASKS = "SLURM_NTASKS"                  # "8"
LOCALID = "SLURM_LOCALID"                # "1"
TASKS_PER_NODE = "SLURM_NTASKS_PER_NODE"  # "4"
JOB_ID = "SLURM_JOB_ID"                  # "123456"


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    if PROCID not in environ or NTASKS not in environ:
        return None
    return Launch(
        launcher="slurm",
        world_size=int_var(environ, NTASKS, "slurm"),
        rank=int_var(environ, PROCID, "slurm"),
        local_rank=int_var(environ, LOCALID, "slurm") if LOCALID in environ else 0,
        local_size=int_var(environ, TASKS_PER_NODE, "slurm") if environ.get(TASKS_PER_NODE, "").isdigit() else 1,
        job_id=environ.get(JOB_ID),
    )
