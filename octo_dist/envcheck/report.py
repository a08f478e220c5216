"""Render check results: a table for people, JSON for programs."""

from __future__ import annotations

import json
import platform
import socket
from typing import Mapping, Optional, Sequence

from octo_dist import __version__

from octo_dist.envcheck.result import FAIL, OK, SKIP, WARN, Check

_MARK = {OK: "ok  ", WARN: "WARN", FAIL: "FAIL", SKIP: "skip"}
# The JSON report's layout; bumped when a field changes meaning or disappears (adding one does not).
SCHEMA = 1


def context(gpu: bool, host: Optional[str] = None) -> dict:
    """What every JSON report carries, so a pasted one says where and with what it was made."""
    return {
        "octo_dist_version": __version__,
        "schema": SCHEMA,
        "host": host or socket.gethostname(),
        "python": platform.python_version(),
        "gpu": gpu,
    }


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def as_json(checks: Sequence[Check], profile: str, ctx: Optional[Mapping] = None) -> str:
    """``{"octo_dist_version": "0.1.0", "schema": 1, "host": ..., "python": "3.10.12", "gpu": true,
    "profile": "cuda11", "ok": false, "checks": [...]}``."""
    return json.dumps(
        {
            **(ctx or {}),
            "profile": profile,
            "ok": exit_code(checks) == 0,
            "checks": [c.as_dict() for c in checks],
        },
        indent=2,
    )


def as_table(checks: Sequence[Check], profile: str, verbose: bool = False) -> str:
    """Problems in full (found / expected / fix); passing checks folded into one count unless verbose."""
    lines = [f"octo-dist check-env  profile={profile}"]
    shown = [c for c in checks if verbose or c.status != OK]
    width = max((len(c.id) for c in shown), default=0)
    for c in shown:
        lines.append(f"  {_MARK[c.status]}  {c.id:<{width}}  found: {c.found}")
        if c.status not in (OK, SKIP):
            lines.append(f"        {'':<{width}}  expected: {c.expected}")
            if c.remedy:
                lines.append(f"        {'':<{width}}  fix: {c.remedy}")
    n = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL, SKIP)}
    skipped = f", {n[SKIP]} skipped" if n[SKIP] else ""
    lines.append(f"{n[OK]} ok, {n[WARN]} warning(s), {n[FAIL]} failure(s){skipped}")
    return "\n".join(lines)
