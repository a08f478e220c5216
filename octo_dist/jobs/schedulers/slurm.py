"""SLURM: ``sbatch`` with ``--signal=B:USR1@MARGIN``, ranks started by ``srun``, and a node probe (srun has no
keepalive)."""

from __future__ import annotations

import os
import re

from octo_dist.jobs.schedulers.base import AFTER_ENV, Scheduler

# "srun: error: Task launch for StepId=7.3 failed on node node002: Communication connection failure"
LOST_NODE = re.compile(r" failed on node ([^:\s]+):")


class Slurm(Scheduler):
    name = "slurm"
    title = "SLURM"
    # --signal=B:USR1@MARGIN sends SIGUSR1 to the script MARGIN s before the time limit: the supervisor forwards it
    # to srun, which forwards it to every rank.
    header = """\
#!/bin/bash
#SBATCH --job-name=@{name}
#SBATCH --nodes=@{nodes}
#SBATCH --ntasks-per-node=@{ranks_per_node}
#SBATCH --gpus-per-node=@{gpus_per_node}
@{slurm_cpus}#SBATCH --time=@{walltime}
#SBATCH --signal=B:USR1@@{stop_margin_s}
#SBATCH --output=@{name}-%j.out
"""
    directive_prefix = "#SBATCH"
    job_id_var = "SLURM_JOB_ID"
    workdir = '"${SLURM_SUBMIT_DIR:-$PWD}"'
    launcher_program = "srun"
    stop_timer = False
    submit_program = "sbatch"
    job_id_re = re.compile(r"(\d+)(?:;\S+)?")  # sbatch --parsable: "12345" or "12345;cluster"

    def header_values(self, spec):
        return {
            "slurm_cpus": f"#SBATCH --cpus-per-task={spec.cpus_per_rank}\n"
            if spec.cpus_per_rank
            else "",
        }

    def site_lines(self, spec):
        # --account A --partition gpu --qos normal --constraint 'a100&ib': "#SBATCH --partition=gpu"...
        out = [f"#SBATCH --account={spec.group}"] if spec.group else []
        for key, value in (
            ("--partition", spec.partition),
            ("--qos", spec.qos),
            ("--constraint", spec.constraint),
        ):
            if value:
                out.append(f"#SBATCH {key}={value}")
        return out + list(spec.directives)

    def submit_command(self, script, after):
        extra = (
            [f"--dependency=afterany:{after}", f"--export=ALL,{AFTER_ENV}={after}"] if after else []
        )
        return ["sbatch", "--parsable", *extra, script]

    def log_path(self, name, job, submit_dir, home):
        return os.path.join(submit_dir, f"{name}-{job}.out")

    def node_checks(self, env, nodes, ranks_per_node, script_name):
        if not env.get(self.job_id_var):
            return (
                f"{self.job_id_var} is unset; expected to run inside a job. Fix: sbatch {script_name}",
                [],
            )
        return None, []

    def launcher(self, job):
        # srun passes the whole environment on (--export=ALL, said explicitly); --cpus-per-task binds each rank's cores.
        argv = [
            "srun",
            f"--nodes={job.nodes}",
            f"--ntasks-per-node={job.ranks_per_node}",
            "--export=ALL",
            "--kill-on-bad-exit=1",
        ]
        if job.cpus_per_rank > 0:
            argv += [f"--cpus-per-task={job.cpus_per_rank}", "--cpu-bind=cores"]
        else:
            argv += ["--cpu-bind=none"]
        return argv, {}

    def node_probe(self, nodes):
        # srun has no keepalive: when a node's link is cut (no RST), srun waits for its tasks until Slurm marks the
        # node down (SlurmdTimeout, 300 s by default) and the ranks left hang in a collective. A probe step (one
        # task per node, --overlap: Slurm's own channel to every slurmd) fails naming the node after Slurm's
        # MessageTimeout (10 s by default).
        if nodes < 2:
            return None
        return [
            "srun",
            "--overlap",
            "--quiet",
            f"--nodes={nodes}",
            f"--ntasks={nodes}",
            "--ntasks-per-node=1",
            "true",
        ]

    def lost_node(self, said):
        m = LOST_NODE.search(" ".join(said.split("\n")))
        return m.group(1) if m else None
