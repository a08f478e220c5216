"""Open MPI's ``mpirun`` (or MPICH's Hydra ``mpiexec`` in its place) as the job's launcher (PBS, Grid Engine): the
part those schedulers share.

``-x NAME`` passes a variable to the ranks on other nodes (Open MPI 4 gives them nothing else; the values stay off
the command line, so a wandb key never shows in ``ps``). The scheduler's node list may exist on the first node only,
outside the image: the ranks get a copy in the job's directory under the save directory, which every node and the
image see, named by ``OCTO_DIST_NODEFILE`` (the scheduler's own variable is left as it set it).

The ``mpirun`` on PATH may be MPICH's Hydra (``mpirun.mpich``, Intel MPI's ``mpirun``), which refuses Open MPI's
options ("unrecognized argument x"): where its links lead says which, and Hydra gets its own line (``-f HOSTS -ppn R -n
N``; it passes the whole environment to every rank by default, so no ``-x``). Under a session-wide SIGTERM (PBS's
qdel) Hydra behaves (measured, MPICH 4.0.2): ``mpiexec`` forwards SIGTERM and SIGUSR1 to every rank and runs on
until they exit; its ``hydra_pmi_proxy`` and every rank call ``setsid``, so the qdel reaches neither, and a proxy
whose ``mpiexec`` is gone (``kill -9``, the kill delay's SIGKILL) SIGKILLs the processes it started.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from typing import List, Mapping, Optional, Tuple

from octo_dist import savelayout
from octo_dist.jobs.settings import RANK0_WAIT_ENV
from octo_dist.jobs.schedulers.base import Scheduler

NODE_LIST_ENV = (
    "OCTO_DIST_NODEFILE"  # the job's node list as every node and the image see it (read first)
)
# A node that stops answering (link down, panic) is noticed by mpirun's daemons through TCP keepalive; Open MPI's
# defaults (300 s, then 9 probes 20 s apart) hold a dead job for 8 minutes: 10 s and 3 probes 5 s apart instead.
# Open MPI 4 (hpcx) reads OMPI_MCA_*, Open MPI 5's PRRTE reads PRTE_MCA_*; each ignores the other's.
KEEPALIVE = {"keepalive_time": "10", "keepalive_intvl": "5", "keepalive_probes": "3"}


def count_hosts(text: str) -> int:
    """Distinct hosts of a node list, first word of each line ("node001 4 all.q@node001 UNDEFINED" or "node001")."""
    return len({ln.split()[0] for ln in text.splitlines() if ln.split()})


def sockets_here() -> int:
    """CPU sockets of this node (lscpu -p=SOCKET: one "#" header, then one socket number per CPU); 0: unknown."""
    lscpu = shutil.which("lscpu")
    if not lscpu:
        return 0
    try:
        out = subprocess.run(
            [lscpu, "-p=SOCKET"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len({ln for ln in out.splitlines() if ln and not ln.startswith("#")})


def binding(
    ranks_per_node: int, cpus_per_rank: int, sockets: int, cores: int, found_sockets: int
) -> Tuple[List[str], str]:
    """mpirun's mapping and binding, and a note ("" when none): a block of ranks per socket, each with
    ``cpus_per_rank`` cores for its input pipeline (unbound, 8 tf.data pipelines fight over the same cores); on a
    node of another shape, one block per node, or none.

    >>> binding(8, 12, 2, 96, 2)[0]
    ['--map-by', 'ppr:4:socket:PE=12', '--bind-to', 'core']
    """
    none = ["--map-by", f"ppr:{ranks_per_node}:node", "--bind-to", "none"]
    if cpus_per_rank <= 0:
        return none, ""
    if cores < cpus_per_rank * ranks_per_node:
        return none, (
            f"this node has {cores} CPU(s), fewer than {ranks_per_node} rank(s) x {cpus_per_rank}: "
            "not binding ranks to cores"
        )
    if sockets > 0 and found_sockets == sockets and ranks_per_node % sockets == 0:
        return [
            "--map-by",
            f"ppr:{ranks_per_node // sockets}:socket:PE={cpus_per_rank}",
            "--bind-to",
            "core",
        ], ""
    return ["--map-by", f"ppr:{ranks_per_node}:node:PE={cpus_per_rank}", "--bind-to", "core"], ""


# Hydra's launcher program: MPICH's ``mpirun`` links to it (/usr/bin/mpirun.mpich -> mpiexec.hydra); Intel MPI's
# ``mpirun`` is a shell script that starts it.
HYDRA_PROGRAM = "mpiexec.hydra"


def is_hydra(real_path: str, head: bytes) -> bool:
    """Whether the job's ``mpirun`` is Hydra, from where its links lead (``real_path``) and its first bytes
    (``head``): ``mpiexec.hydra`` itself, or a script (``#!``) that names it. Open MPI's (``orterun``, ``prterun``,
    hpcx's) is neither. Read, not run: running ``mpirun --version`` is one more launch a site's wrapper may log."""
    if os.path.basename(real_path) == HYDRA_PROGRAM:
        return True
    return head.startswith(b"#!") and HYDRA_PROGRAM.encode() in head


def launcher_is_hydra(env: Mapping[str, str]) -> bool:
    """``is_hydra`` for the first ``mpirun`` on the job's PATH; False when there is none or it cannot be read."""
    program = shutil.which("mpirun", path=env.get("PATH", ""))
    if not program:
        return False
    real = os.path.realpath(program)
    head = b""
    try:
        # Without blocking: an executable FIFO named mpirun would wait for a writer (for ever) in open().
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return is_hydra(real, head)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            head = os.read(fd, 1 << 16)
    except OSError:
        pass
    finally:
        os.close(fd)
    return is_hydra(real, head)


def hydra_binding(ranks_per_node: int, cpus_per_rank: int, cores: int) -> Tuple[List[str], str]:
    """Hydra's binding, and a note ("" when none): ``cpus_per_rank`` cores per rank, when the node has them.

    >>> hydra_binding(8, 12, 96)[0]
    ['-bind-to', 'core:12']
    """
    if cpus_per_rank <= 0:
        return ["-bind-to", "none"], ""
    if cores < cpus_per_rank * ranks_per_node:
        return ["-bind-to", "none"], (
            f"this node has {cores} CPU(s), fewer than {ranks_per_node} rank(s) x {cpus_per_rank}: "
            "not binding ranks to cores"
        )
    return ["-bind-to", f"core:{cpus_per_rank}"], ""


def forwarded(env: Mapping[str, str], prefixes, names) -> List[str]:
    """``-x NAME`` for each variable of ``env`` with one of ``prefixes`` or one of ``names``, sorted."""
    out = []
    for var in sorted(env):
        if var.startswith(tuple(prefixes)) or var in names:
            out += ["-x", var]
    return out


# A node list of 10,000 nodes ("g0001.abci.local 8 rt_HF@g0001 UNDEFINED") is under 1 MiB: read at most this much.
NODE_LIST_MAX_BYTES = 4 << 20


def read_node_list(path: str) -> Tuple[str, str]:
    """(text, "") of the node list at ``path``, or ("", what is wrong with it): unset, missing, not a regular file
    (a directory, ``/dev/zero``: checked before it is opened), larger than ``NODE_LIST_MAX_BYTES``, not text."""
    if not path:
        return "", "unset"
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return "", "not a regular file"
        with open(path, "rb") as f:
            data = f.read(NODE_LIST_MAX_BYTES + 1)
    except OSError as e:
        return "", f"cannot be read: {e.strerror or e}"
    if len(data) > NODE_LIST_MAX_BYTES:
        return "", f"larger than {NODE_LIST_MAX_BYTES >> 20} MiB"
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return "", "not text: not UTF-8"
    if "\0" in text:
        return "", "not text: a NUL byte"
    return text, ""


class MpirunScheduler(Scheduler):
    """A scheduler whose job starts its ranks with ``mpirun`` from a node list in ``hostfile_var``."""

    hostfile_var = ""  # "PBS_NODEFILE"
    hostfile_option = True  # False where Open MPI reads the scheduler's list itself (Grid Engine)

    def node_checks(self, env, nodes, ranks_per_node, script_name):
        hostfile = env.get(self.hostfile_var, "")
        text, problem = read_node_list(hostfile)
        if problem:
            return (
                f"{self.hostfile_var} is {hostfile!r} ({problem}); expected the node list the scheduler gives "
                f"every job (a text file, one node a line). Fix: submit it ({self.submit_program} {script_name}) "
                "rather than running it"
            ), []
        found = count_hosts(text)
        refusal = self.allocation_error(env, text, nodes, ranks_per_node)
        if found < nodes and not refusal:
            # mpirun would pile the missing nodes' ranks onto the listed ones (oversubscribed GPUs) or fail later.
            refusal = (
                f"{self.hostfile_var} {hostfile} lists {found} node(s); expected the {nodes} this script was "
                f"rendered for. Fix: re-render with --nodes {found}, or submit it as rendered "
                f"({self.submit_program} {script_name})"
            )
        warnings = []
        if found > nodes:
            warnings.append(
                f"warning: {hostfile} lists {found} node(s); this script was rendered for {nodes}"
            )
        return refusal, warnings

    def allocation_error(
        self, env, hostfile_text: str, nodes: int, ranks_per_node: int
    ) -> Optional[str]:
        """A refusal of the allocation's shape, or None."""
        return None

    def launcher(self, settings, ctx):
        a = settings.allocation
        node_list = savelayout.node_list(ctx.job_dir)
        shutil.copyfile(ctx.env[self.hostfile_var], node_list)
        exports = {NODE_LIST_ENV: node_list}
        for name, value in KEEPALIVE.items():
            exports[f"OMPI_MCA_oob_tcp_{name}"] = value
            exports[f"PRTE_MCA_oob_tcp_{name}"] = value
        if launcher_is_hydra(ctx.env):
            return self.hydra_launcher(settings, ctx, node_list), exports
        bind, note = binding(
            a.ranks_per_node,
            a.cpus_per_rank,
            a.sockets,
            ctx.cores,
            sockets_here() if a.cpus_per_rank > 0 and a.sockets > 0 else 0,
        )
        if note:
            ctx.note(note)
        argv = ["mpirun"]
        if self.hostfile_option:
            argv += ["-hostfile", ctx.env[self.hostfile_var]]
        env = {**ctx.env, **exports}
        # The job's id as the supervisor checked it, the ranks' wait for rank 0 it set, and the scheduler's own
        # job id, whatever the forwarded prefixes say.
        f = settings.forwarding
        names = (*f.forward_names, savelayout.JOB_ID_ENV, RANK0_WAIT_ENV, self.job_id_var)
        argv += [*bind, *forwarded(env, f.forward_prefixes, names)]
        return argv, exports

    def hydra_launcher(self, settings, ctx, node_list: str) -> List[str]:
        """MPICH's (or Intel MPI's) Hydra ``mpiexec``: ``-ppn R -n N``, the hosts from the node list (one line per
        slot, "g0001" twice -> ``-hosts g0001:2``); where Open MPI reads the scheduler's list itself (Grid Engine),
        Hydra does too. Every variable reaches the ranks (Hydra's default, ``-genvall``)."""
        per_node = settings.allocation.ranks_per_node
        bind, note = hydra_binding(per_node, settings.allocation.cpus_per_rank, ctx.cores)
        if note:
            ctx.note(note)
        argv = ["mpirun", "-ppn", str(per_node), "-n", str(settings.ranks), *bind]
        if self.hostfile_option:
            with open(node_list) as f:
                hosts = list(dict.fromkeys(ln.split()[0] for ln in f if ln.split()))
            argv += ["-hosts", ",".join(f"{h}:{per_node}" for h in hosts)]
        return argv
