"""Launcher detection: who started this process, and what it says about the job.

Pure functions over a ``Mapping[str, str]`` (tests pass dicts; ``octo-dist detect`` shows the answer). Standard
library only, Python 3.9 compatible. In order, the first that recognises the environment wins:

1. ``openmpi``  Open MPI 4 (ORTE, sets OMPI_MCA_orte_hnp_uri) and 5 (PRRTE): OMPI_COMM_WORLD_*
2. ``slurm``    an srun step whose own PMI (``srun --mpi=pmi2/pmix``) set PMI_RANK/PMIX_RANK: the step has the counts
3. ``pals``     HPE Cray PALS mpiexec: PALS_RANKID, PALS_LOCAL_RANKID (+ Cray PMI's PMI_SIZE)
4. ``pmi``      MPICH / Intel MPI Hydra mpiexec: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
5. ``slurm``    an srun step: SLURM_STEP_NUM_TASKS, SLURM_PROCID, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE
6. refused     torchrun/DeepSpeed, LSF jsrun, horovodrun, a PMIx-only launcher (``unsupported.py``)
   refused     SLURM_PROCID > 0 outside an srun step (the number of ranks is unknown)
7. ``single``  a Slurm batch script or salloc shell, a PBS/Grid Engine/LSF job script, or nothing at all

MPI launchers come before Slurm because ``mpirun``/``mpiexec.hydra`` inside an allocation start their daemons with
srun: their ranks carry the daemons' step variables (one task per node) as well as their own. Half a pair
(PMI_RANK without PMI_SIZE) is an error, never a fallback. ``detect(environ, name)`` selects one by name
(``--launcher``).
"""

from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional

from octo_dist.launchers import openmpi, pals, pmi, scheduler, single, slurm, unsupported
from octo_dist.launchers.base import Launch, LauncherError, refuse

__all__ = ["Launch", "LauncherError", "ORDER", "detect"]

Detector = Callable[[Mapping[str, str]], Optional[Launch]]


def _slurm_own_pmi(environ: Mapping[str, str]) -> Optional[Launch]:
    """``srun --mpi=pmi2|pmix``: Slurm's PMI plugin sets PMI_RANK / PMIX_RANK equal to SLURM_PROCID; take the step."""
    if not slurm.is_step(environ):
        return None
    pmi_rank = environ.get(pmi.RANK, environ.get("PMIX_RANK"))
    if pmi_rank is None or pmi_rank != environ.get(slurm.PROCID):
        return None
    if pmi.SIZE in environ and environ[pmi.SIZE] != environ.get(slurm.STEP_NUM_TASKS):
        return None
    if openmpi.RANK in environ or pals.RANK in environ or pmi.HYDRA_LOCAL_RANK in environ:
        return None  # Open MPI, PALS or Hydra set their own variables: they are the launcher, srun only ran daemons
    return slurm.detect(environ)


def _single(environ: Mapping[str, str]) -> Launch:
    return slurm.allocation(environ) or scheduler.allocation(environ) or single.detect(environ)


def _auto(environ: Mapping[str, str]) -> Launch:
    for fn in (openmpi.detect, _slurm_own_pmi, pals.detect, pmi.detect, slurm.detect):
        found = fn(environ)
        if found is not None:
            return unsupported.check_agrees(environ, found)
    unsupported.refuse_unsupported(environ)
    slurm.refuse_rank_without_step(environ)
    return _single(environ)


def _refuse_single_among_many(environ: Mapping[str, str]) -> None:
    """``--launcher single`` under a launcher that started several processes would run N independent jobs."""
    try:
        launch = _auto(environ)
    except LauncherError:
        return  # the variables are broken or unsupported: forcing one process is then the user's explicit choice
    if launch.world_size > 1:
        raise refuse(
            f"--launcher single, but {launch.detail or launch.launcher} started {launch.world_size} processes "
            f"(this is rank {launch.rank}; read from {', '.join(launch.variables)})",
            "one process when forcing --launcher single (otherwise each rank trains alone on the full batch)",
            "drop --launcher single to train as one job, or run one process without the launcher",
        )


ORDER: Dict[str, Detector] = {
    "openmpi": openmpi.detect,
    "pals": pals.detect,
    "pmi": pmi.detect,
    "slurm": slurm.detect,
    "single": _single,
}


def detect(environ: Mapping[str, str], name: str = "auto") -> Launch:
    """The job as the launcher describes it.

    Args:
      environ: the environment to read (``os.environ``, or a recorded one).
      name: ``"auto"`` (the order above) or a key of ORDER to force one launcher (``--launcher``).

    Raises:
      LauncherError: the variables are malformed or contradictory, belong to an unsupported launcher, or the
        launcher asked for by name is not there. The message says what was found, what was expected, the fix.
    """
    if name == "auto":
        return _auto(environ)
    if name not in ORDER:
        raise refuse(
            f"unknown launcher {name!r}",
            f"auto or one of: {', '.join(ORDER)}",
            "pass --launcher auto",
        )
    if name == "single":
        _refuse_single_among_many(environ)
    found = ORDER[name](environ)
    if found is None:
        raise refuse(
            f"--launcher {name} was asked for, but its environment variables are not set in this process",
            f"the variables {name} sets (see `octo-dist detect --json` for what this process sees)",
            "pass --launcher auto, or start the ranks with that launcher",
        )
    return found
