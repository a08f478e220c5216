"""Grid Engine (Son of Grid Engine, Altair, Open Cluster Scheduler): ``-pe NAME SLOTS``, ``PE_HOSTFILE``/``NSLOTS``,
and Open MPI's gridengine integration starting the other nodes' ranks through ``qrsh -inherit``."""

from __future__ import annotations

import re

from octo_dist.jobs.schedulers.base import AFTER_ENV, Option, _resource_keys
from octo_dist.jobs.schedulers.mpirun import MpirunScheduler

# Grid Engine's parallel environment (-pe NAME SLOTS): no name is built into Grid Engine; "mpi" is the common name
# for a site's MPI PE and says what it is for (Open MPI's own FAQ example calls it "orte": --pe orte there). Open
# MPI's tight integration needs control_slaves TRUE, and the allocation_rule decides how the slots spread over the
# nodes (`qconf -spl` lists a site's PEs, `qconf -sp mpi` shows one).
DEFAULT_PE = "mpi"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class GridEngine(MpirunScheduler):
    name = "sge"
    title = "Grid Engine"
    help = "Grid Engine (Son of Grid Engine, Altair Grid Engine, Open Cluster Scheduler): -pe NAME SLOTS"
    description = (
        "Render a job script for Grid Engine: #$ -pe PE SLOTS (one slot per rank) and -l h_rt, -notify so the "
        "job gets SIGUSR1 before it is stopped, nodes and slots from PE_HOSTFILE and NSLOTS, and mpirun started "
        "without a host file: Open MPI's gridengine support reads PE_HOSTFILE and starts the other nodes' ranks "
        "through qrsh -inherit (the PE needs control_slaves TRUE). Give --gpus-per-node, --pe if your site's PE "
        "is not called mpi, --queue/--project where your site wants them, --module for its MPI, --directive for "
        "any other #$ line."
    )
    options = (
        Option(
            "pe",
            "Grid Engine parallel environment, #$ -pe NAME SLOTS with one slot per rank; it needs "
            "control_slaves TRUE (Open MPI starts the other nodes' ranks through qrsh -inherit) and an "
            "allocation_rule that gives each node --ranks-per-node slots; `qconf -spl` lists your site's "
            "(default: {default}, the common name; Open MPI's FAQ example uses orte)",
            default=DEFAULT_PE,
            group="resources",
            pattern=NAME,
            pattern_says="letters, digits, '_', '.', '-' (it goes into the scheduler's #$ lines)",
        ),
        Option(
            "queue",
            "Grid Engine queue, #$ -q QUEUE (default: the site's choice)",
            group="resources",
            pattern=NAME,
            pattern_says="letters, digits, '_', '.', '-' (it goes into the scheduler's #$ lines)",
        ),
    )
    group_help = (
        "Grid Engine project to charge, #$ -P PROJECT (default: the site's default project)"
    )
    group_flags = ("--project",)
    depend_help = "qsub -hold_jid ID"
    rendered_keys = {
        "-pe": "--pe and --nodes/--ranks-per-node",
        "-l h_rt": "--walltime",
        "-N": "--name",
        "-j": "nothing (octo-dist keeps one log)",
        "-o": "nothing (octo-dist keeps one log)",
        "-e": "nothing (octo-dist keeps one log)",
        "-cwd": "nothing (the job starts where qsub ran)",
        "-wd": "nothing (the job starts where qsub ran)",
        "-notify": "nothing (the job asks for its stop signal)",
        "-q": "--queue",
        "-P": "--project",
    }
    conditional_keys = {"-q": "queue", "-P": "group"}
    refused_keys = {
        "-t": "an array job runs the script once per index, every one training into the same save directory",
        "-S": "the job script is bash; another shell cannot run it",
    }
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

    def directive_keys(self, directive):
        # Grid Engine's options are words (-pe, -cwd), never with their value attached.
        return _resource_keys(directive.split()[1:])

    def header_values(self, header, settings):
        return {"pe": header.site.get("pe") or DEFAULT_PE}

    def site_lines(self, header, settings):
        # --queue gpu.q, --project P: "#$ -q gpu.q", "#$ -P P"
        out = [f"#$ -q {header.site['queue']}"] if header.site.get("queue") else []
        out += [f"#$ -P {header.group}"] if header.group else []
        return out + list(header.directives)

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
