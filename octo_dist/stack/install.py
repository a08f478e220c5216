"""The install steps that follow the hashed lock: direct wheels, git deps, octo-dist itself.

``containers/install.sh`` (run by ``make env``, the Dockerfile and singularity.def alike) first
installs ``env/locks/<profile>-py<X.Y>.txt`` with ``--require-hashes --no-deps``, then runs
``python -m octo_dist.stack.install`` with the new environment's interpreter for the rest:

1. direct wheels that are not on PyPI (``jaxlib 0.4.20+cuda11.cudnn86`` from JAX's CUDA release
   page), by exact version and URL, without dependencies (the lock already holds them);
2. git-only packages (``octo``, ``dlimp``) at their full-SHA commits. Where their host cannot be
   reached (CI here has no GitHub) they are skipped with a warning, so the rest of the environment
   still works; ``--require-git`` (the images) turns that into a failure;
3. octo-dist itself, editable for a checkout or as a plain install for an image, without deps;
4. ``pip freeze`` into the log, for the build record.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from octo_dist import EXIT_USAGE
from octo_dist.stack import manifest as mf

Runner = Callable[[Sequence[str]], int]


def _run(cmd: Sequence[str]) -> int:
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(list(cmd))


def git_reachable(url: str, timeout: float = 20.0) -> bool:
    """True when ``git ls-remote`` answers for ``url`` (GitHub is unreachable on CI here)."""
    try:
        return (
            subprocess.run(
                ["git", "ls-remote", "--exit-code", url, "HEAD"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
            ).returncode
            == 0
        )
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return False


def pip(python: str) -> list[str]:
    return [
        python,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
    ]


def install_direct(profile: mf.Profile, python: str, run: Runner = _run) -> None:
    for wheel in profile.direct:
        cmd = pip(python) + [f"{wheel.name} @ {wheel.url}"]
        if run(cmd) != 0:
            raise SystemExit(
                f"error: could not install {wheel.name}=={wheel.version} from {wheel.url}\n"
                f"  expected: the wheel reachable at that URL (JAX's CUDA release page: {wheel.find_links})\n"
                f"  fix: on a machine that reaches it, `pip download --no-deps '{wheel.name} @ {wheel.url}'`, "
                f"copy the wheel here and `pip install --no-deps ./<wheel>`"
            )


def install_git(
    manifest: mf.Manifest,
    python: str,
    require: bool,
    run: Runner = _run,
    reachable: Callable[[str], bool] = git_reachable,
) -> list[str]:
    """Install every git dependency; return the names skipped because their host is unreachable."""
    skipped = []
    for dep in manifest.git:
        if not reachable(dep.url):
            msg = (
                f"{dep.name}: {dep.url} is unreachable from here; skipped {dep.pip_spec}. "
                f"octo-dist's engine, smoke job (--model tiny) and checks work without it; "
                f"install it where GitHub is reachable with `make git-deps`."
            )
            if require:
                raise SystemExit("error: " + msg)
            print("warning: " + msg, file=sys.stderr, flush=True)
            skipped.append(dep.name)
            continue
        if run(pip(python) + [dep.pip_spec]) != 0:
            raise SystemExit(
                f"error: pip could not install {dep.pip_spec} (reachable, so see pip's error above)"
            )
    return skipped


def install_self(source: Path, python: str, editable: bool, run: Runner = _run) -> None:
    # setuptools and wheel are in every lock: build without fetching an unhashed build env.
    cmd = (
        pip(python)
        + ["--no-build-isolation"]
        + (["--editable", str(source)] if editable else [str(source)])
    )
    if run(cmd) != 0:
        raise SystemExit(f"error: could not install octo-dist from {source}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m octo_dist.stack.install", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--profile",
        required=True,
        help="profile of env/stack.toml to install (required: cpu, cuda11, ...)",
    )
    parser.add_argument(
        "--manifest", help="env/stack.toml (default: $OCTO_DIST_MANIFEST or the checkout's)"
    )
    parser.add_argument(
        "--source",
        default=str(mf.REPO_ROOT),
        help="octo-dist source tree to install (default: this checkout)",
    )
    parser.add_argument(
        "--editable",
        action="store_true",
        help="editable install (make env) (default: a regular install)",
    )
    parser.add_argument(
        "--no-self",
        action="store_true",
        help="do not install octo-dist itself (default: install it)",
    )
    parser.add_argument(
        "--only-git",
        action="store_true",
        help="only the git dependencies (make git-deps) (default: everything)",
    )
    git = parser.add_mutually_exclusive_group()
    git.add_argument(
        "--skip-git",
        action="store_true",
        help="do not try the git dependencies (default: try, warn when unreachable)",
    )
    git.add_argument(
        "--require-git",
        action="store_true",
        help="fail when a git dependency cannot be installed (default: warn)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    try:
        # Refuses a git dependency pinned to a branch, tag or short SHA: the image build stops here.
        manifest = mf.load_manifest(args.manifest)
        profile = manifest.profile(args.profile)
    except mf.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    python = sys.executable
    if not args.only_git:
        install_direct(profile, python)
    if not args.skip_git:
        install_git(manifest, python, require=args.require_git or args.only_git)
    if not (args.no_self or args.only_git):
        install_self(Path(args.source), python, editable=args.editable)
    print("--- pip freeze ---", flush=True)
    subprocess.call([python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
