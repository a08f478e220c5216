"""The GPUs ``nvidia-smi -L`` lists: run once, parsed in one place.

Sample output, one line per GPU::

    GPU 0: NVIDIA H200 (UUID: GPU-5b8e6f7a-...)
    GPU 1: NVIDIA H200 (UUID: GPU-0c1d2e3f-...)

(MIG instances appear as indented ``  MIG 1g.18gb Device 0: ...`` lines under their GPU and are not counted.)
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable, List, Mapping, Optional

from octo_dist import savelayout


def listed(smi_output: Optional[str]) -> Optional[List[str]]:
    """The ``GPU n: ...`` lines of ``nvidia-smi -L``; None when nvidia-smi did not run."""
    if smi_output is None:
        return None
    return [line for line in smi_output.splitlines() if line.startswith("GPU ")]


def count(smi_output: Optional[str]) -> Optional[int]:
    """How many GPUs ``nvidia-smi -L`` listed; None when it did not run."""
    gpus = listed(smi_output)
    return None if gpus is None else len(gpus)


def nvidia_smi_list(
    which: Callable[[str], Optional[str]] = shutil.which, timeout: float = 30.0
) -> Optional[str]:
    """``nvidia-smi -L``'s stdout; None when nvidia-smi is not on PATH, "" when it fails or hangs."""
    exe = which("nvidia-smi")
    if not exe:
        return None
    try:
        return subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def compute_capability(
    which: Callable[[str], Optional[str]] = shutil.which, timeout: float = 30.0
) -> Optional[str]:
    """``nvidia-smi --query-gpu=compute_cap --format=csv,noheader``'s stdout (``"9.0\\n9.0\\n"`` on an H200 node);
    None when nvidia-smi is missing, fails or is too old for the field (drivers before 510)."""
    exe = which("nvidia-smi")
    if not exe:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


# Resource types (PBS queues, or RTYPE in a reservation's queue) whose jobs share a node with other jobs: ABCI 3.0's
# rt_HG, one H200 of a node's 8.
SHARED_RESOURCE_TYPES = ("rt_HG",)
# What a scheduler sets where it gave the job a subset of a node's GPUs: "1" (SLURM_JOB_GPUS), "0,1".
SUBSET_VARS = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SGE_HGR_gpu")


def shared_node(environ: Mapping[str, str]) -> Optional[str]:
    """Why the GPUs ``CUDA_VISIBLE_DEVICES`` hides here may be other jobs' (so the advice is never to unset it), or
    None outside a scheduler's job. ``{"PBS_JOBID": "1.pbs1", "PBS_QUEUE": "rt_HG"}`` -> ``"PBS job 1.pbs1 on
    rt_HG, a share of a node (other jobs use its other GPUs)"``; a job without such a sign -> ``"... may share the
    node"``."""
    var = savelayout.scheduler_job_var(environ)  # "PBS_JOBID": "12345.pbs1"; None outside a job
    if var is None:
        return None
    where = f"{savelayout.SCHEDULER_JOB_ID_VARS[var]} job {environ[var]}"
    rtype = environ.get("RTYPE") or environ.get("PBS_QUEUE", "")
    if rtype in SHARED_RESOURCE_TYPES:
        return f"{where} on {rtype}, a share of a node (other jobs use its other GPUs)"
    subset = next((f"{v}={environ[v]}" for v in SUBSET_VARS if environ.get(v)), None)
    if subset:
        return f"{where} given a subset of the node's GPUs ({subset}; other jobs may use the rest)"
    return f"{where}: the scheduler may have set it to the job's own GPUs, and other jobs may use the rest"
