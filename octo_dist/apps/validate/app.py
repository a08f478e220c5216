"""octo-dist validate (make validate-gpu): is this node, and this job, fit for training?

    octo-dist validate                                            # one GPU node: environment + scaling
    mpirun -npernode 8 -hostfile $PBS_NODEFILE octo-dist validate # across nodes: NCCL transport + all-reduce

Without a launcher (one process): check-env --deep (JAX on the GPU backend, cuDNN loaded), then the smoke job
on one GPU and on every GPU of the node at the same per-GPU batch, with the scaling efficiency. Under mpirun
(several processes): every rank's fast check-env and JAX backend, the all-reduce bandwidth of a fixed-size
buffer, and the network NCCL actually chose between hosts (from its NCCL_DEBUG=INFO log, one file per rank).
On the CPU the GPU-only steps are skipped and say so. Rank 0 prints the report; exit 0 when nothing failed, 1
when something did, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Mapping, Optional, Sequence

from octo_dist import EXIT_USAGE, subcommand
from octo_dist.apps.smoke.flags import MODELS  # the scaling step runs smoke: its --model is smoke's
from octo_dist.apps.validate import report
from octo_dist.apps.validate.report import FAIL, OK, SKIP, Step
from octo_dist.jobs import options
from octo_dist.problems import Problem
from octo_dist.runtime import runtime

NCCL_LOG_NAME = "nccl.%h.%p.log"  # NCCL expands %h (host) and %p (pid): one file per rank
HELP = (
    "first run on a GPU node: check-env --deep, 1 GPU vs all GPUs, NCCL across "
    "nodes under mpirun (short report, non-zero on any problem)"
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = subcommand.parser(sub, "validate", HELP, __doc__, main)
    p.add_argument(
        "--profile",
        help="stack profile for check-env (default: $OCTO_DIST_PROFILE, else from the jaxlib build)",
    )
    _add_scaling_options(p)
    p.add_argument(
        "--allreduce-mib",
        type=float,
        default=64.0,
        help="all-reduce buffer per device, MiB (default: %(default)s)",
    )
    p.add_argument(
        "--iterations", type=int, default=20, help="timed all-reduces (default: %(default)s)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds each check-env or smoke subprocess may take (default: %(default)s)",
    )
    p.add_argument(
        "--nccl-log-dir",
        help="keep the NCCL logs here, one per rank (default: a temporary directory, removed)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON (rank 0) (default: text)"
    )
    p.add_argument(
        "--report", help="rank 0 also writes the JSON report to this file (default: none)"
    )
    runtime.argv_options(p)
    return p


def _add_scaling_options(p: argparse.ArgumentParser) -> None:
    """The flags of the 1 GPU vs all GPUs comparison."""
    p.add_argument(
        "--model",
        choices=MODELS,
        default="tiny",
        help="smoke model for the scaling step (default: %(default)s: no octo needed)",
    )
    p.add_argument(
        "--steps", type=int, default=30, help="smoke steps per run, >= 5 (default: %(default)s)"
    )
    p.add_argument(
        "--per-gpu-batch",
        "--per-device-batch",  # its old name: accepted, with a note (launch's name is --per-gpu-batch)
        dest="per_device_batch",
        type=int,
        action=options.Renamed,
        default=8,
        help="examples per device per step; the global batch grows with the devices (default: %(default)s)",
    )
    p.add_argument(
        "--min-efficiency",
        type=float,
        default=0.6,
        help="scaling efficiency t(1 GPU)/t(all GPUs) below which the node fails (default: %(default)s)",
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=0,
        help="on the CPU, run the scaling step with this many forced host devices, shown but not judged "
        "(default: %(default)s: skipped)",
    )


def usage_problems(args) -> list:
    """Flag values refused before anything runs."""
    out = []
    if args.steps < 5:
        out.append(
            f"--steps {args.steps}: expected >= 5 (the first two steps compile; the median needs the rest)"
        )
    if args.per_device_batch < 1:
        out.append(f"--per-gpu-batch {args.per_device_batch}: expected >= 1")
    if not 0 < args.min_efficiency <= 1:
        out.append(f"--min-efficiency {args.min_efficiency}: expected a number in (0, 1]")
    if args.cpu_devices < 0 or args.cpu_devices == 1:
        out.append(f"--cpu-devices {args.cpu_devices}: expected 0 (skip) or >= 2")
    if not args.allreduce_mib > 0:
        out.append(f"--allreduce-mib {args.allreduce_mib}: expected > 0")
    if args.iterations < 1:
        out.append(f"--iterations {args.iterations}: expected >= 1")
    return out


def check_env(args, deep: bool, environ: Mapping[str, str]) -> tuple:
    """``octo-dist check-env [--deep] --json`` in a subprocess: (its JSON or None, the Step)."""
    cmd = (
        [sys.executable, "-m", "octo_dist", "check-env", "--json"]
        + (["--deep"] if deep else [])
        + (["--profile", args.profile] if args.profile else [])
    )
    try:
        proc = subprocess.run(
            cmd, env=dict(environ), capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return None, Step(
            "environment",
            FAIL,
            f"`octo-dist check-env` did not finish within {args.timeout:g} s",
            "a finished check",
            "octo-dist check-env --deep (read where it stops)",
        )
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return None, Step(
            "environment",
            FAIL,
            f"`octo-dist check-env` exited {proc.returncode}: {tail[0]}",
            "a check-env report",
            "octo-dist check-env",
        )
    failures = [c for c in result["checks"] if c["status"] == "fail"]
    deep_check = next((c for c in result["checks"] if c["id"] == "deep.backend"), None)
    found = f"check-env{' --deep' if deep else ''} (profile {result['profile']}): {len(failures)} failure(s)"
    if deep_check:
        found += f"; JAX: {deep_check['found']}"
    if failures:
        shown = "; ".join(f"{c['id']}: {c['found']}" for c in failures[:3])
        return result, Step(
            "environment",
            FAIL,
            f"{found}: {shown}",
            "no failure",
            f"octo-dist check-env{' --deep' if deep else ''} --profile {result['profile']} "
            f"(each failure prints its fix)",
            data={"failures": [c["id"] for c in failures]},
        )
    return result, Step("environment", OK, found)


def architecture_step(result: Optional[Mapping]) -> Step:
    """check-env --deep's ``jaxlib.arch`` and ``deep.jit`` as one step: which profile suits this node's GPUs.

    A jaxlib with only PTX for the GPU still runs (the driver JIT-compiles it), so that is reported, not failed;
    a jaxlib with no code at all for the GPU fails.
    """
    checks = {c["id"]: c for c in (result or {}).get("checks", ())}
    arch, jit = checks.get("jaxlib.arch"), checks.get("deep.jit")
    if arch is None:
        return Step("architecture", SKIP, "no jaxlib.arch check in the report (a cpu profile?)")
    found = arch["found"] + (f"; {jit['found']}" if jit and jit["status"] != "skip" else "")
    if arch["status"] == "skip":
        return Step("architecture", SKIP, found)
    if arch["status"] == "fail":
        return Step("architecture", FAIL, found, arch["expected"], arch["remedy"])
    return Step("architecture", OK, found)


def backend_of(result: Optional[Mapping]) -> str:
    """``"gpu"``/``"cpu"`` from check-env --deep's ``deep.backend`` ("gpu backend, 8 device(s), ..."); "" unknown."""
    for c in (result or {}).get("checks", ()):
        if c["id"] == "deep.backend":
            return c["found"].split(" backend", 1)[0] if " backend" in c["found"] else ""
    return ""


def visible_gpus(environ: Mapping[str, str], listed: Sequence[str]) -> list:
    """The GPU ids a process on this node sees: ``CUDA_VISIBLE_DEVICES`` ("0,1") when set, else every listed one."""
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [
            d.strip() for d in cvd.split(",") if d.strip() and d.strip() not in ("-1", "NoDevFiles")
        ]
    return [str(i) for i in range(len(listed))]


def node(args, environ: Mapping[str, str]) -> tuple:
    """One process on one node: environment, then the scaling comparison."""
    result, env_step = check_env(args, deep=True, environ=environ)
    steps = [env_step, architecture_step(result)]
    backend = backend_of(result)
    profile = (result or {}).get("profile", args.profile or "?")
    steps.append(_scaling_step(args, environ, backend))
    across = "mpirun -npernode <GPUs per node> -hostfile $PBS_NODEFILE octo-dist validate"
    steps.append(
        Step(
            "allreduce",
            SKIP,
            f"one process: the all-reduce bandwidth needs several, run `{across}`",
        )
    )
    steps.append(
        Step(
            "transport", SKIP, f"one process: the NCCL network between nodes shows under `{across}`"
        )
    )
    context = {
        "mode": "node",
        "profile": profile,
        "backend": backend,
        "host": socket.gethostname(),
        "processes": 1,
    }
    return context, steps


def _scaling_step(args, environ: Mapping[str, str], backend: str) -> Step:
    """The 1 GPU vs all GPUs comparison on this node (on forced CPU devices with ``--cpu-devices``), or why it is
    skipped."""
    from octo_dist.apps.validate import scaling
    from octo_dist.envcheck import gpus as gpu_list

    if backend == "gpu":
        ids = visible_gpus(environ, gpu_list.listed(gpu_list.nvidia_smi_list()) or [])
        if len(ids) < 2:
            return Step(
                "scaling", SKIP, f"{len(ids)} GPU visible on this node: nothing to compare with"
            )
        cpu_devices = 0
    elif backend == "cpu" and args.cpu_devices >= 2:
        ids, cpu_devices = [], args.cpu_devices
    else:
        return Step(
            "scaling",
            SKIP,
            f"{backend or 'unknown'} backend: the 1 GPU vs all GPUs comparison needs "
            f"GPUs (--cpu-devices N shows it on forced CPU devices, not judged)",
        )
    return scaling.run(
        environ,
        ids,
        cpu_devices,
        args.per_device_batch,
        args.steps,
        args.model,
        args.min_efficiency,
        args.timeout,
    )


def nccl_environment(log_dir: str) -> dict:
    """What this rank exports before JAX starts so NCCL writes its choices into a file of its own."""
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
        "NCCL_DEBUG_FILE": os.path.join(log_dir, NCCL_LOG_NAME),
    }


def read_nccl_logs(log_dir: str) -> list:
    lines: list = []
    for path in sorted(glob.glob(os.path.join(log_dir, "nccl.*.log"))):
        with open(path, errors="replace") as f:
            lines += f.read().splitlines()
    return lines


def _environment_step(
    records: Sequence[Mapping], hosts: list, platforms: list, gpu_profile: bool
) -> Step:
    """check-env on every rank, and the backend a GPU profile needs."""
    failing = {r["rank"]: r["env_failures"] for r in records if r["env_failures"]}
    found = f"{len(records)} ranks on {len(hosts)} host(s), JAX backend {'/'.join(platforms)}"
    if failing:
        return Step(
            "environment",
            FAIL,
            f"{found}; check-env fails on rank(s) "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(failing.items())),
            "check-env passes on every rank",
            "mpirun ... octo-dist check-env --launch",
        )
    if gpu_profile and platforms != ["gpu"]:
        return Step(
            "environment",
            FAIL,
            f"{found}; a GPU profile on the CPU backend",
            "gpu on every rank",
            "singularity exec --nv ... octo-dist check-env --deep (the cudnn.* checks say why)",
        )
    return Step("environment", OK, f"{found}; check-env ok on every rank")


def across_steps(records: Sequence[Mapping], gpu_profile: bool) -> list:
    """The report of a multi-process run, from every rank's record (pure; the same on every rank)."""
    from octo_dist.apps.validate import nccl_log

    hosts = sorted({r["host"] for r in records})
    platforms = sorted({r["platform"] for r in records})
    steps = [_environment_step(records, hosts, platforms, gpu_profile)]
    bench = [r["allreduce"] for r in records]
    wrong = [r["rank"] for r in records if r["allreduce"]["sum"] != r["allreduce"]["sum_expected"]]
    b0 = bench[0]
    slowest = max(bench, key=lambda b: b["median_s"])
    found = (
        f"{b0['bytes'] / 2**20:g} MiB per device over {b0['devices']} devices: {b0['median_s'] * 1e3:.2f} ms, "
        f"algbw {b0['algbw_gbs']:.2f} GB/s, busbw {b0['busbw_gbs']:.2f} GB/s (rank 0; slowest rank "
        f"{slowest['median_s'] * 1e3:.2f} ms)"
    )
    if wrong:
        steps.append(
            Step(
                "allreduce",
                FAIL,
                f"{found}; wrong sum on rank(s) {wrong}",
                f"{b0['sum_expected']:g}",
                "a broken collective: check the NCCL log (NCCL_DEBUG=INFO)",
            )
        )
    else:
        steps.append(Step("allreduce", OK, found, data={"rank0": b0}))
    if platforms != ["gpu"]:
        steps.append(
            Step(
                "transport",
                SKIP,
                "CPU backend: JAX's CPU collectives go over gloo (TCP), not NCCL; "
                "the NCCL network is checked on GPUs",
            )
        )
    else:
        ok, what, fix = nccl_log.judge({r["rank"]: r["nccl"] for r in records}, len(hosts))
        steps.append(
            Step(
                "transport",
                OK if ok else FAIL,
                what,
                "NCCL over InfiniBand between hosts",
                fix,
                data={"rank0": records[0]["nccl"]},
            )
        )
    steps.append(
        Step(
            "scaling",
            SKIP,
            "under mpirun: run `octo-dist validate` without mpirun on one node for the "
            "1 GPU vs all GPUs comparison",
        )
    )
    return steps


def across(args, environ: Mapping[str, str]) -> int:
    """Every rank: fast check-env, start the runtime with NCCL logging to a file, all-reduce, gather, rank 0 reports."""
    from octo_dist.apps.validate import allreduce, nccl_log
    from octo_dist.runtime import collectives

    result, _ = check_env(args, deep=False, environ=environ)
    if result is None:
        env_failures = ["check-env did not run"]
    else:
        env_failures = sorted(c["id"] for c in result["checks"] if c["status"] == "fail")
    gpu_profile = bool(result and result.get("gpu"))
    log_dir = args.nccl_log_dir or tempfile.mkdtemp(prefix="octo-dist-nccl-")
    os.makedirs(log_dir, exist_ok=True)
    os.environ.update(nccl_environment(log_dir))
    try:
        with runtime.distributed(**runtime.from_args(args)) as rt:
            bench = allreduce.measure(args.allreduce_mib, args.iterations)
            nccl = nccl_log.parse(read_nccl_logs(log_dir)) if rt.platform == "gpu" else None
            records = collectives.allgather_json(
                {
                    "rank": rt.process_index,
                    "host": rt.host,
                    "platform": rt.platform,
                    "env_failures": env_failures,
                    "allreduce": bench,
                    "nccl": nccl,
                }
            )
            steps = across_steps(records, gpu_profile)
            if rt.is_main:
                context = {
                    "mode": "across",
                    "profile": (result or {}).get("profile"),
                    "backend": rt.platform,
                    "host": rt.host,
                    "processes": rt.process_count,
                    "hosts": sorted({r["host"] for r in records}),
                }
                _emit(args, context, steps)
            return report.exit_code(steps)
    finally:
        if not args.nccl_log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)


def _emit(args, context: Mapping, steps: Sequence[Step]) -> None:

    report.write(args.report, context, steps)
    if args.json:
        print(json.dumps(report.as_dict(context, steps), indent=1), flush=True)
    else:
        header = (
            f"octo-dist validate: profile {context['profile']}, {context['processes']} process(es) on "
            f"{', '.join(context.get('hosts') or [context['host']])}, JAX backend {context['backend'] or 'unknown'}"
        )
        print(report.as_text(header, steps), flush=True)


def main(args) -> int:
    from octo_dist import launchers

    problems = usage_problems(args)
    if problems:
        print(f"octo-dist validate: error: {'; '.join(problems)}", file=sys.stderr)
        return EXIT_USAGE
    environ = dict(os.environ)
    try:
        launch = launchers.detect(environ, args.launcher)
    except Problem as e:  # LauncherError: the launcher's variables refused (2)
        print(f"octo-dist validate: error: {e}", file=sys.stderr)
        return e.exit_status
    if launch.world_size > 1:
        return across(args, environ)
    context, steps = node(args, environ)
    _emit(args, context, steps)
    return report.exit_code(steps)
