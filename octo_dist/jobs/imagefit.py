"""Does ``--image`` suit the GPUs of ``--resource-type``? The image's profile, read from its file name.

A .sif keeps its profile in a label (``io.github.octo-dist.profile``), but only ``singularity inspect`` reads it,
and ``octo-dist launch`` runs on a login node's bare Python, often where the image is not even present
(``--skip-image-check``). What is visible is the name, and the names are ours: ``make sif`` writes
``octo-dist-cuda11.sif`` / ``octo-dist-cuda12.sif``, and the README's paths say ``octo-dist_cuda11.sif``. So the
profile is the ``cpu``/``cuda<N>`` word of the file name (``/groups/gxx00000/octo-dist/octo-dist_cuda11.sif`` ->
``cuda11``), and an image whose name carries none is not judged: a mismatch is refused only where it can be seen.

Pure functions of two strings; the table of architectures is per resource type (ABCI's resource types are in
``schedulers/pbs.py``).
"""

from __future__ import annotations

import os
import re
from typing import Optional

# Resource type -> (GPU, CUDA architecture). ABCI 3.0's H nodes carry H200 (compute capability 9.0).
GPU_ARCH = {
    "rt_HF": ("H200", "sm_90"),
    "rt_HG": ("H200", "sm_90"),
    "rt_F": ("V100", "sm_70"),
    "rt_AF": ("A100", "sm_80"),
}
# "octo-dist_cuda11.sif", "octo-dist-cuda12.sif", "cuda12.sif", "octo-dist.cpu.sif": the profile as a word.
_PROFILE_WORD = re.compile(r"(?:^|[-_.])(cpu|cuda\d+)(?=[-_.]|$)")


# A SIF file (sylabs/sif's global header): a 32-byte launch line ("#!/usr/bin/env run-singularity\n"), then the
# magic "SIF_MAGIC\0" at byte 32. A squashfs image (singularity runs those too) starts with "hsqs".
SIF_MAGIC_OFFSET = 32
SIF_MAGIC = b"SIF_MAGIC"
SQUASHFS_MAGIC = b"hsqs"
HEADER_BYTES = 64


def needed_profile(resource_type: Optional[str]) -> str:
    """The image profile a resource type's GPUs need: ``"rt_HF"`` (H200, sm_90) -> ``"cuda12"``; ``"rt_F"`` (V100)
    -> ``"cuda11"``; unknown (SLURM, Grid Engine) -> ``"cuda12"``, what ``make sif`` builds by default."""
    arch = GPU_ARCH.get(resource_type or "", ("", ""))[1]
    return "cuda11" if arch in ("sm_70",) else "cuda12"


def build_fix(resource_type: Optional[str]) -> str:
    """How to build the image a resource type needs: ``"make sif PROFILE=cuda12 (writes octo-dist-cuda12.sif)"``."""
    profile = needed_profile(resource_type)
    return f"make sif PROFILE={profile} (writes octo-dist-{profile}.sif)"


def header_problem(head: bytes, image: str) -> Optional[str]:
    """Why the first bytes of ``image`` are not an image singularity runs (None when they are):
    ``b""`` -> "is empty"; a text file -> "is not a SIF file (it starts with 'hello')"."""
    if not head:
        return f"--image {image} is empty"
    if head[SIF_MAGIC_OFFSET : SIF_MAGIC_OFFSET + len(SIF_MAGIC)] == SIF_MAGIC or head.startswith(
        SQUASHFS_MAGIC
    ):
        return None
    start = head[:16].decode("ascii", "backslashreplace")
    return f"--image {image} is not a SIF file (it starts with {start!r}, not a SIF header)"


def read_head(path: str) -> Optional[bytes]:
    """The first ``HEADER_BYTES`` of ``path``; None where it cannot be opened here (the caller's existence check
    decides about a missing file; a FIFO is not opened, so nothing blocks)."""
    import stat

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as f:
            return f.read(HEADER_BYTES)
    except OSError:
        return None


def image_profile(image: str) -> Optional[str]:
    """``"/groups/g/octo-dist/octo-dist_cuda11.sif"`` -> ``"cuda11"``; a name without one -> None."""
    name = os.path.basename(image)
    if name.endswith(".sif"):
        name = name[: -len(".sif")]
    found = _PROFILE_WORD.findall(name)
    return found[-1] if len(set(found)) == 1 else None


def check(image: Optional[str], resource_type: Optional[str]) -> tuple:
    """(refusal, warning) for running ``image`` on ``resource_type``'s GPUs; each None or one line.

    A refusal is a triple (found, expected, fix) for ``JobSpecError``: the cpu image on GPU nodes (its JAX never
    uses them). The warning: a ``cuda11`` image on H200 nodes, which runs, at a cost the user should choose.
    """
    profile = image_profile(image) if image else None
    if profile is None or resource_type not in GPU_ARCH:
        return None, None
    gpu, arch = GPU_ARCH[resource_type]
    if profile == "cpu":
        return (
            f"--image {os.path.basename(image)} (the cpu profile) on {resource_type} ({gpu}, {arch})",
            "a GPU image: the cpu profile's JAX runs on the CPU and leaves every GPU idle",
            f"--image octo-dist-cuda12.sif ({build_fix(resource_type)})",
        ), None
    if profile == "cuda11" and arch == "sm_90":
        return None, (
            f"--image {os.path.basename(image)} is the cuda11 profile on {resource_type} ({gpu}, {arch}): "
            "the researchers' reference stack, but CUDA 11.8 with a jaxlib that may carry only PTX for sm_90 "
            "(driver JIT at start-up, no Hopper-tuned kernels); the cuda12 image (make sif PROFILE=cuda12) "
            "targets Hopper. `octo-dist check-env --deep` on a node settles it (jaxlib.arch)"
        )
    return None, None
