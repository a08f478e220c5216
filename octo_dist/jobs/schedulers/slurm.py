"""SLURM: ``sbatch`` with ``--signal=B:USR1@MARGIN``, ranks started by ``srun``, and a node probe (srun has no
keepalive)."""

from __future__ import annotations

import os
import re

from octo_dist.jobs.schedulers.base import AFTER_ENV, WORD_CHARS, Option, Scheduler

# "srun: error: Task launch for StepId=7.3 failed on node node002: Communication connection failure"
LOST_NODE = re.compile(r" failed on node ([^:\s]+):")
# SLURM constraints use & | [ ] * ( ) !: "a100&ib", "[rack1|rack2]".
CONSTRAINT = re.compile(r"[A-Za-z0-9_.,:/=+@%&|\[\]*()!-]+")

# sbatch 22.05's long options (`sbatch --help`, plus the few it does not list). sbatch takes any unique prefix of
# one (getopt_long): "--sig=B:KILL@1" is --signal, "--ntasks-per-no=64" --ntasks-per-node.
LONG_OPTIONS = (
    "account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint container "
    "contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot dependency "
    "distribution error exclude exclusive export export-file extra-node-info get-user-env gid gpu-bind gpu-freq "
    "gpus gpus-per-node gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name "
    "kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus "
    "network nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu "
    "ntasks-per-node ntasks-per-socket open-mode output overcommit oversubscribe parsable partition power "
    "priority profile propagate qos quiet reboot requeue reservation signal sockets-per-node spread-job "
    "switches test-only thread-spec threads-per-core time time-min tmp uid usage use-min-nodes verbose version "
    "wait wait-all-nodes wckey wrap"
).split()
# sbatch's one-letter options that take a value (getopt "A:a:b:..."): the rest of a cluster is that value.
SHORT_WITH_VALUE = set("AabBcCdDeFGiJLmMnNopqStwx")
SHORT = {  # sbatch's one-letter spellings of the long options octo-dist checks
    "-J": "--job-name",
    "-N": "--nodes",
    "-n": "--ntasks",
    "-G": "--gpus",
    "-c": "--cpus-per-task",
    "-t": "--time",
    "-o": "--output",
    "-e": "--error",
    "-A": "--account",
    "-p": "--partition",
    "-q": "--qos",
    "-C": "--constraint",
    "-a": "--array",
    "-d": "--dependency",
}


def long_option(word: str) -> str:
    """``"--sig=B:KILL@1"`` -> ``"--signal"``: the option sbatch reads; a prefix of several (``"--gpus-per"``)
    -> every one it may be, joined by "|", so a check finds any of them; unknown ones as given."""
    name = word.split("=", 1)[0][2:]
    if name in LONG_OPTIONS:
        return "--" + name
    matches = [o for o in LONG_OPTIONS if o.startswith(name)] if name else []
    return "|".join("--" + o for o in matches) if matches else "--" + name


class Slurm(Scheduler):
    name = "slurm"
    title = "SLURM"
    help = "SLURM"
    description = (
        "Render a job script for SLURM: #SBATCH --nodes/--ntasks-per-node/--gpus-per-node, srun starts the "
        "ranks with the whole environment, --signal=B:USR1 asks for the stop before the time limit. Give "
        "--gpus-per-node, and --cpus-per-rank to bind cores; --account/--partition/--qos/--constraint where "
        "your site wants them, --directive for any other #SBATCH line, --module for your site's modules."
    )
    options = (
        Option(
            "partition",
            "SLURM partition, #SBATCH --partition (default: the site's default partition)",
        ),
        Option("qos", "SLURM quality of service, #SBATCH --qos (default: the site's default)"),
        Option(
            "constraint",
            "SLURM node features, #SBATCH --constraint, e.g. a100 or 'a100&ib' (default: none)",
            pattern=CONSTRAINT,
            pattern_says=f"one word of {WORD_CHARS}&|[]*()! (it goes into a scheduler directive)",
        ),
    )
    group_help = "account, sbatch --account (default: the site's default account)"
    group_flags = ("--account",)
    depend_help = "sbatch --dependency=afterany:ID"
    rendered_keys = {
        "--job-name": "--name",
        "--nodes": "--nodes",
        "--ntasks": "--nodes/--ranks-per-node",
        "--ntasks-per-node": "--ranks-per-node",
        "--gpus-per-node": "--gpus-per-node",
        "--gpus": "--gpus-per-node",
        "--gres": "--gpus-per-node",
        "--cpus-per-task": "--cpus-per-rank",
        "--time": "--walltime",
        "--signal": "--stop-margin",
        "--output": "nothing (octo-dist names the log)",
        "--error": "nothing (octo-dist names the log)",
        "--account": "--account",
        "--partition": "--partition",
        "--qos": "--qos",
        "--constraint": "--constraint",
    }
    conditional_keys = {k: k[2:] for k in ("--partition", "--qos", "--constraint")}
    conditional_keys["--account"] = "group"
    refused_keys = {
        "--export": "the job's ranks need the job's environment (srun --export=ALL); NONE or a list drops it",
        "--array": "an array job runs the script once per index, every one training into the same save directory",
        "--wrap": "the job is this script, not a wrapped command",
    }
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

    def directive_keys(self, directive):
        # getopt_long: "--sig=B:KILL@1", "--ntasks-per-no 64", and clustered one-letter options "-vN3" (-v, -N 3).
        out = []
        words = directive.split()[1:]
        for word in words:
            if word.startswith("--"):
                out += long_option(word).split("|")
            elif re.fullmatch(r"-[A-Za-z].*", word):
                for i, letter in enumerate(word[1:]):
                    out.append(SHORT.get(f"-{letter}", f"-{letter}"))
                    if letter in SHORT_WITH_VALUE:
                        break  # the rest of the word is its value: "-N3"
        return out

    def header_values(self, header, settings):
        cpus = settings.allocation.cpus_per_rank
        return {"slurm_cpus": f"#SBATCH --cpus-per-task={cpus}\n" if cpus else ""}

    def site_lines(self, header, settings):
        # --account A --partition gpu --qos normal --constraint 'a100&ib': "#SBATCH --partition=gpu"...
        out = [f"#SBATCH --account={header.group}"] if header.group else []
        for opt in self.options:
            if header.site.get(opt.name):
                out.append(f"#SBATCH {opt.option}={header.site[opt.name]}")
        return out + list(header.directives)

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

    def launcher(self, settings, ctx):
        # srun passes the whole environment on (--export=ALL, said explicitly); --cpus-per-task binds each rank's cores.
        argv = [
            "srun",
            f"--nodes={settings.allocation.nodes}",
            f"--ntasks-per-node={settings.allocation.ranks_per_node}",
            "--export=ALL",
            "--kill-on-bad-exit=1",
        ]
        cpus = settings.allocation.cpus_per_rank
        if cpus > 0:
            argv += [f"--cpus-per-task={cpus}", "--cpu-bind=cores"]
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
