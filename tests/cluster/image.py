"""The simulated cluster's image: what ``singularity.def`` leaves in ``/opt/octo-dist``, for the cpu profile.

Built the way the definition builds the ``.sif``, inside the ``singularity`` stand-in (``container.py --build``)
so that every path in it is the image's own (``/opt/octo-dist/venv/bin/octo-dist``'s shebang included): the
build context (the ``.dockerignore`` allow-list) copied to ``/opt/octo-dist``, ``containers/install.sh cpu
/opt/octo-dist/venv --skip-git``, then the source tree removed as ``%post`` does, and ``%environment`` written to
``environment.sh`` with the profile set to ``cpu``.

Offline: the venv reaches the test venv's pinned packages through a ``.pth`` file (as in
``tests/test_containers.py``), so pip finds every lock line installed and downloads nothing; octo-dist itself is
installed for real, non-editable, from the copied context. Those packages and the base interpreter are bound
read-only into every container at their own paths (``host-paths.json``).

``octo`` and ``dlimp`` are the lock's git lines, which the real image installs from git and this build skips
(``--skip-git``). Where the test process can import them (installed by hand beside the venv, e.g. on
``PYTHONPATH``), the directories holding them join the overlay and the read-only binds, so the image's venv
imports the same ``octo`` the host does; they are part of the image's key, so the image is rebuilt when they
appear or go. Without them, ``host-paths.json`` and the overlay hold exactly what they held before.

Built once into ``.cluster/`` in the clone (git-ignored) and reused while its inputs are unchanged; a changed
input builds a new one and removes the old.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = REPO / ".cluster"
# What singularity.def's %files copies (and the .dockerignore allow-list lets into a build context).
CONTEXT = ("pyproject.toml", "README.md", "env", "containers", "octo_dist", "scripts")
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / ("python%d.%d" % sys.version_info[:2]))
OVERLAY = "octo-dist-sim-overlay.pth"
# The lock's git-only packages: the real image installs them from git; the simulated one reaches them where the
# test process imports them from, when it can.
GIT_PACKAGES = ("octo", "dlimp")


def git_package_dirs() -> list[str]:
    """The directories that hold ``octo`` and ``dlimp`` where the test process can import both, as real paths
    (``["/opt/src"]`` for ``/opt/src/octo/__init__.py``); empty where either is missing, or where they are in the
    test venv's own packages (already reached)."""
    found = []
    for name in GIT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            return []
        where = list(spec.submodule_search_locations or []) or [spec.origin]
        found.append(os.path.dirname(os.path.realpath(where[0])))
    purelib = os.path.realpath(sysconfig.get_paths()["purelib"])
    return [d for d in dict.fromkeys(found) if d != purelib]


def host_paths() -> list[str]:
    """The base interpreter's prefix, the test venv's packages, then the directories holding octo and dlimp where
    the test process imports them (:func:`git_package_dirs`), as real paths."""
    return [
        os.path.realpath(sys.base_prefix),
        os.path.realpath(sysconfig.get_paths()["purelib"]),
        *git_package_dirs(),
    ]


def _context_files() -> list[Path]:
    out = []
    for name in CONTEXT:
        p = REPO / name
        if p.is_dir():
            out += sorted(
                f
                for f in p.rglob("*")
                if f.is_file()
                and "__pycache__" not in f.parts
                and not any(part.endswith(".egg-info") for part in f.parts)
            )
        else:
            out.append(p)
    return out


def input_key() -> str:
    """Digest of everything the image is made from: the context, the definition, this builder, the host paths."""
    h = hashlib.sha256()
    for f in _context_files() + [
        REPO / "singularity.def",
        HERE / "image.py",
        HERE / "container.py",
    ]:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(json.dumps([sys.version, host_paths()]).encode())
    return h.hexdigest()[:16]


def environment_script() -> str:
    """singularity.def's %environment, for the cpu profile: what the image's 90-environment.sh would hold."""
    sys.path.insert(0, str(REPO))
    from octo_dist.stack import singularitydef

    definition = singularitydef.parse_definition((REPO / "singularity.def").read_text())
    body = singularitydef.shell_body(definition.sections["environment"])
    if "OCTO_DIST_PROFILE=cuda11" not in body:
        raise RuntimeError(
            f"singularity.def's %environment no longer sets OCTO_DIST_PROFILE=cuda11:\n{body}"
        )
    return body.replace("OCTO_DIST_PROFILE=cuda11", "OCTO_DIST_PROFILE=cpu") + "\n"


def build(log=sys.stderr) -> Path:
    """The image directory (reused when up to date); what a fake ``.sif`` names.

    Several pytest processes (the CI's streams) may ask at once: one builds under ``CACHE/build.lock`` while the
    others wait for it and then find its image; one that still finds the image there when it comes to rename its own
    (a builder that never took the lock) drops its copy and uses that one (:func:`install`)."""
    key = input_key()
    dest = CACHE / f"image-{key}"
    if (dest / "environment.sh").is_file():
        return dest
    CACHE.mkdir(exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        if (dest / "environment.sh").is_file():  # built by the process that held the lock before
            return dest
        remove_stale(dest)
        work = CACHE / f"building-{key}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        _assemble(work)
        if install(work, dest):
            print(f"cluster: built the simulated image in {dest}", file=log)
    return dest


def remove_stale(dest: Path) -> None:
    """Beside ``dest``: every other key's image, and what a builder that died left (``building-<key>-<pid>`` of a
    pid gone); never ``dest``, which another process may be using."""
    for old in dest.parent.glob("image-*"):
        if old.name != dest.name:
            shutil.rmtree(old, ignore_errors=True)
    for half in dest.parent.glob("building-*"):
        pid = half.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(half, ignore_errors=True)


def install(work: Path, dest: Path) -> bool:
    """``work`` renamed to ``dest``: True; False when ``dest`` already holds a complete image (another builder's,
    renamed first: the rename fails, dest not empty), whose copy in ``work`` is then removed."""
    try:
        work.rename(dest)
        return True
    except OSError:
        if not (dest / "environment.sh").is_file():
            raise
    shutil.rmtree(work, ignore_errors=True)
    return False


def _assemble(work: Path) -> None:
    """The build context copied into ``work``, ``%post`` run there inside the stand-in, ``environment.sh``."""
    for name in CONTEXT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(
                src, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy(src, work / name)
    (work / "host-paths.json").write_text(json.dumps(host_paths()))
    overlay = " ".join(
        shlex.quote(d) for d in host_paths()[1:]
    )  # the venv's packages; octo's, dlimp's directories
    py_mm = "%d.%d" % sys.version_info[:2]
    post = (
        "set -euo pipefail\n"
        f"{BASE_PYTHON} -m venv --without-pip /opt/octo-dist/venv\n"
        f"printf '%s\\n' {overlay} > /opt/octo-dist/venv/lib/python{py_mm}/site-packages/{OVERLAY}\n"
        f"PYTHON={BASE_PYTHON} /opt/octo-dist/containers/install.sh cpu /opt/octo-dist/venv --skip-git\n"
        "rm -rf /opt/octo-dist/octo_dist /opt/octo-dist/scripts /opt/octo-dist/build /opt/octo-dist/*.egg-info\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8"}
    argv = [BASE_PYTHON, "-I", str(HERE / "container.py"), "exec", "--build", str(work)]
    res = subprocess.run(
        [*argv, "/bin/bash", "-c", post],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if res.returncode != 0:
        raise RuntimeError(
            f"building the simulated image failed (exit {res.returncode}):\n"
            f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
        )
    (work / "environment.sh").write_text(environment_script())


def image_dir_of(sif: Path) -> Path:
    """The image directory a fake ``.sif`` names."""
    return Path(sif.read_text().split(None, 1)[1].strip())


# A SIF file's global header as far as `octo-dist launch --image` reads it: the 32-byte launch line, then the magic.
SIF_HEADER = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0"


def write_sif(path: Path, image: Path) -> Path:
    """A fake ``.sif`` naming the image directory (what ``container.py`` opens), behind a SIF header."""
    path.write_bytes(SIF_HEADER + f"octo-dist-sim-image {image}\n".encode())
    return path


if __name__ == "__main__":
    print(build())
