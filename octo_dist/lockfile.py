"""Parse the hashed lock files that ``uv pip compile --generate-hashes`` writes.

A lock entry looks like::

    scipy==1.12.0 \\
        --hash=sha256:0b6b... \\
        --hash=sha256:9e11...
        # via jax

Pure functions over text, so tests can feed them strings.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from octo_dist.manifest import canonical_name

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


@dataclasses.dataclass(frozen=True)
class LockedPin:
    name: str
    version: str
    hashes: tuple[str, ...]


def parse_lock(text: str) -> dict[str, LockedPin]:
    """Lock text -> canonical name -> :class:`LockedPin`."""
    pins: dict[str, LockedPin] = {}
    current = None
    hashes: list[str] = []

    def flush() -> None:
        if current is not None:
            name, version = current
            pins[name] = LockedPin(name, version, tuple(hashes))

    for line in text.splitlines():
        stripped = line.strip()
        m = _PIN.match(line)
        if m:
            flush()
            current = (canonical_name(m.group(1)), m.group(3))
            hashes = []
        hashes.extend(_HASH.findall(stripped))
    flush()
    return pins


_DIRECT = re.compile(r"^# ([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) @ (\S+)$")


def parse_direct(text: str) -> dict[str, tuple[str, str]]:
    """The lock's trailer of non-PyPI wheels -> canonical name -> (version, url)."""
    out = {}
    for line in text.splitlines():
        m = _DIRECT.match(line.strip())
        if m:
            out[canonical_name(m.group(1))] = (m.group(2), m.group(3))
    return out


def unhashed(pins: Mapping[str, LockedPin]) -> list[str]:
    return sorted(name for name, pin in pins.items() if not pin.hashes)
