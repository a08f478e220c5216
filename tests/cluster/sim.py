"""A cluster on one machine: nodes as Linux namespaces, ssh as an agent that enters them, scheduler-shaped jobs.

Each node (``node001``, ``node002`` ...) is a network namespace ``octosim-<node>`` with a UTS namespace (its own
hostname) and a mount namespace (``ip netns exec`` binds ``/etc/netns/octosim-<node>/hosts`` over ``/etc/hosts``,
so the nodes resolve each other), held open by one ``sleep`` process per node. Their only link is a veth pair to a
bridge in a switch namespace ``octosim-sw``: addresses ``10.231.0.<i>/24`` exist only inside these namespaces,
with no default route and no NAT, so no traffic leaves them. ``cut_link(node)`` sets a node's port down.

``ssh`` is ``bin/rsh-agent`` (``PRTE_MCA_plm_ssh_agent``): it enters the node's namespaces and runs the command
through ``bash -c`` with a clean environment, as sshd would, so ranks on other nodes see only what ``mpirun``
forwards. Slurm is the real one (``slurm.py`` starts its daemons on these nodes); ``singularity`` is
``container.py``; ``module load`` is a bash function exported in the job's environment (``BASH_FUNC_module%%``, as
Lmod does) that puts the launcher on PATH.

Every set-up first removes what an earlier crashed run left (namespaces with this prefix, the processes in them,
``/etc/netns`` entries); ``down()`` does the same, and is idempotent. One cluster at a time per instance (a lock
file); ``OCTOSIM_INSTANCE=1`` gives a second, independent one (``octsim1-*``, ``10.231.1.0/24``) beside it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

from helpers import restore_signals

HERE = Path(__file__).resolve().parent
# Which of the clusters that may be up at once this process makes: "0" (the default), and "1", "2" for pytests
# beside the first (make test runs the real Slurm and Grid Engine tests so). Each instance has its own names,
# subnet, lock, spool and leftovers; at most one cluster per instance at a time. Interface names hold 15
# characters: "octosim-node001" is 15, so every prefix is 7.
INSTANCE_ENV = "OCTOSIM_INSTANCE"


def _instance(environ) -> int:
    raw = environ.get(INSTANCE_ENV, "0") or "0"
    if not (len(raw) == 1 and raw in "0123456789"):
        raise RuntimeError(f"{INSTANCE_ENV}={raw!r}; expected one digit, 0 to 9")
    return int(raw)


def prefix_of(instance: int) -> str:
    """0 -> "octosim", 3 -> "octsim3": the names of an instance's namespaces, links, lock and spools."""
    return "octosim" if instance == 0 else f"octsim{instance}"


INSTANCE = _instance(os.environ)
PREFIX = prefix_of(INSTANCE)
SWITCH = f"{PREFIX}-sw"
SUBNET = f"10.231.{INSTANCE}"
LOCK = Path("/run/lock") / f"{PREFIX}.lock"
# A scheduler's spool for the imitated PBS and Grid Engine jobs (node files): outside $HOME, /tmp and the working
# directory, so no container binds it. One cluster per instance at a time: a fixed name, removed by every set-up
# and teardown.
SPOOL = Path("/var/spool") / f"{PREFIX}-spool"
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / ("python%d.%d" % sys.version_info[:2]))
VENV_BIN = Path(sys.executable).parent
# What a login shell on a compute node has before the job's own settings (rsh-agent gives ssh's narrower /usr/bin:/bin).
NODE_PATH = "/usr/local/bin:/usr/bin:/bin"
_HELD = False  # this process holds the lock (flock would let a second up() here deadlock against itself)


def unavailable() -> Optional[str]:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the cluster simulation needs root (network, UTS and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"the cluster simulation needs '{tool}' (iproute2 / util-linux)"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if res.returncode != 0:
        return f"cannot create a network namespace here: {res.stderr.strip()}"
    if not (VENV_BIN / "mpirun").exists():
        return f"no mpirun in {VENV_BIN} (the cpu profile has one: make env)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX + "-")]


def remove_leftovers() -> None:
    """Every process in our namespaces, the namespaces, their hosts files, a veth stranded on the host, the spool."""
    for ns in namespaces():
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in namespaces():
        _ip("netns", "del", ns, check=False)
    for d in Path("/etc/netns").glob(f"{PREFIX}-*"):
        shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(SPOOL, ignore_errors=True)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX + "-"):
            _ip("link", "del", name, check=False)


class Cluster:
    """``Cluster(state_dir, n).up()``; ``exec_argv(node, argv, env, cwd)``; ``cut_link(node)``; ``down()``."""

    def __init__(self, state: Path, nodes: int = 2):
        self.state = Path(state)
        self.nodes = [f"node{i:03d}" for i in range(1, nodes + 1)]
        self.address = {n: f"{SUBNET}.{i}" for i, n in enumerate(self.nodes, 1)}
        self.holders: dict[str, subprocess.Popen] = {}
        self._lock = None

    def ns(self, node: str) -> str:
        return f"{PREFIX}-{node}"

    def pid(self, node: str) -> int:
        return self.holders[node].pid

    @property
    def bin(self) -> Path:
        """The site's programs: ssh agent, singularity (on node001's PATH only, like a module's)."""
        return self.state / "bin"

    @property
    def hpcx(self) -> Path:
        """What ``module load hpcx`` puts on PATH: the venv's Open MPI 5 ``mpirun`` (PRRTE)."""
        return self.state / "hpcx" / "bin"

    def up(self) -> "Cluster":
        global _HELD
        if _HELD:
            raise RuntimeError(
                "a simulated cluster is already up in this process: one at a time (down() it first)"
            )
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(LOCK, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        _HELD = True
        remove_leftovers()
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "nodes").mkdir(exist_ok=True)
        try:
            self._network()
            for node in self.nodes:
                self._holder(node)
            self._programs()
        except BaseException:
            self.down()
            raise
        return self

    def _network(self) -> None:
        _ip("netns", "add", SWITCH)
        _ip("-n", SWITCH, "link", "add", "br0", "type", "bridge")
        _ip("-n", SWITCH, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.address[n]} {n}\n" for n in self.nodes)
        for node in self.nodes:
            ns, port = self.ns(node), f"{PREFIX}-{node}"
            _ip("netns", "add", ns)
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", port, "netns", SWITCH)
            _ip("-n", SWITCH, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address[node]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)

    def _holder(self, node: str) -> None:
        # ip netns exec: the netns + a mount namespace with /etc/netns/<ns>/hosts over /etc/hosts; unshare: UTS.
        # Every command execs the next, so the holder's pid is the sleep's: nsenter -t <pid> enters all three.
        p = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.ns(node),
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "slave",
                "sh",
                "-c",
                f"hostname {node} && echo up && exec sleep infinity",
            ],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        line = p.stdout.readline()
        if line.strip() != b"up":
            raise RuntimeError(f"node {node} did not start (said {line!r})")
        self.holders[node] = p
        (self.state / "nodes" / node).write_text(str(p.pid))

    def _programs(self) -> None:
        """The site's commands, with this cluster's state directory written into them."""
        self.bin.mkdir(parents=True, exist_ok=True)
        self.hpcx.mkdir(parents=True, exist_ok=True)
        for name in ("mpirun", "mpiexec", "prterun"):
            link = self.hpcx / name
            if not link.exists():
                link.symlink_to(VENV_BIN / name)
        wrappers = {
            "rsh-agent": f'exec {HERE}/rsh-agent {self.state} "$@"',
            "singularity": f'exec {BASE_PYTHON} -I {HERE}/container.py --record {self.state}/rank-env "$@"',
        }
        (self.state / "rank-env").mkdir(exist_ok=True)
        for name, body in wrappers.items():
            path = self.bin / name
            path.write_text(f"#!/bin/bash\n{body}\n")
            path.chmod(0o755)

    def down(self) -> None:
        global _HELD
        for node, p in self.holders.items():
            if p.poll() is None:
                p.kill()
                p.wait()
        self.holders.clear()
        remove_leftovers()
        if self._lock is not None:
            self._lock.close()
            self._lock = None
            _HELD = False

    # ---- running things on a node ---------------------------------------------------------------------------------

    def exec_argv(
        self, node: str, argv: Sequence[str], env: Mapping[str, str], cwd: str
    ) -> list[str]:
        """argv that runs ``argv`` on ``node`` (its network, hostname and /etc/hosts) with exactly ``env``."""
        return (
            [
                "nsenter",
                "-F",
                "-t",
                str(self.pid(node)),
                "-n",
                "-u",
                "-m",
                f"--wd={cwd}",
                "env",
                "-i",
            ]
            + [f"{k}={v}" for k, v in env.items()]
            + list(argv)
        )

    def popen(
        self, node: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, **kw
    ) -> subprocess.Popen:
        # Every process on a node starts with the default stop signals, whatever the test process inherited
        # (a CI runner or `make test &` may ignore SIGINT/SIGTERM): a job's scheduler would give it the defaults.
        kw.setdefault("preexec_fn", restore_signals)
        return subprocess.Popen(
            self.exec_argv(node, argv, env, cwd), stdin=subprocess.DEVNULL, **kw
        )

    def cut_link(self, node: str) -> None:
        """Pull node's cable: its switch port goes down (packets to and from it are dropped, no RST)."""
        _ip("-n", SWITCH, "link", "set", f"{PREFIX}-{node}", "down")

    def run(
        self,
        node: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        *,
        check: bool,
        timeout: float,
        who: str = "",
    ) -> subprocess.CompletedProcess:
        """``argv`` run on ``node`` with exactly ``env``, its output captured as text; with ``check``, a non-zero
        exit raises naming the command, the node (and ``who``: " as octo") and what it printed."""
        proc = subprocess.run(
            self.exec_argv(node, argv, env, cwd),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=restore_signals,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} on {node}{who} failed ({proc.returncode}): "
                f"{proc.stderr.strip() or proc.stdout.strip()}"
            )
        return proc

    def processes_on(self, node: str) -> list[int]:
        """Pids in node's network namespace, its holder excepted."""
        pids = [int(p) for p in _ip("netns", "pids", self.ns(node), check=False).stdout.split()]
        return [p for p in pids if p != self.pid(node)]

    def kill_ranks(self, node: str, sig: int = signal.SIGKILL, also: bytes = b"") -> list[int]:
        """``sig`` to every training process on ``node`` (``.../bin/octo-dist ...``, with ``also`` among its
        arguments: b"smoke"; not the launcher's daemon, not the rank guard): their pids."""
        hit = []
        for pid in self.processes_on(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"octo-dist") for part in cmd[:2]) and (not also or also in cmd):
                os.kill(pid, sig)
                hit.append(pid)
        return hit

    def kill_processes(self) -> None:
        """SIGKILL to everything running on every node that is up (its holder excepted): what a job or daemon
        left."""
        for node in self.holders:
            for pid in self.processes_on(node):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


# ---- scheduler-shaped job environments ----------------------------------------------------------------------------


def module_function(cluster: Cluster) -> str:
    """``module load hpcx/... singularitypro``: what Lmod's exported bash function does, for two modules."""
    return (
        '() { if [ "$1" != load ]; then echo "module: only \'module load\' is simulated" >&2; return 1; fi; '
        'shift; local m; for m in "$@"; do case $m in '
        f"hpcx/*) PATH={cluster.hpcx}:$PATH ;; singularity*) ;; "
        '*) echo "Lmod has detected the following error: unknown module $m" >&2; return 1 ;; esac; done; '
        "export PATH; }"
    )


def base_env(cluster: Cluster, home: Path, extra: Mapping[str, str] = ()) -> dict:
    """A job's environment before the scheduler's variables: a login's PATH plus the site's ``singularity``."""
    env = {
        "PATH": f"{cluster.bin}:{NODE_PATH}",
        "HOME": str(home),
        "USER": "root",
        "LOGNAME": "root",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "BASH_FUNC_module%%": module_function(cluster),
        # The site's Open MPI: ssh is the agent (here the namespace-entering one); root needs the two overrides.
        "PRTE_MCA_plm_ssh_agent": str(cluster.bin / "rsh-agent"),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    env.update(extra)
    return env


def pbs_env(cluster: Cluster, spool: Path, job_id: str, workdir: Path, ranks_per_node: int) -> dict:
    """PBS Professional's batch job variables; the node file in the spool, one line per MPI slot."""
    aux = spool / "aux"
    aux.mkdir(parents=True, exist_ok=True)
    nodefile = aux / job_id
    nodefile.write_text("".join(f"{n}\n" * ranks_per_node for n in cluster.nodes))
    return {
        "PBS_ENVIRONMENT": "PBS_BATCH",
        "PBS_JOBID": job_id,
        "PBS_JOBNAME": "octo-dist",
        "PBS_NODEFILE": str(nodefile),
        "PBS_O_WORKDIR": str(workdir),
        "PBS_O_HOST": "login1",
        "PBS_O_QUEUE": "rt_HF",
        "PBS_QUEUE": "rt_HF",
        "PBS_O_SHELL": "/bin/bash",
        "PBS_O_LOGNAME": "root",
        "PBS_TASKNUM": "1",
        "PBS_NODENUM": "0",
        "PBS_MOMPORT": "15003",
        "NCPUS": str(ranks_per_node),
    }


class Job:
    """``bash job.sh`` on node001 under a scheduler's environment; stdout and stderr to files in the workdir."""

    def __init__(
        self, cluster: Cluster, script: Path, env: Mapping[str, str], cwd: Path, name: str
    ):
        self.cluster, self.script, self.env, self.cwd, self.name = (
            cluster,
            script,
            dict(env),
            cwd,
            name,
        )
        self.out = cwd / f"{name}.out"
        self.err = cwd / f"{name}.err"
        self.proc: Optional[subprocess.Popen] = None
        self.started = 0.0

    def start(self) -> "Job":
        self.started = time.monotonic()
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = self.cluster.popen(
                self.cluster.nodes[0],
                ["/bin/bash", str(self.script)],
                self.env,
                str(self.cwd),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        return self

    def wait(self, timeout: float) -> Optional[int]:
        """The job's exit status, or None when it is still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """Everything the job started, on every node (what a scheduler's job cleanup does)."""
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.cluster.kill_processes()
        if self.proc:
            self.proc.wait()

    def output(self) -> str:
        return self.out.read_text()

    def errors(self) -> str:
        return self.err.read_text()


def rank_envs(cluster: Cluster) -> list[dict]:
    """The environment every container started with (one file per rank, written by the singularity stand-in)."""
    out = []
    for f in sorted((cluster.state / "rank-env").glob("*.env")):
        env = dict(item.split("=", 1) for item in f.read_text().split("\0") if "=" in item)
        env["_host"] = f.name.split("-")[0]
        out.append(env)
    return out
