"""``render(spec) -> str``: a complete job script for PBS (ABCI 3.0), SGE (ABCI 2.0) or SLURM.

A scheduler's header template (``pbs.tmpl``, ...) + the body every scheduler shares (``body.tmpl``), with
``@{name}`` placeholders (``$`` and ``{}`` belong to bash). Every value goes through ``shlex.quote``; the
scheduler-specific pieces of the body (how to find the node list, the launcher line) come from ``SCHEDULERS``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from importlib import resources

from octo_dist.jobs.spec import COMMANDS, JobSpec, format_walltime

PLACEHOLDER = re.compile(r"@\{(\w+)\}")


@dataclasses.dataclass(frozen=True)
class Scheduler:
    hostfile_var: str     # "" when the launcher needs no node list (srun)
    job_id_var: str
    workdir: str          # where the job starts: qsub's directory
    launcher: str
    stop_timer: bool      # False where the scheduler can signal the script ahead of the limit itself


# mpirun: -x names what ranks on other nodes get (the values stay off the command line). The node list may exist on
# the first node only, and octo-dist's coordinator reads it on every rank when mpi4py cannot be used (a host MPI other
# than the image's): the ranks get a copy in the save directory, which every node (and the container) sees.
# --bind-to none: with 2 ranks or fewer Open MPI binds each rank to a single core, starving the input pipeline.
MPIRUN = """\
NODE_LIST=$SAVE_DIR/.octo-dist-nodes-${{{job_id}:-0}}
cp "$HOSTFILE" "$NODE_LIST"
LAUNCHER=(mpirun -npernode "$RANKS_PER_NODE" -hostfile "$HOSTFILE" --bind-to none -x {hostfile}="$NODE_LIST")
for var in WANDB_MODE WANDB_API_KEY COORDINATOR_ADDRESS OCTO_DIST_INIT_TIMEOUT {job_id}@{{command_env_names}}; do
  if [ -n "${{!var:-}}" ]; then LAUNCHER+=(-x "$var"); fi
done"""

# srun passes the whole environment on; --cpu-bind=none for the same reason as mpirun's --bind-to none.
SRUN = """\
LAUNCHER=(srun --nodes="$NODES" --ntasks-per-node="$RANKS_PER_NODE" --cpu-bind=none --kill-on-bad-exit=1)"""

SCHEDULERS = {
    # PBS starts the job in $HOME; PBS_O_WORKDIR is where qsub ran.
    "pbs": Scheduler("PBS_NODEFILE", "PBS_JOBID", '"${PBS_O_WORKDIR:-$PWD}"',
                     MPIRUN.format(job_id="PBS_JOBID", hostfile="PBS_NODEFILE"), stop_timer=True),
    # -cwd: SGE starts the job where qsub ran.
    "sge": Scheduler("SGE_JOB_HOSTLIST", "JOB_ID", '"$PWD"',
                     MPIRUN.format(job_id="JOB_ID", hostfile="SGE_JOB_HOSTLIST"), stop_timer=True),
    "slurm": Scheduler("", "SLURM_JOB_ID", '"${SLURM_SUBMIT_DIR:-$PWD}"', SRUN, stop_timer=False),
}


def _scheduler_checks(spec: JobSpec, script_name: str) -> str:
    s = SCHEDULERS[spec.scheduler]
    submit = "sbatch" if spec.scheduler == "slurm" else "qsub"
    if not s.hostfile_var:
        return (f"HOSTFILE=\n"
                f'[ -n "${{{s.job_id_var}:-}}" ] || fail "{s.job_id_var} is unset; expected to run inside a job. '
                f'Fix: {submit} {script_name}"')
    return (f"HOSTFILE=${{{s.hostfile_var}:-}}\n"
            f'if [ -z "$HOSTFILE" ] || [ ! -r "$HOSTFILE" ]; then\n'
            f'  fail "{s.hostfile_var} is \'$HOSTFILE\'; expected the node list the scheduler gives every job. '
            f'Fix: submit it ({submit} {script_name}) rather than running it"\n'
            f"fi\n"
            f"hosts_found=$(awk 'NF && !seen[$1]++' \"$HOSTFILE\" | wc -l)\n"
            f'if [ "$hosts_found" -ne "$NODES" ]; then\n'
            f'  note "warning: $HOSTFILE lists $hosts_found node(s); this script was rendered for $NODES"\n'
            f"fi")


def train_lines(spec: JobSpec) -> list:
    """The TRAIN array's lines: the program (from the venv's bin/ or the image's PATH), then its flags."""
    cmd = COMMANDS[spec.command]
    program, *rest = cmd.program
    lines = [" ".join([f'"${{BIN}}{program}"', *map(shlex.quote, rest)])]
    if spec.job_args:
        lines.append(shlex.join(spec.job_args))
    lines.append(f'"{cmd.save_dir}=$SAVE_DIR"' + (f' "{cmd.data_dir}=$DATA_DIR"' if spec.data_dir else ""))
    if spec.user_args:
        lines.append(shlex.join(spec.user_args))
    if spec.resume:
        lines.append(cmd.resume)
    return ["  " + line for line in lines]


def substitute(template: str, values: dict) -> str:
    """``@{name}`` -> values[name]; a placeholder without a value is a bug here, not the user's."""
    missing = sorted(set(PLACEHOLDER.findall(template)) - set(values))
    if missing:
        raise KeyError(f"template placeholders without a value: {missing}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def _template(name: str) -> str:
    return resources.files("octo_dist.jobs").joinpath(name).read_text()


def render(spec: JobSpec, script_name: str = "job.sh") -> str:
    """The job script for ``spec``; ``script_name`` only appears in the submit hints."""
    s = SCHEDULERS[spec.scheduler]
    q = shlex.quote
    values = {
        "group": spec.group or "", "group_or_placeholder": spec.group or "GROUP", "resource_type": spec.resource_type or "",
        "nodes": spec.nodes, "ranks_per_node": spec.ranks_per_node, "gpus_per_node": spec.gpus_per_node,
        "walltime": format_walltime(spec.walltime_s), "walltime_s": spec.walltime_s, "name": spec.name,
        "script_name": script_name, "command_line": shlex.join(spec.command_line) or "octo-dist launch",
        "slurm_account": f"#SBATCH --account={spec.group}\n" if spec.group else "",
        "stop_margin_s": spec.stop_margin_s, "stop_timer": int(s.stop_timer),
        "image": q(spec.image or ""), "venv": q(spec.venv), "save_dir": q(spec.save_dir), "data_dir": q(spec.data_dir or ""),
        "modules": " ".join(map(q, spec.modules)), "workdir": s.workdir, "wandb_mode": q(spec.wandb_mode),
        "coordinator": (f"export COORDINATOR_ADDRESS={q(spec.coordinator)}  # asked for; else octo-dist agrees one"
                        if spec.coordinator else
                        "# coordinator: octo-dist agrees one (mpi4py broadcast, else the node list's first host and a port from the job id)"),
        "scheduler_checks": _scheduler_checks(spec, script_name),
        "launcher_program": "srun" if spec.scheduler == "slurm" else "mpirun", "launcher": s.launcher,
        "train": "\n".join(train_lines(spec)),
        "command_env": "".join(f"export {k}={q(v)}  # {why}\n" for k, v, why in COMMANDS[spec.command].environment),
        "command_env_names": "".join(f" {k}" for k, _, _ in COMMANDS[spec.command].environment),
    }
    values["launcher"] = substitute(values["launcher"], values)
    return substitute(_template(f"{spec.scheduler}.tmpl"), values) + substitute(_template("body.tmpl"), values)
