"""HPE Cray PALS ``mpiexec`` (Cray EX systems under PBS Professional: Polaris, Aurora, and the like).

PALS sets, per process (HPE Cray PALS ``mpiexec(1)`` ENVIRONMENT; used the same way by the ALCF job scripts):
PALS_RANKID (rank), PALS_LOCAL_RANKID (rank on the node), PALS_NODEID (node index), PALS_APID, PALS_DEPTH and,
on current PALS, PALS_LOCAL_SIZE. PALS itself publishes no world size; Cray PMI, which Cray MPICH loads, sets
PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK and PMI_LOCAL_SIZE. Without the local rank every rank would bind GPU 0, so a
PALS launch without one is refused.
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.launchers.base import Launch, first, int_var, refuse, shown

RANK = "PALS_RANKID"  # "5"
LOCAL_RANK = "PALS_LOCAL_RANKID"  # "1"
LOCAL_SIZE = "PALS_LOCAL_SIZE"  # "4"
NODE = "PALS_NODEID"  # "1"
APID = "PALS_APID"  # "6c6bd2b6-1f3e-4cd6-a7b5-e3ea6ee6e1f4"
PMI_RANK, PMI_SIZE = "PMI_RANK", "PMI_SIZE"  # Cray PMI: "5", "8"
PMI_LOCAL_RANK, PMI_LOCAL_SIZE = "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE"  # Cray PMI: "1", "4"
FIX = "start the ranks with PALS mpiexec and Cray MPICH loaded (mpiexec -n N --ppn <GPUs per node> octo-dist ...)"


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    if RANK not in environ and LOCAL_RANK not in environ:
        return None
    used = shown(
        environ,
        RANK,
        LOCAL_RANK,
        LOCAL_SIZE,
        NODE,
        PMI_RANK,
        PMI_SIZE,
        PMI_LOCAL_RANK,
        PMI_LOCAL_SIZE,
    )
    rank_var = first(environ, RANK, PMI_RANK)
    lr = first(environ, LOCAL_RANK, PMI_LOCAL_RANK)
    ls = first(environ, LOCAL_SIZE, PMI_LOCAL_SIZE)
    missing = [
        what
        for what, var in (
            ("a rank (PALS_RANKID)", rank_var),
            ("a world size (PMI_SIZE)", environ.get(PMI_SIZE)),
            ("a local rank (PALS_LOCAL_RANKID)", lr),
            ("a local size (PALS_LOCAL_SIZE or PMI_LOCAL_SIZE)", ls),
        )
        if not var
    ]
    if missing:
        raise refuse(
            f"pals: PALS variables found ({', '.join(used)}) but not {', '.join(missing)}",
            "PALS_RANKID, PALS_LOCAL_RANKID, PALS_LOCAL_SIZE from PALS and PMI_SIZE from Cray PMI",
            FIX,
        )
    return Launch(
        launcher="pals",
        world_size=int_var(environ, PMI_SIZE, "pals"),
        rank=int_var(environ, rank_var, "pals"),
        local_rank=int_var(environ, lr, "pals"),
        local_size=int_var(environ, ls, "pals"),
        job_id=environ.get(APID),
        detail="HPE Cray PALS mpiexec",
        variables=used,
    )
