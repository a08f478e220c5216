"""An imitation of PBS Professional on the namespace cluster of ``sim.py``, behaving as a real PBS was measured to.

    with sim.Cluster(state) as c, Pbs(c) as p:
        p.run(["qsub", "job.sh"], user=True, cwd=p.home / "submit")

What it imitates (measured against OpenPBS 23.06.06, the open-source PBS Professional, on this cluster, and PBS
Professional's documented behaviour):

* **A job is its sessions.** The job script runs as the submitting user (never root: qsub refuses root's jobs) in
  a new session on the job's first host, under a job shell (``bash -c 'bash SCRIPT; exit $?'``), in ``$HOME``.
  ``pbs_tmrsh HOST CMD...`` starts a task of the job on HOST: a new session there, which the job owns too. ``qdel``
  and the wall time send SIGTERM to every process of those sessions on every node, wait the queue's ``kill_delay``
  (10 s unless ``qmgr -c "set queue Q kill_delay=N"``), then SIGKILL every process still in them; the job ends as
  soon as none is left. A job whose job shell exits ends, and what is left in its sessions is SIGKILLed.
  ``Exit_status``: the job shell's, 256 + N when it died of signal N (a qdel'd job: 271, whatever its script did).
* **A process that left the job's sessions** (setsid, ``start_new_session``) is invisible to PBS: never signalled,
  never waited for, it outlives the job. The imitation finds it (it still carries the job's ``PBS_JOBID`` in
  ``/proc/PID/environ``) and names it in the job's record: ``octo_outside_sessions`` (seen while the job ran) and
  ``octo_survivors`` (alive when the job ended). ``Pbs.escapes(record)`` lists both; tests assert it is empty.
* **qsub**: ``#PBS`` directives up to the script's first command, command-line options over them; ``-v`` lists
  (``NAME=value``, or ``NAME`` whose value qsub reads from its environment) and ``-V``; a command line's ``-v``
  *replaces* the script's ``#PBS -v`` (as measured); nothing else of the submitting shell reaches the job but
  ``PBS_O_*``. ``-l select=N:ncpus=C:mpiprocs=R``: ``place=scatter`` (or ``excl``) puts each chunk on its own
  host; otherwise chunks fill a host first (measured: ``select=2:mpiprocs=1`` ran as ``node001/0+node001/1``).
  ``-W depend=afterany:ID`` holds a job (``H``) until ID has ended. ``-j oe``, ``-k oe`` (the output file kept in
  the user's home on the first host while the job runs: ``NAME.oSEQ``), ``-o``/``-e`` (else the output is copied
  to ``PBS_O_WORKDIR`` at the end). ``-q`` (ABCI's ``rt_HF``, the default, and ``rt_HG``), ``-P`` (any project),
  ``-N``. Job ids are ``SEQ.node001``, from 0.
* **The job's environment**, as a mom gives it: the node's ``pbs_environment`` (here: ``PATH=/bin:/usr/bin``,
  ``PBS_CONF_FILE``, the site's Open MPI rsh agent, ``OCTO_DIST_NO_MPI4PY=1`` and a ``sitecustomize`` that writes
  each MPI rank's environment to its own file under ``RUN/rank-env``), the job's ``Variable_List``, the owner's
  ``HOME``/``USER``/``LOGNAME``/``SHELL``, ``PBS_JOBID``, ``PBS_JOBNAME``, ``PBS_QUEUE``, ``PBS_NODEFILE`` (one line
  per ``mpiprocs`` of each chunk), ``PBS_O_*`` (``PBS_O_WORKDIR``: where qsub ran), ``PBS_ENVIRONMENT=PBS_BATCH``,
  ``TMPDIR``, and ``NCPUS``/``OMP_NUM_THREADS`` set to the ncpus of the job's chunks on that host (1 when the
  select asks none, as measured).
* **qstat** ``-f``/``-x``/``-F json`` (``Exit_status``, ``exec_host``, ``exec_vnode``, ``Resource_List``,
  ``Variable_List``, ``depend``, ``project``...; a finished job only with ``-x``), ``qstat -Qf -F json QUEUE``
  (``kill_delay`` listed only where the queue sets it); ``qdel [-W force]``; ``qmgr -c "set queue Q ATTR=V"``.
* **Remote ranks through PBS's task manager**: Debian's Open MPI 4.1 has no ``tm`` launcher, so the site's
  environment makes its rsh agent ``RUN/bin/tmrsh-agent``, which runs the shell line Open MPI hands an agent as
  ``pbs_tmrsh HOST /bin/sh -c LINE``: node002's Open MPI daemon is a task of the job there, not an ssh.

What it does not imitate: a scheduler's policy beyond first fit (priorities, fairshare, reservations), resource
limits other than the wall time (no cgroups, no memory or CPU enforcement: ranks may run on every CPU), prologue
and epilogue, hooks, job arrays, ``qsig``, ``qhold``/``qrls``, rerun, stage-in/out, interactive jobs, a login
shell reading ``/etc/profile``, the exact text of PBS's error messages, and the exit status PBS Professional
records for a wall-time kill (here, as for a qdel, 256 + SIGTERM).

How it runs: one root daemon, ``pbs_server.py``, in node001's namespaces, does the server's, the scheduler's and
every node's mom's work (the nodes share this kernel's one pid namespace, so it sees and signals every session,
and starts a node's processes with ``nsenter``). The commands (``pbs_commands.py``, installed as ``$PBS_EXEC/bin/
{qsub,qstat,qdel,qmgr,pbs_tmrsh}``; ``PBS_EXEC`` and the daemon's socket are named in each node's ``pbs.conf``,
``PBS_CONF_FILE``) talk to it over a unix socket. Everything lives in one run directory, ``RUN``
(``/var/spool/<prefix>-pbs``, removed before and after): ``pbs.conf``, ``pbs_environment``, ``aux`` (node files),
``mom_priv/jobs`` (the scripts) and ``spool`` per node, the jobs' user's home, ``TMPDIR``s. Nothing is written to
``/etc``. The jobs' user (``USER``, uid ``UID``, one per cluster instance) exists only in
the nodes: each node's own mount namespace gets ``/etc/passwd`` and ``/etc/group`` bound from copies in ``RUN/etc``
that name it. The venv's Python may live where only root may enter (a pyenv in ``/root``): each node's mount
namespace gets an overlay there whose top others may enter (the machine's own directories are untouched).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from helpers import HANG_S, REPO, restore_signals

from . import pbs_server, sim

HERE = Path(__file__).resolve().parent
RUN = Path("/var/spool") / f"{sim.PREFIX}-pbs"
USER = f"{sim.PREFIX}-pbs"  # octosim-pbs, octsim3-pbs: each instance's jobs have their own user and home
# The jobs' user's uid and gid (47100 for instance 0, 47103 for instance 3): known only inside the nodes, whose mount
# namespaces get a passwd and group file naming it (the machine's /etc is never written).
UID = GID = 47100 + sim.INSTANCE
QUEUES = ("rt_HF", "rt_HG")
NCPUS_PER_NODE = 8
SYSTEM_PYTHON = Path("/usr/bin/python3")  # the commands' interpreter: any user can run it
MPIRUN = Path("/usr/bin/mpirun")  # Debian's Open MPI 4.1 (the hpcx family); .ci/run selects it
COMMANDS = ("qsub", "qstat", "qdel", "qmgr", "pbs_tmrsh")
START_TIMEOUT_S = HANG_S  # the server up: seconds; HANG_S only ends a hang
# job_state once a job has left the queue (qstat -x): F finished (any way).
ENDED = frozenset({"F"})

# Records one file per MPI rank process (Open MPI sets OMPI_COMM_WORLD_RANK in each); anything else is untouched.
SITECUSTOMIZE = """\
import os
if "OMPI_COMM_WORLD_RANK" in os.environ:
    try:
        import socket
        name = "%s-%s-%d.env" % (socket.gethostname(), os.environ["OMPI_COMM_WORLD_RANK"], os.getpid())
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read().replace(b"\\0", b" ").decode(errors="replace").strip()
        items = dict(os.environ, _affinity=str(len(os.sched_getaffinity(0))), _argv=argv)
        path = os.path.join({folder!r}, name)
        with open(path + ".tmp", "w") as f:
            f.write("\\0".join("%s=%s" % kv for kv in items.items()))
        os.rename(path + ".tmp", path)
    except OSError:
        pass
"""

TMRSH_AGENT = """\
#!/bin/sh
# Open MPI's rsh launcher gives its agent a host and one shell command line (as ssh runs it through a shell);
# pbs_tmrsh has the mom exec its arguments as they are: a shell runs the line, started by PBS on the node.
host=$1
shift
exec {tmrsh} "$host" /bin/sh -c "$*"
"""


def unavailable() -> Optional[str]:
    """Why the PBS imitation cannot run here, or None."""
    reason = sim.unavailable()
    if reason:
        return reason
    if not SYSTEM_PYTHON.exists():
        return f"no {SYSTEM_PYTHON} (the PBS commands' interpreter): apt-get install python3"
    if not MPIRUN.exists():
        return f"no {MPIRUN}: apt-get install openmpi-bin"
    if shutil.which("setpriv") is None:
        return "no setpriv (util-linux): the jobs cannot run as a user that is not root"
    try:
        taken = pwd.getpwuid(UID).pw_name
    except KeyError:
        taken = ""
    if taken and taken != USER:
        return f"uid {UID} is {taken}'s on this machine; expected it free for the PBS jobs' user ({USER})"
    return None


def blockers(paths: Sequence[Path]) -> list[Path]:
    """The first directory on the way to each of ``paths`` that others may not enter (no o+x): ``/root`` for a
    venv made from a pyenv Python in root's home."""
    out: list[Path] = []
    for path in paths:
        real = Path(os.path.realpath(path))
        for d in [*reversed(real.parents), real]:
            if not os.stat(d).st_mode & 0o001:
                if d not in out:
                    out.append(d)
                break
    return out


def escapes(record: Mapping) -> list[str]:
    """The processes of a job that PBS could not see (the imitation's own fields of ``qstat -x -f``): 'seen
    outside the job's sessions: node001: 4242 (session 4242) mpirun ...', 'alive after the job ended: ...'."""
    return [
        f"seen outside the job's sessions: {p}" for p in record.get("octo_outside_sessions", [])
    ] + [f"alive after the job ended: {p}" for p in record.get("octo_survivors", [])]


class Pbs:
    """``Pbs(cluster).up()`` on a cluster that is up; ``run(argv)``; ``job(id)``; ``wait_ended(id)``; ``down()``."""

    def __init__(
        self,
        cluster: sim.Cluster,
        run: Path = RUN,
        reach: Sequence[Path] = (Path(sys.base_prefix), Path(sys.prefix), REPO),
    ):
        self.cluster = cluster
        self.reach = reach
        self.run_dir = Path(run)
        self.exec = self.run_dir / "exec"
        self.server = cluster.nodes[0]
        self.daemon: Optional[subprocess.Popen] = None
        self.user, self.uid, self.gid = USER, UID, GID

    # ---- paths and environments -----------------------------------------------------------------------------

    def home_of(self, node: str) -> Path:
        """``PBS_HOME`` of ``node``."""
        return self.run_dir / node

    def conf(self, node: str) -> Path:
        return self.home_of(node) / "pbs.conf"

    @property
    def home(self) -> Path:
        """The jobs' user's home: jobs start there, and their live output (``-k oe``) is kept there."""
        return self.run_dir / "home"

    @property
    def rank_env_dir(self) -> Path:
        return self.run_dir / "rank-env"

    def env(self, node: Optional[str] = None, extra: Mapping[str, str] = ()) -> dict:
        """What root's login shell on ``node`` has for PBS's commands."""
        env = {
            "PATH": f"{self.exec}/bin:{sim.NODE_PATH}",
            "PBS_CONF_FILE": str(self.conf(node or self.server)),
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "LANG": "C.UTF-8",
        }
        env.update(extra)
        return env

    def user_env(self, extra: Mapping[str, str] = ()) -> dict:
        """The jobs' user's login shell on node001 (the login node): PBS's commands on PATH."""
        env = {
            "PATH": f"{self.exec}/bin:{sim.NODE_PATH}",
            "PBS_CONF_FILE": str(self.conf(self.server)),
            "HOME": str(self.home),
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
        }
        env.update(extra)
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        node: Optional[str] = None,
        user: bool = False,
        cwd: Optional[Path] = None,
        env: Mapping[str, str] = (),
        check: bool = True,
        timeout: float = HANG_S,  # qsub, qstat, qdel answer in seconds: HANG_S only ends a hang
    ) -> subprocess.CompletedProcess:
        """``argv`` on ``node`` (node001), as root or as the jobs' user (``user=True``), with a login's environment."""
        node = node or self.server
        if user:
            argv = [
                "setpriv",
                f"--reuid={self.uid}",
                f"--regid={self.gid}",
                "--init-groups",
                "--",
                *argv,
            ]
            full_env = self.user_env(env)
        else:
            full_env = self.env(node, env)
        where = str(cwd or (self.home if user else self.run_dir))
        who = f" as {self.user}" if user else ""
        return self.cluster.run(node, argv, full_env, where, check=check, timeout=timeout, who=who)

    # ---- set-up -----------------------------------------------------------------------------------------------

    def up(self) -> "Pbs":
        shutil.rmtree(self.run_dir, ignore_errors=True)
        try:
            self._files()
            self._node_mounts()
            self._start_server()
        except BaseException:
            self.down()
            raise
        return self

    def _files(self) -> None:
        self.run_dir.mkdir(parents=True)
        self.run_dir.chmod(0o755)
        for d, mode in (
            (self.home, 0o755),
            (self.rank_env_dir, 0o1777),
            (self.run_dir / "site-python", 0o755),
            (self.run_dir / "tmp", 0o1777),
            (self.run_dir / "bin", 0o755),
            (self.exec / "bin", 0o755),
            (self.exec / "lib", 0o755),
        ):
            d.mkdir(parents=True)
            d.chmod(mode)
        self.exec.chmod(0o755)
        os.chown(self.home, self.uid, self.gid)
        (self.run_dir / "etc").mkdir(mode=0o755)
        for name, line in (
            (
                "passwd",
                f"{self.user}:x:{self.uid}:{self.gid}:octo-dist PBS tests:{self.home}:/bin/bash\n",
            ),
            ("group", f"{self.user}:x:{self.gid}:\n"),
        ):
            (self.run_dir / "etc" / name).write_text(Path("/etc", name).read_text() + line)
            (self.run_dir / "etc" / name).chmod(0o644)
        (self.run_dir / "site-python" / "sitecustomize.py").write_text(
            SITECUSTOMIZE.format(folder=str(self.rank_env_dir))
        )
        shutil.copy(HERE / "pbs_commands.py", self.exec / "lib" / "pbs_commands.py")
        for name in COMMANDS:
            path = self.exec / "bin" / name
            path.write_text(
                f'#!/bin/sh\nexec {SYSTEM_PYTHON} -I {self.exec}/lib/pbs_commands.py {name} "$@"\n'
            )
            path.chmod(0o755)
        agent = self.run_dir / "bin" / "tmrsh-agent"
        agent.write_text(TMRSH_AGENT.format(tmrsh=self.exec / "bin" / "pbs_tmrsh"))
        agent.chmod(0o755)
        for node in self.cluster.nodes:
            self._pbs_home(node)

    def _pbs_home(self, node: str) -> None:
        """A node's pbs.conf, the site's job environment (what its mom gives every job), aux, spool, the scripts."""
        home = self.home_of(node)
        for rel, mode in (("", 0o755), ("aux", 0o755), ("spool", 0o1777), ("mom_priv/jobs", 0o751)):
            (home / rel).mkdir(parents=True, exist_ok=True)
            (home / rel).chmod(mode)
        self.conf(node).write_text(
            f"# Written by tests/cluster/pbs.py for one test run; removed with {self.run_dir}.\n"
            f"PBS_EXEC={self.exec}\n"
            f"PBS_HOME={home}\n"
            f"PBS_SERVER={self.server}\n"
            f"PBS_MOM_NODE_NAME={node}\n"
            f"PBS_IMITATION_SOCKET={self.run_dir / 'server.sock'}\n"
        )
        (home / "pbs_environment").write_text(
            "TZ=UTC\n"
            "PATH=/bin:/usr/bin\n"
            f"PBS_CONF_FILE={self.conf(node)}\n"
            # The site's MPI settings (what a site's profile or module gives every job; see the module docstring).
            f"OMPI_MCA_plm_rsh_agent={self.run_dir / 'bin' / 'tmrsh-agent'}\n"
            "OCTO_DIST_NO_MPI4PY=1\n"
            f"PYTHONPATH={self.run_dir / 'site-python'}\n"
        )

    def _node_mounts(self) -> None:
        """In each node's own mount namespace (the machine's is untouched): the jobs' user in its /etc/passwd and
        /etc/group (bind mounts of RUN/etc's copies), and, where the venv's Python lives where only root may enter
        (a pyenv in ``/root``), an overlay on each such directory whose top all may enter (mode 0711, on a tmpfs of
        that namespace), its content unchanged."""
        for node in self.cluster.nodes:
            for name in ("passwd", "group"):
                self._in_mounts(
                    node, 'mount --bind "$1" "$2"', self.run_dir / "etc" / name, Path("/etc", name)
                )
        for i, blocked in enumerate(blockers(self.reach)):
            for node in self.cluster.nodes:
                top = self.run_dir / "overlay" / node / str(i)
                top.mkdir(parents=True)
                script = (
                    'mount -t tmpfs -o mode=0700 octo-dist-overlay "$1" && mkdir "$1/upper" "$1/work" '
                    '&& chmod 0711 "$1/upper" && '
                    'mount -t overlay octo-dist-overlay -o "lowerdir=$2,upperdir=$1/upper,workdir=$1/work" "$2"'
                )
                self._in_mounts(node, script, top, blocked)

    def _in_mounts(self, node: str, script: str, first: Path, second: Path) -> None:
        """``sh -c script sh first second`` in ``node``'s mount namespace."""
        argv = ["nsenter", "-t", str(self.cluster.pid(node)), "-m", "sh", "-c", script, "sh"]
        proc = subprocess.run(
            [*argv, str(first), str(second)], capture_output=True, text=True, timeout=HANG_S
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{second} on {node}: {script} failed in its mount namespace: {proc.stderr.strip()}; expected the "
                "jobs' user known there and the venv's Python reachable by it"
            )

    def _start_server(self) -> None:
        config = {
            "run": str(self.run_dir),
            "nodes": {n: self.cluster.pid(n) for n in self.cluster.nodes},
            "ncpus": NCPUS_PER_NODE,
            "queues": list(QUEUES),
            "default_queue": QUEUES[0],
            "tmpdir": str(self.run_dir / "tmp"),
            "pbs_environment": {
                n: str(self.home_of(n) / "pbs_environment") for n in self.cluster.nodes
            },
        }
        (self.run_dir / "config.json").write_text(json.dumps(config))
        log = open(self.run_dir / "server.log", "w")
        with log:
            self.daemon = subprocess.Popen(
                self.cluster.exec_argv(
                    self.server,
                    [
                        sys.executable,
                        "-I",
                        str(HERE / "pbs_server.py"),
                        str(self.run_dir / "config.json"),
                    ],
                    {"PATH": sim.NODE_PATH, "LANG": "C.UTF-8"},
                    str(self.run_dir),
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=restore_signals,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.run_dir / "server.ready").exists():
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the PBS imitation's server did not start\n{self.logs()}")
            time.sleep(0.1)

    def qmgr(self, *commands: str) -> None:
        for command in commands:
            self.run(["qmgr", "-c", command])

    # ---- looking at jobs --------------------------------------------------------------------------------------

    def job(self, job_id: str) -> dict:
        """``qstat -x -f -F json ID``'s record of the job ({} when PBS does not know it)."""
        proc = self.run(["qstat", "-x", "-f", "-F", "json", job_id], check=False)
        try:
            jobs = json.loads(proc.stdout).get("Jobs", {})
        except ValueError:
            return {}
        return next(iter(jobs.values()), {})

    def wait_ended(self, job_id: str, timeout: float) -> dict:
        """The job's record once it has ended (``job_state`` F), or the last one seen after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record.get("job_state") in ENDED or time.monotonic() > deadline:
                return record
            time.sleep(1)

    def rank_envs(self) -> list[dict]:
        """Every MPI rank process's environment as the site's sitecustomize recorded it, oldest first; ``_host``,
        ``_rank``, ``_affinity`` (CPUs it may run on) and ``_argv`` added."""
        out = []
        files = sorted(self.rank_env_dir.glob("*.env"), key=lambda f: f.stat().st_mtime)
        for f in files:
            env = dict(kv.split("=", 1) for kv in f.read_text().split("\0") if "=" in kv)
            host, rank, _pid = f.name[: -len(".env")].rsplit("-", 2)
            env.update(_host=host, _rank=rank)
            out.append(env)
        return out

    def carrying(self, job_id: str) -> list[str]:
        """Every live process that carries the job's PBS_JOBID, in its sessions or not: 'node002: 4242 ...'."""
        holders = {n: self.cluster.pid(n) for n in self.cluster.nodes}
        return [
            pbs_server.describe(pid, holders)
            for pid, _sid in pbs_server.outside_sessions(job_id, set(), holders)
        ]

    def logs(self, n: int = 3000) -> str:
        """The tail of the server's log (for a failing test's message)."""
        log = self.run_dir / "server.log"
        text = log.read_text(errors="replace").strip() if log.exists() else ""
        return f"--- pbs_server.log ---\n{text[-n:]}" if text else "(the PBS server logged nothing)"

    # ---- teardown ---------------------------------------------------------------------------------------------

    def down(self) -> None:
        """The daemon and whatever is left in the nodes' namespaces SIGKILLed; the run directory removed.
        Idempotent."""
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()
        self.daemon = None
        for node in self.cluster.nodes:
            if node in self.cluster.holders:
                for pid in self.cluster.processes_on(node):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> "Pbs":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
