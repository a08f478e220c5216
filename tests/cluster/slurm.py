"""Real Slurm (Debian's 22.05: ``slurmctld``, ``slurmd``, ``munged``) on the namespace cluster of ``sim.py``.

    with sim.Cluster(state) as c, Slurm(c) as s:
        s.client("node001", ["sbatch", "--parsable", "job.sh"], cwd=work)

How it runs:

* Everything the daemons write (configs, munge key and socket, slurmctld's state, each slurmd's spool, pid and log
  files, the GPU files) lives under one run directory, ``RUN`` (``/var/spool/octosim-slurm``). One cluster runs at a
  time (``sim``'s lock), so the name is fixed: a set-up removes what a crashed run left there, ``down()`` removes it.
* Every daemon runs in the foreground (``-D`` / ``-F``) inside a node's namespaces, started by ``nsenter`` with
  default signal dispositions and a clean environment: ``munged`` and ``slurmctld`` on node001 (which is also the
  login node: ``sbatch``, ``scontrol``, ``scancel`` run there, since the nodes' addresses exist only inside the
  namespaces), ``slurmd -N nodeNNN`` on each node. A daemon, a ``slurmstepd`` or a rank that outlives ``down()`` is
  inside a node's network namespace, so ``sim``'s clean-up (``down()``, and the next ``up()``) kills it.
* ``SLURM_CONF`` (in ``env()``) points every command at ``RUN/slurm.conf``; ``sbatch`` exports it to the job
  (``--export=ALL``), so the job's ``srun`` finds it. ``/etc/slurm`` is not touched.
* munge: one ``munged`` (as user ``munge``, Debian's package user) with a fresh 1024-byte key and its socket in
  ``RUN/munge``; ``AuthInfo=socket=...`` tells Slurm where. Both nodes share the filesystem, so one daemon serves all.
* No cgroups: two ``slurmd`` on one kernel would share cgroup v1 paths (``slurm/uid_0/job_N/step_M``, the same on
  both nodes), so processes are tracked by parentage (``proctrack/linuxproc``), ``task/none``, no accounting
  (``sacct`` needs ``slurmdbd``: job states come from ``scontrol show job`` while ``MinJobAge`` keeps the record).
* GPUs: ``GresTypes=gpu``, ``Gres=gpu:2`` on the node line, and ``gres.conf`` with ``AutoDetect=off`` and ``File=``
  naming two plain files per node (``RUN/dev/<node>/nvidia[0-1]``): Slurm counts and binds them as GPUs
  (``CUDA_VISIBLE_DEVICES``) without a driver. The nodes' CPU and memory counts are declared
  (``SlurmdParameters=config_overrides``), not probed: both nodes share this machine's cores.
* Everything else is what a site's ``slurm.conf`` would leave at Slurm's defaults (``SlurmdTimeout``, ``KillWait``,
  ``MessageTimeout``, no ``KillOnBadExit``): the job script must not rely on settings a site may not have.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from helpers import HANG_S, restore_signals

from . import sim

RUN = Path("/var/spool") / f"{sim.PREFIX}-slurm"
# The states of a job that has ended. Anything else is a job still alive, and not only PENDING, RUNNING, COMPLETING
# or CONFIGURING: scontrol shows a flag in place of the state, e.g. SIGNALING for the second or so the SIGCONT that
# slurmctld sends before --signal's own signal is in flight (a wait that took it for the end cancelled a running job).
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo")
START_TIMEOUT_S = HANG_S  # the daemons up and both nodes idle: seconds; HANG_S only ends a hang
STOP_TIMEOUT_S = 30
GPUS_PER_NODE = 2
CPUS_PER_NODE = 8
MEMORY_MB = 8000
# ``scontrol show job -o ID`` ends a job's record after this long (Slurm's default is 300 s): the tests read final
# states well within it.
MIN_JOB_AGE_S = 600

SLURM_CONF = """\
# Written by tests/cluster/slurm.py for one test run; removed with {run}.
ClusterName=octosim
SlurmctldHost={controller}({controller_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={run}/munge/munge.socket
StateSaveLocation={run}/slurmctld
SlurmdSpoolDir={run}/slurmd/%n
SlurmctldPidFile={run}/slurmctld.pid
SlurmdPidFile={run}/slurmd-%n.pid
SlurmctldLogFile={run}/log/slurmctld.log
SlurmdLogFile={run}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={run}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
MinJobAge={min_job_age}
{nodes}
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def unavailable() -> Optional[str]:
    """Why real Slurm cannot run here, or None."""
    reason = sim.unavailable()
    if reason:
        return reason
    missing = [p for p in PROGRAMS if shutil.which(p, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]
    if missing:
        return f"no {', '.join(missing)}: install Debian's slurmctld slurmd slurm-client munge"
    try:
        import pwd

        pwd.getpwnam("munge")
    except KeyError:
        return "no user 'munge' (Debian's munge package creates it)"
    return None


def remove_leftovers(run: Path = RUN) -> None:
    """What a crashed run left in ``run``. Its processes lived in the cluster's namespaces: ``sim`` killed them."""
    shutil.rmtree(run, ignore_errors=True)


class Slurm:
    """``Slurm(cluster).up()`` on a cluster that is up; ``client(node, argv)``; ``job(id)``; ``down()``."""

    def __init__(self, cluster: sim.Cluster, run: Path = RUN):
        self.cluster = cluster
        self.run = Path(run)
        self.controller = cluster.nodes[0]
        self.daemons: dict[str, subprocess.Popen] = {}

    @property
    def conf(self) -> Path:
        return self.run / "slurm.conf"

    def env(self, extra: Mapping[str, str] = ()) -> dict:
        """What a login shell has for Slurm's commands: the config's path, a node's PATH."""
        env = {
            "PATH": sim.NODE_PATH,
            "SLURM_CONF": str(self.conf),
            "HOME": "/root",
            "USER": "root",
            "LANG": "C.UTF-8",
        }
        env.update(extra)
        return env

    # ---- set-up and teardown ----------------------------------------------------------------------------------------

    def up(self) -> "Slurm":
        remove_leftovers(self.run)
        try:
            self._write_configs()
            self._start("munged", self.controller, self._munged_argv())
            self._wait(lambda: (self.run / "munge" / "munge.socket").exists(), "munged's socket")
            self._start(
                "slurmctld", self.controller, ["/usr/sbin/slurmctld", "-D", "-f", str(self.conf)]
            )
            for node in self.cluster.nodes:
                self._start(
                    f"slurmd-{node}",
                    node,
                    ["/usr/sbin/slurmd", "-D", "-N", node, "-f", str(self.conf)],
                )
            self._wait(self._nodes_idle, "both nodes idle in sinfo")
        except BaseException:
            self.down()
            raise
        return self

    def _write_configs(self) -> None:
        for d in ("munge", "slurmctld", "log", "dev", *(f"slurmd/{n}" for n in self.cluster.nodes)):
            (self.run / d).mkdir(parents=True, exist_ok=True)
        self.run.chmod(0o755)
        # munged refuses a key others can read and a socket directory it does not own.
        key = self.run / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        shutil.chown(key, "munge", "munge")
        shutil.chown(self.run / "munge", "munge", "munge")
        (self.run / "munge").chmod(0o755)
        nodes = []
        gres = ["AutoDetect=off"]
        for node in self.cluster.nodes:
            dev = self.run / "dev" / node
            dev.mkdir()
            for i in range(GPUS_PER_NODE):
                (dev / f"nvidia{i}").write_text("")
            nodes.append(
                f"NodeName={node} NodeAddr={self.cluster.address[node]} CPUs={CPUS_PER_NODE} "
                f"Boards=1 SocketsPerBoard=1 CoresPerSocket={CPUS_PER_NODE} ThreadsPerCore=1 "
                f"RealMemory={MEMORY_MB} Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            )
            gres.append(f"NodeName={node} Name=gpu File={dev}/nvidia[0-{GPUS_PER_NODE - 1}]")
        self.conf.write_text(
            SLURM_CONF.format(
                run=self.run,
                controller=self.controller,
                controller_addr=self.cluster.address[self.controller],
                min_job_age=MIN_JOB_AGE_S,
                nodes="\n".join(nodes),
            )
        )
        (self.run / "gres.conf").write_text("\n".join(gres) + "\n")
        (self.run / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        (self.run / "plugstack.conf").write_text("")

    def _munged_argv(self) -> list[str]:
        m = self.run / "munge"
        return [
            "/usr/sbin/runuser",
            "-u",
            "munge",
            "--",
            "/usr/sbin/munged",
            "-F",
            f"--socket={m}/munge.socket",
            f"--key-file={m}/munge.key",
            f"--pid-file={m}/munged.pid",
            f"--log-file={m}/munged.log",
            f"--seed-file={m}/munged.seed",
        ]

    def _start(self, name: str, node: str, argv: Sequence[str]) -> None:
        log = open(self.run / "log" / f"{name}.console", "w")
        self.daemons[name] = subprocess.Popen(
            self.cluster.exec_argv(node, argv, self.env(), str(self.run)),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=restore_signals,
        )
        log.close()

    def _wait(self, ready, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [n for n, p in self.daemons.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"{', '.join(dead)} exited while waiting for {what}\n{self.logs()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} after {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.5)

    def _nodes_idle(self) -> bool:
        res = self.client(self.controller, ["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
        states = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.cluster.nodes)

    def logs(self, n: int = 3000) -> str:
        """The tail of every daemon's log (for a failing test's message)."""
        out = []
        for f in sorted((self.run / "log").glob("*")) + [self.run / "munge" / "munged.log"]:
            if f.is_file():
                out.append(f"--- {f.name} ---\n{f.read_text(errors='replace')[-n:]}")
        return "\n".join(out)

    def down(self) -> None:
        """SIGTERM to the daemons (slurmd ends its steps), SIGKILL to what stays; every process left in the nodes'
        namespaces killed; the run directory removed. Idempotent."""
        for p in self.daemons.values():
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.daemons.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.daemons.clear()
        self.cluster.kill_processes()
        remove_leftovers(self.run)

    def __enter__(self) -> "Slurm":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ---- commands -----------------------------------------------------------------------------------------------

    def client(
        self,
        node: str,
        argv: Sequence[str],
        env: Mapping[str, str] = (),
        cwd: Optional[str] = None,
        check: bool = True,
        timeout: float = HANG_S,  # Slurm's commands answer in seconds: HANG_S only ends a hang
    ) -> subprocess.CompletedProcess:
        """A Slurm command (``sbatch``, ``scontrol`` ...) run on ``node`` with ``env()`` plus ``env``."""
        return self.cluster.run(
            node, argv, self.env(env), cwd or str(self.run), check=check, timeout=timeout
        )

    def job(self, job_id: str) -> dict:
        """``scontrol show job -o ID`` as a dict: ``{"JobState": "COMPLETED", "ExitCode": "0:0", ...}``."""
        out = self.client(self.controller, ["scontrol", "show", "job", "-o", job_id]).stdout
        fields = {}
        for item in out.split():
            key, sep, value = item.partition("=")
            if sep:
                fields[key] = value
        return fields

    def latency(self) -> float:
        """The slowest of three ``scontrol ping`` on the login node, in seconds: what one Slurm command takes on
        this machine now (0.05 s quiet, seconds at a load of 20)."""
        took = []
        for _ in range(3):
            t0 = time.monotonic()
            self.client(self.controller, ["scontrol", "ping"])
            took.append(time.monotonic() - t0)
        return max(took)

    def wait_job(self, job_id: str, timeout: float) -> dict:
        """The job's record once it has ended (a state in ``ENDED``), or the last one seen after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record.get("JobState") in ENDED:
                return record
            if time.monotonic() > deadline:
                return record
            time.sleep(1)


# ---- what a job left running on the nodes -------------------------------------------------------------------------


def job_processes(cluster: sim.Cluster) -> list[str]:
    """The job's programs still running on the nodes (Slurm's own daemons excepted): 'node002: octo-dist smoke'."""
    out = []
    for node in cluster.nodes:
        for pid in cluster.processes_on(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            name = " ".join(c.decode(errors="replace") for c in cmd[:3])
            if not any(
                d in name for d in ("slurmd", "slurmctld", "munged", "runuser", "slurmstepd")
            ):
                out.append(f"{node}: {name}")
    return out
