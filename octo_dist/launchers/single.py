"""Nothing detected: one process (an interactive run)."""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

from octo_dist.launchers.base import Launch


def detect(environ: Mapping[str, str]) -> Launch:
    return one_process()


def one_process(
    job_id: Optional[str] = None,
    detail: str = "",
    variables: Tuple[str, ...] = (),
    note: Optional[str] = None,
) -> Launch:
    """This process alone, rank 0 of 1: an interactive run, or a scheduler's job script without a launcher
    (``job_id="123456"``, ``detail="Slurm job 123456 without an srun step (batch script or salloc shell)"``)."""
    return Launch(
        launcher="single",
        world_size=1,
        rank=0,
        local_rank=0,
        local_size=1,
        job_id=job_id,
        detail=detail,
        variables=variables,
        note=note,
    )
