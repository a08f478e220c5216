"""``render(spec) -> str``: a complete job script for PBS Professional, Grid Engine or SLURM.

A scheduler's header template (``pbs.tmpl``, ...) + the body every scheduler shares (``body.tmpl``), with
``@{name}`` placeholders (``$`` and ``{}`` belong to bash). Every value the user chose lands in a shell variable
assignment through ``shlex.quote`` (or, in a scheduler directive, was restricted to ``[A-Za-z0-9_.-]`` by
``spec.build``); the body only expands those variables in double quotes. The scheduler-specific pieces of the
body (the node list, the job id, the launcher line) come from ``SCHEDULERS``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from importlib import resources

from octo_dist.launchers.hostlists import OCTO_DIST_NODEFILE
from octo_dist.jobs import sitedirectives
from octo_dist.jobs.spec import COMMANDS, FORWARD_NAMES, FORWARD_PREFIXES, JobSpec, format_walltime

PLACEHOLDER = re.compile(r"@\{(\w+)\}")
NODE_LIST_ENV = OCTO_DIST_NODEFILE  # the job's node list, copied where every node and the image see it (read first)


@dataclasses.dataclass(frozen=True)
class Scheduler:
    hostfile_var: str  # "" when the launcher needs no node list (srun)
    job_id_var: str
    workdir: str  # where the job starts: qsub's directory
    launcher: str
    stop_timer: bool  # False where the scheduler can signal the script ahead of the limit itself


# mpirun: -x NAME passes a variable to the ranks on other nodes (Open MPI 4 gives them nothing else; the values stay
# off the command line, so a wandb key never shows in `ps`). The scheduler's node list may exist on the first node
# only, outside the image: the ranks get a copy in the job's directory under the save directory, which every node and
# the image see, named by OCTO_DIST_NODEFILE (the scheduler's own variable is left as it set it).
# CPU binding: a block of ranks per socket, each with CPUS_PER_RANK cores for its input pipeline (unbound, 8
# tf.data pipelines fight over the same cores); on a node with another shape, one block per node, or none.
MPIRUN = """\
SOCKETS=@{{sockets}}  # CPU sockets of a node of this resource type; 0: unknown
# Exported variables with these prefixes, and these names, reach every rank on every node.
FORWARD_PREFIXES=(@{{forward_prefixes}})
FORWARD_NAMES=(@{{forward_names}})
NODE_LIST=$JOB_DIR/nodes
cp -- "$HOSTFILE" "$NODE_LIST"
export {node_list_env}=$NODE_LIST
BIND=(--map-by "ppr:$RANKS_PER_NODE:node" --bind-to none)
if [ "$CPUS_PER_RANK" -gt 0 ]; then
  cores_here=$(nproc)
  sockets_here=$(lscpu -p=SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l || true)
  if [ "$cores_here" -lt $((CPUS_PER_RANK * RANKS_PER_NODE)) ]; then
    note "this node has $cores_here CPU(s), fewer than $RANKS_PER_NODE rank(s) x $CPUS_PER_RANK: not binding ranks to cores"
  elif [ "$SOCKETS" -gt 0 ] && [ "$sockets_here" -eq "$SOCKETS" ] && [ $((RANKS_PER_NODE % SOCKETS)) -eq 0 ]; then
    BIND=(--map-by "ppr:$((RANKS_PER_NODE / SOCKETS)):socket:PE=$CPUS_PER_RANK" --bind-to core)
  else
    BIND=(--map-by "ppr:$RANKS_PER_NODE:node:PE=$CPUS_PER_RANK" --bind-to core)
  fi
fi
# A node that stops answering (link down, panic) is noticed by mpirun's daemons through TCP keepalive; Open MPI's
# defaults (300 s, then 9 probes 20 s apart) hold a dead job for 8 minutes: 10 s and 3 probes 5 s apart instead.
# Open MPI 4 (hpcx) reads OMPI_MCA_*, Open MPI 5's PRRTE reads PRTE_MCA_*; each ignores the other's.
for param in keepalive_time=10 keepalive_intvl=5 keepalive_probes=3; do
  export "OMPI_MCA_oob_tcp_${{param%%=*}}=${{param#*=}}" "PRTE_MCA_oob_tcp_${{param%%=*}}=${{param#*=}}"
done
LAUNCHER=(mpirun {hostfile}"${{BIND[@]}}" -x {job_id})
while IFS= read -r var; do
  for prefix in "${{FORWARD_PREFIXES[@]}}"; do
    if [[ "$var" == "$prefix"* ]]; then LAUNCHER+=(-x "$var"); continue 2; fi
  done
  for name in "${{FORWARD_NAMES[@]}}"; do
    if [ "$var" = "$name" ]; then LAUNCHER+=(-x "$var"); fi
  done
done < <(compgen -e)"""

# srun passes the whole environment on (--export=ALL, said explicitly); --cpus-per-task binds each rank's cores.
# srun has no keepalive: when a node's link is cut (no RST), srun waits for its tasks until Slurm marks the node down
# (SlurmdTimeout, 300 s by default) and the ranks left hang in a collective. So while srun runs, a probe step
# (srun --overlap, one task per node: Slurm's own channel to every slurmd) is started every NODE_PROBE_S seconds; one
# that fails naming a node ("Task launch for StepId=7.3 failed on node node002: Communication connection failure",
# after Slurm's MessageTimeout, 10 s by default) ends the ranks' step, naming the node. A probe that fails without
# naming a node (a busy controller) only leaves a note.
SRUN = """\
NODE_PROBE_S=15
SRUN_GUARD=(bash -c 'nodes=$1 every=$2; shift 2
"$@" &
pid=$!
for sig in USR1 USR2 TERM INT; do trap "kill -$sig $pid 2>/dev/null" "$sig"; done
probe=
if [ "$nodes" -gt 1 ]; then
  (while sleep "$every"; do
    if said=$(srun --overlap --quiet --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 true 2>&1 >/dev/null); then continue; fi
    said=$(tr "\\n" " " <<<"$said")
    node=$(sed -n "s/.* failed on node \\([^:]*\\):.*/\\1/p" <<<"$said")
    if [ -z "$node" ]; then echo "octo-dist job: a node probe failed, not ending the job: $said" >&2; continue; fi
    echo "octo-dist job: node $node cannot be reached by Slurm: ending the job step ($said)" >&2
    kill -TERM "$pid" 2>/dev/null; sleep 10; kill -KILL "$pid" 2>/dev/null; exit
  done) </dev/null &
  probe=$!
fi
while :; do
  status=0; wait "$pid" || status=$?
  if [ "$status" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
  break
done
if [ -n "$probe" ]; then kill "$probe" 2>/dev/null; fi
exit "$status"' octo-dist-srun "$NODES" "$NODE_PROBE_S")
LAUNCHER=("${SRUN_GUARD[@]}" srun --nodes="$NODES" --ntasks-per-node="$RANKS_PER_NODE" --export=ALL --kill-on-bad-exit=1)
if [ "$CPUS_PER_RANK" -gt 0 ]; then
  LAUNCHER+=(--cpus-per-task="$CPUS_PER_RANK" --cpu-bind=cores)
else
  LAUNCHER+=(--cpu-bind=none)
fi"""

SCHEDULERS = {
    # PBS starts the job in $HOME; PBS_O_WORKDIR is where qsub ran.
    "pbs": Scheduler(
        "PBS_NODEFILE",
        "PBS_JOBID",
        '"${PBS_O_WORKDIR:-$PWD}"',
        MPIRUN.format(
            job_id="PBS_JOBID", node_list_env=NODE_LIST_ENV, hostfile='-hostfile "$HOSTFILE" '
        ),
        stop_timer=True,
    ),
    # -cwd: Grid Engine starts the job where qsub ran. No -hostfile: Open MPI's gridengine components read
    # PE_HOSTFILE ("node001 4 all.q@node001 UNDEFINED", not a host file Open MPI can read) and start the other
    # nodes' ranks through `qrsh -inherit`, inside the job's accounting and limits.
    "sge": Scheduler(
        "PE_HOSTFILE",
        "JOB_ID",
        '"$PWD"',
        MPIRUN.format(job_id="JOB_ID", node_list_env=NODE_LIST_ENV, hostfile=""),
        stop_timer=True,
    ),
    "slurm": Scheduler("", "SLURM_JOB_ID", '"${SLURM_SUBMIT_DIR:-$PWD}"', SRUN, stop_timer=False),
}

TRUSTED_VALUE = re.compile(
    r"[A-Za-z0-9_.,:/=+-]+"
)  # values from octo-dist's own tables, written unquoted


def _scheduler_checks(spec: JobSpec) -> str:
    s = SCHEDULERS[spec.scheduler]
    submit = "sbatch" if spec.scheduler == "slurm" else "qsub"
    job = f"JOB=${{{s.job_id_var}:-0}}  # the scheduler's job id"
    if not s.hostfile_var:
        return (
            f"{job}\n"
            f'[ -n "${{{s.job_id_var}:-}}" ] || fail "{s.job_id_var} is unset; expected to run inside a job. '
            f'Fix: {submit} $SCRIPT_NAME"'
        )
    return (
        f"{job}\n"
        f"HOSTFILE=${{{s.hostfile_var}:-}}\n"
        f'if [ -z "$HOSTFILE" ] || [ ! -r "$HOSTFILE" ]; then\n'
        f"  fail \"{s.hostfile_var} is '$HOSTFILE'; expected the node list the scheduler gives every job. "
        f'Fix: submit it ({submit} $SCRIPT_NAME) rather than running it"\n'
        f"fi\n"
        f"hosts_found=$(awk 'NF && !seen[$1]++' \"$HOSTFILE\" | wc -l)\n"
        f'if [ "$hosts_found" -ne "$NODES" ]; then\n'
        f'  note "warning: $HOSTFILE lists $hosts_found node(s); this script was rendered for $NODES"\n'
        f"fi" + (SGE_SLOTS_CHECK if spec.scheduler == "sge" else "")
    )


# Grid Engine: the PE's allocation_rule decides where the slots land; mpirun --map-by ppr:R:node needs R slots on
# each of the job's nodes. PE_HOSTFILE: "node001 2 all.q@node001 UNDEFINED" per host; NSLOTS: "4".
SGE_SLOTS_CHECK = """
shape=$(awk 'NF { printf "%s%s:%s", sep, $1, $2; sep = " " }' "$HOSTFILE")
if [ "${NSLOTS:-}" != $((NODES * RANKS_PER_NODE)) ] || awk -v r="$RANKS_PER_NODE" 'NF && $2 != r { bad = 1 } END { exit !bad }' "$HOSTFILE"; then
  fail "Grid Engine gave NSLOTS=${NSLOTS:-unset} as $shape (PE_HOSTFILE); expected $NODES node(s) x $RANKS_PER_NODE slot(s). Fix: submit to a PE whose allocation_rule is $RANKS_PER_NODE (qconf -sp NAME; re-render with --pe NAME)"
fi"""


def train_lines(spec: JobSpec) -> list:
    """The TRAIN array's lines: the program (from the venv's bin/ or the image's PATH), then its flags."""
    cmd = COMMANDS[spec.command]
    program, *rest = cmd.program
    lines = [" ".join([f'"${{BIN}}{program}"', *map(shlex.quote, rest)])]
    if spec.lead_args:
        lines.append(shlex.join(spec.lead_args))
    if spec.job_args:
        lines.append(shlex.join(spec.job_args))
    paths = [f'"{cmd.save_dir}=$SAVE_DIR"']
    if spec.data_dir:
        paths.append(f'"{cmd.data_dir}=$DATA_DIR"')
    if spec.compile_cache:
        paths.append(f'"{cmd.compile_cache}=$COMPILE_CACHE"')
    lines.append(" ".join(paths))
    if spec.user_args:
        lines.append(shlex.join(spec.user_args))
    if spec.resume:
        lines.append(cmd.resume)
    return ["  " + line for line in lines]


def _exports(variables) -> str:
    """``(name, value, why)`` -> ``export NAME=${NAME:-value}  # why`` lines: a value set before the job wins."""
    lines = []
    for name, value, why in variables:
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) and TRUSTED_VALUE.fullmatch(value), (
            name,
            value,
        )
        lines.append(f"export {name}=${{{name}:-{value}}}  # {why}\n")
    return "".join(lines)


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
        "group": spec.group or "",
        "group_or_placeholder": spec.group or "GROUP",
        "resource_type": spec.resource_type or "",
        "nodes": spec.nodes,
        "ranks_per_node": spec.ranks_per_node,
        "gpus_per_node": spec.gpus_per_node,
        "sockets": spec.sockets,
        "cpus_per_rank": spec.cpus_per_rank,
        "walltime": format_walltime(spec.walltime_s),
        "walltime_s": spec.walltime_s,
        "name": spec.name,
        "script_name": q(script_name),
        "script_name_comment": q(script_name),
        "command_line": shlex.join(spec.command_line) or "octo-dist launch",
        "slurm_account": "",  # the account, queue and project are site lines (sitedirectives)
        "pe": spec.pe,
        "slots": spec.ranks,
        "sge_site": "",
        "slurm_cpus": f"#SBATCH --cpus-per-task={spec.cpus_per_rank}\n"
        if spec.cpus_per_rank
        else "",
        "stop_margin_s": spec.stop_margin_s,
        "stop_timer": int(s.stop_timer),
        "image": q(spec.image or ""),
        "venv": q(spec.venv),
        "save_dir": q(spec.save_dir),
        "data_dir": q(spec.data_dir or ""),
        "compile_cache": q(spec.compile_cache),
        "binds": " ".join(map(q, spec.binds)),
        "modules": " ".join(map(q, spec.modules)),
        "workdir": s.workdir,
        "wandb_mode": q(spec.wandb_mode),
        "environment": _exports(spec.environment + COMMANDS[spec.command].environment),
        "coordinator": (
            f"export COORDINATOR_ADDRESS={q(spec.coordinator)}  # asked for; else octo-dist agrees one"
            if spec.coordinator
            else "# coordinator: octo-dist agrees one (mpi4py broadcast, else the node list's first host and a "
            "port from the job id)"
        ),
        "forward_prefixes": " ".join(FORWARD_PREFIXES),
        "forward_names": " ".join(FORWARD_NAMES),
        "scheduler_checks": _scheduler_checks(spec),
        "launcher_program": "srun" if spec.scheduler == "slurm" else "mpirun",
        "launcher": s.launcher,
        "train": "\n".join(train_lines(spec)),
    }
    values["launcher"] = substitute(s.launcher, values)
    header = substitute(_template(f"{spec.scheduler}.tmpl"), values)
    return sitedirectives.insert(
        header, sitedirectives.header_lines(spec), spec.scheduler
    ) + substitute(_template("body.tmpl"), values)
