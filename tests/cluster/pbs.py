"""A real PBS (OpenPBS 23.06.06, the open-source PBS Professional) on the namespace cluster of ``sim.py``.

    with sim.Cluster(state) as c, Pbs(c) as p:
        p.run(["qsub", "job.sh"], user=True, cwd=p.home / "submit")

OpenPBS is neither a Debian package nor on PyPI: ``openpbs-build.sh`` builds it from ``../shared/thirdparty/``
into a versioned prefix outside the clone (root, once per machine; ``OCTO_DIST_OPENPBS_PREFIX`` names another).

How it runs:

* Everything the daemons write lives under one run directory, ``RUN`` (``/var/spool/<prefix>-pbs``, one per
  cluster instance, removed before and after): a ``PBS_HOME`` per node (``RUN/node001``: server, scheduler, comm,
  the datastore and a mom; ``RUN/node002``: a mom), each with its own ``pbs.conf``, named by ``PBS_CONF_FILE`` in
  every command's environment and in the node's ``pbs_environment`` (what a mom gives every job). ``/etc/pbs.conf``,
  ``/etc/init.d`` and ``/etc/profile.d`` are never written (``pbs_postinstall``, which writes them, is not run: the
  ``PBS_HOME`` layout it makes is made here).
* The datastore is PostgreSQL (Debian's), created by OpenPBS's own ``pbs_db_utility install_db`` and run by the
  server as user ``postgres`` on a port of this instance (``15200 + instance``: its socket file is in Debian's
  shared ``/run/postgresql``). ``down()`` stops it cleanly (a SIGKILLed postmaster would leave its shared memory).
* Every daemon runs in the foreground (``-N``) inside a node's namespaces: ``pbs_comm``, ``pbs_server`` (and so
  the datastore) and ``pbs_sched`` on node001, ``pbs_mom`` on node001 and node002. Whatever outlives ``down()`` is
  in a node's network namespace, where ``sim``'s clean-up (``down()``, and the next ``up()``) kills it.
* ABCI's specifics are configured, not assumed: execution queues ``rt_HF`` and ``rt_HG`` (enabled, started;
  ``rt_HF`` the default), ``-P group`` (a job's project: OpenPBS accepts any), job history for ``qstat -x``.
  Each node declares ``NCPUS_PER_NODE`` CPUs (both share this machine's cores), as the Slurm cluster does.
* Jobs run as a user that is not root, ``USER`` (one per instance, created once with ``useradd``; its home is
  ``RUN/home``, made afresh by every set-up). ``run(..., user=True)`` runs a command as that user on a node.
* Remote ranks: Debian's Open MPI 4.1 has no ``tm`` launcher, so the site's environment (``pbs_environment``) sets
  its rsh agent to ``RUN/bin/tmrsh-agent``, which hands the command line Open MPI gives an agent (a shell command,
  as to ssh) to ``pbs_tmrsh HOST /bin/sh -c LINE``: PBS's task manager starts it on the other node's mom, inside
  the job (as Open MPI's own tm launcher would), not through ssh. The site's environment also carries
  ``OCTO_DIST_NO_MPI4PY=1`` (the venv's mpi4py is built for its Open MPI 5, not Debian's 4.1) and a
  ``sitecustomize`` that writes each MPI rank's environment, CPU affinity and command to ``RUN/rank-env`` (one file
  per process: never parsed from interleaved output).
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

from helpers import REPO, restore_signals

from . import sim

VERSION = "23.06.06"
HERE = Path(__file__).resolve().parent
BUILD = HERE / "openpbs-build.sh"
PREFIX_ENV = "OCTO_DIST_OPENPBS_PREFIX"
MARKER = ".octo-dist-build-complete"  # written by openpbs-build.sh once the install is complete
RUN = Path("/var/spool") / f"{sim.PREFIX}-pbs"
USER = f"{sim.PREFIX}-pbs"  # octosim-pbs, octsim3-pbs: each instance's jobs have their own home
QUEUES = ("rt_HF", "rt_HG")
NCPUS_PER_NODE = 8
DB_USER = "postgres"  # Debian's postgresql package's user; OpenPBS's default data service user
DB_PORT = 15200 + sim.INSTANCE
MPIRUN = Path("/usr/bin/mpirun")  # Debian's Open MPI 4.1 (the hpcx family); .ci/run selects it
START_TIMEOUT_S = 180  # datastore, server, scheduler and two moms up, on a loaded 2-core machine
STOP_TIMEOUT_S = 60
# job_state once a job has left the queue (qstat -x): F finished (any way), M moved.
ENDED = frozenset({"F", "M"})

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


def prefix() -> Path:
    """Where openpbs-build.sh installs (or installed) OpenPBS."""
    if os.environ.get(PREFIX_ENV):
        return Path(os.environ[PREFIX_ENV])
    out = subprocess.run(
        ["bash", str(BUILD), "--prefix"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def pg_bin() -> Optional[Path]:
    """Debian's PostgreSQL server programs (initdb, pg_ctl), the newest version installed."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parent.parent.name
    )
    return found[-1].parent if found else None


def unavailable() -> Optional[str]:
    """Why a real PBS cannot run here, or None."""
    reason = sim.unavailable()
    if reason:
        return reason
    exe = prefix()
    if not (exe / MARKER).exists():
        return (
            f"OpenPBS {VERSION} is not built at {exe}; expected a complete build there. "
            f"Fix: sudo {BUILD.relative_to(HERE.parents[1])} (once per machine; a few minutes)"
        )
    if not os.stat(exe / "sbin" / "pbs_iff").st_mode & 0o4000:
        return f"{exe}/sbin/pbs_iff is not setuid root: rebuild with {BUILD.name}"
    if pg_bin() is None or shutil.which("psql") is None or shutil.which("pg_config") is None:
        return "no PostgreSQL server (the PBS datastore): apt-get install postgresql libpq-dev"
    try:
        pwd.getpwnam(DB_USER)
    except KeyError:
        return f"no user '{DB_USER}' (Debian's postgresql package creates it)"
    if not MPIRUN.exists():
        return f"no {MPIRUN}: apt-get install openmpi-bin"
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        return "no useradd or setpriv (passwd, util-linux): the jobs' user cannot be made"
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


def remove_leftovers(run: Path = RUN) -> None:
    """What a crashed run left in ``run``, and the shared memory of its SIGKILLed postmaster (named in its
    ``postmaster.pid``; removed once nothing is attached). Its processes lived in the cluster's namespaces: ``sim``
    killed them."""
    for pidfile in run.glob("*/datastore/postmaster.pid"):
        try:
            shmid = pidfile.read_text().splitlines()[6].split()[1]
            attached = {
                ln.split()[1]: ln.split()[6]
                for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
                if len(ln.split()) > 6
            }
        except (OSError, IndexError):
            continue
        if attached.get(shmid) == "0":
            subprocess.run(["ipcrm", "-m", shmid], capture_output=True)
    shutil.rmtree(run, ignore_errors=True)


def ensure_user(name: str = USER, home: Path = RUN / "home") -> pwd.struct_passwd:
    """The jobs' user (not root), created once; its home is made afresh by every set-up."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", str(home),
         "--shell", "/bin/bash", "--comment", "octo-dist PBS tests", name],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return pwd.getpwnam(name)


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
        self.exec = prefix()
        self.server = cluster.nodes[0]
        self.daemons: dict[str, subprocess.Popen] = {}
        self.user = USER

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
            "PATH": f"{self.exec}/bin:{self.exec}/sbin:{sim.NODE_PATH}",
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
        timeout: float = 120,
    ) -> subprocess.CompletedProcess:
        """``argv`` on ``node`` (node001), as root or as the jobs' user (``user=True``), with a login's environment."""
        node = node or self.server
        if user:
            pw = pwd.getpwnam(self.user)
            argv = [
                "setpriv",
                f"--reuid={pw.pw_uid}",
                f"--regid={pw.pw_gid}",
                "--init-groups",
                "--",
                *argv,
            ]
            full_env = self.user_env(env)
        else:
            full_env = self.env(node, env)
        proc = subprocess.run(
            self.cluster.exec_argv(
                node, argv, full_env, str(cwd or (self.home if user else self.run_dir))
            ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=restore_signals,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} on {node}{' as ' + self.user if user else ''} failed ({proc.returncode}): "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    # ---- set-up -----------------------------------------------------------------------------------------------

    def up(self) -> "Pbs":
        remove_leftovers(self.run_dir)
        try:
            self._files()
            self._open_the_way()
            self._install_datastore()
            self._start("pbs_comm", self.server, ["pbs_comm", "-N"])
            self._start("pbs_server", self.server, ["pbs_server", "-N", "-t", "create"])
            self._wait(self._server_answers, "pbs_server answers qstat -B")
            self._configure()
            self._start("pbs_sched", self.server, ["pbs_sched", "-N"])
            for node in self.cluster.nodes:
                self._start(f"pbs_mom-{node}", node, ["pbs_mom", "-N"])
            self._wait(self._nodes_free, "every node free in pbsnodes")
        except BaseException:
            self.down()
            raise
        return self

    def _files(self) -> None:
        pw = ensure_user(self.user, self.home)
        self.run_dir.mkdir(parents=True)
        self.run_dir.chmod(0o755)
        for d, mode in (
            (self.home, 0o755),
            (self.rank_env_dir, 0o1777),
            (self.run_dir / "site-python", 0o755),
        ):
            d.mkdir()
            d.chmod(mode)
        shutil.chown(self.home, pw.pw_uid, pw.pw_gid)
        (self.run_dir / "site-python" / "sitecustomize.py").write_text(
            SITECUSTOMIZE.format(folder=str(self.rank_env_dir))
        )
        bindir = self.run_dir / "bin"
        bindir.mkdir()
        agent = bindir / "tmrsh-agent"
        agent.write_text(TMRSH_AGENT.format(tmrsh=self.exec / "bin" / "pbs_tmrsh"))
        agent.chmod(0o755)
        for node in self.cluster.nodes:
            self._pbs_home(node, server=node == self.server)

    def _open_the_way(self) -> None:
        """The jobs' user must run the venv's Python, which may live where only root may enter (a pyenv in
        ``/root``): in each node's own mount namespace (the machine's is untouched), every such directory gets an
        overlay whose top is enterable by all (mode 0711, on a tmpfs of that namespace), its content unchanged."""
        for i, blocked in enumerate(blockers(self.reach)):
            for node in self.cluster.nodes:
                top = self.run_dir / "overlay" / node / str(i)
                top.mkdir(parents=True)
                script = (
                    'mount -t tmpfs -o mode=0700 octo-dist-overlay "$1" && mkdir "$1/upper" "$1/work" '
                    '&& chmod 0711 "$1/upper" && '
                    'mount -t overlay octo-dist-overlay -o "lowerdir=$2,upperdir=$1/upper,workdir=$1/work" "$2"'
                )
                proc = subprocess.run(
                    [
                        "nsenter",
                        "-t",
                        str(self.cluster.pid(node)),
                        "-m",
                        "sh",
                        "-c",
                        script,
                        "sh",
                        str(top),
                        str(blocked),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if proc.returncode != 0:
                    raise RuntimeError(
                        f"{blocked} cannot be opened to the jobs' user on {node} (an overlay in its mount namespace): "
                        f"{proc.stderr.strip()}; expected the venv's Python reachable by a user that is not root"
                    )

    def _pbs_home(self, node: str, server: bool) -> None:
        """The layout pbs_postinstall makes, its pbs.conf, the mom's config and the site's job environment."""
        home = self.home_of(node)
        dirs = [
            ("", 0o755), ("aux", 0o755), ("checkpoint", 0o700), ("mom_logs", 0o755), ("mom_priv", 0o751),
            ("mom_priv/jobs", 0o751), ("mom_priv/hooks", 0o750), ("mom_priv/hooks/tmp", 0o750),
            ("spool", 0o1777), ("undelivered", 0o1777), ("tmp", 0o1777),
        ]  # fmt: skip
        if server:
            dirs += [
                ("server_logs", 0o755), ("server_priv", 0o750), ("server_priv/accounting", 0o755),
                ("server_priv/jobs", 0o750), ("server_priv/users", 0o750), ("server_priv/hooks", 0o750),
                ("server_priv/hooks/tmp", 0o750), ("sched_logs", 0o755), ("sched_priv", 0o750),
                ("comm_logs", 0o755),
            ]  # fmt: skip
        for rel, mode in dirs:
            d = home / rel
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(mode)
        etc = self.exec / "etc"
        if server:
            hooks = self.exec / "lib" / "python" / "altair" / "pbs_hooks"
            for f in hooks.glob("*") if hooks.is_dir() else ():
                shutil.copy2(f, home / "server_priv" / "hooks" / f.name)
            for f in (home / "server_priv" / "hooks").glob("PBS_xeon_phi_provision.*"):
                f.unlink()
            (home / "server_priv" / "db_user").write_text(DB_USER)
            (home / "server_priv" / "db_user").chmod(0o600)
            for src, dst in (
                ("pbs_dedicated", "dedicated_time"),
                ("pbs_holidays", "holidays"),
                ("pbs_resource_group", "resource_group"),
                ("pbs_sched_config", "sched_config"),
            ):
                shutil.copy(etc / src, home / "sched_priv" / dst)
        starts = {"SERVER": server, "SCHED": server, "COMM": server, "MOM": True}
        self.conf(node).write_text(
            f"# Written by tests/cluster/pbs.py for one test run; removed with {self.run_dir}.\n"
            f"PBS_EXEC={self.exec}\n"
            f"PBS_HOME={home}\n"
            f"PBS_SERVER={self.server}\n"
            f"PBS_MOM_NODE_NAME={node}\n"
            f"PBS_LEAF_ROUTERS={self.server}\n"
            f"PBS_DATA_SERVICE_PORT={DB_PORT}\n"
            f"PBS_TMPDIR={home / 'tmp'}\n"
            "PBS_CORE_LIMIT=unlimited\n"
            "PBS_SCP=/bin/false\n" + "".join(f"PBS_START_{k}={int(v)}\n" for k, v in starts.items())
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
        (home / "mom_priv" / "config").write_text(
            f"$clienthost {self.server}\n"
            # Output and staging stay on this machine's one file system: cp, never scp/rcp.
            "$usecp *:/ /\n"
            "$logevent 0x1ff\n"
        )

    def _install_datastore(self) -> None:
        """OpenPBS's own datastore set-up (initdb as postgres, schema, password), as pbs_habitat runs it."""
        argv = [
            "bash",
            "-c",
            f'. "{self.exec}/libexec/pbs_db_env" && exec "{self.exec}/libexec/pbs_db_utility" install_db',
        ]
        env = {
            "PATH": f"{self.exec}/bin:{self.exec}/sbin:{sim.NODE_PATH}",
            "PBS_DATA_SERVICE_USER": DB_USER,
            "PBS_DATA_SERVICE_PORT": str(DB_PORT),
        }
        self._wait_for_a_dead_postmaster()
        proc = self.run(argv, env=env, check=False, timeout=300)
        if proc.returncode != 0:
            # Seen 3 times in about 15 recoveries from a crashed run, beside another PBS cluster's tests and a CPU
            # hog: "Error starting PBS Data Service" (its log was not kept then). The script removed its half-made
            # datastore; a postmaster it may have left is asked to stop; then once more.
            first = f"{proc.stdout.strip()} {proc.stderr.strip()}"
            self._stop_postmaster()
            time.sleep(5)
            proc = self.run(argv, env=env, check=False, timeout=300)
        if proc.returncode != 0:
            log = self.home_of(self.server) / "spool" / "db_start.log"
            said = log.read_text(errors="replace")[-2000:] if log.exists() else f"(no {log})"
            raise RuntimeError(
                f"pbs_db_utility install_db failed twice ({proc.returncode}): {first} / {proc.stdout.strip()} "
                f"{proc.stderr.strip()}\n--- {log.name} ---\n{said}"
            )

    def _wait_for_a_dead_postmaster(self, timeout: float = 30) -> None:
        """A crashed run's postmaster, SIGKILLed by the cluster's set-up, still named in its socket's lock file
        (``/run/postgresql/.s.PGSQL.<port>.lock``) until it is reaped: PostgreSQL refuses to start while that pid
        exists. Waits until it is gone (or is another program's again)."""
        lock = Path("/run/postgresql") / f".s.PGSQL.{DB_PORT}.lock"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pid = int(lock.read_text().split()[0])
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                zombie = "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
            except (OSError, ValueError, IndexError):
                return
            if b"postgres" not in cmd and not zombie:
                return
            time.sleep(0.5)

    def _stop_postmaster(self, timeout: float = 20) -> None:
        """SIGINT (PostgreSQL's fast shutdown) to a postmaster of this cluster's datastore, and a wait for it."""
        datastore = str(self.home_of(self.server) / "datastore").encode()
        pids = []
        for pid in self.cluster.processes_on(self.server):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"postgres" in cmd and datastore in cmd:
                pids.append(pid)
                try:
                    os.kill(pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
            time.sleep(0.5)

    def _start(self, name: str, node: str, argv: Sequence[str]) -> None:
        log_dir = self.run_dir / "console"
        log_dir.mkdir(exist_ok=True)
        with open(log_dir / f"{name}.log", "w") as log:
            self.daemons[name] = subprocess.Popen(
                self.cluster.exec_argv(node, argv, self.env(node), str(self.home_of(node))),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=restore_signals,
            )

    def _wait(self, ready, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [n for n, p in self.daemons.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"{', '.join(dead)} exited while waiting until {what}\n{self.logs()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"PBS: timed out waiting until {what}\n{self.logs()}")
            time.sleep(1)

    def _server_answers(self) -> bool:
        return self.run(["qstat", "-B"], check=False, timeout=60).returncode == 0

    def qmgr(self, *commands: str) -> None:
        for command in commands:
            self.run(["qmgr", "-c", command])

    def _configure(self) -> None:
        """ABCI's queues and what the tests read (job history), the nodes with their declared CPUs."""
        commands = []
        for q in QUEUES:
            commands += [
                f"create queue {q} queue_type=execution",
                f"set queue {q} enabled=true",
                f"set queue {q} started=true",
            ]
        commands += [
            f"set server default_queue={QUEUES[0]}",
            "set server job_history_enable=true",
            "set server scheduling=true",
            "set server scheduler_iteration=5",
        ]
        for node in self.cluster.nodes:
            commands += [
                f"create node {node}",
                f"set node {node} resources_available.ncpus={NCPUS_PER_NODE}",
            ]
        self.qmgr(*commands)

    def nodes(self) -> dict:
        """``pbsnodes -av -F json``'s nodes: {"node001": {"state": "free", ...}}."""
        proc = self.run(["pbsnodes", "-av", "-F", "json"], check=False, timeout=60)
        try:
            return json.loads(proc.stdout).get("nodes", {})
        except ValueError:
            return {}

    def _nodes_free(self) -> bool:
        found = self.nodes()
        return all(found.get(n, {}).get("state") == "free" for n in self.cluster.nodes)

    # ---- looking at jobs --------------------------------------------------------------------------------------

    def job(self, job_id: str) -> dict:
        """``qstat -x -f -F json ID``'s record of the job ({} when PBS does not know it)."""
        proc = self.run(["qstat", "-x", "-f", "-F", "json", job_id], check=False, timeout=60)
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

    def logs(self, n: int = 3000) -> str:
        """The tail of every daemon's log of today and their console output (for a failing test's message)."""
        out = []
        for node in self.cluster.nodes:
            for d in ("server_logs", "sched_logs", "mom_logs", "comm_logs"):
                for f in sorted((self.home_of(node) / d).glob("*")):
                    out.append(f"--- {node} {d}/{f.name} ---\n{f.read_text(errors='replace')[-n:]}")
        for f in sorted((self.run_dir / "console").glob("*.log")):
            text = f.read_text(errors="replace").strip()
            if text:
                out.append(f"--- console {f.name} ---\n{text[-n:]}")
        return "\n".join(out)

    # ---- teardown ---------------------------------------------------------------------------------------------

    def down(self) -> None:
        """The server stopped with its datastore (qterm), the other daemons SIGTERMed, what stays SIGKILLed with
        everything else in the nodes' namespaces; the run directory removed. Idempotent."""
        server = self.daemons.get("pbs_server")
        if server is not None and server.poll() is None:
            try:
                self.run(["qterm", "-t", "quick"], check=False, timeout=30)
                server.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        if self.conf(self.server).exists() and (self.home_of(self.server) / "datastore").is_dir():
            try:  # the postmaster, if the server left it running
                self.run([f"{self.exec}/sbin/pbs_dataservice", "stop"], check=False, timeout=60)
            except subprocess.TimeoutExpired:
                pass
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
        for node in self.cluster.nodes:
            if node in self.cluster.holders:
                for pid in self.cluster.processes_on(node):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        remove_leftovers(self.run_dir)

    def __enter__(self) -> "Pbs":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
