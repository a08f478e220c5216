"""How the ranks split a node: GPUs per node (from ``--gpus-per-node`` or the resource type), ranks per node, GPUs
and CPU cores per rank, decided once from the options; refused in flag words when a GPU would sit idle or the
cores do not exist.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

from octo_dist.jobs import schedulers
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs.flagchecks import JobSpecError, shown_number
from octo_dist.jobs.options import LaunchOptions
from octo_dist.jobs.rankcores import default_cpus_per_rank
from octo_dist.jobs.walltime import format_walltime, parse_walltime


class Placement(NamedTuple):
    """What a node holds and how the ranks split it, decided once from the options and the resource type."""

    gpus_per_node: int
    resource_type: Optional[str]
    rt: Optional[schedulers.base.ResourceType]
    ranks_per_node: int
    devices_per_rank: int
    cpus_per_rank: int


def ranks_and_devices(
    gpus_per_node: int, ranks: Optional[int], devices: Optional[int]
) -> Tuple[int, int]:
    """(ranks per node, GPUs per rank) that use every GPU of a node, from the two options (either may be unset).

    8 GPUs: (None, None) -> (8, 1); (4, None) -> (4, 2); (None, 8) -> (1, 8); (3, None) and (4, 4) are refused:
    a GPU nobody binds sits idle for the whole job while the batch is counted as if it worked.
    """
    # Checked here too: --show-defaults works these out without the options' check (spec.derived_defaults).
    for flag, value, key in (
        ("--devices-per-process", devices, "devices_per_rank"),
        ("--ranks-per-node", ranks, "ranks_per_node"),
    ):
        if value is not None:
            job_settings.check_bound(flag, value, job_settings.BOUNDS[key], flags=True)
    if ranks is not None and ranks > gpus_per_node:
        raise JobSpecError(
            f"--ranks-per-node {shown_number(ranks)} with --gpus-per-node {gpus_per_node}",
            "at most one rank per GPU (JAX binds whole GPUs to a process; two ranks on one GPU fail "
            "or share its memory)",
            f"--ranks-per-node {gpus_per_node}",
        )
    if ranks is None:
        ranks = gpus_per_node // devices if devices and devices <= gpus_per_node else gpus_per_node
    if devices is None:
        devices = gpus_per_node // ranks
    if ranks * devices != gpus_per_node:
        divisors = [r for r in range(1, gpus_per_node + 1) if gpus_per_node % r == 0]
        near = max((r for r in divisors if r <= ranks), default=1)
        raise JobSpecError(
            f"{shown_number(ranks)} rank(s) per node x {shown_number(devices)} GPU(s) per rank "
            f"with --gpus-per-node {gpus_per_node}",
            f"ranks per node x devices per rank = {gpus_per_node}, so every GPU is used",
            f"--ranks-per-node {near} --devices-per-process {gpus_per_node // near}, "
            f"or --ranks-per-node {gpus_per_node} (one GPU each)",
        )
    return ranks, devices


def _gpus_per_node(o: LaunchOptions, sched) -> Tuple[int, Optional[str], Any]:
    """(GPUs per node, resource type, its ResourceType): from --gpus-per-node, or the scheduler's resource type."""
    gpus_per_node = o.gpus_per_node
    if not sched.resource_types:
        if o.resource_type:
            raise JobSpecError(
                f"--resource-type {o.resource_type} for {o.scheduler}",
                f"none: octo-dist knows no {sched.title} resource types (ABCI 3.0's are PBS's)",
                "drop --resource-type and give --gpus-per-node",
            )
        if gpus_per_node is None:
            raise JobSpecError(
                f"{o.scheduler} without --gpus-per-node",
                f"the GPUs of one node ({sched.title} sites differ)",
                "--gpus-per-node 8 (or what your nodes have)",
            )
        return gpus_per_node, None, None
    resource_type = o.chosen_resource_type()
    rt = sched.resource_types.get(resource_type)
    if rt is None:
        known = ", ".join(f"{k} ({v.about})" for k, v in sched.resource_types.items())
        raise JobSpecError(
            f"--resource-type {resource_type!r} for {o.scheduler}",
            f"one of: {known}",
            f"--resource-type {sched.default_resource_type or next(iter(sched.resource_types))}",
        )
    if gpus_per_node is None:
        gpus_per_node = rt.gpus
    elif gpus_per_node > rt.gpus:
        raise JobSpecError(
            f"--gpus-per-node {shown_number(gpus_per_node)} on {resource_type}",
            f"at most {rt.gpus} ({rt.about})",
            f"--gpus-per-node {rt.gpus}",
        )
    return gpus_per_node, resource_type, rt


def site_limits(o: LaunchOptions, resource_type: str, rt: schedulers.base.ResourceType) -> None:
    """The site's own limits for one job of ``rt`` (its nodes and its wall time), refused here as qsub would refuse
    them after the render: ``--nodes 200`` on rt_HF (1 to 128), ``--nodes 2`` on rt_HG (one node),
    ``--walltime 169:00:00`` (168:00:00 at most)."""
    if rt.max_nodes and o.nodes > rt.max_nodes:
        if rt.max_nodes == 1:
            expected = f"1 node: {resource_type} is {rt.about}, and a job of it has one node ({rt.limits_source})"
            fix = (
                f"--nodes 1, or {rt.multi_node_fix} for several nodes"
                if rt.multi_node_fix
                else "--nodes 1"
            )
        else:
            expected = f"1 to {rt.max_nodes} nodes for {resource_type} ({rt.limits_source})"
            fix = f"--nodes {rt.max_nodes} (the most one {resource_type} job may have)"
        raise JobSpecError(f"--nodes {shown_number(o.nodes)} on {resource_type}", expected, fix)
    # A reservation runs as long as it was booked for: the elapsed-time limit is the Spot service's
    if rt.max_walltime_s and not dict(o.site).get("reservation"):
        walltime_s = parse_walltime(o.walltime)
        if walltime_s > rt.max_walltime_s:
            most = format_walltime(rt.max_walltime_s)
            raise JobSpecError(
                f"--walltime {o.walltime} ({walltime_s} s) on {resource_type}",
                f"at most {most} ({rt.max_walltime_s // 3600} hours: {rt.limits_source})",
                f"--walltime {most} and --submit --chain N: each job resumes from the last checkpoint",
            )


def shown_defaults(o: LaunchOptions, gpus: Optional[int], rt, resource_type: Optional[str]) -> dict:
    """What :func:`placement` takes for the ranks, GPUs and cores per rank left unset, for ``--show-defaults``, as
    ``{"cpus_per_rank": (12, "from --resource-type rt_HF")}``; a split the render refuses shows as None."""
    out: dict = {}
    ranks, devices = o.ranks_per_node, o.devices_per_rank
    if gpus:
        try:
            ranks, devices = ranks_and_devices(gpus, ranks, devices)
        except JobSpecError:
            ranks, devices = None, None  # the render refuses them, saying why
    # The reasons use --help's words: "(default: GPUs per node / ranks per node)".
    if o.ranks_per_node is None:
        why = "GPUs per node / --devices-per-process" if o.devices_per_rank else "one per GPU"
        out["ranks_per_node"] = (ranks, why)
    if o.devices_per_rank is None:
        out["devices_per_rank"] = (devices, "GPUs per node / ranks per node")
    if o.cpus_per_rank is None:
        why = (
            f"from --resource-type {resource_type}" if rt else "none bound without a resource type"
        )
        out["cpus_per_rank"] = (default_cpus_per_rank(rt, ranks, devices or 1), why)
    return out


def placement(o: LaunchOptions, sched) -> Placement:
    if o.nodes is None:
        raise JobSpecError(f"{o.scheduler} without --nodes", "the number of nodes", "--nodes 2")
    gpus_per_node, resource_type, rt = _gpus_per_node(o, sched)
    if rt:
        site_limits(o, resource_type, rt)
    ranks_per_node, devices_per_rank = ranks_and_devices(
        gpus_per_node, o.ranks_per_node, o.devices_per_rank
    )
    cpus_per_rank = o.cpus_per_rank
    if cpus_per_rank is None:
        cpus_per_rank = default_cpus_per_rank(rt, ranks_per_node, devices_per_rank)
    # A given count was checked with the options (options.check_bounds); the default is checked here, before use.
    cpus_bound = job_settings.BOUNDS["cpus_per_rank"]
    job_settings.check_bound("--cpus-per-rank", cpus_per_rank, cpus_bound, flags=True)
    if rt and cpus_per_rank * ranks_per_node > rt.cores:
        raise JobSpecError(
            f"--cpus-per-rank {shown_number(cpus_per_rank)} x {ranks_per_node} rank(s) on {resource_type}",
            f"at most {rt.cores} cores ({rt.about})",
            f"--cpus-per-rank {rt.cores // ranks_per_node}",
        )
    if ranks_per_node == 1:
        cpus_per_rank = 0  # one rank per node has the node's CPUs to itself; a partial node's cores are the cgroup's
    return Placement(
        gpus_per_node, resource_type, rt, ranks_per_node, devices_per_rank, cpus_per_rank
    )
