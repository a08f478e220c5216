"""The container definitions (``Dockerfile``, ``singularity.def``, ``singularity-cuda12.def``) checked against
env/stack.toml, on a checkout: the entry point of ``make docker``, ``make sif``, ``make image-defs`` and
``make refresh-digests``.

    python -m octo_dist.stack.imagedefs check            # every definition against env/stack.toml
    python -m octo_dist.stack.imagedefs render           # write env/'s pins into them
    python -m octo_dist.stack.imagedefs refresh-digests  # re-resolve the base digests, render, check

One module per concern, each pure over file text and a :class:`~octo_dist.stack.manifest.Manifest` (tests fabricate
a drifted copy and see it reported): :mod:`.imagecontract` (what every image promises: names, labels, the install
and OS package scripts, the pinned lines and their rendering), :mod:`.dockerfile` (the Dockerfile's targets),
:mod:`.singularitydef` (each GPU profile's definition), :mod:`.digests` (re-resolving base image digests). This one
adds the OS package script's check and runs them all.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional, Sequence

from octo_dist import EXIT_FAILED, EXIT_USAGE
from octo_dist.stack import digests, dockerfile, singularitydef
from octo_dist.stack import imagecontract as ic
from octo_dist.stack import manifest as mf


def check_os_packages(text: str) -> list[ic.Finding]:
    """``containers/os-packages.sh`` installs every InfiniBand package for ``--infiniband``.

    The script holds them as one bash array: ``infiniband=(libibverbs1 ibverbs-providers librdmacm1)``.
    """
    m = re.search(r"^infiniband=\(([^)]*)\)", text, re.M)
    have = m.group(1).split() if m else []
    missing = [p for p in ic.INFINIBAND_PACKAGES if p not in have]
    if not missing:
        return []
    return [
        ic.Finding(
            ic.OS_PACKAGES_SCRIPT,
            f"infiniband=({' '.join(have)})" if m else "no infiniband=(...) array",
            f"every one of {', '.join(ic.INFINIBAND_PACKAGES)}",
            f"infiniband=({' '.join(ic.INFINIBAND_PACKAGES)}) in {ic.OS_PACKAGES_SCRIPT}",
        )
    ]


def check_checkout(
    source: Path = mf.REPO_ROOT, manifest: Optional[mf.Manifest] = None
) -> list[ic.Finding]:
    """The Dockerfile, every GPU profile's Singularity definition and the OS package script of a checkout
    against its env/stack.toml."""
    manifest = manifest or mf.load_manifest(source / "env" / "stack.toml")
    gpu = [p.name for p in manifest.profiles.values() if p.image_base and p.gpu]
    findings = check_os_packages((source / ic.OS_PACKAGES_SCRIPT).read_text())
    findings += dockerfile.check_dockerfile((source / ic.DOCKERFILE).read_text(), manifest)
    for name in gpu:
        path = source / ic.definition_file(name)
        if not path.is_file():
            findings.append(
                ic.Finding(
                    ic.definition_file(name),
                    "no such file",
                    f"a Singularity definition for the {name} profile's image",
                    f"copy {ic.SINGULARITY_DEF} to {ic.definition_file(name)} and change its profile and base image",
                )
            )
            continue
        findings += singularitydef.check_definition(path.read_text(), manifest, name)
    return findings


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m octo_dist.stack.imagedefs",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
    parser.add_argument(
        "command",
        choices=("check", "render", "refresh-digests"),
        help="check: every definition against env/stack.toml; render: write env/'s pins into them "
        "(make image-defs); refresh-digests: re-resolve the base image digests (needs crane or "
        "skopeo), render, then check",
    )
    parser.add_argument(
        "--source", default=str(mf.REPO_ROOT), help="the checkout (default: this one)"
    )
    args = parser.parse_args(argv)
    source = Path(args.source)
    try:
        if args.command == "refresh-digests":
            changes = digests.refresh_digests(source, digests.registry_resolver())
            for old, new in changes.items():
                print(f"{old} -> {new}")
            print(
                f"refresh-digests: {len(changes)} base image digest(s) changed"
                + ("; rebuild the images" if changes else "")
            )
        if args.command == "render":
            changed = ic.render_checkout(source)
            print(f"render: {', '.join(changed) or 'nothing'} rewritten from env/stack.toml")
        findings = check_checkout(source)
    except mf.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except digests.RefreshError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for f in findings:
        print(f"error: {f}", file=sys.stderr)
    if findings:
        print(
            f"{len(findings)} disagreement(s) between the image definitions and env/stack.toml",
            file=sys.stderr,
        )
        return EXIT_FAILED
    names = ", ".join(
        [ic.DOCKERFILE, *ic.definition_files(mf.load_manifest(source / "env" / "stack.toml"))]
    )
    print(f"{names} agree with env/stack.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
