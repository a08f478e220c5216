"""One device vs all devices of this node: the smoke job run twice through its command line, step times compared.

Weak scaling, as data-parallel training uses it: the per-device batch stays fixed, so the global batch grows with
the devices, and a perfectly scaling node keeps the step time of one device. Efficiency = t(1) / t(N) (the same as
throughput(N) / (N x throughput(1))).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Mapping, Optional, Sequence

from octo_dist.apps.validate.report import FAIL, OK, Step

FORCE_CPU_DEVICES = "--xla_force_host_platform_device_count={n}"


def smoke_command(steps: int, global_batch: int, model: str, record: str) -> list:
    """``python -m octo_dist smoke ...``: the smoke job's own CLI, in this interpreter."""
    return [
        sys.executable,
        "-m",
        "octo_dist",
        "smoke",
        "--steps",
        str(steps),
        "--global-batch",
        str(global_batch),
        "--model",
        model,
        "--wandb-mode",
        "disabled",
        "--record",
        record,
    ]


def run_smoke(
    env: Mapping[str, str], steps: int, global_batch: int, model: str, timeout_s: float
) -> dict:
    """The smoke job's ``--record`` (step time, devices, platform); raises RuntimeError with its output's tail."""
    with tempfile.TemporaryDirectory(prefix="octo-dist-validate-") as tmp:
        record = os.path.join(tmp, "record.json")
        cmd = smoke_command(steps, global_batch, model, record)
        try:
            proc = subprocess.run(
                cmd, env=dict(env), capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"`{' '.join(cmd[1:])}` did not finish within {timeout_s:g} s"
            ) from None
        if proc.returncode != 0 or not os.path.exists(record):
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
            raise RuntimeError(
                f"`{' '.join(cmd[1:])}` exited {proc.returncode}: {' | '.join(tail) or 'no output'}"
            )
        with open(record) as f:
            return json.load(f)


def efficiency(one: Mapping, every: Mapping) -> Optional[float]:
    """t(1 device) / t(N devices) at a fixed per-device batch; None without both step times."""
    t1, tn = one.get("step_time_median_s"), every.get("step_time_median_s")
    if not t1 or not tn:
        return None
    return t1 / tn


def judge(one: Mapping, every: Mapping, min_efficiency: float, judged: bool) -> Step:
    """The scaling step from the two records (pure)."""
    eff = efficiency(one, every)
    n = every.get("devices")
    if eff is None:
        return Step(
            "scaling",
            FAIL,
            "no steady step time in the smoke records (too few steps?)",
            "a median step time from each run",
            "raise --steps (at least 5)",
        )
    t1, tn = one["step_time_median_s"], every["step_time_median_s"]
    found = (
        f"1 {one.get('platform')} device {t1 * 1e3:.1f} ms/step (batch {one.get('global_batch')}), "
        f"{n} devices {tn * 1e3:.1f} ms/step (batch {every.get('global_batch')}): efficiency {eff:.2f}"
    )
    data = {"one": dict(one), "all": dict(every), "efficiency": eff}
    if not judged:
        return Step(
            "scaling",
            OK,
            found + " (CPU devices share one host's cores: shown, not judged)",
            data=data,
        )
    ok = eff >= min_efficiency
    return Step(
        "scaling",
        OK if ok else FAIL,
        found,
        f"efficiency >= {min_efficiency:.2f}",
        ""
        if ok
        else "a node whose GPUs do not scale: check `nvidia-smi topo -m` (NVLink), other jobs on the "
        "node, and `octo-dist check-env --deep`",
        data=data,
    )


def run(
    environ: Mapping[str, str],
    gpus: Sequence[str],
    cpu_devices: int,
    per_device_batch: int,
    steps: int,
    model: str,
    min_efficiency: float,
    timeout_s: float,
) -> Step:
    """On GPUs: GPU ``gpus[0]`` alone vs every GPU. On the CPU: 1 vs ``cpu_devices`` forced host devices."""
    env = dict(environ)
    if gpus:
        one_env = dict(env, CUDA_VISIBLE_DEVICES=gpus[0])
        all_env, n = env, len(gpus)
    else:
        flags = env.get("XLA_FLAGS", "")
        one_env = dict(
            env, JAX_PLATFORMS="cpu", XLA_FLAGS=f"{flags} {FORCE_CPU_DEVICES.format(n=1)}".strip()
        )
        all_env = dict(
            env,
            JAX_PLATFORMS="cpu",
            XLA_FLAGS=f"{flags} {FORCE_CPU_DEVICES.format(n=cpu_devices)}".strip(),
        )
        n = cpu_devices
    try:
        one = run_smoke(one_env, steps, per_device_batch, model, timeout_s)
        every = run_smoke(all_env, steps, per_device_batch * n, model, timeout_s)
    except RuntimeError as e:
        return Step(
            "scaling",
            FAIL,
            str(e),
            "the smoke job runs on this node",
            "octo-dist smoke --steps 5 (read its error)",
        )
    if every.get("devices") != n:
        return Step(
            "scaling",
            FAIL,
            f"the all-device run saw {every.get('devices')} device(s)",
            f"{n} devices",
            "unset CUDA_VISIBLE_DEVICES; check `nvidia-smi -L`",
        )
    return judge(one, every, min_efficiency, judged=bool(gpus))
