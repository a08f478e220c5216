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

from octo_dist.stack.manifest import canonical_name

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


def lock_mismatches(
    requirements: Mapping[str, str],
    lock_text: str,
    overrides: Mapping[str, str] = {},
    direct: Mapping[str, tuple[str, str]] = {},
) -> list[str]:
    """Every way a lock disagrees with the manifest, as readable lines (empty when it agrees).

    Args:
        requirements: canonical name -> specifier from the manifest (``{"scipy": "==1.12.0"}``).
        lock_text: the lock file's text.
        overrides: canonical name -> version the lock must hold regardless of other requirements.
        direct: canonical name -> (version, url) of non-PyPI wheels, expected in the lock's trailer
            and absent from its hashed part.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    pins = parse_lock(lock_text)
    trailer = parse_direct(lock_text)
    problems = []
    for name, spec in sorted(requirements.items()):
        if name in direct:
            continue
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{name}: required {spec} by env/stack.toml, missing from the lock")
        elif not SpecifierSet(spec).contains(Version(pin.version), prereleases=True):
            problems.append(f"{name}: lock has {pin.version}, env/stack.toml requires {spec}")
    for name, version in sorted(overrides.items()):
        pin = pins.get(name)
        if pin is None or pin.version != version:
            found = pin.version if pin else "nothing"
            problems.append(f"{name}: override to {version} in env/stack.toml, lock has {found}")
    for name, (version, url) in sorted(direct.items()):
        if name in pins:
            problems.append(
                f"{name}: a non-PyPI wheel, yet the hashed part of the lock pins {pins[name].version}"
            )
        if trailer.get(name) != (version, url):
            problems.append(
                f"{name}: expected trailer line '# {name}=={version} @ {url}', found {trailer.get(name)}"
            )
    for name in unhashed(pins):
        problems.append(f"{name}: no --hash in the lock (pip --require-hashes would refuse it)")
    if problems:
        problems.append("fix: make lock   (regenerates env/locks/ from env/stack.toml)")
    return problems
