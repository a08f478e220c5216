"""What the ranks run from, decided before the render: the image or the venv, and a venv that cannot run refused.

ABCI 3.0 has no Python the stack installs on (the system ``python3`` is 3.9; the modules are ``python/3.12`` and
``python/3.13``; the stack's locks are for 3.10 and 3.11), so a ``.venv`` cannot be built there and an ABCI job runs
from the image. ``launch pbs`` without ``--image`` and without ``--venv`` therefore takes the image ``make sif``
wrote in the directory it renders from (``octo-dist-cuda12.sif`` for the H200 nodes), and a venv that is here but
cannot run (its interpreter gone: ``bin/python -> /root/.pyenv/versions/3.11.7/bin/python3.11`` copied from another
machine; or a Python the stack has no lock for) is refused at render, not when the job starts after its wait.

Pure over the options and two file-system callables, so tests fabricate directories.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Callable, Optional, Tuple

from octo_dist.jobs import imagefit, schedulers
from octo_dist.jobs.options import LaunchOptions

# The Pythons the stack has locks for (env/locks/*-py3.10.txt, *-py3.11.txt).
STACK_PYTHONS = ("3.10", "3.11")
# pyvenv.cfg: "version = 3.11.7" (venv), "version_info = 3.11.7" (uv, virtualenv)
VERSION_LINE = re.compile(r"^\s*version(?:_info)?\s*=\s*(\d+)\.(\d+)", re.MULTILINE)
DEFAULT_VENV = ".venv"  # LaunchOptions.venv's default


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


def default_image(
    o: LaunchOptions, is_file: Callable[[str], bool] = os.path.isfile
) -> Optional[str]:
    """The image a job of a scheduler whose site runs from images (ABCI's PBS) takes when neither ``--image`` nor
    ``--venv`` is given: ``make sif``'s file in the directory rendered from (``octo-dist-cuda12.sif`` for rt_HF),
    absolute; None when there is none, or another choice was made."""
    sched = schedulers.get(o.scheduler)
    if o.image or o.venv != DEFAULT_VENV or not sched.runs_from_image:
        return None
    name = f"octo-dist-{imagefit.needed_profile(o.chosen_resource_type())}.sif"
    return os.path.abspath(name) if is_file(name) else None


def with_default_image(o: LaunchOptions, **kw) -> Tuple[LaunchOptions, str]:
    """(the options with :func:`default_image` as ``--image``, a note saying so); the options as given and ""
    when there is no default image."""
    image = default_image(o, **kw)
    if image is None:
        return o, ""
    why = schedulers.get(o.scheduler).runs_from_image
    note = (
        f"--image {image}: the image make sif wrote here, taken by default ({why}: the jobs run from the "
        "image); --venv PATH runs from an environment instead"
    )
    return dataclasses.replace(o, image=image), note


def venv_refusal(
    venv: str,
    read: Callable[[str], Optional[str]] = _read,
    exists: Callable[[str], bool] = os.path.exists,
    is_link: Callable[[str], bool] = os.path.islink,
) -> Optional[Tuple[str, str, str]]:
    """(found, expected, fix) for a venv that is here but cannot run a rank: its ``bin/python`` link does not
    resolve (the interpreter it was made from is not on this machine), or it is a Python the stack has no lock for
    (``version = 3.9.18``). None when it runs, or when there is no venv here (it may exist only on the cluster:
    a warning's business)."""
    if not exists(venv):
        return None
    python = os.path.join(venv, "bin", "python")
    cfg = read(os.path.join(venv, "pyvenv.cfg"))
    fix = (
        "--image FILE.sif (on ABCI 3.0: make sif PROFILE=cuda12 on a compute node; no Python there builds a "
        "venv), or make env on a machine with Python 3.10 or 3.11 and --venv PATH"
    )
    if is_link(python) and not exists(
        python
    ):  # a venv's python is a link to the Python it was made from
        home = ""
        if cfg:
            m = re.search(r"^\s*home\s*=\s*(.+)$", cfg, re.MULTILINE)
            home = f" (it was made from {m.group(1).strip()})" if m else ""
        return (
            f"--venv {venv}: {python} does not run here: its interpreter is missing{home}",
            "an environment whose Python exists where the job runs",
            fix,
        )
    m = VERSION_LINE.search(cfg or "")
    version = f"{m.group(1)}.{m.group(2)}" if m else None
    if version and version not in STACK_PYTHONS:
        return (
            f"--venv {venv}: Python {version} (its pyvenv.cfg)",
            f"Python {' or '.join(STACK_PYTHONS)}, the stack's (env/locks)",
            fix,
        )
    return None
