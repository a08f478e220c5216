"""Which commit of a git-only package (octo, dlimp) this environment runs: the lines a bug report needs most.

``pip install git+URL@SHA`` records the commit in ``direct_url.json`` (PEP 610); ``pip install -e ./octo`` records
only the directory, whose ``.git`` then says the commit; a source tree on PYTHONPATH has no metadata at all, only
its checkout. Each case is read from files alone (no ``git`` command, no import of the package).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Mapping, Optional, Sequence
from urllib.parse import unquote, urlparse

from octo_dist.envcheck.installed import Installed
from octo_dist.stack import manifest as mf

_SHA = re.compile(r"^[0-9a-f]{40}$")
_MAX_REF_BYTES = 1 << 20  # .git/HEAD and packed-refs are small; a bigger file is not a checkout's


def checkout_commit(directory: Path) -> Optional[str]:
    """The commit a git checkout at (or above) ``directory`` has checked out, read from ``.git`` (None: not one).

    ``.git/HEAD`` holds ``ref: refs/heads/main`` (then ``.git/refs/heads/main`` or ``packed-refs`` holds the SHA)
    or a detached SHA; a worktree's ``.git`` is a file ``gitdir: /path/.git/worktrees/x``.
    """
    for d in [directory, *directory.parents]:
        git = d / ".git"
        if git.is_file():
            text = _read(git)
            if text is None or not text.startswith("gitdir:"):
                return None
            git = (d / text.split(":", 1)[1].strip()).resolve()
        if not git.is_dir():
            continue
        head = _read(git / "HEAD")
        if head is None:
            return None
        head = head.strip()
        if _SHA.match(head):
            return head
        ref = head[len("ref:") :].strip() if head.startswith("ref:") else ""
        # A worktree keeps its HEAD but shares refs with the main repository (commondir).
        common = git
        commondir = _read(git / "commondir")
        if commondir:
            common = (git / commondir.strip()).resolve()
        for base in (git, common):
            value = _read(base / ref) if ref else None
            if value and _SHA.match(value.strip()):
                return value.strip()
        packed = _read(common / "packed-refs") or ""
        for line in packed.splitlines():
            sha, _, name = line.partition(" ")
            if name == ref and _SHA.match(sha):
                return sha
        return None
    return None


def _read(path: Path) -> Optional[str]:
    try:
        if path.stat().st_size > _MAX_REF_BYTES:
            return None
        return path.read_text(errors="replace")
    except OSError:
        return None


def describe(dep: mf.GitDep, dist: Optional[Installed], source_dir: Optional[str] = None) -> dict:
    """``{"name": "octo", "pinned": "b14ec77...", "installed": "0.1.0 at b14ec77...", "matches": true}``.

    ``source_dir``: where the package imports from when no distribution is installed (a tree on PYTHONPATH).
    """
    row = {"name": dep.name, "pinned": dep.commit, "installed": None, "matches": False}
    if dist is None:
        if source_dir:
            commit = checkout_commit(Path(source_dir))
            row["installed"] = f"source tree {source_dir} at {commit or 'no git commit found'}"
            row["matches"] = commit == dep.commit
        return row
    direct = dist.direct_url or {}
    commit = (direct.get("vcs_info") or {}).get("commit_id")
    where = ""
    if commit is None and (direct.get("dir_info") is not None or "url" in direct):
        # {"url": "file:///home/u/octo", "dir_info": {"editable": true}}: the checkout says the commit
        url = urlparse(direct.get("url", ""))
        if url.scheme == "file":
            path = unquote(url.path)
            commit = checkout_commit(Path(path))
            where = f" from {path}" + (
                " (editable)" if (direct.get("dir_info") or {}).get("editable") else ""
            )
    row["installed"] = f"{dist.version}{where} at {commit or 'no recorded commit'}"
    row["matches"] = commit == dep.commit
    return row


def rows(
    deps: Sequence[mf.GitDep],
    dists: Mapping[str, Installed],
    source_dirs: Optional[Mapping[str, str]] = None,
) -> list:
    """One :func:`describe` row per git-only package of the manifest."""
    return [
        describe(d, dists.get(mf.canonical_name(d.distribution)), (source_dirs or {}).get(d.name))
        for d in deps
    ]


def source_dirs(deps: Sequence[mf.GitDep]) -> dict:
    """Where each git-only package would import from, found without importing it (top-level find_spec)."""
    import importlib.util

    out = {}
    for d in deps:
        try:
            spec = importlib.util.find_spec(d.name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            out[d.name] = os.path.dirname(os.path.dirname(spec.origin))
    return out
