"""PBS Professional, as on ABCI 3.0: ``select=N:mpiprocs=R``, the node list in ``PBS_NODEFILE``, ``mpirun``."""

from __future__ import annotations

import os
import re

from octo_dist.jobs.schedulers.base import AFTER_ENV
from octo_dist.jobs.schedulers.mpirun import MpirunScheduler


class Pbs(MpirunScheduler):
    name = "pbs"
    title = "PBS Professional (as on ABCI 3.0)"
    # -j oe -k oe: one output file, written while the job runs (in your home directory) rather than copied at its end.
    header = """\
#!/bin/bash
#PBS -P @{group}
#PBS -q @{resource_type}
#PBS -l select=@{nodes}:mpiprocs=@{ranks_per_node}
#PBS -l walltime=@{walltime}
#PBS -N @{name}
#PBS -j oe
#PBS -k oe
"""
    directive_prefix = "#PBS"
    job_id_var = "PBS_JOBID"
    hostfile_var = "PBS_NODEFILE"
    workdir = (
        '"${PBS_O_WORKDIR:-$PWD}"'  # PBS starts the job in $HOME; PBS_O_WORKDIR is where qsub ran
    )
    # PBS signals every process of the job at the wall time, mpirun included (which then kills the ranks at once):
    # the supervisor asks for the stop itself, the stop margin before it.
    stop_timer = True
    job_id_re = re.compile(r"(\d+(?:\.[\w.-]+)?)")  # qsub prints "12345.pbs1"
    job_id_example = "12345.pbs1"

    def site_lines(self, spec):
        # --resource place=scatter: "#PBS -l place=scatter"
        return [f"#PBS -l {r}" for r in spec.resources] + list(spec.directives)

    def submit_command(self, script, after):
        extra = ["-W", f"depend=afterany:{after}", "-v", f"{AFTER_ENV}={after}"] if after else []
        return ["qsub", *extra, script]

    def submit_hint(self, script, group):
        return f"qsub {script}"

    def log_path(self, name, job, submit_dir, home):
        # -k oe keeps it in your home as NAME.oNUMBER while the job runs
        return os.path.join(home, f"{name}.o{job.split('.')[0]}")
