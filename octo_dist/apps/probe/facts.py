"""The probe job's facts, each parsed from what one command printed on the compute node: pure functions over strings.

Every function takes the text a command wrote (and its exit status where that matters) and returns one fact as a
dict; a fact the node cannot have (no GPU on a CPU node, no ``qstat`` there, no ``show_quota``) is
``{"absent": "<why>"}``, never a guess.
"""

from __future__ import annotations

import json
import os
import re
from typing import List, Mapping, Optional

from octo_dist.jobs import footprint
from octo_dist.jobs.schedulers import pbs

# nvidia-smi's banner: "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |"
DRIVER = re.compile(r"Driver Version:\s*([0-9.]+)")
CUDA = re.compile(r"CUDA Version:\s*([0-9.]+)")
# singularity --version: "SingularityCE version 4.1.5-1.el9" / "singularity-ce version 4.3.1" / "apptainer version 1.3"
SINGULARITY = re.compile(r"^(\S+) version ([0-9][0-9A-Za-z.+~-]*)", re.M)
# ls -l /dev/infiniband: "crw-rw-rw- 1 root root 231, 192 Apr  1 09:00 uverbs0"
DEVICE = re.compile(r"^c\S*\s.*\s(\S+)$", re.M)
# ompi_info --parsable: "mca:plm:tm:version:mca:2.1.0" and "mca:plm:rsh:param:plm_rsh_agent:value:ssh : rsh"
PLM = re.compile(r"^mca:plm:([a-z0-9_]+):version:", re.M)
RSH_AGENT = re.compile(r"^mca:plm:rsh:param:plm_rsh_agent:value:(.*)$", re.M)
# exec_vnode: "(node001:ncpus=1)+(node002:ncpus=1)" or "(hnode001:ngpus=1:ncpus=8)"
VNODE = re.compile(r"\(([^:)]+)")


# bash's prefix on a missing command: "/var/spool/pbs/mom_priv/jobs/12.pbs1.SC: line 14: nvidia-smi: not found"
BASH_PREFIX = re.compile(r"^\S+: line [0-9]+: ", re.M)


def absent(why: str) -> dict:
    return {"absent": " ".join(BASH_PREFIX.sub("", why).split())[:300] or "no output"}


def gpus(smi_csv: str, smi_rc: int, banner: str) -> dict:
    """``nvidia-smi --query-gpu=index,name,driver_version,uuid --format=csv,noheader`` and ``nvidia-smi``'s banner
    -> ``{"count": 1, "names": ["NVIDIA H200"], "driver": "550.54.15", "cuda": "12.4"}``."""
    if smi_rc != 0:
        return absent(f"nvidia-smi failed (exit {smi_rc}): {smi_csv}")
    rows = [[c.strip() for c in ln.split(",")] for ln in smi_csv.splitlines() if ln.strip()]
    if not rows:
        return absent("nvidia-smi listed no GPU")
    driver, cuda = DRIVER.search(banner), CUDA.search(banner)
    return {
        "count": len(rows),
        "names": [r[1] if len(r) > 1 else "" for r in rows],
        "driver": driver.group(1) if driver else (rows[0][2] if len(rows[0]) > 2 else ""),
        "cuda": cuda.group(1) if cuda else "",
    }


def isolation(env: Mapping[str, str], cgroup: str, gpu: Mapping) -> dict:
    """How the job's GPU is kept its own: ``CUDA_VISIBLE_DEVICES`` (``env``), the cgroup the job runs in
    (``/proc/self/cgroup``: "0::/pbs_jobs.service/jobid/12.pbs1") and how many GPUs nvidia-smi lists."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    groups = [ln.split(":", 2)[-1] for ln in cgroup.splitlines() if ln.count(":") >= 2]
    in_job = next((g for g in groups if "pbs" in g.lower() or "job" in g.lower()), "")
    if "absent" in gpu:
        return {
            **absent(f"no GPU to isolate ({gpu['absent']})"),
            "cuda_visible_devices": visible,
            "cgroup": in_job,
        }
    if gpu["count"] == 1:
        how = "the device cgroup: nvidia-smi lists only the job's GPU"
    elif visible is not None:
        how = f"CUDA_VISIBLE_DEVICES={visible} among the {gpu['count']} GPUs nvidia-smi lists"
    else:
        how = f"none: nvidia-smi lists {gpu['count']} GPUs and CUDA_VISIBLE_DEVICES is unset"
    return {"how": how, "cuda_visible_devices": visible, "cgroup": in_job, "listed": gpu["count"]}


def devices(listing: str, rc: int) -> dict:
    """``ls -l /dev/infiniband`` -> ``{"uverbs": ["uverbs0", ...], "files": [...]}``; absent without the folder."""
    if rc != 0:
        return absent(f"no /dev/infiniband ({listing})")
    files = DEVICE.findall(listing)
    return {"files": files, "uverbs": [f for f in files if f.startswith("uverbs")]}


# qstat -f's text: "Job Id: 12.pbs1" / "Queue: rt_HG", then "    NAME = VALUE" lines; a long value goes on in lines
# that start with a tab ("    exec_vnode = (hnode001:ncpus=8:ngpus=1)+(hnode002:nc\n\tpus=8:ngpus=1)").
HEADING = re.compile(r"^(Job Id|Queue): (\S+)$")
ATTRIBUTE = re.compile(r"^    ([A-Za-z_][A-Za-z0-9_.]*) = (.*)$")


def qstat_text(text: str) -> dict:
    """``qstat -f`` or ``qstat -Qf`` without ``-F json``, as ``-F json`` would say it: ``{"Jobs": {"12.pbs1":
    {"Resource_List": {"place": "scatter"}, "exec_vnode": "..."}}}`` or ``{"Queue": {"rt_HG": {...}}}``."""
    out: dict = {}
    attrs, last = None, None
    for line in text.splitlines():
        heading, attribute = HEADING.match(line), ATTRIBUTE.match(line)
        if heading:
            attrs = out.setdefault("Jobs" if heading.group(1) == "Job Id" else "Queue", {})
            attrs = attrs.setdefault(heading.group(2), {})
        elif attribute and attrs is not None:
            name, _, sub = attribute.group(1).partition(".")
            where = attrs.setdefault(name, {}) if sub else attrs
            if not isinstance(where, dict):
                continue
            last = (where, sub or name)
            where[last[1]] = attribute.group(2)
        elif line.startswith("\t") and last is not None:
            last[0][last[1]] += line[1:]
    return out


def _qstat(text: str) -> dict:
    """``qstat -F json``'s output or its text, parsed; {} when it is neither."""
    try:
        return json.loads(text) if text.lstrip().startswith("{") else qstat_text(text)
    except ValueError:
        return {}


def kill_delay(qstat_out: str, rc: int, queue: str) -> dict:
    """``qstat -Qf -F json QUEUE`` (or its text) -> ``{"seconds": 10, "source": "PBS's default: queue rt_HG sets no
    kill_delay"}`` (PBS lists kill_delay only where the queue sets it)."""
    parsed = _qstat(qstat_out)
    if rc != 0 or queue not in parsed.get("Queue", {}):
        return absent(f"qstat -Qf {queue} failed (exit {rc}): {qstat_out}")
    seconds, source = pbs.kill_delay(json.dumps(parsed), queue)
    return {"seconds": seconds, "source": source}


def placement(qstat_out: str, rc: int, job_id: str) -> dict:
    """``qstat -f -F json JOBID`` (or its text) -> ``{"place": "scatter", "exec_vnode": "(node001:ncpus=1)",
    "hosts": ["node001"]}``."""
    try:
        record = _qstat(qstat_out)["Jobs"]
        record = record.get(job_id) or next(iter(record.values()))
    except (ValueError, KeyError, TypeError, AttributeError, StopIteration):
        return absent(f"qstat -f {job_id} failed (exit {rc}): {qstat_out}")
    resources = record.get("Resource_List")
    resources = resources if isinstance(resources, dict) else {}
    vnode = str(record.get("exec_vnode", ""))
    return {
        "place": str(resources.get("place", "")),
        "select": str(resources.get("select", "")),
        "exec_vnode": vnode,
        "hosts": VNODE.findall(vnode),
    }


def launcher(ompi_info: str, rc: int, env: Mapping[str, str]) -> dict:
    """How ``mpirun`` starts remote ranks: its plm components (``tm``: through PBS's task manager) and the rsh
    agent, from ``ompi_info --parsable --all``; ``OMPI_MCA_plm_rsh_agent`` in the job's environment wins."""
    if rc != 0 and not PLM.search(ompi_info):
        return absent(f"ompi_info failed (exit {rc}): {ompi_info}")
    plm = sorted(set(PLM.findall(ompi_info)))
    agent = RSH_AGENT.search(ompi_info)
    agent_value = env.get("OMPI_MCA_plm_rsh_agent") or (
        agent.group(1).strip().strip('"') if agent else ""
    )
    if "tm" in plm:
        how = "PBS's task manager (plm tm): remote ranks are tasks of the job"
    elif "tmrsh" in os.path.basename(agent_value.split()[0] if agent_value.split() else ""):
        how = f"the rsh agent {agent_value!r}: remote ranks are tasks of the job"
    else:
        how = f"the rsh agent {agent_value or 'ssh'!r}: remote ranks are outside the job"
    return {"plm": plm, "rsh_agent": agent_value, "how": how, "under_pbs": "outside" not in how}


def singularity(text: str, rc: int) -> dict:
    """``singularity --version`` -> ``{"product": "SingularityCE", "version": "4.1.5-1.el9"}``."""
    found = SINGULARITY.search(text) if rc == 0 else None
    if not found:
        return absent(f"singularity --version failed (exit {rc}): {text}")
    return {"product": found.group(1), "version": found.group(2)}


def check_env(text: str, rc: int) -> dict:
    """``octo-dist check-env --deep --json`` -> ``{"exit": 1, "failed": ["cudnn: ..."]}``."""
    try:
        rows = json.loads(text)
    except ValueError:
        return {"exit": rc, "failed": [" ".join(text.split())[-300:]] if rc else []}
    checks = rows.get("checks", rows) if isinstance(rows, dict) else rows
    # {"checks": [{"id": "cudnn.loaded", "status": "fail", "found": "...", "remedy": "..."}, ...]}
    failed = [
        f"{c.get('id', '?')}: {c.get('found', '')} (fix: {c.get('remedy', '') or 'see check-env'})"
        for c in (checks if isinstance(checks, list) else [])
        if isinstance(c, dict) and str(c.get("status", "")).lower() == "fail"
    ]
    return {"exit": rc, "failed": failed}


def quota(text: str, rc: int) -> dict:
    """``show_quota -b G``'s tables (ABCI's user guide, "Checking Disk Quota") -> each area's use and limit in
    bytes, ``{"areas": [{"directory": "/groups/grpname", "used": 335007449088, "limit": 35184372088832, "free":
    34849364639744}], "text": <as printed>}``; absent where there is none."""
    if rc != 0:
        return absent(f"show_quota failed (exit {rc}): {text}")
    areas = [
        {"directory": q.directory, "used": q.used, "limit": q.limit, "free": q.free}
        for q in footprint.parse_quota(text)
    ]
    return {"areas": areas, "text": text.rstrip()[:4000]}


def outbound(target: str, error: Optional[str]) -> dict:
    """A TCP connect to ``target`` ("huggingface.co:443"): reached, or what the connect said."""
    return {"target": target, "reached": error is None, **({"error": error} if error else {})}


def version_tuple(text: str) -> List[int]:
    """ "4.1.5-1.el9" -> [4, 1, 5]."""
    return [int(p) for p in re.findall(r"[0-9]+", text.split("-")[0])[:3]]
