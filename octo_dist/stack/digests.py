"""``make refresh-digests``: re-resolve each base image's tag to the digest it points at now (crane or skopeo, where a
registry answers), rewrite env/stack.toml and render the definitions from it."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Optional

from octo_dist.problems import Problem
from octo_dist.stack import imagecontract as ic
from octo_dist.stack import manifest as mf

Resolver = Callable[[str], str]


class RefreshError(Problem, RuntimeError):
    """A digest could not be resolved (no tool, or no registry reachable)."""


def manifest_digest(raw: bytes) -> str:
    """The digest a registry serves a manifest (or index) under: sha256 of its exact bytes."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def registry_resolver(which: Callable[[str], Optional[str]] = shutil.which) -> Resolver:
    """Resolve ``repo:tag`` to the digest of what the tag points at now, with crane or skopeo."""
    crane, skopeo = which("crane"), which("skopeo")
    if not (crane or skopeo):
        raise RefreshError(
            "refresh-digests found neither crane nor skopeo on PATH; expected one of them to ask the registry "
            "which digest each tag in env/stack.toml [images] points at now.\n"
            "  fix: apt-get install skopeo (or install crane), on a machine that reaches the registry, "
            "then `make refresh-digests`"
        )

    def resolve(ref: str) -> str:
        # skopeo: the index (multi-arch manifest list) itself, hashed as served -- the digest `FROM x@...` pulls.
        cmd = [crane, "digest", ref] if crane else [skopeo, "inspect", "--raw", f"docker://{ref}"]
        try:
            res = subprocess.run(cmd, capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise RefreshError(
                f"{' '.join(cmd)} timed out after 120 s; is a registry reachable from here?"
            ) from None
        if res.returncode != 0:
            tail = res.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise RefreshError(
                f"could not resolve {ref}: `{' '.join(cmd)}` exited {res.returncode}: {tail[0]}\n"
                f"  expected: a registry reachable from this machine (no registry is reachable on CI here)\n"
                f"  fix: run `make refresh-digests` where docker.io answers, or set HTTPS_PROXY"
            )
        return res.stdout.decode().strip() if crane else manifest_digest(res.stdout)

    return resolve


def refreshed(manifest: mf.Manifest, resolve: Resolver) -> dict[str, str]:
    """Old digest -> new digest for every base image whose tag now points elsewhere."""
    changes = {}
    for image in manifest.images.values():
        new = resolve(image.tagged)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", new):
            raise RefreshError(
                f"resolving {image.tagged} gave {new!r}; expected 'sha256:' and 64 hex"
            )
        if new != image.digest:
            changes[image.digest] = new
    return changes


def refresh_digests(source: Path, resolve: Resolver) -> dict[str, str]:
    """Re-resolve every base image, rewrite env/stack.toml, render the definitions from it; return the changes."""
    stack = source / "env" / "stack.toml"
    changes = refreshed(mf.load_manifest(stack), resolve)
    text = stack.read_text()
    # Digests are unique strings, so a plain replace is exact (and keeps the file's comments).
    for old, new in changes.items():
        text = text.replace(old, new)
    stack.write_text(text)
    ic.render_checkout(source)
    return changes
