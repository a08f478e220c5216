"""What ``launch`` assumes of a PBS site, against what a probe job found there (``octo-dist probe``).

The probe job writes ``probe.json`` in its save directory; :func:`differences` names each fact that contradicts an
assumption, with its fix (the job writes them into the report), and :func:`launch_warnings` repeats the ones that
concern a job about to be rendered. Standard library only: it runs on the login node (``launch``) and in the image
(the probe job's report writer).
"""

from __future__ import annotations

import json
import os
from typing import List, Mapping, Optional

from octo_dist.jobs import footprint
from octo_dist import savelayout

REPORT = "probe.json"
TEXT = "probe.txt"
REPORT_ENV = "OCTO_DIST_PROBE_REPORT"  # a probe report elsewhere: "/groups/gxx/probe/probe.json"
DEFAULT_SAVE_DIR = os.path.join(
    "runs", "probe"
)  # where `octo-dist probe` writes, from the submit directory
REPORT_LIMIT = 1 << 20  # bytes: a report is a few kB
# A qdel (or the wall time) gives the job kill_delay seconds between SIGTERM and SIGKILL: the stop's checkpoint
# must be written in them. Below this, a large train state's last save is cut off.
MIN_KILL_DELAY_S = 30
# The image's CUDA (env/stack.toml's cuda12 profile) needs a driver for CUDA 12.
IMAGE_CUDA_MAJOR = 12
MULTI_NODE, EVERY_JOB = "multi-node", "every job"
# The group area (ABCI: /groups/<group>, 0 TB until raised in the user portal) holds the image, the weights, the
# data and the checkpoints (README); the least a fine-tune there needs: Octo-Small's checkpoints and the image.
GROUP_AREA = "/groups/"
SMALLEST_RUN = footprint.estimate(
    "hf://rail-berkeley/octo-small", ""
)  # 4 x 309.0 MiB: named, so never None


def _diff(fact: str, found: str, expected: str, fix: str, applies: str = EVERY_JOB) -> dict:
    return {"fact": fact, "found": found, "expected": expected, "fix": fix, "applies": applies}


def _major(version: str) -> Optional[int]:
    head = version.split(".")[0]
    return int(head) if head.isdigit() else None


def differences(facts: Mapping[str, Mapping], nodes: int) -> List[dict]:
    """Each fact of a probe report (``facts``: name -> fact, see apps/probe/facts.py) that contradicts what
    ``launch`` assumes, as ``{"fact", "found", "expected", "fix", "applies"}``; an absent fact contradicts nothing."""
    return (
        _node_differences(facts, nodes)
        + _job_differences(facts, nodes)
        + _software_differences(facts)
        + _quota_differences(facts)
    )


def _node_differences(facts: Mapping[str, Mapping], nodes: int) -> List[dict]:
    """The node's hardware as the job sees it: the driver, GPU isolation, the InfiniBand devices."""
    out = []
    gpu = facts.get("gpus", {})
    cuda = _major(str(gpu.get("cuda", "")))
    if cuda is not None and cuda < IMAGE_CUDA_MAJOR:
        out.append(
            _diff(
                "driver",
                f"driver {gpu.get('driver')} supports CUDA {gpu.get('cuda')}",
                f"a driver for CUDA {IMAGE_CUDA_MAJOR} (the cuda12 image)",
                "make sif PROFILE=cuda11 and --image octo-dist-cuda11.sif",
            )
        )
    iso = facts.get("isolation", {})
    # a 1-node probe is an rt_HG job, a share of a node: other jobs' GPUs must stay hidden (an rt_HF pair owns
    # its nodes' 8 GPUs, all listed)
    if nodes == 1 and "absent" not in iso and str(iso.get("how", "")).startswith("none"):
        out.append(
            _diff(
                "gpu isolation",
                str(iso["how"]),
                "the job sees only its own GPU (a device cgroup or CUDA_VISIBLE_DEVICES)",
                "--resource-type rt_HF (a whole node), or ask ABCI how rt_HG isolates GPUs",
            )
        )
    host_ib, image_ib = facts.get("infiniband_host", {}), facts.get("infiniband_image", {})
    if host_ib.get("uverbs") and not image_ib.get("uverbs"):
        out.append(
            _diff(
                "/dev/infiniband",
                "the node has " + ", ".join(host_ib["uverbs"]) + "; the image sees none",
                "the verbs devices inside the image (NCCL falls back to TCP between nodes)",
                "--bind /dev/infiniband",
                MULTI_NODE,
            )
        )
    return out


def _job_differences(facts: Mapping[str, Mapping], nodes: int) -> List[dict]:
    """How PBS runs and stops the job: the kill delay, the nodes' placement, how mpirun starts remote ranks."""
    out = []
    delay = facts.get("kill_delay", {})
    if "seconds" in delay and delay["seconds"] < MIN_KILL_DELAY_S:
        out.append(
            _diff(
                "kill_delay",
                f"{delay['seconds']} s ({delay.get('source', '')})",
                f"at least {MIN_KILL_DELAY_S} s for the checkpoint of a job stopped by qdel (the wall time is "
                "not concerned: the job stops itself --stop-margin before it)",
                "save more often (-- finetune --config.save_interval=N): a qdel'd job's last checkpoint may not "
                "finish, and the one before it is where the next job resumes",
            )
        )
    place = facts.get("placement", {})
    hosts = place.get("hosts") or []
    if nodes > 1 and "exec_vnode" in place and len(set(hosts)) < nodes:
        out.append(
            _diff(
                "placement",
                f"exec_vnode {place.get('exec_vnode')} (place={place.get('place')})",
                f"{nodes} chunks on {nodes} hosts (place=scatter)",
                "keep #PBS -l place=scatter; do not override it with --resource place=...",
                MULTI_NODE,
            )
        )
    mpi = facts.get("launcher", {})
    if "absent" not in mpi and mpi and not mpi.get("under_pbs"):
        out.append(
            _diff(
                "mpirun",
                str(mpi.get("how")),
                "remote ranks started through PBS (plm tm, or the rsh agent pbs_tmrsh): qdel reaches them",
                "export OMPI_MCA_plm_rsh_agent=pbs_tmrsh before mpirun (--directive '-v "
                "OMPI_MCA_plm_rsh_agent=pbs_tmrsh')",
                MULTI_NODE,
            )
        )
    return out


def _software_differences(facts: Mapping[str, Mapping]) -> List[dict]:
    """The software around the image: SingularityCE on both sides, check-env and validate inside, the network."""
    out = []
    login, compute = facts.get("singularity_login", {}), facts.get("singularity_compute", {})
    if "version" in login and "version" in compute:
        same = login["version"].split(".")[:2] == compute["version"].split(".")[:2]
        if not same:
            out.append(
                _diff(
                    "SingularityCE",
                    f"{login['version']} on the login node, {compute['version']} on "
                    "the compute node",
                    "one version (an image is built and run by the same one)",
                    "build the image on a compute node (make sif in an rt_HC job)",
                )
            )
    checked = facts.get("check_env", {})
    if checked.get("exit"):
        failed = "; ".join(checked.get("failed") or []) or f"exit {checked['exit']}"
        out.append(
            _diff(
                "check-env --deep",
                f"inside the image: {failed}",
                "nothing failing",
                "the fix check-env names, then octo-dist probe again",
            )
        )
    validate = facts.get("validate", {})
    if validate.get("exit"):
        last = (str(validate.get("tail", "")).strip().splitlines() or ["no output"])[-1]
        out.append(
            _diff(
                "validate",
                f"octo-dist validate across the nodes failed (exit {validate['exit']}): {last}",
                "every step ok or skipped",
                "the failing step's fix, in probe.txt's validate output",
                MULTI_NODE,
            )
        )
    net = facts.get("outbound", {})
    if net.get("target") and not net.get("reached"):
        out.append(
            _diff(
                "outbound",
                f"{net['target']} not reached ({net.get('error', '')})",
                "compute nodes reach ports 80/443 (ABCI's external-networks page)",
                "make weights on the login node, HF_HUB_OFFLINE=1, and --wandb-mode offline",
            )
        )
    return out


def _quota_differences(facts: Mapping[str, Mapping]) -> List[dict]:
    """A group area (show_quota's ``/groups/...`` row) without room for the smallest fine-tune and its image."""
    out = []
    need = SMALLEST_RUN.need + footprint.IMAGE_BYTES
    for area in facts.get("quota", {}).get("areas") or []:
        if not str(area.get("directory", "")).startswith(GROUP_AREA) or area.get("free", 0) >= need:
            continue
        free, used, limit = (
            savelayout.size_text(area.get(k, 0)) for k in ("free", "used", "limit")
        )
        out.append(
            _diff(
                "quota",
                f"{area['directory']}: {free} free (show_quota: {used} of {limit} used)",
                f"at least {savelayout.size_text(need)} in the group area for the image and "
                f"{SMALLEST_RUN.said}",
                "raise the group area's quota in the ABCI user portal (it starts at 0 TB), or free space there",
            )
        )
    return out


def find_report(save_dir: str, environ: Mapping[str, str], cwd: str) -> Optional[str]:
    """The probe report launch reads: ``$OCTO_DIST_PROBE_REPORT``, else ``SAVE_DIR/probe.json``, else
    ``runs/probe/probe.json`` (octo-dist probe's default), from ``cwd``; None when there is none."""
    given = environ.get(REPORT_ENV)
    if given:
        return os.path.join(cwd, given)
    for path in (os.path.join(save_dir, REPORT), os.path.join(DEFAULT_SAVE_DIR, REPORT)):
        full = os.path.join(cwd, path)
        if os.path.isfile(full):
            return full
    return None


def read_report(path: str) -> Optional[dict]:
    """The probe report at ``path``; None when it cannot be read or is not one."""
    try:
        with open(path, "rb") as f:
            report = json.loads(f.read(REPORT_LIMIT).decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and isinstance(report.get("facts"), dict) else None


def launch_warnings(report: Mapping, path: str, nodes: int) -> List[str]:
    """The report's differences that concern a job of ``nodes`` nodes, one warning line each, naming the report."""
    where = f"the probe job {report.get('job_id', '?')} ({path})"
    return [
        f"{d['fact']}: {where} found {d['found']}; launch assumes {d['expected']}. Fix: {d['fix']}"
        for d in differences(report["facts"], int(report.get("nodes", 1) or 1))
        if nodes > 1 or d["applies"] != MULTI_NODE
    ]


def status_lines(save_dir: str) -> List[str]:
    """What ``octo-dist jobs`` shows of a probe report in ``save_dir``: its job and each difference, or []."""
    path = os.path.join(save_dir, REPORT)
    report = read_report(path)
    if report is None:
        return []
    diffs = differences(report["facts"], int(report.get("nodes", 1) or 1))
    head = (
        f"probe report {path} (job {report.get('job_id', '?')}): {len(diffs) or 'no'} difference(s) from what "
        "launch assumes"
    )
    return [head] + [f"  {d['fact']}: {d['found']}. Fix: {d['fix']}" for d in diffs]
