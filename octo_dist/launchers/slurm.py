"""Slurm: an ``srun`` step is a launch; a batch script or an ``salloc`` shell is one process.

What Slurm sets, from its source (``src/common/env.c``) and the srun/sbatch ENVIRONMENT docs:

* every step, from ``env_array_for_step()``: SLURM_STEP_ID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NUM_NODES,
  SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE (``uint16_array_to_str()``: ``"4(x2)"``, ``"3,5"``,
  ``"2(x3),1"``), and it overwrites SLURM_NTASKS with the step's task count unless ``--preserve-env``;
* every task, from ``setup_env()`` in slurmstepd: SLURM_PROCID (rank in the step), SLURM_LOCALID (rank on the node),
  SLURM_NODEID (the node's index in the step);
* a batch script (``env_array_for_batch_job()``) or salloc (``env_array_for_job()``): SLURM_JOB_ID,
  SLURM_JOB_NODELIST, SLURM_NTASKS when ``--ntasks`` was given, SLURM_NTASKS_PER_NODE only when
  ``--ntasks-per-node`` was given; the batch step also gets SLURM_PROCID=0 and SLURM_LOCALID=0, but never
  SLURM_STEP_NUM_TASKS. So the step variables, not SLURM_NTASKS or SLURM_NTASKS_PER_NODE, say how many ranks
  run and where.

JAX's own ``slurm_cluster.py`` reads SLURM_NTASKS and SLURM_LOCALID and takes the first host of
SLURM_STEP_NODELIST by string slicing; here the node list is fully expanded and every count is cross-checked.
"""

from __future__ import annotations

import re
from typing import List, Mapping, Optional

from octo_dist.launchers import hostlists
from octo_dist.launchers.single import one_process
from octo_dist.launchers.base import Launch, int_var, refuse, shown

PROCID = "SLURM_PROCID"  # "5": rank in the step
LOCALID = "SLURM_LOCALID"  # "1": rank on this node
NODEID = "SLURM_NODEID"  # "1": this node's index in the step
STEP_ID = "SLURM_STEP_ID"  # "0" (an srun step); absent in a batch script
STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"  # "8": the step's ranks
STEP_NUM_NODES = "SLURM_STEP_NUM_NODES"  # "2"
STEP_NODELIST = "SLURM_STEP_NODELIST"  # "node[003-004]": the step's nodes, task 0's first
STEP_TASKS_PER_NODE = "SLURM_STEP_TASKS_PER_NODE"  # "4(x2)" or "3,5"
NTASKS = "SLURM_NTASKS"  # "8": the step's count in a step, the request in a batch script
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"  # "4(x2)": the job's layout (the step's inside a step)
NTASKS_PER_NODE = "SLURM_NTASKS_PER_NODE"  # "4": only with --ntasks-per-node
GTIDS = "SLURM_GTIDS"  # "4,5,6,7": this node's ranks (removed in Slurm 23.11)
JOB_ID = "SLURM_JOB_ID"  # "123456"
JOB_NODELIST = "SLURM_JOB_NODELIST"  # "node[001-004]": the allocation

READ = (
    PROCID,
    LOCALID,
    NODEID,
    STEP_ID,
    STEP_NUM_TASKS,
    STEP_NUM_NODES,
    STEP_NODELIST,
    STEP_TASKS_PER_NODE,
    NTASKS,
    JOB_ID,
)
SRUN_FIX = "start the ranks with srun inside the allocation (srun --ntasks-per-node=<GPUs per node> octo-dist ...)"


def parse_tasks_per_node(value: str, var: str = STEP_TASKS_PER_NODE) -> List[int]:
    """Slurm's per-node counts: ``"4(x2)"`` -> [4, 4]; ``"3,5"`` -> [3, 5]; ``"2(x3),1"`` -> [2, 2, 2, 1]."""
    counts: List[int] = []
    for piece in value.split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", piece)
        if not m or (m.group(2) is not None and int(m.group(2)) == 0):
            raise refuse(
                f"slurm: {var}={value!r} is not a per-node task count",
                "counts such as 4(x2) or 3,5, as srun sets them",
                f"unset {var} if you set it yourself",
            )
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def is_step(environ: Mapping[str, str]) -> bool:
    """An srun step (SLURM_STEP_NUM_TASKS exists in every step and in no batch script or salloc shell)."""
    return bool(environ.get(STEP_NUM_TASKS))


def detect(environ: Mapping[str, str]) -> Optional[Launch]:
    """The srun step this process belongs to, or None outside one (see :func:`allocation` for batch scripts)."""
    if not is_step(environ):
        return None
    used = shown(environ, *READ, TASKS_PER_NODE, NTASKS_PER_NODE, GTIDS)
    for var in (PROCID, LOCALID):
        if var not in environ:
            raise _without(
                f"an srun step ({STEP_NUM_TASKS}={environ[STEP_NUM_TASKS]})",
                var,
                f"{PROCID} and {LOCALID}",
            )
    world = int_var(environ, STEP_NUM_TASKS, "slurm")
    rank = int_var(environ, PROCID, "slurm")
    local_rank = int_var(environ, LOCALID, "slurm")
    nodes = None
    if environ.get(STEP_NODELIST):
        nodes = tuple(hostlists.expand_nodelist(environ[STEP_NODELIST], STEP_NODELIST))
    local_size = _local_size(environ, world, nodes)
    step = environ.get(STEP_ID)
    job = environ.get(JOB_ID)
    return Launch(
        launcher="slurm",
        world_size=world,
        rank=rank,
        local_rank=local_rank,
        local_size=local_size,
        job_id=job,
        nodes=nodes,
        nodes_source=STEP_NODELIST if nodes else None,
        step_id=step,
        detail=f"Slurm srun step {step if step is not None else '?'} of job {job or '?'}",
        variables=used,
    )


def _without(what: str, var: str, expected: str):
    """A step's task started without a variable srun sets in each: ``slurm: <what> without SLURM_NODEID``."""
    return refuse(f"slurm: {what} without {var}", f"{expected} in every task srun starts", SRUN_FIX)


def _local_size(environ: Mapping[str, str], world: int, nodes) -> int:
    """Ranks on this node: SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID, else what older Slurm leaves."""
    tpn_var = (
        STEP_TASKS_PER_NODE
        if environ.get(STEP_TASKS_PER_NODE)
        else (TASKS_PER_NODE if environ.get(TASKS_PER_NODE) else None)
    )
    if tpn_var:
        counts = parse_tasks_per_node(environ[tpn_var], tpn_var)
        if sum(counts) != world:
            raise refuse(
                f"slurm: {tpn_var}={environ[tpn_var]!r} adds up to {sum(counts)} tasks but "
                f"{STEP_NUM_TASKS}={world}",
                "the per-node counts to add up to the step's tasks",
                f"unset {tpn_var} and {STEP_NUM_TASKS} if you set them yourself; {SRUN_FIX}",
            )
        if nodes is not None and len(nodes) != len(counts):
            raise refuse(
                f"slurm: {STEP_NODELIST} names {len(nodes)} node(s) but {tpn_var}={environ[tpn_var]!r} "
                f"counts {len(counts)}",
                "one count per node of the step",
                SRUN_FIX,
            )
        if len(counts) == 1:
            return counts[0]
        if NODEID not in environ:
            raise _without(
                f"a step over {len(counts)} nodes ({tpn_var}={environ[tpn_var]})", NODEID, NODEID
            )
        node = int_var(environ, NODEID, "slurm")
        if node >= len(counts):
            raise refuse(
                f"slurm: {NODEID}={node} but the step has {len(counts)} node(s)",
                f"0 <= {NODEID} < {len(counts)}",
                SRUN_FIX,
            )
        return counts[node]
    if environ.get(GTIDS):
        return len([g for g in environ[GTIDS].split(",") if g.strip()])
    if re.fullmatch(r"[0-9]{1,9}", environ.get(NTASKS_PER_NODE, "")):  # not "²" (isdigit())
        return int(environ[NTASKS_PER_NODE])
    if world == 1:
        return 1
    raise refuse(
        f"slurm: an srun step of {world} tasks without {STEP_TASKS_PER_NODE}, {GTIDS} or {NTASKS_PER_NODE}",
        "srun's per-node task counts, to know how many ranks share this node",
        f"{SRUN_FIX}, or pass --ntasks-per-node",
    )


def refuse_rank_without_step(environ: Mapping[str, str]) -> None:
    """A task's rank (SLURM_PROCID=3) with no step size is not a batch script: refuse rather than train alone.

    A batch script or salloc shell has SLURM_PROCID=0 (or none); a task srun starts always has
    SLURM_STEP_NUM_TASKS. ``SLURM_PROCID=3`` without it (variables copied by hand, a wrapper that dropped the step's
    ones) read as one process would make every rank train alone on the full batch.
    """
    if is_step(environ):
        return
    rank = environ.get(PROCID, "").strip()
    if rank in ("", "0"):
        return
    present = shown(environ, NTASKS, STEP_NUM_TASKS, JOB_ID)
    raise refuse(
        f"slurm: {PROCID}={rank} but no {STEP_NUM_TASKS}"
        + (f" (only {', '.join(present)})" if present else "")
        + ": the number of ranks is unknown",
        f"{STEP_NUM_TASKS} beside {PROCID} in every task srun starts ({PROCID}=0 or none in a batch script "
        f"or salloc shell)",
        f"unset {PROCID} if you set it yourself; {SRUN_FIX}",
    )


def allocation(environ: Mapping[str, str]) -> Optional[Launch]:
    """A batch script or salloc shell (SLURM_JOB_ID, no step): one process, with a note when more were asked for."""
    if not environ.get(JOB_ID) or is_step(environ):
        return None
    asked = environ.get(NTASKS, "")
    note = None
    if re.fullmatch(r"[0-9]{1,9}", asked) and int(asked) > 1:
        note = (
            f"Slurm job {environ[JOB_ID]} asked for {asked} tasks ({NTASKS}={asked}) but this process is its batch "
            f"script or salloc shell, not an srun step: it runs as one process. To run {asked} ranks: "
            f"srun octo-dist ..."
        )
    return one_process(
        job_id=environ[JOB_ID],
        detail=f"Slurm job {environ[JOB_ID]} without an srun step (batch script or salloc shell)",
        variables=shown(environ, JOB_ID, NTASKS, PROCID, JOB_NODELIST),
        note=note,
    )
