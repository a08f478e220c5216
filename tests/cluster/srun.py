"""``srun`` for the simulated cluster: one job step, its tasks started on the nodes through the namespace agent.

    srun.py STATE_DIR [--nodes=N] [--ntasks-per-node=R] [--ntasks=T] [--cpu-bind=X] [--kill-on-bad-exit[=0|1]] CMD...

Inside an ``sbatch``-shaped environment (``SLURM_JOB_NODELIST``, ``SLURM_NTASKS_PER_NODE`` ...) it starts R tasks
on each of the job's first N nodes, block-distributed (task t on node t // R), each in its node's namespaces with
srun's own environment (``--export=ALL``, srun's default) plus the step's and the task's variables
(``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``, ``SLURM_STEP_*`` ...). Like srun it forwards SIGINT,
SIGTERM, SIGUSR1, SIGUSR2 to every task; with ``--kill-on-bad-exit`` a task that fails or dies ends the others
(SIGTERM, then SIGKILL after ``KILL_WAIT_S``); it exits with the largest task status (128 + signal for a task
killed by one) and reports each failed task as ``srun: error: <node>: task <t>: ...``.
Not simulated: PMI/PMIx (no MPI wire-up for the tasks), CPU binding, GPU binding, step allocation checks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

KILL_WAIT_S = 10
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def expand(nodelist: str) -> list[str]:
    """``node[001-002,005]`` -> ["node001", "node002", "node005"]; ``node001`` -> ["node001"]."""
    m = re.fullmatch(r"([^\[]+)\[([^\]]+)\]", nodelist)
    if not m:
        return nodelist.split(",")
    out = []
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        for i in range(int(lo), int(hi or lo) + 1):
            out.append(f"{m.group(1)}{i:0{len(lo)}d}")
    return out


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    opts = {"nodes": None, "ntasks_per_node": None, "ntasks": None, "kill_on_bad_exit": False}
    while argv and argv[0].startswith("-"):
        flag = argv.pop(0)
        name, _, value = flag.partition("=")
        if name in ("--nodes", "-N"):
            opts["nodes"] = int(value or argv.pop(0))
        elif name == "--ntasks-per-node":
            opts["ntasks_per_node"] = int(value or argv.pop(0))
        elif name in ("--ntasks", "-n"):
            opts["ntasks"] = int(value or argv.pop(0))
        elif name == "--kill-on-bad-exit" or name == "-K":
            opts["kill_on_bad_exit"] = value != "0"
        elif name in ("--cpu-bind", "--mpi", "--export"):
            if not value:
                argv.pop(0)
        else:
            raise SystemExit(f"srun: unrecognized option '{name}' (not simulated)")
    return opts, argv


def main(argv: list[str]) -> int:
    state, argv = Path(argv[0]), argv[1:]
    env = dict(os.environ)
    if "SLURM_JOB_ID" not in env:
        print(
            "srun: error: no job allocation (SLURM_JOB_ID unset): run inside sbatch/salloc",
            file=sys.stderr,
        )
        return 1
    opts, cmd = parse(argv)
    nodes = expand(env["SLURM_JOB_NODELIST"])[: opts["nodes"] or None]
    per_node = opts["ntasks_per_node"] or int(env.get("SLURM_NTASKS_PER_NODE", "1"))
    ntasks = opts["ntasks"] or per_node * len(nodes)
    step_env = {
        k: v
        for k, v in env.items()
        if not k.startswith(("SLURM_STEP_", "SLURM_PROCID", "SLURM_LOCALID"))
    }
    step_env.update(
        SLURM_STEP_ID="0",
        SLURM_STEPID="0",
        SLURM_STEP_NODELIST=env["SLURM_JOB_NODELIST"],
        SLURM_STEP_NUM_NODES=str(len(nodes)),
        SLURM_STEP_NUM_TASKS=str(ntasks),
        SLURM_STEP_TASKS_PER_NODE=f"{per_node}(x{len(nodes)})",
        SLURM_NTASKS=str(ntasks),
        SLURM_NPROCS=str(ntasks),
        SLURM_NNODES=str(len(nodes)),
        SLURM_NTASKS_PER_NODE=str(per_node),
        SLURM_TASKS_PER_NODE=f"{per_node}(x{len(nodes)})",
        SLURM_STEP_LAUNCHER_PORT="0",
        SLURM_SRUN_COMM_HOST=nodes[0],
        SLURM_LAUNCH_NODE_IPADDR=nodes[0],
    )
    tasks: list[tuple[int, str, subprocess.Popen]] = []
    for t in range(ntasks):
        node = nodes[t // per_node]
        pid = (state / "nodes" / node).read_text().strip()
        task_env = dict(
            step_env,
            SLURM_PROCID=str(t),
            SLURM_LOCALID=str(t % per_node),
            SLURM_NODEID=str(t // per_node),
            SLURMD_NODENAME=node,
            SLURM_TOPOLOGY_ADDR=node,
            SLURM_GTIDS=",".join(
                str(i) for i in range(t - t % per_node, t - t % per_node + per_node)
            ),
        )
        argv_t = (
            ["nsenter", "-F", "-t", pid, "-n", "-u", "-m", f"--wd={os.getcwd()}", "env", "-i"]
            + [f"{k}={v}" for k, v in task_env.items()]
            + cmd
        )
        tasks.append(
            (t, node, subprocess.Popen(argv_t, stdin=subprocess.DEVNULL, start_new_session=True))
        )

    def forward(sig, _frame):
        for _, _, p in tasks:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    codes: dict[int, int] = {}
    killing_since = None
    while len(codes) < len(tasks):
        for t, node, p in tasks:
            if t in codes or p.poll() is None:
                continue
            rc = p.returncode
            codes[t] = 128 - rc if rc < 0 else rc
            if rc != 0:
                what = f"Killed by signal {-rc}" if rc < 0 else f"Exited with exit code {rc}"
                print(f"srun: error: {node}: task {t}: {what}", file=sys.stderr, flush=True)
                if opts["kill_on_bad_exit"] and killing_since is None:
                    print(
                        "srun: error: a task failed; terminating the step (--kill-on-bad-exit)",
                        file=sys.stderr,
                        flush=True,
                    )
                    killing_since = time.monotonic()
                    forward(signal.SIGTERM, None)
        if killing_since is not None and time.monotonic() - killing_since > KILL_WAIT_S:
            forward(signal.SIGKILL, None)
        time.sleep(0.1)
    return max(codes.values())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
