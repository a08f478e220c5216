"""Node lists from the schedulers, for the coordinator host; explicit addresses always win."""

from __future__ import annotations

import re
from typing import Callable, Mapping, Optional

COORDINATOR_VARS = ("COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")  # "g0001:12345" (the seed's job file)
SGE_HOSTFILE = "SGE_JOB_HOSTLIST"    # "/var/spool/.../hostlist": one host a line (ABCI 2.0)
PBS_HOSTFILE = "PBS_NODEFILE"        # "/var/spool/pbs/aux/123.pbs1": a host per MPI slot (ABCI 3.0)
SLURM_NODELIST = "SLURM_JOB_NODELIST"  # "node[001-004,007]"

Reader = Callable[[str], str]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def expand_nodelist(spec: str) -> list[str]:
    """SLURM's compressed node list: ``"node[001-003,007],gpu5"`` -> node001..node003, node007, gpu5."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", spec):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            for n in range(int(lo), int(hi) + 1):
                hosts.append(f"{prefix}{n:0{width}d}{suffix}")
    return hosts


def unique_hosts(text: str) -> list[str]:
    """A host file (PBS repeats a host per slot) -> hosts in first-seen order."""
    out = []
    for line in text.splitlines():
        host = line.split()[0] if line.split() else ""
        if host and not host.startswith("#") and host not in out:
            out.append(host)
    return out


def node_list(environ: Mapping[str, str], read: Reader = _read) -> Optional[tuple[str, list[str]]]:
    """(source variable, hosts) from the first scheduler node list present, else None."""
    for var in (PBS_HOSTFILE, SGE_HOSTFILE):
        if environ.get(var):
            return var, unique_hosts(read(environ[var]))
    if environ.get(SLURM_NODELIST):
        return SLURM_NODELIST, expand_nodelist(environ[SLURM_NODELIST])
    return None


def explicit_coordinator(environ: Mapping[str, str]) -> Optional[str]:
    for var in COORDINATOR_VARS:
        if environ.get(var):
            return environ[var]
    return None
