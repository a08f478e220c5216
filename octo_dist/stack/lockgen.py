"""Turn env/stack.toml into hashed lock files with ``uv pip compile`` (``make lock``).

One lock per profile and Python version (``env/locks/cpu-py3.11.txt``): exact, marker-free files
that ``pip install --require-hashes --no-deps`` installs as they are. Direct (non-PyPI) wheels such
as ``jaxlib 0.4.20+cuda11.cudnn86`` are resolved at their public version so the lock needs PyPI
alone, then left out of the file; they are installed by URL afterwards. The dev tools get their own
lock (``cpu-py3.11-dev.txt``), constrained by the runtime lock and holding only what it lacks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

from octo_dist import EXIT_FAILED, EXIT_USAGE
from octo_dist.stack import manifest as mf
from octo_dist.stack.lockfile import parse_lock
from octo_dist.problems import Problem

# One profile's resolve for one Python takes under a minute here; a hung index must not hold `make lock` forever.
LOCK_TIMEOUT_S = 1800


class LockError(Problem, RuntimeError):
    """A lock could not be generated (one line, with the fix)."""


DEV_PROFILE = "cpu"


def requirement_lines(requirements: Mapping[str, str]) -> list[str]:
    """``{"scipy": "==1.12.0"}`` -> ``["scipy==1.12.0"]`` (sorted, for stable diffs)."""
    return [f"{name}{spec}" for name, spec in sorted(requirements.items())]


def override_lines(profile: mf.Profile) -> list[str]:
    lines = [f"{o.package}=={o.version}" for o in profile.overrides]
    lines += [f"{w.name}=={w.public_version}" for w in profile.direct]
    return lines


DIRECT_HEADER = "# --- not on PyPI: installed by URL after this file (containers/install.sh) ---"


def direct_trailer(profile: mf.Profile) -> str:
    """Comment block naming each direct wheel: pip skips it, readers and check-env see the pin.

    ``# jaxlib==0.4.20+cuda11.cudnn86 @ https://storage.googleapis.com/...whl``
    """
    lines = ["", DIRECT_HEADER]
    lines += [f"# {w.name}=={w.version} @ {w.url}" for w in profile.direct]
    return "\n".join(lines) + "\n"


def _uv() -> list[str]:
    exe = shutil.which("uv")
    if exe:
        return [exe]
    return [sys.executable, "-m", "uv"]


def compile_lock(
    requirements: Iterable[str],
    output: Path,
    python: str,
    platform: str,
    overrides: Iterable[str] = (),
    constraints: Iterable[str] = (),
    no_emit: Iterable[str] = (),
    exclude_newer: str = "",
) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp, "env-stack.in")
        req.write_text("\n".join(requirements) + "\n")
        cmd = _uv() + [
            # Relative input names keep "# via -r env-stack.in" stable across runs (cwd=tmp).
            "pip",
            "compile",
            req.name,
            "--python-version",
            python,
            "--python-platform",
            platform,
            "--generate-hashes",
            "--no-strip-extras",
            "--index-url",
            "https://pypi.org/simple",
            "--custom-compile-command",
            "make lock",
            "--output-file",
            str(output.resolve()),
            "--quiet",
        ]
        if exclude_newer:
            cmd += ["--exclude-newer", exclude_newer]
        overrides = list(overrides)
        if overrides:
            ov = Path(tmp, "overrides.txt")
            ov.write_text("\n".join(overrides) + "\n")
            cmd += ["--override", ov.name]
        constraints = list(constraints)
        if constraints:
            cs = Path(tmp, "constraints.txt")
            cs.write_text("\n".join(constraints) + "\n")
            cmd += ["--constraint", cs.name]
        for name in no_emit:
            cmd += ["--no-emit-package", name]
        env = dict(os.environ, UV_NATIVE_TLS="1")
        try:
            subprocess.run(cmd, check=True, env=env, cwd=tmp, timeout=LOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise LockError(
                f"uv pip compile for {output.name} did not finish within {LOCK_TIMEOUT_S} s; expected PyPI to "
                f"answer. Fix: check the network (or the proxy: export HTTPS_PROXY=...) and rerun make lock"
            ) from None


def lock_profile(manifest: mf.Manifest, profile: mf.Profile, exclude_newer: str) -> list[Path]:
    written = []
    for python in profile.lock_pythons:
        out = manifest.lock_path(profile.name, python)
        print(f"locking {profile.name} for Python {python} -> {out}", flush=True)
        compile_lock(
            requirement_lines(profile.requirements_for(python)),
            out,
            python=python,
            platform=profile.platform,
            overrides=override_lines(profile),
            no_emit=[w.name for w in profile.direct],
            exclude_newer=exclude_newer,
        )
        if profile.direct:
            with out.open("a") as f:
                f.write(direct_trailer(profile))
        written.append(out)
        if profile.name == DEV_PROFILE and manifest.dev_requirements:
            runtime = parse_lock(out.read_text())
            dev_out = manifest.lock_path(profile.name, python, group="dev")
            print(f"locking dev tools for Python {python} -> {dev_out}", flush=True)
            compile_lock(
                requirement_lines(manifest.dev_requirements),
                dev_out,
                python=python,
                platform=profile.platform,
                constraints=[f"{n}=={p.version}" for n, p in runtime.items()],
                no_emit=sorted(runtime),
                exclude_newer=exclude_newer,
            )
            written.append(dev_out)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="make lock", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile",
        action="append",
        help="lock only this profile (repeatable) (default: every profile)",
    )
    parser.add_argument(
        "--manifest", help="path to env/stack.toml (default: $OCTO_DIST_MANIFEST or the checkout's)"
    )
    args = parser.parse_args(argv)
    try:
        manifest = mf.load_manifest(args.manifest)
        profiles = [manifest.profile(name) for name in args.profile or sorted(manifest.profiles)]
    except mf.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        for profile in profiles:
            lock_profile(manifest, profile, manifest.lock_exclude_newer)
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    return 0
