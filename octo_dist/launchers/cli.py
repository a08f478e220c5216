"""octo-dist detect: what this process's launcher says, without starting JAX or MPI.

    mpirun -np 2 octo-dist detect --json --output 'detect-{rank}.json'   # each rank writes its own file
    srun --ntasks-per-node=4 octo-dist detect
    octo-dist detect --env-file recorded.env                             # a recorded environment (`env > recorded.env`)

Exit 0 with the answer; 2 with one line (found / expected / fix) when detection refuses the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import socket
import sys
from typing import Dict, Mapping, Optional

import octo_dist
from octo_dist import launchers, subcommand
from octo_dist.launchers import coordcheck, coordinator, hostlists, outside
from octo_dist.launchers.base import LauncherError, refuse
from octo_dist.problems import Problem

SCHEMA = 1  # bump when a field changes meaning or goes away; adding fields keeps it
HELP = (
    "show what this process's launcher says (rank, world, local rank, nodes, "
    "coordinator), without starting JAX or MPI"
)


# bytes: Linux caps a process's arguments and environment together near 2 MiB; /dev/zero must not be read whole
ENV_FILE_LIMIT = 4 << 20
# "OMPI_COMM_WORLD_RANK=0" starts a variable; bash's exported functions start an entry named
# "BASH_FUNC_module%%=() {  eval ..." (bash 4.4+) or "BASH_FUNC_module()=() {..." (bash 4.3), whose body spans lines
# up to a lone "}".
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_FUNCTION = re.compile(r"BASH_FUNC_[^=\s]+(?:%%|\(\))=")


def read_env_file(text: str) -> Dict[str, str]:
    """``env`` output (``NAME=value`` lines, ``#`` comments) or ``env -0`` output -> a dict.

    A line that starts no variable continues the previous value (``env`` prints multi-line values that way); an
    exported bash function (Environment Modules' ``module``) is an entry of its own up to its closing ``}``::

        OMPI_COMM_WORLD_RANK=0
        BASH_FUNC_module%%=() {  eval $($LMOD_CMD bash "$@")
        }
        PMIX_NAMESPACE=x
    """
    if "\0" in text:
        return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)
    out: Dict[str, str] = {}
    last = None
    in_function = False
    for line in text.splitlines():
        if in_function:
            out[last] += "\n" + line
            in_function = line != "}"
            continue
        if line.startswith("#") or (not line.strip() and last is None):
            continue
        function = _FUNCTION.match(line)
        if function or _NAME.match(line):
            if function:
                name, value = line[: function.end() - 1], line[function.end() :]
            else:
                name, _, value = line.partition("=")
            out[name] = value
            last = name
            in_function = bool(function) and not value.rstrip().endswith("}")
        elif last is not None:
            out[last] += "\n" + line
    return out


def _coordinator(environ: Mapping[str, str], launch: launchers.Launch) -> Dict[str, Optional[str]]:
    """The address start-up would use, and where it comes from; mpi4py's broadcast is described, not run."""
    if launch.world_size == 1 and not hostlists.explicit_coordinator(environ):
        return {"coordinator": None, "coordinator_source": "single process: none needed"}
    mpi = (
        launch.launcher in coordinator.MPI_LAUNCHERS
        and not hostlists.explicit_coordinator(environ)
        and environ.get("OCTO_DIST_NO_MPI4PY", "") in ("", "0")
    )
    try:
        c = coordinator.resolve(environ, launch)
    except coordinator.CoordinatorError as e:
        if not mpi:
            raise
        return {
            "coordinator": None,
            "coordinator_source": f"mpi4py broadcast from rank 0 at start-up; without mpi4py: {e}",
        }
    if c is None:
        return {"coordinator": None, "coordinator_source": "single process: none needed"}
    source = (
        f"mpi4py broadcast from rank 0 at start-up; without mpi4py: {c.address} ({c.source})"
        if mpi
        else c.source
    )
    return {"coordinator": c.address, "coordinator_source": source}


def describe(environ: Mapping[str, str], launcher: str = "auto") -> Dict[str, object]:
    """The detect record for ``environ`` (raises LauncherError / CoordinatorError when detection refuses it)."""
    launch = launchers.detect(environ, launcher)
    nodes, nodes_source, nodes_problem = launch.nodes, launch.nodes_source, None
    if nodes is None:
        try:
            found = hostlists.node_list(environ)
        except LauncherError as e:
            found, nodes_problem = None, str(e)
        if found:
            nodes_source, nodes = found[0], tuple(found[1])
    record: Dict[str, object] = {
        "launcher": launch.launcher,
        "detail": launch.detail,
        "rank": launch.rank,
        "world_size": launch.world_size,
        "local_rank": launch.local_rank,
        "local_size": launch.local_size,
        "job_id": launch.job_id,
        "step_id": launch.step_id,
        "nodes": list(nodes) if nodes is not None else None,
        "nodes_source": nodes_source,
    }
    record.update(_coordinator(environ, launch))
    record.update(
        {"nodes_problem": nodes_problem, "note": launch.note, "variables": list(launch.variables)}
    )
    return record


def check_here(record: Mapping[str, object]) -> Optional[str]:
    """The start-up check of the coordinator, run in this process: ``"ok"``, or why it is not checked.

    Raises:
      CoordinatorError: the host does not resolve; on rank 0, an address not this host's, or a port in use.
    """
    address, source = record["coordinator"], str(record["coordinator_source"])
    if source.startswith("mpi4py"):
        return "not checked: rank 0 picks its own host and a free port at start-up"
    if not address:
        return None
    coordcheck.check(coordinator.Coordinator(str(address), source), int(record["rank"]))
    return "ok"


def _header() -> Dict[str, object]:
    return {
        "schema": SCHEMA,
        "octo_dist_version": octo_dist.__version__,
        "host": socket.gethostname(),
        "python": platform.python_version(),
    }


def as_text(record: Mapping[str, object]) -> str:
    nodes = record["nodes"]
    shown_nodes = (
        "-"
        if nodes is None
        else (",".join(nodes[:8]) + (f" ... ({len(nodes)} nodes)" if len(nodes) > 8 else ""))
    )
    lines = [
        f"launcher     {record['launcher']}  ({record['detail'] or 'nothing detected'})",
        f"rank         {record['rank']} of {record['world_size']}",
        f"local rank   {record['local_rank']} of {record['local_size']} on {record['host']}",
        f"nodes        {shown_nodes}"
        + (f"  (from {record['nodes_source']})" if record["nodes_source"] else ""),
        f"coordinator  {record['coordinator'] or '-'}  ({record['coordinator_source']})",
    ]
    if record.get("job_id"):
        lines.append(
            f"job          {record['job_id']}"
            + (f" step {record['step_id']}" if record.get("step_id") else "")
        )
    if record.get("coordinator_check"):
        lines.append(f"check        {record['coordinator_check']}")
    if record.get("nodes_problem"):
        lines.append(f"node list    {record['nodes_problem']}")
    if record.get("note"):
        lines.append(f"note         {record['note']}")
    if record.get("variables"):
        lines.append(f"read from    {' '.join(record['variables'])}")
    return "\n".join(lines)


def _rank_guess(environ: Mapping[str, str]) -> str:
    """A file name for a rank whose detection failed: the first rank variable any launcher set, else "unknown"."""
    for var in (
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "PALS_RANKID",
        "SLURM_PROCID",
        "PMIX_RANK",
        "RANK",
    ):
        if re.fullmatch(r"[0-9]{1,9}", environ.get(var, "")):  # not "²", which isdigit() passes
            return environ[var]
    return "unknown"


def run(args: argparse.Namespace) -> int:
    environ: Mapping[str, str] = os.environ
    try:
        if args.env_file:
            fix = "env > recorded.env (or env -0), then octo-dist detect --env-file recorded.env"
            try:
                text = outside.read_text(args.env_file, ENV_FILE_LIMIT, "--env-file", fix)
            except FileNotFoundError as e:
                raise refuse(
                    f"--env-file {args.env_file} cannot be read ({e.strerror})",
                    "a file of `env` output (NAME=value lines)",
                    fix,
                )
            except outside.InputError as e:
                raise refuse(e.found, f"{e.expected} of `env` output (NAME=value lines)", fix)
            environ = read_env_file(text)
        record = {**_header(), "ok": True, **describe(environ, args.launcher)}
        record["coordinator_check"] = None if args.env_file else check_here(record)
        code = 0
    except Problem as e:  # LauncherError, CoordinatorError: refused (2)
        message = str(e).replace("\n", " ")
        print(f"octo-dist detect: error: {message}", file=sys.stderr)
        record = {**_header(), "ok": False, "error": message}
        code = e.exit_status
    text = (
        json.dumps(record, indent=None if args.output else 2) if args.json or args.output else None
    )
    if args.output:
        path = args.output.replace("{rank}", str(record.get("rank", _rank_guess(environ))))
        try:
            with open(path, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            print(
                f"octo-dist detect: error: --output {path} cannot be written ({e.strerror or e}); expected a file in "
                f"an existing, writable directory. Fix: mkdir -p {os.path.dirname(path) or '.'}",
                file=sys.stderr,
            )
            return octo_dist.EXIT_USAGE
    if code == 0 or args.json:
        print(text if args.json else as_text(record))
    return code


def add_parser(sub) -> None:
    p = subcommand.parser(sub, "detect", HELP, __doc__, run)
    p.add_argument("--json", action="store_true", help="print one JSON object (schema %d)" % SCHEMA)
    p.add_argument(
        "--launcher",
        default="auto",
        choices=["auto", *launchers.ORDER],
        help="force one launcher's variables (default: detect)",
    )
    p.add_argument(
        "--env-file",
        metavar="FILE",
        help="read this environment (`env` output) instead of the process's",
    )
    p.add_argument(
        "--output", metavar="PATH", help="also write the JSON record here; {rank} becomes this rank"
    )
