"""``octo-dist check-env --launch``: every rank checks itself, rank 0 prints one line per rank and the verdict.

Run under the same launcher as training (``mpirun ... octo-dist check-env --launch``). It proves what the
multi-node runs otherwise find out one failure at a time: every rank sees the same world and coordinator, the
coordinator is reachable, JAX counts every process, ranks per node fit the node's GPUs, every node's environment
passes, and, across hosts with InfiniBand, nothing sends NCCL to TCP sockets (``transport.py``).
"""

from __future__ import annotations

import collections
import json
import socket
from typing import Mapping, Optional, Sequence

from octo_dist.launchers import coordinator as coord_mod
from octo_dist.runtime import runtime
from octo_dist.runtime import startguard
from octo_dist.launchers import Launch
from octo_dist.envcheck import transport
from octo_dist.envcheck.gpus import count as gpus_listed
from octo_dist.envcheck.result import FAIL, Check


def rank_record(
    launch: Launch,
    coordinator: Optional[coord_mod.Coordinator],
    environ: Mapping[str, str],
    checks: Sequence[Check],
    gpus_on_host: Optional[int],
    host: Optional[str] = None,
    transport_facts: Optional[Mapping] = None,
) -> dict:
    """What one rank knows about itself before JAX starts (``transport_facts``: :func:`transport.facts`)."""
    return {
        "host": host or socket.gethostname(),
        "launcher": launch.launcher,
        "rank": launch.rank,
        "world_size": launch.world_size,
        "local_rank": launch.local_rank,
        "local_size": launch.local_size,
        "coordinator": coordinator.address if coordinator else None,
        "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES"),
        "gpus_on_host": gpus_on_host,
        "env_failures": sorted(c.id for c in checks if c.status == FAIL),
        "transport": dict(transport_facts) if transport_facts is not None else None,
    }


def devices_per_rank(mode) -> Optional[int]:
    """The GPUs each rank binds, from ``--devices-per-process``: ``"one"`` -> 1, ``"2"`` -> 2; ``"all"`` -> None
    (every GPU of its host, whatever their number: nothing to compare)."""
    if mode in (None, "one"):
        return 1
    if mode == "all":
        return None
    return int(mode)


def problems(
    records: Sequence[Mapping], gpu_profile: bool, devices: Optional[int] = 1
) -> list[str]:
    """Everything that would make the job fail or silently misbehave; empty when the launch is sound.

    ``devices``: the GPUs each rank binds (:func:`devices_per_rank`); a host's ranks x this must fit its GPUs.
    """
    out = []
    worlds = sorted({r["world_size"] for r in records})
    if len(worlds) > 1:
        out.append(
            f"ranks disagree about the world size: {worlds} (every rank must be started by one launcher)"
        )
    coordinators = sorted({str(r["coordinator"]) for r in records})
    if len(coordinators) > 1:
        out.append(
            f"ranks disagree about the coordinator: {coordinators} "
            f"(export COORDINATOR_ADDRESS to every rank, e.g. mpirun -x COORDINATOR_ADDRESS, or unset it everywhere)"
        )
    ranks = sorted(r["rank"] for r in records)
    if ranks != list(range(len(records))):
        out.append(f"ranks are {ranks}; expected 0..{len(records) - 1}, each once")
    per_host = collections.Counter(r["host"] for r in records)
    if gpu_profile:
        for host, n in sorted(per_host.items()):
            gpus = max((r["gpus_on_host"] or 0) for r in records if r["host"] == host)
            if devices is None:
                if n > 1:
                    out.append(
                        f"{host}: {n} ranks, each binding all {gpus} GPU(s) of the host; expected one "
                        f"rank per host with --devices-per-process all (mpirun -npernode 1)"
                    )
            elif n * devices > gpus:
                out.append(
                    f"{host}: {n} ranks but {gpus} GPU(s) for {devices} GPU(s) each; expected ranks x "
                    f"devices per rank = at most {gpus} (octo-dist launch --ranks-per-node "
                    f"{max(gpus // devices, 1)} --devices-per-process {devices if gpus >= devices else 1})"
                )
    for r in records:
        if r["env_failures"]:
            out.append(
                f"rank {r['rank']} on {r['host']}: check-env fails: {', '.join(r['env_failures'])} "
                f"(run octo-dist check-env there)"
            )
    if gpu_profile:
        out += transport.problems(records)
    return out


def render(
    records: Sequence[Mapping], coordinator: Optional[coord_mod.Coordinator], found: Sequence[str]
) -> str:
    hosts = sorted({r["host"] for r in records})
    first = records[0]
    where = (
        f"{coordinator.address} ({coordinator.source})" if coordinator else "none (single process)"
    )
    lines = [
        f"octo-dist preflight: {len(records)} rank(s) on {len(hosts)} host(s), "
        f"launcher {first['launcher']}, coordinator {where}"
    ]
    for r in sorted(records, key=lambda r: r["rank"]):
        gpus = "-" if r["gpus_on_host"] is None else str(r["gpus_on_host"])
        jax_part = (
            f"  jax: process {r['jax']['process_index']}, {r['jax']['local_devices']} {r['jax']['platform']} device(s)"
            if "jax" in r
            else ""
        )
        lines.append(
            f"  rank {r['rank']:>3}  host {r['host']}  local {r['local_rank']}/{r['local_size']}  "
            f"gpus on host {gpus}  CUDA_VISIBLE_DEVICES={r['cuda_visible_devices'] or '(unset)'}  "
            f"coordinator {r['coordinator'] or '-'}{jax_part}  env: {','.join(r['env_failures']) or 'ok'}"
            f"{_ib_part(r.get('transport'))}"
        )
    lines += [f"  FAIL  {p}" for p in found] or ["  ok    every rank agrees; start-up works"]
    return "\n".join(lines)


def as_json(
    records: Sequence[Mapping],
    coordinator: Optional[coord_mod.Coordinator],
    found: Sequence[str],
    ctx: Optional[Mapping] = None,
) -> str:
    """The preflight for programs: ``{..ctx, "ok": false, "problems": [...], "coordinator": {...}, "ranks": [...]}``."""
    return json.dumps(
        {
            **(ctx or {}),
            "ok": not found,
            "problems": list(found),
            "coordinator": {"address": coordinator.address, "source": coordinator.source}
            if coordinator
            else None,
            "ranks": sorted(records, key=lambda r: r["rank"]),
        },
        indent=1,
        sort_keys=False,
    )


def _ib_part(facts: Optional[Mapping]) -> str:
    if not facts or not facts.get("ib_devices"):
        return ""
    files = facts.get("uverbs")
    ok = not facts.get("verbs_error") and not facts.get("socket_settings") and files != []
    shown = f", {len(files)} uverbs file(s)" if files is not None else ""
    return f"  infiniband: {len(facts['ib_devices'])} HCA(s){shown}, {'verbs ok' if ok else 'NCCL would use sockets'}"


def run(
    launch: Launch,
    environ: Mapping[str, str],
    checks: Sequence[Check],
    gpu_profile: bool,
    smi_output: Optional[str],
    start_options: Mapping,
    sys_root: str = "/",
    json_output: bool = False,
    ctx: Optional[Mapping] = None,
) -> int:
    """On every rank; returns the same exit code everywhere (0 sound, 1 not). Rank 0 alone prints, as a table or
    (``json_output``) as :func:`as_json` with ``ctx`` (version, schema, host, python) on top."""
    from octo_dist.runtime.collectives import allgather_json

    options = dict(start_options)
    devices = devices_per_rank(options.get("devices"))
    c, record, early = _agree(launch, environ, checks, gpu_profile, smi_output, options, sys_root)
    if early is not None:
        found = problems(early, gpu_profile, devices)
        if found:
            if launch.rank == 0:
                _print(early, c, found, ctx, json_output)
            return 1
    with runtime.distributed(coordinator=c, **options) as rt:
        record["jax"] = {
            "process_index": rt.process_index,
            "local_devices": rt.local_device_count,
            "devices": rt.device_count,
            "platform": rt.platform,
        }
        records = allgather_json(record)
        found = problems(records, gpu_profile, devices)
        if rt.is_main:
            _print(records, c, found, ctx, json_output)
        # Every rank returns the same code; jax's shutdown barrier keeps them until rank 0 has printed.
        return 1 if found else 0


def _agree(
    launch: Launch,
    environ: Mapping[str, str],
    checks: Sequence[Check],
    gpu_profile: bool,
    smi_output: Optional[str],
    options: dict,
    sys_root: str,
):
    """Before JAX starts: the coordinator (popped from ``options``), this rank's record, and every rank's records
    when mpi4py can gather them (None without it)."""
    from octo_dist.runtime import mpi

    use_mpi = mpi.allowed(environ)
    # mpi4py's MPI_Init and collectives can block for ever when the ranks disagree (one given another world size):
    # under the start-up watchdog, a stuck rank ends with what it waited for, and an error ends the whole job.
    with startguard.startup_guard(
        launch, runtime.startup_timeout(options.get("timeout_s"), environ)
    ) as dog:
        dog.stage(
            "the coordinator agreement through mpi4py (MPI_Init, broadcast)"
            if use_mpi
            else "the coordinator"
        )
        c = coord_mod.resolve(
            environ,
            launch,
            explicit=options.pop("coordinator", None),
            broadcast=mpi.broadcaster(launch) if use_mpi else None,
        )
        net = transport.facts(sys_root, environ) if gpu_profile else None
        record = rank_record(
            launch, c, environ, checks, gpus_listed(smi_output), transport_facts=net
        )
        dog.stage("comparing every rank's record through mpi4py")
        early = mpi.allgather(record, launch) if use_mpi else None
    return c, record, early


def _print(records, c, found, ctx: Optional[Mapping], json_output: bool) -> None:
    print(as_json(records, c, found, ctx) if json_output else render(records, c, found), flush=True)
