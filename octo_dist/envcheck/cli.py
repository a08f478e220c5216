"""octo-dist check-env (also make check-env, scripts/check_env.py): this environment against env/stack.toml.

    octo-dist check-env                  # the installed stack against the profile's pins, without importing jax
    octo-dist check-env --deep --json    # and JAX in a subprocess (its backend, its CUDA archs), as JSON

Exit 0: nothing fails; 1: something fails; 2: usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Optional, Sequence

from octo_dist import subcommand
from octo_dist.envcheck import report
from octo_dist.problems import Problem

HELP = "check this environment against env/stack.toml (fast, no jax import)"


def profile_name(requested: Optional[str], dists: Mapping, environ: Mapping[str, str]) -> str:
    """``--profile``, else ``$OCTO_DIST_PROFILE``, else inferred from the JAX build ("0.4.20+cuda11.cudnn86" ->
    cuda11, PyPI's jaxlib with jax-cuda12-plugin -> cuda12, a CPU wheel alone -> cpu)."""
    from octo_dist.envcheck.installed import versions
    from octo_dist.stack import builds
    from octo_dist.stack import manifest as mf

    if requested or mf.default_profile(environ):
        return requested or mf.default_profile(environ)
    build = builds.jax_build(versions(dists))
    return builds.profile_for(build) if build else "cpu"


def other_stack(requested: str, dists: Mapping) -> Optional[str]:
    """One line when ``--profile`` asks for a GPU stack and the installed JAX is another profile's: every pin would
    fail (59 lines on a cpu venv), while the fix is one: ``"this is the cpu stack (jaxlib 0.4.22); use the cuda12
    image or `make env PROFILE=cuda12`"``. None when the installed JAX is the requested profile's, or has none."""
    from octo_dist.envcheck.installed import versions
    from octo_dist.stack import builds

    build = builds.jax_build(versions(dists))
    if not build:
        return None
    installed = builds.profile_for(build)
    if installed == requested:
        return None
    return (
        f"check-env --profile {requested}: this is the {installed} stack (jaxlib {build}); expected the "
        f"{requested} stack. Fix: use the {requested} image (octo-dist-{requested}.sif) or "
        f"`make env PROFILE={requested}`; -v lists every check"
    )


def _print(text: str) -> None:
    """``print`` that ends quietly when the reader has gone (``check-env --json | head``): no BrokenPipeError
    traceback; stdout is pointed at /dev/null so the interpreter's own flush at exit does not raise again."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def add_parser(sub) -> argparse.ArgumentParser:
    p = subcommand.parser(sub, "check-env", HELP, __doc__, run)
    p.add_argument(
        "--profile",
        help="cuda11, cuda12, cpu, ... (default: $OCTO_DIST_PROFILE, else the JAX build's: cuda11 for jaxlib "
        "+cuda11.cudnn86, cuda12 for jax-cuda12-plugin, else cpu)",
    )
    p.add_argument(
        "--manifest",
        help="env/stack.toml to check against (default: $OCTO_DIST_MANIFEST or the checkout's)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output; with --launch, the per-rank records (default: a table)",
    )
    p.add_argument(
        "--deep",
        action="store_true",
        help="also import jax in a subprocess: the backend it ends on, the driver's time before the first kernel, "
        "and which CUDA architectures jaxlib carries SASS or PTX for (cuobjdump) (default: off)",
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="list passing checks too (default: only problems)",
    )
    p.add_argument(
        "--no-gpu",
        action="store_true",
        help="skip the checks that need a GPU on this machine, reported as skipped (image builds: singularity "
        "%%test) (default: off)",
    )
    p.add_argument(
        "--launch",
        action="store_true",
        help="run under the job's launcher (mpirun/srun): every rank checks itself and starts the distributed "
        "runtime; rank 0 prints one line per rank and fails on a mismatch (default: off)",
    )
    from octo_dist.runtime import runtime

    runtime.argv_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    from octo_dist.stack import manifest as mf
    from octo_dist.envcheck import cudnn, gpus, installed, rules
    from octo_dist.stack import builds

    try:
        manifest = mf.load_manifest(args.manifest)
    except Problem as e:  # ManifestError: the manifest or profile refused (2)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    dists = installed.scan()
    name = profile_name(args.profile, dists, os.environ)
    try:
        profile = manifest.profile(name)
    except Problem as e:  # ManifestError: the manifest or profile refused (2)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    python = "%d.%d" % sys.version_info[:2]
    tag = builds.cudnn_tag(builds.jax_build(installed.versions(dists), profile.cudnn_build))
    probe = (
        cudnn.probe(installed.site_dirs(dists.values()), tag[0] if tag else None)
        if profile.gpu
        else (None, None, "")
    )
    smi = gpus.nvidia_smi_list() if profile.gpu and not args.no_gpu else None
    checks = rules.run_fast(
        profile, manifest, python, dists, os.environ, probe, smi, no_gpu=args.no_gpu
    )
    if args.no_gpu:
        # Shown as skipped with the reason, so a report from a build host says what it did not check.
        checks = [c for c in checks if not c.id.startswith("gpu.")]
        if profile.gpu:
            checks.append(rules.skipped_gpu_checks())
    if args.launch:
        return _launch(args, profile, checks, smi)
    if args.deep:
        from octo_dist.envcheck.deep import run_deep

        compute_cap = gpus.compute_capability() if smi else None
        checks += run_deep(profile, os.environ, installed.site_dirs(dists.values()), compute_cap)
    code = report.exit_code(checks)
    mismatch = other_stack(profile.name, dists) if args.profile and code and not args.json else None
    if mismatch and not args.verbose:
        print(f"error: {mismatch}", file=sys.stderr)
        return code
    _print(
        report.as_json(checks, profile.name, report.context(profile.gpu))
        if args.json
        else report.as_table(checks, profile.name, args.verbose)
    )
    return code


def _launch(args, profile, checks, smi) -> int:
    from octo_dist import launchers
    from octo_dist.envcheck import launch as preflight
    from octo_dist.runtime import ranklog
    from octo_dist.runtime import runtime
    from octo_dist.envcheck.result import FAIL

    try:
        launch = launchers.detect(os.environ, args.launcher)
    except Problem as e:  # LauncherError (2)
        print(f"error: {e}", file=sys.stderr)
        return e.exit_status
    ranklog.setup(launch.rank, launch.world_size, all_ranks=ranklog.all_ranks_requested(os.environ))
    if launch.rank == 0 and any(c.status == FAIL for c in checks) and not args.json:
        print(report.as_table(checks, profile.name, args.verbose))
    try:
        return preflight.run(
            launch,
            os.environ,
            checks,
            profile.gpu and not args.no_gpu,
            smi,
            runtime.from_args(args),
            json_output=args.json,
            ctx=dict(report.context(profile.gpu), profile=profile.name),
        )
    except (
        Problem
    ) as e:  # a launcher or setting refused (2), a start-up that failed or MPI disagreeing (1)
        print(f"octo-dist: error: {e}", file=sys.stderr)
        return e.exit_status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_env")
    sub = parser.add_subparsers()
    add_parser(sub)
    return run(parser.parse_args(["check-env", *(argv if argv is not None else sys.argv[1:])]))
