"""A real Grid Engine 8.1.9 (Debian's gridengine-master/-exec/-client) on the namespace cluster.

``GridEngine(cluster).up()`` makes a cell of its own under the cluster's state directory (``<state>/sge``: a
``SGE_ROOT`` whose ``bin``/``lib``/``utilbin``/``util`` link to Debian's ``/var/lib/gridengine``, and cell
``default`` with its bootstrap, classic spooling and the execds' spool), starts ``sge_qmaster`` on node001 and
``sge_execd`` on every node, and configures what an MPI site has: a queue ``all.q`` with ``--ranks-per-node`` slots
per host and ``shell_start_mode unix_behavior`` (the script's ``#!/bin/bash`` is used), and a parallel environment
``mpi`` with ``control_slaves TRUE`` (Open MPI starts the other nodes' ranks through ``qrsh -inherit``) and a fixed
``allocation_rule``. Jobs run as root: ``min_uid``/``min_gid`` 0 in the global configuration.

Nothing is written outside the state directory but the jobs' ``TMPDIR`` (one base per node in the instance's
``sim.SPOOL``), and every daemon runs inside the cluster's namespaces, so the
cluster's own teardown (``sim.Cluster.down()``, which kills every process in its namespaces, also those of a crashed
earlier run) ends them; ``down()`` asks them to stop first. The site's default request file (``common/sge_request``)
passes what a site's Open MPI module would set: root may run mpirun (``OMPI_ALLOW_RUN_AS_ROOT``), and the venv's
mpi4py (built for the venv's Open MPI 5) is not called under Debian's Open MPI 4.1 (``OCTO_DIST_NO_MPI4PY``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from cluster import sim
from helpers import HANG_S, restore_signals

DEBIAN_ROOT = Path("/var/lib/gridengine")
DEFAULT_CONFIGURATION = Path("/usr/share/gridengine/default-configuration")
CENTRY = Path("/usr/share/gridengine/util/resources/centry")
USERSETS = Path("/usr/share/gridengine/util/resources/usersets")
SCHEDULER = Path(
    "/usr/share/gridengine/util/install_modules/inst_schedd_normal.conf"
)  # what inst_sge loads
ARCH = "lx-amd64"
CELL = "default"
PE = "mpi"
QMASTER_PORT, EXECD_PORT = "6444", "6445"  # inside the namespaces only
# Rank-side settings every job gets from the site's default request file (see the module docstring).
SITE_REQUEST = "OMPI_ALLOW_RUN_AS_ROOT=1,OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1,OCTO_DIST_NO_MPI4PY=1,PYTHONUNBUFFERED=1"


def unavailable() -> Optional[str]:
    """Why a real Grid Engine cannot run here, or None."""
    for path in (
        DEBIAN_ROOT / "bin" / ARCH / "qsub",
        DEBIAN_ROOT / "bin" / ARCH / "sge_qmaster",
        DEBIAN_ROOT / "bin" / ARCH / "sge_execd",
        DEFAULT_CONFIGURATION,
    ):
        if not path.exists():
            return f"no {path}: apt-get install gridengine-master gridengine-exec gridengine-client"
    if not Path("/usr/bin/mpirun").exists():
        return "no /usr/bin/mpirun: apt-get install openmpi-bin"
    return None


class GridEngine:
    """``GridEngine(cluster, slots_per_host=2).up()``; ``run(argv)`` on the master node; ``down()``."""

    def __init__(self, cluster: sim.Cluster, slots_per_host: int = 2):
        self.cluster = cluster
        self.slots = slots_per_host
        self.root = cluster.state / "sge"
        self.cell = self.root / CELL
        self.spool = self.root / "spool"
        self.master = cluster.nodes[0]
        # Under it each node's own base for its jobs' TMPDIR (the queue's tmpdir): in this instance's spool, which
        # every set-up and teardown removes, with a path short enough for Open MPI's sockets under TMPDIR.
        self.tmp = sim.SPOOL / "sge-tmp"

    # ---- environment ------------------------------------------------------------------------------------------

    def env(self, extra: Mapping[str, str] = ()) -> dict:
        """A login shell's environment on a node with this cell's settings (what settings.sh gives)."""
        env = {
            "PATH": f"{self.root}/bin/{ARCH}:{sim.NODE_PATH}",
            "HOME": str(self.cluster.state),
            "USER": "root",
            "LOGNAME": "root",
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "SGE_ROOT": str(self.root),
            "SGE_CELL": CELL,
            "SGE_QMASTER_PORT": QMASTER_PORT,
            "SGE_EXECD_PORT": EXECD_PORT,
        }
        env.update(extra)
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Optional[Path] = None,
        env: Mapping[str, str] = (),
        check: bool = True,
        timeout: float = HANG_S,  # qsub, qstat, qconf answer in seconds: HANG_S only ends a hang
        node: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """``argv`` on node001 (the login and master node) with this cell's environment."""
        return self.cluster.run(
            node or self.master,
            argv,
            self.env(env),
            str(cwd or self.root),
            check=check,
            timeout=timeout,
        )

    def qconf_from(self, option: str, name: str, text: str) -> None:
        """``qconf -Aq FILE`` and the like: Grid Engine reads objects from files (the name matters for -Mconf)."""
        tmp = self.root / "objects"
        tmp.mkdir(exist_ok=True)
        path = tmp / name
        path.write_text(text)
        self.run(["qconf", option, str(path)])

    # ---- set-up -----------------------------------------------------------------------------------------------

    def up(self) -> "GridEngine":
        try:
            self._cell()
            self._spool()
            self._start(self.master, "sge_qmaster")
            self._wait(
                lambda: self.run(["qstat"], check=False).returncode == 0, "sge_qmaster answers"
            )
            for node in self.cluster.nodes:
                self._start(node, "sge_execd")
            self._wait(self._all_hosts_report, "every sge_execd reports its load")
            self.qconf_from("-Msconf", "sched_configuration", self._scheduler())
            self.qconf_from("-Ap", PE, self._pe())
            self.qconf_from("-Aq", "all.q", self._queue())
        except BaseException:
            self.down()
            raise
        return self

    def _cell(self) -> None:
        common = self.cell / "common"
        common.mkdir(parents=True, exist_ok=True)
        for name in ("bin", "lib", "utilbin", "util"):
            link = self.root / name
            if not link.exists():
                link.symlink_to(DEBIAN_ROOT / name)
        self.spool.mkdir(exist_ok=True)
        for node in self.cluster.nodes:
            (self.tmp / node).mkdir(parents=True, exist_ok=True)
        (self.spool / "execd").mkdir(exist_ok=True)
        (self.spool / "qmaster").mkdir(exist_ok=True)
        (common / "bootstrap").write_text(
            "admin_user              root\n"
            "default_domain          none\n"
            "ignore_fqdn             true\n"
            "spooling_method         classic\n"
            "spooling_lib            libspoolc\n"
            f"spooling_params         {common};{self.spool / 'qmaster'}\n"
            "binary_path             /usr/sbin\n"
            f"qmaster_spool_dir       {self.spool / 'qmaster'}\n"
            "security_mode           none\n"
            "listener_threads        2\n"
            "worker_threads          2\n"
            "scheduler_threads       1\n"
        )
        (common / "act_qmaster").write_text(self.master + "\n")
        (common / "cluster_name").write_text("octosim\n")
        (common / "sge_request").write_text(f"-v {SITE_REQUEST}\n")

    def _global_configuration(self) -> str:
        """Debian's default configuration, for jobs as root, with the execds' spool here and a quick scheduler."""
        changed = {
            "execd_spool_dir": str(self.spool / "execd"),
            "min_uid": "0",
            "min_gid": "0",
            "load_report_time": "00:00:05",
            "max_unheard": "00:01:00",
            "mailer": "/bin/true",
            # The accounting file is flushed each second: a test reads a job's record (qacct) once it has left the
            # queue, and waited up to flush_time for it.
            "reporting_params": "accounting=true reporting=false flush_time=00:00:01 joblog=false "
            "sharelog=00:00:00",
        }
        lines = []
        for line in DEFAULT_CONFIGURATION.read_text().splitlines():
            key = line.split()[0] if line.split() else ""
            lines.append(f"{key} {changed.pop(key)}" if key in changed else line)
        return "\n".join(lines + [f"{k} {v}" for k, v in changed.items()]) + "\n"

    def _spool(self) -> None:
        env = {**self.env(), "SGE_ROOT": str(self.root), "SGE_CELL": CELL}
        conf = self.root / "objects"
        conf.mkdir(exist_ok=True)
        (conf / "global").write_text(self._global_configuration())
        steps = [
            ["/usr/lib/gridengine/spoolinit", "classic", "libspoolc", self._params(), "init"],
            ["/usr/lib/gridengine/spooldefaults", "configuration", str(conf / "global")],
            ["/usr/lib/gridengine/spooldefaults", "complexes", str(CENTRY)],
            ["/usr/lib/gridengine/spooldefaults", "usersets", str(USERSETS)],
            ["/usr/lib/gridengine/spooldefaults", "managers", "root"],
            ["/usr/lib/gridengine/spooldefaults", "adminhosts", str(self._hosts("adminhosts"))],
            ["/usr/lib/gridengine/spooldefaults", "submithosts", str(self._hosts("submithosts"))],
        ]
        for argv in steps:
            proc = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=HANG_S,
            )
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{' '.join(argv)}: {proc.stderr.strip() or proc.stdout.strip()}"
                )

    def _params(self) -> str:
        return f"{self.cell / 'common'};{self.spool / 'qmaster'}"

    def _hosts(self, kind: str) -> Path:
        d = self.root / "objects" / kind
        d.mkdir(parents=True, exist_ok=True)
        for node in self.cluster.nodes:
            (d / node).write_text(f"hostname {node}\n")
        return d

    def _start(self, node: str, daemon: str) -> None:
        """The daemon daemonizes itself inside the node's namespaces; its first process is waited for."""
        log = self.root / f"{daemon}-{node}.start.log"
        with open(log, "w") as out:
            proc = self.cluster.popen(
                node,
                [f"/usr/sbin/{daemon}"],
                self.env(),
                str(self.root),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=restore_signals,
            )
            if proc.wait(timeout=HANG_S) != 0:
                raise RuntimeError(f"{daemon} on {node} did not start: {log.read_text().strip()}")

    def _wait(self, condition, what: str, timeout: float = HANG_S) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Grid Engine: timed out waiting until {what}: {self.diagnose()}"
                )
            time.sleep(1)

    def _all_hosts_report(self) -> bool:
        out = self.run(["qhost"], check=False).stdout
        hosts = {ln.split()[0]: ln.split() for ln in out.splitlines()[3:] if ln.split()}
        return all(n in hosts and hosts[n][3] != "-" for n in self.cluster.nodes)

    def _scheduler(self) -> str:
        """inst_sge's "normal" scheduler configuration, scheduling every 2 s instead of 15 s."""
        return "".join(
            "schedule_interval                 0:0:2\n"
            if line.startswith("schedule_interval")
            else "job_load_adjustments             NONE\n"
            if line.startswith("job_load_adjustments")
            else line + "\n"
            for line in SCHEDULER.read_text().splitlines()
        )

    def _pe(self) -> str:
        return (
            f"pe_name            {PE}\n"
            "slots              999\n"
            "user_lists         NONE\n"
            "xuser_lists        NONE\n"
            "start_proc_args    NONE\n"
            "stop_proc_args     NONE\n"
            f"allocation_rule    {self.slots}\n"
            "control_slaves     TRUE\n"
            "job_is_first_task  FALSE\n"
            "urgency_slots      min\n"
            "accounting_summary FALSE\n"
            "qsort_args         NONE\n"
        )

    def _queue(self) -> str:
        template = self.run(
            ["qconf", "-sq"]
        ).stdout  # the built-in template ("qconf -sq" without a name)
        changed = {
            "qname": "all.q",
            "hostlist": " ".join(self.cluster.nodes),
            "slots": str(self.slots),
            "pe_list": PE,
            "shell": "/bin/bash",
            "shell_start_mode": "unix_behavior",
            "notify": "00:00:30",
            # Each node's own base for its jobs' TMPDIR ("[node002=/var/spool/octosim-spool/sge-tmp/node002]"), as
            # on nodes with a disk each: in the machine's /tmp, which the nodes share, node002's execd removed the
            # job's "/tmp/1.1.all.q" once the job's last task there ended (the preflight's ranks), and with it the
            # session directory of the training's mpirun on node001; a cluster of another instance numbers its jobs
            # from 1 too.
            "tmpdir": ",".join(
                [str(self.tmp), *(f"[{n}={self.tmp / n}]" for n in self.cluster.nodes)]
            ),
            # The machine is shared and busy: a load threshold would put the queue in alarm state (no jobs).
            "load_thresholds": "NONE",
        }
        lines = []
        for line in template.splitlines():
            key = line.split()[0] if line.split() else ""
            lines.append(f"{key} {changed.pop(key)}" if key in changed else line)
        return "\n".join(lines) + "\n"

    # ---- looking at jobs --------------------------------------------------------------------------------------

    def job_state(self, job_id: str) -> Optional[str]:
        """The job's state letters from qstat ("r", "qw", "dr"), or None once it has left the queue."""
        for line in self.run(["qstat", "-u", "*"]).stdout.splitlines()[2:]:
            fields = line.split()
            if fields and fields[0] == job_id:
                return fields[4]
        return None

    def accounting(self, job_id: str) -> dict:
        """``qacct -j ID`` as a dict (failed, exit_status, ...); {} until the job is accounted. A job that has left
        the queue may not be in the accounting file yet: qacct then says "error: no jobs running since startup"
        (CI read that as the record {'no': 'jobs running since startup'}), or names no exit_status."""
        proc = self.run(["qacct", "-j", job_id], check=False)
        out = {}
        for line in proc.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key and not key.startswith("="):
                out.setdefault(key, value.strip())
        return out if "exit_status" in out else {}

    def wait_ended(self, job_id: str, timeout: float) -> dict:
        """Waits until the job has left the queue and is accounted; its accounting record."""
        deadline = time.monotonic() + timeout
        while True:
            if self.job_state(job_id) is None:
                record = self.accounting(job_id)
                if record:
                    return record
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"job {job_id} still {self.job_state(job_id)} after {timeout:.0f} s"
                )
            time.sleep(2)

    def diagnose(self) -> str:
        """The daemons' messages, for a failure's report."""
        out = []
        for f in sorted(self.spool.rglob("messages")):
            out.append(f"--- {f.relative_to(self.root)} ---\n{f.read_text()[-3000:]}")
        return "\n".join(out)

    # ---- teardown ---------------------------------------------------------------------------------------------

    def down(self) -> None:
        """Asks the daemons to stop (the cluster's teardown kills whatever remains in its namespaces)."""
        if (self.cell / "common" / "act_qmaster").exists():
            try:
                self.run(["qconf", "-ke", "all"], check=False, timeout=30)
                self.run(["qconf", "-km"], check=False, timeout=30)
            except (subprocess.TimeoutExpired, OSError):
                pass
        for pidfile in self.spool.rglob("*.pid"):
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
            except (ValueError, ProcessLookupError, IndexError):
                pass
