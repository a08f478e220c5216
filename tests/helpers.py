"""What tests share: the repository's paths and an environment free of the caller's job (imported as ``helpers``)."""

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "tests" / "programs"
# Variables of an enclosing job (a CI runner inside SLURM, a developer inside qrsh) that would change detection.
JOB_VARS = ("COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS", "PBS_NODEFILE", "PBS_JOBID", "SGE_JOB_HOSTLIST", "JOB_ID",
            "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_PROCID", "SLURM_NTASKS", "PMI_RANK", "PMI_SIZE",
            "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "WANDB_MODE", "WANDB_API_KEY", "CUDA_VISIBLE_DEVICES")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARS and not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def json_lines(text: str) -> list:
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]
