"""One module per scheduler, and the registry the rest of ``jobs/`` reads.

Each module defines one :class:`~octo_dist.jobs.schedulers.base.Scheduler` subclass owning everything that differs
between schedulers: the script's header, where the job's node list and id come from, the launcher command, the
submit and dependency commands, how to read the job id ``qsub``/``sbatch`` prints, and where the log lands. Adding a
scheduler is one new module here (and its test) plus one ``register`` line below, or ``register(MyScheduler())``
from anywhere before rendering.

Standard library only: these modules ship inside the job runtime (``octo-dist job-runtime``), which runs on the
job's first node with the host's ``python3``.
"""

from __future__ import annotations

from typing import Dict

from octo_dist.jobs.schedulers.base import Scheduler
from octo_dist.jobs.schedulers.gridengine import GridEngine
from octo_dist.jobs.schedulers.pbs import Pbs
from octo_dist.jobs.schedulers.slurm import Slurm

SCHEDULERS: Dict[str, Scheduler] = {}


def register(scheduler: Scheduler) -> Scheduler:
    """Make ``scheduler`` known by its ``name`` (``"pbs"``) to rendering, submitting and the job runtime."""
    SCHEDULERS[scheduler.name] = scheduler
    return scheduler


def get(name: str) -> Scheduler:
    """The scheduler called ``name``; a name nobody registered is a bug of the caller (the CLI offers only these)."""
    return SCHEDULERS[name]


for _s in (Pbs(), GridEngine(), Slurm()):
    register(_s)
