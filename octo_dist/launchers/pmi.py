"""MPICH (Hydra), Intel MPI and other PMI launchers."""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers.base import Launch, first, int_var

RANK = "PMI_RANK"                   # "3"
SIZE = "PMI_SIZE"                   # "8"
LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "MPI_LOCAL_RANK")   # "1" (Hydra / Intel MPI / others)
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "MPI_LOCAL_NRANKS")  # "4"


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    if RANK not in environ or SIZE not in environ:
        return None
    lr, ls = first(environ, *LOCAL_RANK_VARS), first(environ, *LOCAL_SIZE_VARS)
    return Launch(
        launcher="pmi",
        world_size=int_var(environ, SIZE, "pmi"),
        rank=int_var(environ, RANK, "pmi"),
        local_rank=int_var(environ, lr, "pmi") if lr else 0,
        local_size=int_var(environ, ls, "pmi") if ls else 1,
    )
