"""Whether this process runs in a container, and in which image: for ``octo-dist env`` (a bug report must say
whether the job ran the image's code or a checkout's).

    where(os.environ)                 # {"runtime": "singularity", "image": "/groups/g/octo-dist-cuda12.sif", ...}
    where({}, root="/")               # {"runtime": "none", ...} on a login node

Pure over the environment and a root directory, so the tests fabricate both. What each runtime leaves:

* SingularityCE and Apptainer set ``SINGULARITY_CONTAINER`` / ``APPTAINER_CONTAINER`` to the image
  (``/groups/gxx00000/octo-dist-cuda12.sif``) and ``..._NAME`` to its file name; the image's ``%labels`` are in
  ``/.singularity.d/labels.json`` (``{"org.opencontainers.image.version": "0.1.0", ...}``).
* Docker leaves ``/.dockerenv``; Podman ``/run/.containerenv`` (``image="localhost/octo-dist:cpu"`` among its lines).
* octo-dist's own images set ``OCTO_DIST_PROFILE`` (``cuda12``) and carry ``/opt/octo-dist/REVISION`` (the commit).
"""

from __future__ import annotations

import json
import os
import re
from typing import Mapping, Optional

LABELS_MAX = 64 * 1024  # a labels file is a few hundred bytes; a larger one is not read whole
IMAGE_PREFIX = "/opt/octo-dist"  # where octo-dist's images keep their venv, env/ and REVISION


def _read(path: str, limit: int = LABELS_MAX) -> Optional[str]:
    """The text of a regular file (at most ``limit`` bytes), or None: absent, not a file, unreadable."""
    try:
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return None


def _labels(text: Optional[str]) -> dict:
    """``labels.json``'s string values; {} for anything else (a damaged file must not take the report down)."""
    try:
        data = json.loads(text or "")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def where(environ: Mapping[str, str], root: str = "/") -> dict:
    """What runs this process: ``runtime`` ("singularity", "apptainer", "docker", "podman" or "none"), ``image``
    (the image file or name, "" where unknown), ``labels`` (the image's, where the runtime keeps them), and
    ``octo_dist_image`` (the profile and commit of an octo-dist image, "" outside one)."""
    runtime, image, labels = "none", "", {}
    for name in ("APPTAINER", "SINGULARITY"):  # Apptainer sets both: its own name first
        if environ.get(f"{name}_CONTAINER"):
            runtime = name.lower()
            image = environ[f"{name}_CONTAINER"]
            labels = _labels(_read(os.path.join(root, ".singularity.d", "labels.json")))
            break
    else:
        containerenv = _read(os.path.join(root, "run", ".containerenv"))
        if containerenv is not None:
            runtime = "podman"
            found = re.search(r'^image="([^"]*)"', containerenv, re.M)
            image = found.group(1) if found else ""
        elif os.path.exists(os.path.join(root, ".dockerenv")):
            runtime = "docker"
    revision = (_read(os.path.join(root, IMAGE_PREFIX.lstrip("/"), "REVISION"), 256) or "").strip()
    profile = environ.get("OCTO_DIST_PROFILE", "")
    ours = ""
    if revision or (runtime != "none" and profile):
        ours = f"profile {profile or 'unknown'}, revision {revision or 'unknown'}"
    return {"runtime": runtime, "image": image, "labels": labels, "octo_dist_image": ours}


def as_line(w: Mapping) -> str:
    """``"singularity: /groups/g/octo-dist-cuda12.sif (octo-dist image: profile cuda12, revision 1a2b3c4)"``."""
    if w["runtime"] == "none":
        return "none (not in a container)" + (
            f"; octo-dist image files present ({w['octo_dist_image']})"
            if w["octo_dist_image"]
            else ""
        )
    said = f"{w['runtime']}: {w['image'] or 'image unknown'}"
    version = w["labels"].get("org.opencontainers.image.version")
    if version:
        said += f", version {version}"
    if w["octo_dist_image"]:
        said += f" (octo-dist image: {w['octo_dist_image']})"
    return said
