"""Node lists: Slurm's compressed host lists and the schedulers' node files.

Slurm host lists follow ``src/common/hostlist.c`` (``hostlist_create``): entries are separated by commas, spaces or
tabs outside brackets; ``prefix[ranges]suffix`` expands each bracket group (``1-3,7``; the width of a range's low
end sets the zero padding, ``[08-10]`` -> 08 09 10, ``[8-10]`` -> 8 9 10); several groups in one name expand as a
product, the first group outermost (``rack[1-2]-n[01-02]`` -> rack1-n01 rack1-n02 rack2-n01 rack2-n02). Slurm
refuses a range whose low end is above its high end, a negative or non-numeric bound, and more than 64k hosts in
one range; we also refuse what Slurm silently repairs (an unclosed ``[``), empty brackets and nested brackets, since
none of them comes out of a real scheduler. Duplicates are dropped, keeping the first.

Node files (one host a line; PBS repeats a host once per MPI slot; Grid Engine's PE_HOSTFILE has
``host slots queue processors`` columns) live in the scheduler's spool on the host: inside a container they are
often not visible, which :func:`node_list` reports as a :class:`NodeFileError` instead of a traceback.
"""

from __future__ import annotations

import itertools
import re
from typing import Callable, List, Mapping, Optional, Tuple

from octo_dist.launchers.base import LauncherError, refuse

COORDINATOR_VARS = (
    "COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_ADDRESS",
)  # "g0001:12345", an address the user chose
PBS_HOSTFILE = "PBS_NODEFILE"  # "/var/spool/pbs/aux/123.pbs1": a host per MPI slot (PBS Professional, ABCI 3.0)
SGE_HOSTFILE = (
    "SGE_JOB_HOSTLIST"  # "/var/spool/.../hostlist": one host a line (ABCI 2.0's Grid Engine)
)
# "/var/spool/sge/g0001/active_jobs/9876.1/pe_hostfile", whose lines read "g0001 4 all.q@g0001 UNDEFINED"
SGE_PE_HOSTFILE = "PE_HOSTFILE"
LSF_HOSTFILE = "LSB_DJOB_HOSTFILE"  # "/home/u/.lsbatch/1234.hostfile": one host per slot (LSF)
SLURM_NODELIST = "SLURM_JOB_NODELIST"  # "node[001-004,007]": the allocation (a step's own list is SLURM_STEP_NODELIST)
# "/groups/gxx00000/runs/.octo-dist/nodes-123.pbs1": the rendered job scripts copy the scheduler's node list where
# every node and the image see it (the scheduler's own file stays in its spool on the host); read first.
OCTO_DIST_NODEFILE = "OCTO_DIST_NODEFILE"
NODE_FILES = (OCTO_DIST_NODEFILE, PBS_HOSTFILE, SGE_HOSTFILE, SGE_PE_HOSTFILE, LSF_HOSTFILE)

MAX_RANGE = 64 * 1024  # Slurm's MAX_RANGE: hosts in one bracket range
MAX_HOSTS = 1024 * 1024  # all hosts of one list: "a[0-65535]b[0-65535]" is not a cluster

Reader = Callable[[str], str]


class NodeListError(LauncherError):
    """A host list that is not in Slurm's form."""


class NodeFileError(LauncherError):
    """A node file named by the scheduler that this process cannot read (e.g. a host spool file inside a container)."""


# A node file has a line per rank slot (PBS_NODEFILE) or per host (PE_HOSTFILE): 1,000 nodes x 8 slots is about
# 200 KB. Anything past this bound is not a node file (a wrong variable, /dev/zero): refused, not read to the end.
NODE_FILE_LIMIT = 16 << 20


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        text = f.read(NODE_FILE_LIMIT + 1)
    if len(text) > NODE_FILE_LIMIT:
        raise NodeListError(
            str(
                refuse(
                    f"node file {path} is larger than {NODE_FILE_LIMIT >> 20} MiB",
                    "a node file with one host per line (PBS_NODEFILE, PE_HOSTFILE, OCTO_DIST_NODEFILE)",
                    "point the variable at the scheduler's node file",
                )
            )
        )
    return text


def _bad(spec: str, var: str, problem: str) -> NodeListError:
    err = refuse(
        f"{var}={spec!r}: {problem}",
        "a Slurm host list such as node[001-004,007],gpu[1-2]-ib0 (ranges low-high, low <= high, "
        "brackets balanced and not nested)",
        f"if you set {var} yourself, write it in that form (`scontrol show hostnames '<list>'` expands one on a "
        f"Slurm node); or export COORDINATOR_ADDRESS=<rank 0's host>:<port> for every rank",
    )
    return NodeListError(str(err))


def _split(spec: str, var: str) -> List[str]:
    """Top-level entries: separated by ``,`` space or tab outside brackets; brackets balanced, never nested."""
    out, cur, depth = [], [], 0
    for i, ch in enumerate(spec):
        if ch == "[":
            if depth:
                raise _bad(spec, var, f"nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise _bad(spec, var, f"']' without '[' at position {i}")
            depth = 0
        elif ch in ", \t\n" and not depth:
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth:
        raise _bad(spec, var, "'[' is never closed")
    out.append("".join(cur))
    return [e for e in out if e]  # Slurm skips empty entries ("a,,b")


def _ranges(group: str, spec: str, var: str) -> List[str]:
    """``"001-003,7"`` -> ["001", "002", "003", "7"]: the low end's width pads the whole range."""
    if not group:
        raise _bad(spec, var, "empty brackets '[]'")
    out: List[str] = []
    for piece in group.split(","):
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", piece)
        if not m:
            raise _bad(spec, var, f"range {piece!r} is not N or LOW-HIGH")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise _bad(spec, var, f"range {piece!r} runs backwards")
        if hi - lo + 1 > MAX_RANGE:
            raise _bad(
                spec, var, f"range {piece!r} holds {hi - lo + 1} hosts, more than {MAX_RANGE}"
            )
        width = len(lo_text)
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


def expand_nodelist(spec: str, var: str = "node list") -> List[str]:
    """Slurm's compressed host list -> host names in order, duplicates dropped.

    ``"node[001-003,007],gpu5"`` -> node001 node002 node003 node007 gpu5;
    ``"rack[1-2]-n[01-02]"`` -> rack1-n01 rack1-n02 rack2-n01 rack2-n02.

    Raises:
      NodeListError: the list is malformed (found/expected/fix, naming ``var``).
    """
    hosts: List[str] = []
    seen = set()
    total = 0
    for entry in _split(spec, var):
        parts = re.split(r"\[([^\]]*)\]", entry)  # literal, group, literal, group, ..., literal
        choices = [[p] if i % 2 == 0 else _ranges(p, spec, var) for i, p in enumerate(parts)]
        count = 1
        for c in choices:
            count *= len(c)
        total += count
        if total > MAX_HOSTS:
            raise _bad(spec, var, f"expands to more than {MAX_HOSTS} hosts")
        for combo in itertools.product(*choices):
            host = "".join(combo)
            if host not in seen:
                seen.add(host)
                hosts.append(host)
    return hosts


def parse_node_file(text: str, var: str) -> List[str]:
    """A node file's hosts in first-seen order: first column of each line; ``#`` comments and blanks skipped."""
    out: List[str] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] not in out:
            out.append(fields[0])
    return out


def node_list(environ: Mapping[str, str], read: Reader = _read) -> Optional[Tuple[str, List[str]]]:
    """(source variable, hosts) from the first scheduler node list present, else None.

    Raises:
      NodeFileError: a node file is named but cannot be read here (with the fix: bind it, or set the coordinator).
      NodeListError: SLURM_JOB_NODELIST is malformed.
    """
    for var in NODE_FILES:
        path = environ.get(var)
        if not path:
            continue
        try:
            text = read(path)
        except OSError as e:
            err = refuse(
                f"{var}={path} cannot be read in this process ({e.strerror or e}); node files live in the scheduler's "
                f"spool on the host and are not visible inside a container unless bound",
                f"{var} readable here, or another way to find rank 0's host",
                f"bind it into the container (singularity exec --bind {path}), start the ranks with mpirun so mpi4py "
                f"can agree on the address, or export COORDINATOR_ADDRESS=<first node>:<port> for every rank "
                f"(mpirun -x COORDINATOR_ADDRESS)",
            )
            raise NodeFileError(str(err)) from None
        return var, parse_node_file(text, var)
    if environ.get(SLURM_NODELIST):
        return SLURM_NODELIST, expand_nodelist(environ[SLURM_NODELIST], SLURM_NODELIST)
    return None


def explicit_coordinator(environ: Mapping[str, str]) -> Optional[str]:
    """The address the user chose (COORDINATOR_ADDRESS, then JAX_COORDINATOR_ADDRESS), if any."""
    for var in COORDINATOR_VARS:
        if environ.get(var):
            return environ[var]
    return None
