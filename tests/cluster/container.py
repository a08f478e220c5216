"""A ``singularity exec`` stand-in for the simulated cluster: the image's prefix, not the checkout, and only the
host paths Singularity would bind.

    singularity exec [--nv] [--bind SRC[:DST[:ro|rw]],...] [--pwd DIR] IMAGE CMD [ARGS...]

``IMAGE`` is a small text file standing in for a ``.sif`` (``octo-dist-sim-image <dir>``): ``<dir>`` holds what
``singularity.def`` leaves in ``/opt/octo-dist`` (the installed venv, ``env/``, the ``%environment`` script), built
by ``tests/cluster/image.py``. In a private mount namespace this builds a root on a tmpfs with:

* the host's OS directories read-only (``/usr``, ``/etc``, the merged-usr links) standing in for the image's OS,
  and the base interpreter and the pinned packages of the test venv read-only at their own paths (the offline
  image venv reaches them through a ``.pth`` file, as ``tests/test_containers.py`` builds it);
* ``<dir>`` at ``/opt/octo-dist``;
* what SingularityCE binds by default: ``$HOME``, the working directory, ``/tmp``, ``/var/tmp``, ``/dev``,
  ``/proc``, ``/sys``; then every ``--bind``. Nothing else of the host: a scheduler's spool file is invisible.

then ``chroot``s into it and runs the command with the environment Singularity makes: the host's variables
passed through except ``PATH`` (the container's default, extended by the image's ``%environment``),
``SINGULARITYENV_X`` becoming ``X`` (winning over ``%environment``), ``SINGULARITY_CONTAINER``/``SINGULARITY_NAME``
set. ``--nv`` is accepted and binds nothing (no GPU here). ``--record DIR`` (before ``exec``; the cluster's
``singularity`` wrapper passes it) makes every call write the environment its command starts with to
``DIR/<host>-<pid>.env`` (NUL-separated, as ``env -0``): a per-rank file the tests read (``octo-dist job-runtime``,
the job script's own call that writes the image's job runtime, is no rank and writes none).

``--build DIR`` (for ``image.py`` only) binds DIR writable at ``/opt/octo-dist`` without an image file.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
IMAGE_MAGIC = "octo-dist-sim-image"
IMAGE_MOUNT = "/opt/octo-dist"
# SingularityCE's PATH inside a container when the image sets none (the host's PATH is not passed in).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The image's OS: read-only from the host. Merged-usr links (/bin -> usr/bin) are recreated as links.
OS_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# Singularity's default binds besides $HOME and the working directory (bind path = yes in singularity.conf).
SYSTEM_BINDS = ("/dev", "/proc", "/sys", "/tmp", "/var/tmp")
# Where the new root is mounted, inside the private mount namespace only (the host's /mnt is untouched).
ROOT = "/mnt"


class UsageError(Exception):
    pass


def parse(argv: list[str]) -> dict:
    """``exec [--nv] [--bind S[:D[:o]]]... [--pwd D] IMAGE CMD...`` -> a dict; refuses what it does not mimic."""
    if not argv or argv[0] != "exec":
        raise UsageError(f"only 'singularity exec' is simulated; got {argv[:1]}")
    out = {"nv": False, "binds": [], "pwd": None, "build": None}
    args = argv[1:]
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        name, eq, value = flag.partition("=")
        if name == "--nv":
            out["nv"] = True
        elif name in ("--bind", "-B", "--pwd", "--build"):
            if not eq:
                if not args:
                    raise UsageError(f"{name} needs a value")
                value = args.pop(0)
            if name == "--pwd":
                out["pwd"] = value
            elif name == "--build":
                out["build"] = value
            else:
                out["binds"] += [bind_spec(b) for b in value.split(",") if b]
        else:
            raise UsageError(f"option {name} is not simulated")
    if out["build"] is None:
        if len(args) < 2:
            raise UsageError("expected IMAGE CMD [ARGS...]")
        out["image"] = args.pop(0)
    out["command"] = args
    return out


def bind_spec(spec: str) -> tuple[str, str, bool]:
    """``"/data:/d:ro"`` -> ("/data", "/d", read_only); ``"/data"`` -> ("/data", "/data", False)."""
    parts = spec.split(":")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    opts = parts[2] if len(parts) > 2 else "rw"
    return src, dst, opts == "ro"


def image_dir(image: str) -> Path:
    """The directory a fake ``.sif`` names; errors read like Singularity's."""
    try:
        data = Path(image).read_bytes()
        # After a SIF header (what launch checks), or alone.
        data = data[42:] if data[32:41] == b"SIF_MAGIC" else data
        magic, path = data.decode().split(None, 1)
    except (OSError, ValueError):
        raise UsageError(
            f"could not open image {image}: not a simulated image (expected '{IMAGE_MAGIC} DIR')"
        )
    if magic != IMAGE_MAGIC:
        raise UsageError(f"could not open image {image}: not a simulated image")
    return Path(path.strip())


def unshare_mounts() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)} (the simulation needs root)")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def bind(src: str, dst_in_root: str, read_only: bool) -> None:
    target = Path(ROOT + dst_in_root)
    if Path(src).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    mount("--rbind", src, str(target))
    if read_only:
        mount("-o", "remount,bind,ro", str(target))


def build_root(image: Path, writable_image: bool, home: str, cwd: str, binds: list) -> None:
    mount("--make-rprivate", "/")
    mount("-t", "tmpfs", "-o", "mode=755", "sim-root", ROOT)
    for d in OS_DIRS:
        if os.path.islink(d):
            os.symlink(os.readlink(d), ROOT + d)
        elif os.path.isdir(d):
            bind(d, d, read_only=True)
    for d in SYSTEM_BINDS:
        bind(d, d, read_only=False)
    # The interpreter the image venv was made from, and the packages its .pth reaches (see image.py): after the
    # default binds, so that one under /tmp (octo's source, say) is still read-only.
    for d in (
        json.loads((image / "host-paths.json").read_text())
        if (image / "host-paths.json").exists()
        else []
    ):
        bind(d, d, read_only=True)
    bind(str(image), IMAGE_MOUNT, read_only=not writable_image)
    for src in (home, cwd):
        if src and os.path.isdir(src):
            bind(src, src, read_only=False)
    for src, dst, ro in binds:
        if not os.path.exists(src):
            raise UsageError(f"mount source {src} doesn't exist")
        bind(src, dst, ro)


def container_env(host: dict, image: Path) -> dict:
    """Singularity's environment: the host's minus PATH, SINGULARITYENV_X -> X after the image's %environment."""
    env = {k: v for k, v in host.items() if k != "PATH" and not k.startswith("SINGULARITYENV_")}
    env["PATH"] = DEFAULT_PATH
    env["SINGULARITY_CONTAINER"] = env["SINGULARITY_NAME"] = str(image)
    return env


def main(argv: list[str]) -> int:
    record = None
    if argv[:1] == ["--record"]:
        record, argv = argv[1], argv[2:]
    try:
        opts = parse(argv)
        if opts["build"]:
            image, writable, env_script = Path(opts["build"]), True, None
        else:
            image, writable = image_dir(opts["image"]), False
            env_script = IMAGE_MOUNT + "/environment.sh"
            if not (image / "environment.sh").exists():
                raise UsageError(
                    f"image {opts['image']}: {image} holds no environment.sh (rebuild it)"
                )
        home = os.environ.get("HOME", "")
        cwd = os.getcwd()
        unshare_mounts()
        build_root(image, writable, home, cwd, opts["binds"])
    except UsageError as e:
        print(f"FATAL:   {e}", file=sys.stderr)
        return 255
    overrides = {
        k[len("SINGULARITYENV_") :]: v
        for k, v in os.environ.items()
        if k.startswith("SINGULARITYENV_")
    }
    env = container_env(dict(os.environ), Path(opts.get("image") or image))
    os.chroot(ROOT)
    workdir = opts["pwd"] or (cwd if os.path.isdir(cwd) else home or "/")
    os.chdir(workdir)
    # Like /.singularity.d/env/90-environment.sh, then the SINGULARITYENV_ values on top.
    prelude = f". {env_script}; " if env_script else ""
    prelude += "".join(f"export {k}={shlex.quote(v)}; " for k, v in overrides.items())
    # Not a rank: the job script's call that writes the image's job runtime beside the job (render.py).
    if record and opts["command"][:2] != ["octo-dist", "job-runtime"]:
        prelude += f"env -0 > {shlex.quote(record)}/{socket.gethostname()}-$$.env; "
    os.execve(
        "/bin/bash",
        ["/bin/bash", "-c", prelude + 'exec "$@"', "singularity", *opts["command"]],
        env,
    )
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
