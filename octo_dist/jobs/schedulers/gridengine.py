"""Grid Engine (Son of Grid Engine, Altair, Open Cluster Scheduler): ``-pe NAME SLOTS``, ``PE_HOSTFILE``/``NSLOTS``,
and Open MPI's gridengine integration starting the other nodes' ranks through ``qrsh -inherit``."""

from __future__ import annotations

import re

from octo_dist.jobs.schedulers.base import AFTER_ENV
from octo_dist.jobs.schedulers.mpirun import MpirunScheduler


class GridEngine(MpirunScheduler):
    name = "sge"
    title = "Grid Engine"
    # -cwd: the job starts where qsub ran. -notify: SIGUSR1/SIGUSR2 before Grid Engine suspends/kills the job, which
    # the supervisor turns into a stop. -pe NAME SLOTS: one slot per rank; control_slaves TRUE in the PE lets mpirun
    # start the other nodes' ranks through `qrsh -inherit`.
    header = """\
#!/bin/bash
#$ -pe @{pe} @{slots}
#$ -l h_rt=@{walltime}
#$ -N @{name}
#$ -j y
#$ -cwd
#$ -notify
"""
    directive_prefix = "#$"
    job_id_var = "JOB_ID"
    hostfile_var = "PE_HOSTFILE"
    # No -hostfile: Open MPI's gridengine components read PE_HOSTFILE ("node001 4 all.q@node001 UNDEFINED", not a
    # host file Open MPI can read) and start the remote ranks inside the job's accounting and limits.
    hostfile_option = False
    stop_timer = True  # h_rt kills outright
    job_id_re = re.compile(r"(\d+)(?:\.\S*)?")  # qsub -terse: "12345", an array job "12345.1-10:1"

    def site_lines(self, spec):
        # --queue gpu.q, --project P: "#$ -q gpu.q", "#$ -P P"
        out = [f"#$ -q {spec.queue}"] if spec.queue else []
        out += [f"#$ -P {spec.group}"] if spec.group else []
        return out + list(spec.directives)

    def submit_command(self, script, after):
        extra = ["-hold_jid", after, "-v", f"{AFTER_ENV}={after}"] if after else []
        return ["qsub", "-terse", *extra, script]  # the project (-P) and queue are in the script

    def allocation_error(self, env, hostfile_text, nodes, ranks_per_node):
        # The PE's allocation_rule decides where the slots land; mpirun --map-by ppr:R:node needs R slots on each
        # node. PE_HOSTFILE: "node001 2 all.q@node001 UNDEFINED" per host; NSLOTS: "4".
        rows = [ln.split() for ln in hostfile_text.splitlines() if ln.split()]
        shape = " ".join(f"{r[0]}:{r[1] if len(r) > 1 else ''}" for r in rows)
        nslots = env.get("NSLOTS", "")
        if nslots != str(nodes * ranks_per_node) or any(
            len(r) < 2 or r[1] != str(ranks_per_node) for r in rows
        ):
            return (
                f"Grid Engine gave NSLOTS={nslots or 'unset'} as {shape} (PE_HOSTFILE); expected {nodes} node(s) x "
                f"{ranks_per_node} slot(s). Fix: submit to a PE whose allocation_rule is {ranks_per_node} "
                f"(qconf -sp NAME; re-render with --pe NAME)"
            )
        return None
