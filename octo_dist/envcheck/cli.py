"""`octo-dist check-env` (also `make check-env`, `scripts/check_env.py`)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Optional, Sequence

EXIT_USAGE = 2


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("check-env", help="check this environment against env/stack.toml (fast, no jax import)",
                       description="Exit 0: nothing fails; 1: something fails; 2: usage error.")
    p.add_argument("--profile", help="cuda11, cpu, ... (default: $OCTO_DIST_PROFILE, else cuda11 when jaxlib is a CUDA build, else cpu)")
    p.add_argument("--manifest", help="env/stack.toml to check against (default: $OCTO_DIST_MANIFEST or the checkout's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--deep", action="store_true", help="also import jax in a subprocess and check the backend it ends on")
    p.add_argument("--verbose", "-v", action="store_true", help="list passing checks too")
    p.set_defaults(func=run)
    return p


def _nvidia_smi() -> Optional[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        return subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run(args: argparse.Namespace) -> int:
    from octo_dist import manifest as mf
    from octo_dist.envcheck import cudnn, installed, report, rules

    try:
        manifest = mf.load_manifest(args.manifest)
    except mf.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    dists = installed.scan()
    name = args.profile or mf.default_profile()
    if not name:
        # No profile named: infer from the jaxlib build ("0.4.20+cuda11.cudnn86" -> cuda11).
        jaxlib = dists.get("jaxlib")
        name = "cuda11" if jaxlib and "+cuda" in jaxlib.version else "cpu"
    try:
        profile = manifest.profile(name)
    except mf.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    python = "%d.%d" % sys.version_info[:2]
    tag = rules.cudnn_tag(dists["jaxlib"].version) if "jaxlib" in dists else None
    probe = cudnn.probe(installed.site_dirs(dists.values()), tag[0] if tag else None) if profile.gpu else (None, None, "")
    checks = rules.run_fast(profile, manifest, python, dists, os.environ, probe, _nvidia_smi() if profile.gpu else None)
    if args.deep:
        from octo_dist.envcheck.deep import run_deep
        checks.append(run_deep(profile, os.environ))
    print(report.as_json(checks, profile.name) if args.json else report.as_table(checks, profile.name, args.verbose))
    return report.exit_code(checks)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_env")
    sub = parser.add_subparsers()
    add_parser(sub)
    return run(parser.parse_args(["check-env", *(argv if argv is not None else sys.argv[1:])]))
