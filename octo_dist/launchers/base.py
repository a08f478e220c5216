"""What every launcher reports, and the errors detection raises.

Standard library only, Python 3.9 compatible: this layer is read by ``octo-dist detect`` on login nodes and
inside images whose Python may be older than the training stack's.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Tuple

from octo_dist.problems import Refusal


class LauncherError(Refusal, ValueError):
    """The launcher's variables are missing, malformed, contradict each other, or belong to an unsupported launcher.

    The message is one line: what was found, what was expected, and the fix.
    """


def refuse(found: str, expected: str, fix: str) -> LauncherError:
    """A LauncherError worded the one way every problem is: ``found ...; expected .... Fix: ...``."""
    return LauncherError(found, expected, fix)


@dataclasses.dataclass(frozen=True)
class Launch:
    """This process as its launcher describes it.

    Attributes:
      launcher: ``openmpi4``, ``openmpi5``, ``pmi`` (MPICH / Intel MPI Hydra), ``pals``, ``slurm`` or ``single``.
      world_size, rank, local_rank, local_size: the job's processes, this one's index, its index and count on this node.
      job_id: the launcher's own job id (Open MPI 4's job family, PRRTE's namespace, Slurm's job id), if any.
      nodes: the hosts of this launch when the launcher says (a Slurm step's SLURM_STEP_NODELIST), rank 0's first.
      nodes_source: the variable ``nodes`` came from.
      step_id: the Slurm step id, so two concurrent steps of one job derive different coordinator ports.
      detail: a human description ("Slurm srun step 3 of job 123456", "MPICH Hydra mpiexec").
      variables: the environment variables the answer was read from, as ``NAME=value`` strings.
      note: something the user should know about this answer (a batch script taken as one process).
    """

    launcher: str
    world_size: int
    rank: int
    local_rank: int
    local_size: int
    job_id: Optional[str] = None
    nodes: Optional[Tuple[str, ...]] = None
    nodes_source: Optional[str] = None
    step_id: Optional[str] = None
    detail: str = ""
    variables: Tuple[str, ...] = ()
    note: Optional[str] = None

    def __post_init__(self):
        if (
            not (0 <= self.rank < self.world_size)
            or not (0 <= self.local_rank < max(self.local_size, 1))
            or self.local_size > self.world_size
        ):
            read = f" (read from {', '.join(self.variables)})" if self.variables else ""
            raise refuse(
                f"{self.launcher}: rank {self.rank}/{self.world_size}, local rank {self.local_rank}/{self.local_size} "
                f"are inconsistent{read}",
                "0 <= rank < world size, 0 <= local rank < local size <= world size",
                "start every rank with the launcher itself (mpirun, mpiexec, srun), not with variables set by hand; "
                "`octo-dist detect` shows what this process sees",
            )


def int_var(environ: Mapping[str, str], name: str, launcher: str) -> int:
    """``environ[name]`` as a non-negative integer, else a LauncherError naming the variable."""
    raw = environ[name]
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise refuse(
            f"{launcher}: {name}={raw!r} is not an integer",
            f"{name} to be a number >= 0 set by the launcher",
            f"unset {name} if you exported it yourself, and start the ranks with the launcher",
        )
    return value


def first(environ: Mapping[str, str], *names: str) -> Optional[str]:
    """The first of ``names`` set to a non-empty value, else None."""
    for n in names:
        if environ.get(n):
            return n
    return None


def shown(environ: Mapping[str, str], *names: str) -> Tuple[str, ...]:
    """``("NAME=value", ...)`` for those of ``names`` that are set: what a detection read, for messages and detect."""
    return tuple(f"{n}={environ[n]}" for n in names if n in environ)


def half_pair(
    environ: Mapping[str, str], launcher: str, rank_var: str, size_var: str, fix: str
) -> None:
    """A rank without a world size (or the reverse) is an error, never a silent single process."""
    has_rank, has_size = rank_var in environ, size_var in environ
    if has_rank != has_size:
        there, missing = (rank_var, size_var) if has_rank else (size_var, rank_var)
        raise refuse(
            f"{launcher}: {there}={environ[there]!r} is set but {missing} is not",
            f"both {rank_var} and {size_var}, as the launcher sets them",
            fix,
        )
