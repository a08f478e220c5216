"""The probe job's report: ``python -m octo_dist.apps.probe.write DIR --raw RAW`` reads what the job's commands
wrote in RAW (one file per command, its exit status in ``NAME.rc``), tries the outbound connection, and writes
``DIR/probe.json`` and ``DIR/probe.txt``. It runs inside the image, after the commands (octo-dist probe renders them).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from octo_dist.apps.probe import facts as F
from octo_dist.jobs import probesite
from octo_dist import savelayout

CONNECT_TIMEOUT_S = (
    5.0  # a TCP connect that a firewall drops never answers: reported, not waited for
)
RAW_LIMIT = 1 << 20  # bytes of one command's output read (ompi_info --all prints ~300 kB)
# The raw files the job script writes (jobs/probe.py renders the commands): name -> what printed it.
RAW = {
    "env.txt": "the job's CUDA_VISIBLE_DEVICES, PBS_* and OMPI_MCA_* variables",
    "nvidia-smi.csv": "nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader",
    "nvidia-smi.txt": "nvidia-smi",
    "cgroup.txt": "cat /proc/self/cgroup",
    "host-infiniband.txt": "ls -l /dev/infiniband (on the node)",
    "image-infiniband.txt": "ls -l /dev/infiniband (inside the image)",
    "qstat-queue.json": "qstat -Qf -F json $PBS_QUEUE",
    "qstat-job.json": "qstat -f -F json $PBS_JOBID",
    "ompi-info.txt": "ompi_info --parsable --all (after module load)",
    "singularity-login.txt": "singularity --version (login node, at submit)",
    "singularity-compute.txt": "singularity --version (compute node)",
    "check-env.json": "octo-dist check-env --deep --json (inside the image)",
    "quota.txt": "show_quota -b G",
    "validate.txt": "mpirun ... octo-dist validate (across the nodes)",
}


def read_raw(raw_dir: str) -> Dict[str, Tuple[str, int]]:
    """name -> (output, exit status) of each command the job ran; a command that did not run: ("not run", 127)."""
    out = {}
    for name in RAW:
        try:
            with open(os.path.join(raw_dir, name), "rb") as f:
                text = f.read(RAW_LIMIT).decode("utf-8", "replace")
        except OSError:
            out[name] = ("not run", 127)
            continue
        try:
            with open(os.path.join(raw_dir, name + ".rc")) as f:
                rc = int(f.read().strip() or 0)
        except (OSError, ValueError):
            rc = 0
        out[name] = (text, rc)
    return out


def parse_env(text: str) -> Dict[str, str]:
    """``env``'s lines "NAME=value" -> {NAME: value}."""
    return dict(ln.split("=", 1) for ln in text.splitlines() if "=" in ln)


def connect(target: str, timeout: float = CONNECT_TIMEOUT_S) -> Optional[str]:
    """None when a TCP connection to ``target`` ("huggingface.co:443") opened, else what failed."""
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def gather(raw: Mapping[str, Tuple[str, int]], net: Mapping) -> Dict[str, dict]:
    """Every fact of the report from the commands' outputs (pure: ``net`` is the outbound fact)."""
    env = parse_env(raw["env.txt"][0])
    gpu = F.gpus(*raw["nvidia-smi.csv"], raw["nvidia-smi.txt"][0])
    out = {
        "gpus": gpu,
        "isolation": F.isolation(env, raw["cgroup.txt"][0], gpu),
        "infiniband_host": F.devices(*raw["host-infiniband.txt"]),
        "infiniband_image": F.devices(*raw["image-infiniband.txt"]),
        "kill_delay": F.kill_delay(*raw["qstat-queue.json"], env.get("PBS_QUEUE", "")),
        "placement": F.placement(*raw["qstat-job.json"], env.get("PBS_JOBID", "")),
        "launcher": F.launcher(*raw["ompi-info.txt"], env),
        "singularity_login": F.singularity(*raw["singularity-login.txt"]),
        "singularity_compute": F.singularity(*raw["singularity-compute.txt"]),
        "check_env": F.check_env(*raw["check-env.json"]),
        "quota": F.quota(*raw["quota.txt"]),
        "outbound": dict(net),
    }
    validate, rc = raw["validate.txt"]
    if rc != 127:
        out["validate"] = {"exit": rc, "tail": validate.rstrip()[-2000:]}
    return out


def report(facts: Mapping[str, dict], env: Mapping[str, str], nodes: int, now: str) -> dict:
    return {
        "schema": 1,
        "job_id": env.get("PBS_JOBID", ""),
        "queue": env.get("PBS_QUEUE", ""),
        "nodes": nodes,
        "written": now,
        "facts": dict(facts),
        "differences": probesite.differences(facts, nodes),
    }


def shown(fact: Mapping) -> str:
    """One fact in one line: ``"absent: nvidia-smi failed (exit 127): ..."`` or ``"count=1, driver=550.54.15"``."""
    if "absent" in fact:
        return f"absent: {fact['absent']}"
    parts = []
    for key, value in fact.items():
        if key == "text" or key == "tail":
            value = "\n    " + str(value).replace("\n", "\n    ")
        elif key == "areas":  # show_quota's rows: "/groups/grpname 312.0 GiB of 32.0 TiB used"
            size = savelayout.size_text
            value = "; ".join(
                f"{a['directory']} {size(a['used'])} of {size(a['limit'])} used" for a in value
            )
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def text(rep: Mapping) -> str:
    """The report for a reader: each fact, then what contradicts launch's assumptions, each with its fix."""
    lines = [
        f"octo-dist probe: job {rep['job_id']} on {rep['queue']} ({rep['nodes']} node(s)), {rep['written']}"
    ]
    for name, fact in rep["facts"].items():
        lines.append(f"  {name}: {shown(fact)}")
    diffs: List[dict] = rep["differences"]
    lines.append(f"differences from what launch assumes: {len(diffs) or 'none'}")
    for d in diffs:
        lines.append(
            f"  {d['fact']}: found {d['found']}; expected {d['expected']}. Fix: {d['fix']}"
        )
    return "\n".join(lines) + "\n"


def write(directory: str, rep: Mapping) -> None:
    for name, body in (
        (probesite.REPORT, json.dumps(rep, indent=1) + "\n"),
        (probesite.TEXT, text(rep)),
    ):
        tmp = os.path.join(directory, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(body)
        os.replace(tmp, os.path.join(directory, name))


def main(
    argv: Optional[Sequence[str]] = None, try_connect: Callable[[str], Optional[str]] = connect
) -> int:
    p = argparse.ArgumentParser(prog="python -m octo_dist.apps.probe.write")
    p.add_argument("directory", help="the probe's save directory (its commands' outputs in raw/)")
    p.add_argument(
        "--connect", default="huggingface.co:443", help="HOST:PORT to open a TCP connection to"
    )
    p.add_argument("--raw", help="the commands' outputs (default: DIRECTORY/raw)")
    p.add_argument("--nodes", type=int, default=1)
    args = p.parse_args(argv)
    raw = read_raw(args.raw or os.path.join(args.directory, "raw"))
    net = F.outbound(args.connect, try_connect(args.connect))
    facts = gather(raw, net)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    rep = report(facts, parse_env(raw["env.txt"][0]), args.nodes, now)
    write(args.directory, rep)
    sys.stdout.write(text(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
