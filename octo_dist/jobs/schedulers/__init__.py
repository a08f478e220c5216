"""One module per scheduler, and the registry the rest of ``jobs/`` reads.

Each module defines one :class:`~octo_dist.jobs.schedulers.base.Scheduler` subclass owning everything that differs
between schedulers: the script's header, where the job's node list and id come from, the launcher command, the
submit and dependency commands, how to read the job id ``qsub``/``sbatch`` prints, and where the log lands. A
subclass that sets ``name`` registers itself when it is defined (``Scheduler.__init_subclass__``), and every module
of this package is imported here: adding a scheduler is one new module in this directory (and its test), nothing
else. ``register(MyScheduler())`` still makes one known from anywhere before rendering.

Standard library only: these modules ship inside the job runtime (``octo-dist job-runtime``), which runs on the
job's first node with the host's ``python3``.
"""

from __future__ import annotations

import importlib
import pkgutil

from octo_dist.jobs.schedulers.base import SCHEDULERS, Scheduler

__all__ = ["SCHEDULERS", "Scheduler", "get", "register"]


def register(scheduler: Scheduler) -> Scheduler:
    """Make ``scheduler`` known by its ``name`` (``"pbs"``) to rendering, submitting and the job runtime."""
    SCHEDULERS[scheduler.name] = scheduler
    return scheduler


def get(name: str) -> Scheduler:
    """The scheduler called ``name``; a name nobody registered is a bug of the caller (the CLI offers only these)."""
    return SCHEDULERS[name]


# Every module here (pbs, gridengine, slurm, and whatever a site adds), also from inside the job runtime's zipapp;
# then the registry in name order, as `octo-dist launch --help` lists them: lsf, pbs, sge, slurm.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
_by_name = sorted(SCHEDULERS.items())
SCHEDULERS.clear()
SCHEDULERS.update(_by_name)
