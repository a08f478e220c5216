"""The checksum record of a checkpoint step, and its verification: pure functions over a step directory.

Orbax 0.4.4 with ``use_ocdbt=False`` keeps no checksum of its own: a zarr chunk that is deleted reads back as
zeros, a flipped byte as garbage or NaN, and both restore "successfully". So once a step is complete on every
process, process 0 hashes every file of it into ``<step>/checksums.json`` (written last, atomically)::

    {"format": 1, "step": 10, "algorithm": "sha256",
     "files": {"state/params.patch.kernel/0.0.0.0": {"size": 1536, "sha256": "9f2c..."}, "meta/metadata": ...}}

:func:`verify` says what is wrong with a step as a phrase (``"state/params.patch.kernel/0.0.0.0 is missing"``), or
None; :mod:`octo_dist.engine.checkpoint` decides from it which step a run resumes from. Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Optional

from octo_dist import savelayout

MANIFEST = savelayout.CHECKSUMS  # "checksums.json", in the step's directory
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


def manifest_of(step_dir: Path) -> Path:
    """``D/10`` -> ``D/10/checksums.json``: the step's record, where savelayout puts it (``checksums_file``)."""
    return Path(savelayout.checksums_file(str(step_dir)))


def recorded_bytes(step_dir: Path) -> Optional[int]:
    """The bytes a verified step's ``checksums.json`` records (its files' sizes), or None when unreadable."""
    try:
        record = json.loads(manifest_of(step_dir).read_text())
        return sum(int(f["size"]) for f in record["files"].values()) or None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def file_digests(step_dir: Path) -> Dict[str, dict]:
    """``{"state/params.x/0.0.0.0": {"size": n, "sha256": hex}, ...}`` for every file under ``step_dir`` but the
    record itself, paths relative to ``step_dir`` with ``/`` separators."""
    return {
        rel: {"size": path.stat().st_size, "sha256": _sha256(path)}
        for rel, path in _files(step_dir)
    }


def write_manifest(step_dir: Path, step: int) -> Path:
    """Hash ``step_dir`` into its ``checksums.json``: written to a temporary name, flushed, then renamed, so the
    record exists only complete and only after every file it covers."""
    record = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "algorithm": "sha256",
        "files": file_digests(step_dir),
    }
    final = manifest_of(step_dir)
    tmp = Path(f"{final}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, indent=0, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    _fsync_dir(step_dir)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except (
        OSError
    ):  # some file systems refuse fsync on a directory; the rename is still ordered after the data
        pass
    finally:
        os.close(fd)


def verify(step_dir: Path, step: Optional[int] = None) -> Optional[str]:
    """None when ``step_dir`` holds exactly the files its record names, with their sizes and checksums; else what
    is wrong, as a phrase: ``"state/params.patch.kernel/0.0.0.0 is missing"``."""
    if not step_dir.is_dir():
        return f"{step_dir} is not a directory"
    manifest = manifest_of(step_dir)
    if not manifest.is_file():
        return (
            f"it has no {MANIFEST} (the save did not finish: the job was killed while writing it, or it was "
            f"written by an octo-dist without checksums)"
        )
    try:
        record = json.loads(manifest.read_text())
        expected = record["files"]
        if record.get("format") != MANIFEST_FORMAT or not isinstance(expected, dict):
            raise ValueError(f"format {record.get('format')!r}, expected {MANIFEST_FORMAT}")
        if step is not None and record.get("step") != step:
            raise ValueError(f"it records step {record.get('step')!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its {MANIFEST} cannot be read ({type(e).__name__}: {e})"
    try:
        found = {rel: path for rel, path in _files(step_dir)}
    except OSError as e:
        return f"it cannot be listed ({e})"
    problems = [f"{rel} is missing" for rel in sorted(set(expected) - set(found))]
    problems += [f"{rel} was not part of the save" for rel in sorted(set(found) - set(expected))]
    for rel in sorted(set(expected) & set(found)):
        want = expected[rel]
        try:
            size = found[rel].stat().st_size
            if size != want["size"]:
                problems.append(
                    f"{rel} is {size} bytes, expected {want['size']} (truncated or overwritten)"
                )
            elif _sha256(found[rel]) != want["sha256"]:
                problems.append(
                    f"{rel} does not match its checksum (its content changed after the save)"
                )
        except OSError as e:
            problems.append(f"{rel} cannot be read ({e.strerror or e})")
    if not problems:
        return None
    more = f" (and {len(problems) - 3} more problems)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def _files(step_dir: Path):
    for path in sorted(step_dir.rglob("*")):
        rel = path.relative_to(step_dir).as_posix()
        if (
            (path.is_file() or path.is_symlink())
            and rel != MANIFEST
            and not rel.startswith(MANIFEST + ".")
        ):
            yield rel, path
