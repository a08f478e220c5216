"""The GPUs ``nvidia-smi -L`` lists: run once, parsed in one place.

Sample output, one line per GPU::

    GPU 0: NVIDIA H200 (UUID: GPU-5b8e6f7a-...)
    GPU 1: NVIDIA H200 (UUID: GPU-0c1d2e3f-...)

(MIG instances appear as indented ``  MIG 1g.18gb Device 0: ...`` lines under their GPU and are not counted.)
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable, List, Optional


def listed(smi_output: Optional[str]) -> Optional[List[str]]:
    """The ``GPU n: ...`` lines of ``nvidia-smi -L``; None when nvidia-smi did not run."""
    if smi_output is None:
        return None
    return [line for line in smi_output.splitlines() if line.startswith("GPU ")]


def count(smi_output: Optional[str]) -> Optional[int]:
    """How many GPUs ``nvidia-smi -L`` listed; None when it did not run."""
    gpus = listed(smi_output)
    return None if gpus is None else len(gpus)


def nvidia_smi_list(
    which: Callable[[str], Optional[str]] = shutil.which, timeout: float = 30.0
) -> Optional[str]:
    """``nvidia-smi -L``'s stdout; None when nvidia-smi is not on PATH, "" when it fails or hangs."""
    exe = which("nvidia-smi")
    if not exe:
        return None
    try:
        return subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def compute_capability(
    which: Callable[[str], Optional[str]] = shutil.which, timeout: float = 30.0
) -> Optional[str]:
    """``nvidia-smi --query-gpu=compute_cap --format=csv,noheader``'s stdout (``"9.0\\n9.0\\n"`` on an H200 node);
    None when nvidia-smi is missing, fails or is too old for the field (drivers before 510)."""
    exe = which("nvidia-smi")
    if not exe:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None
