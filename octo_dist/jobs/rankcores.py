"""The CPU cores each rank is bound to when ``--cpus-per-rank`` is not given, worked out in one place: the job's
placement (``allocation.placement``), ``--show-defaults`` (``allocation.shown_defaults``) and ``launch --help``
(``options.launch_help``) all call it.
"""

from __future__ import annotations

from typing import Optional

from octo_dist.jobs.schedulers.base import ResourceType


def default_cpus_per_rank(
    rt: Optional[ResourceType], ranks_per_node: int, devices_per_rank: int
) -> int:
    """The cores bound to each rank, for its input pipeline, when ``--cpus-per-rank`` is not given: its GPUs' share
    of the node's cores (rt_HF: 96 cores / 8 GPUs x 1 GPU = 12; 2 GPUs a rank: 24), the ranks spread evenly over
    the sockets. 0 (none bound) without a resource type, whose cores octo-dist does not know, and for one rank per
    node, which has the node's cores to itself (a partial node's cores are the cgroup's)."""
    if rt is None or ranks_per_node == 1:
        return 0
    return rt.cores // rt.gpus * devices_per_rank
