"""Run a built image as ``docker run`` would, where no container engine can run one (buildah builds, runc cannot).

``docker run [--read-only] [--user U] IMAGE [CMD...]`` starts the image's ``Entrypoint`` followed by ``CMD...`` or
else its ``Cmd``, as its ``User`` (or ``--user``), in its ``WorkingDir`` (created if missing), with exactly its
``Env`` plus ``HOSTNAME`` and ``HOME`` (from the image's /etc/passwd, ``/`` for a uid it does not list), in new
mount, UTS, network and PID namespaces whose hostname resolves through /etc/hosts. This module reads those fields
from ``buildah inspect`` (pure: :func:`image_config`, :func:`run_spec`) and reproduces the rest with
``unshare`` and ``chroot`` on the image's mounted root filesystem (:func:`run`). What it does not reproduce:
cgroups, seccomp, capabilities dropped for root, and a routed network (the container's eth0 is a veth pair with both
ends inside).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

BUILDAH = ("buildah", "--storage-driver", "vfs")
# Docker's PATH when an image sets none (moby's oci.DefaultPathEnv on Linux).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOSTNAME = "octo-dist-ctr"
# What eth0 holds, as Docker's default bridge gives a container 172.17.0.2.
CONTAINER_ADDR = "172.17.0.2"


@dataclasses.dataclass(frozen=True)
class ImageConfig:
    """The fields of an OCI image configuration that decide what ``docker run`` starts."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    user: str  # "octo", "1000:1000" or "" (root)
    workdir: str  # "/home/octo" or "" (/)
    env: tuple[
        str, ...
    ]  # ("PATH=/opt/octo-dist/venv/bin:/usr/local/sbin:...", "PYTHONNOUSERSITE=1")


def image_config(inspect: Mapping) -> ImageConfig:
    """The run fields of ``buildah inspect --type image`` output (its ``OCIv1.config``)."""
    cfg = (inspect.get("OCIv1") or {}).get("config") or {}
    return ImageConfig(
        entrypoint=tuple(cfg.get("Entrypoint") or ()),
        cmd=tuple(cfg.get("Cmd") or ()),
        user=cfg.get("User") or "",
        workdir=cfg.get("WorkingDir") or "",
        env=tuple(cfg.get("Env") or ()),
    )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One process start, every value decided: what :func:`run` executes in the chroot."""

    argv: tuple[str, ...]
    uid: int
    gid: int
    groups: tuple[int, ...]
    workdir: str
    env: tuple[str, ...]
    read_only: bool = False


def _table(text: str) -> list[list[str]]:
    return [ln.split(":") for ln in text.splitlines() if ln and not ln.startswith("#")]


def resolve_user(user: str, passwd: str, group: str) -> tuple[int, int, tuple[int, ...], str]:
    """``(uid, gid, supplementary gids, home)`` for a Docker ``User`` value, as runc resolves it in the image.

    ``"octo"`` -> ``(1000, 1000, (), "/home/octo")`` from ``octo:x:1000:1000::/home/octo:/bin/bash``; a numeric
    uid the image does not list runs with gid 0 (or the given one) and HOME ``/``.
    """
    name, _, grp = (user or "0").partition(":")
    users = {r[0]: r for r in _table(passwd) if len(r) >= 7}
    by_uid = {r[2]: r for r in users.values()}
    row = users.get(name) or by_uid.get(name)
    if row is None and not name.isdigit():
        raise ValueError(f"unable to find user {name}: no matching entries in passwd file")
    uid = int(row[2]) if row else int(name)
    gid = int(row[3]) if row else 0
    home = row[5] if row else "/"
    groups = {r[0]: r for r in _table(group) if len(r) >= 4}
    if grp:
        g = groups.get(grp)
        if g is None and not grp.isdigit():
            raise ValueError(f"unable to find group {grp}: no matching entries in group file")
        gid = int(g[2]) if g else int(grp)
    extra = ()
    if row:
        extra = tuple(
            int(g[2]) for g in groups.values() if row[0] in g[3].split(",") and int(g[2]) != gid
        )
    return uid, gid, extra, home


def run_spec(
    config: ImageConfig,
    passwd: str,
    group: str,
    command: Sequence[str] = (),
    user: Optional[str] = None,
    read_only: bool = False,
) -> RunSpec:
    """What ``docker run [--read-only] [--user USER] IMAGE [COMMAND...]`` starts, from the image's configuration."""
    argv = config.entrypoint + (tuple(command) or config.cmd)
    if not argv:
        raise ValueError("no command specified: the image has neither Entrypoint nor Cmd")
    uid, gid, groups, home = resolve_user(user if user is not None else config.user, passwd, group)
    env = dict(e.split("=", 1) for e in config.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env["HOSTNAME"] = HOSTNAME
    env.setdefault("HOME", home)
    return RunSpec(
        argv=argv,
        uid=uid,
        gid=gid,
        groups=groups,
        workdir=config.workdir or "/",
        env=tuple(f"{k}={v}" for k, v in env.items()),
        read_only=read_only,
    )


# Run as root inside `unshare --mount --uts --net --pid --fork`: the container's mounts on a private bind of the
# root filesystem, a hostname that resolves, loopback and a dummy eth0, then chroot to the image's user.
SETUP = r"""
set -euo pipefail
root=$1 ro=$2 workdir=$3 userspec=$4 groups=$5; shift 5
mount --make-rprivate /
# The root filesystem bound onto itself: a mount point of its own (for the read-only remount) that needs no
# folder on the host (a mktemp folder would stay behind in /tmp after every run).
mnt=$root
mount --bind "$root" "$mnt"
mkdir -p "$mnt$workdir"
for f in hosts hostname resolv.conf; do [ -e "$mnt/etc/$f" ] || : > "$mnt/etc/$f"; done
mount -t proc proc "$mnt/proc"
mount -t tmpfs -o nosuid,mode=755 tmpfs "$mnt/dev"
for d in null zero full random urandom tty; do : > "$mnt/dev/$d"; mount --bind "/dev/$d" "$mnt/dev/$d"; done
mkdir "$mnt/dev/shm" "$mnt/dev/pts"
mount -t tmpfs -o nosuid,nodev,mode=1777 shm "$mnt/dev/shm"
ln -s /proc/self/fd "$mnt/dev/fd"
mount -t sysfs -o ro sysfs "$mnt/sys"
hostname "$HOSTNAME_"
ip link set lo up
# Docker's eth0 is one end of a veth pair; here both ends stay in the namespace (nothing is routed out).
ip link add eth0 type veth peer name veth0 && ip link set veth0 up
ip addr add "$ADDR_/16" dev eth0 && ip link set eth0 up
printf '127.0.0.1\tlocalhost\n%s\t%s\n' "$ADDR_" "$HOSTNAME_" > "$etc/hosts"
printf '%s\n' "$HOSTNAME_" > "$etc/hostname"
: > "$etc/resolv.conf"
for f in hosts hostname resolv.conf; do mount --bind "$etc/$f" "$mnt/etc/$f"; done
if [ "$ro" = 1 ]; then mount -o remount,bind,ro "$mnt"; fi
exec chroot --userspec="$userspec" ${groups:+--groups="$groups"} "$mnt" /usr/bin/env -i -C "$workdir" "$@"
"""


def setup_argv(rootfs: Path, spec: RunSpec) -> list[str]:
    """The host command that starts ``spec`` in ``rootfs`` (root only: namespaces, mounts, chroot)."""
    return [
        "unshare",
        "--mount",
        "--uts",
        "--net",
        "--pid",
        "--fork",
        "--kill-child",
        "bash",
        "-c",
        SETUP,
        "octo-dist-ctr",
        str(rootfs),
        "1" if spec.read_only else "0",
        spec.workdir,
        f"{spec.uid}:{spec.gid}",
        ",".join(map(str, spec.groups)),
        *spec.env,
        *spec.argv,
    ]


def run(
    rootfs: Path, spec: RunSpec, etc: Path, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Start ``spec`` in the image's ``rootfs`` and wait; ``etc`` is a scratch folder for hosts/hostname."""
    etc.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": DEFAULT_PATH,
        "HOSTNAME_": HOSTNAME,
        "ADDR_": CONTAINER_ADDR,
        "etc": str(etc),
    }
    # Its own session: on a timeout the whole tree (unshare, its PID namespace) is ended, nothing else.
    return subprocess.run(
        setup_argv(rootfs, spec),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )


def inspect(image: str) -> dict:
    """``buildah inspect --type image IMAGE`` as JSON."""
    out = subprocess.run(
        [*BUILDAH, "inspect", "--type", "image", image],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return json.loads(out)


class MountedImage:
    """A working container of ``image`` (``buildah from``) and its root filesystem (``buildah mount``).

    ``name``: a container of that name made earlier from the same image is reused (.ci/run makes it in the
    background: vfs copies every layer, 3 GB, for each container); it is removed on exit either way.
    """

    def __init__(self, image: str, name: str = ""):
        self.image = image
        self.name = name
        self.container = ""
        self.rootfs = Path()

    def _reusable(self) -> bool:
        if not self.name:
            return False
        ctr = subprocess.run(
            [*BUILDAH, "inspect", "--type", "container", self.name],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return (
            ctr.returncode == 0
            and json.loads(ctr.stdout)["FromImageID"] == inspect(self.image)["FromImageID"]
        )

    def __enter__(self) -> "MountedImage":
        run_ = dict(capture_output=True, text=True, check=True, timeout=900)
        if self._reusable():
            self.container = self.name
        else:
            if self.name:
                subprocess.run([*BUILDAH, "rm", self.name], capture_output=True, timeout=300)
            named = ["--name", self.name] if self.name else []
            self.container = subprocess.run(
                [*BUILDAH, "from", "--pull-never", *named, self.image], **run_
            ).stdout.strip()
        self.rootfs = Path(
            subprocess.run([*BUILDAH, "mount", self.container], **run_).stdout.strip()
        )
        return self

    def __exit__(self, *exc) -> None:
        if self.container:
            subprocess.run([*BUILDAH, "rm", self.container], capture_output=True, timeout=300)

    def spec(self, command: Sequence[str] = (), **kw) -> RunSpec:
        """What ``docker run [--user U] [--read-only] IMAGE COMMAND...`` starts (:func:`run_spec`)."""
        passwd, group = (self.rootfs / "etc/passwd", self.rootfs / "etc/group")
        return run_spec(
            image_config(inspect(self.image)),
            passwd.read_text() if passwd.exists() else "",
            group.read_text() if group.exists() else "",
            command,
            **kw,
        )


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse
    import tempfile

    p = argparse.ArgumentParser(
        prog="python -m tests.imagerun",
        description="run a buildah-built image as `docker run` would (root; chroot + namespaces)",
    )
    p.add_argument("--image", required=True)
    p.add_argument("--user", default=None, help="as docker run --user (default: the image's User)")
    p.add_argument("--read-only", action="store_true", help="as docker run --read-only")
    p.add_argument("command", nargs="*", help="after --: replaces the image's Cmd")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "error: tests.imagerun found a non-root user; expected root (namespaces, chroot); fix: sudo make ..."
        )
        return 2
    with MountedImage(a.image) as img, tempfile.TemporaryDirectory() as tmp:
        spec = img.spec(a.command, user=a.user, read_only=a.read_only)
        print(
            "+ docker run"
            + (" --read-only" if a.read_only else "")
            + f" {a.image} "
            + shlex.join(spec.argv),
            flush=True,
        )
        res = run(img.rootfs, spec, Path(tmp))
        print(res.stdout, end="")
        print(res.stderr, end="", file=sys.stderr)
        return res.returncode
