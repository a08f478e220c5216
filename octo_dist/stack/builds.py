"""What a jaxlib version string says about its build: the one place that decides "is this a CUDA jaxlib".

Samples: ``"0.4.20+cuda11.cudnn86"`` (JAX's CUDA 11 wheel, built against cuDNN 8.6), ``"0.4.22"`` (PyPI's CPU
wheel), ``"0.4.20+rocm5.7"``. From jax 0.4.23 on, CUDA 12 comes from PyPI as a plugin beside PyPI's CPU jaxlib
(``jax-cuda12-plugin`` and ``jax-cuda12-pjrt``): :func:`jax_build` spells such an install the same way
(``"0.4.23+cuda12.cudnn89"``), so every function here answers for both. Pure string functions, standard library
only (the launch and image steps run on a login node's bare Python).
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Tuple

_CUDNN_TAG = re.compile(r"cudnn(\d)(\d+)")
_CUDA_TAG = re.compile(r"^cuda(\d+)")


def local_tag(jaxlib_version: str) -> str:
    """``"0.4.20+cuda11.cudnn86"`` -> ``"cuda11.cudnn86"``; a CPU wheel -> ``""``."""
    return jaxlib_version.partition("+")[2]


def is_cuda_jaxlib(jaxlib_version: str) -> bool:
    """A jaxlib built for CUDA: its local tag starts with ``cuda`` (``0.4.20+cuda11.cudnn86``)."""
    return local_tag(jaxlib_version).startswith("cuda")


def is_gpu_jaxlib(jaxlib_version: str) -> bool:
    """A jaxlib built for a GPU, CUDA or ROCm (``0.4.20+rocm5.7``)."""
    return local_tag(jaxlib_version).startswith(("cuda", "rocm"))


def cudnn_tag(jaxlib_version: str) -> Optional[Tuple[int, int]]:
    """``"0.4.20+cuda11.cudnn86"`` -> ``(8, 6)``: the cuDNN it was built against; a CPU jaxlib -> None."""
    m = _CUDNN_TAG.search(local_tag(jaxlib_version))
    return (int(m.group(1)), int(m.group(2))) if m else None


def cuda_major(jaxlib_version: str) -> Optional[int]:
    """``"0.4.20+cuda12.cudnn89"`` -> ``12``: the CUDA major it was built for; a CPU or ROCm jaxlib -> None."""
    m = _CUDA_TAG.match(local_tag(jaxlib_version))
    return int(m.group(1)) if m else None


def cudnn_wheel(jaxlib_version: str) -> Optional[str]:
    """``"0.4.20+cuda12.cudnn89"`` -> ``"nvidia-cudnn-cu12"``: the PyPI wheel that carries its cuDNN."""
    major = cuda_major(jaxlib_version)
    return f"nvidia-cudnn-cu{major}" if major else None


def profile_for(jaxlib_version: str) -> str:
    """The profile a jaxlib build belongs to: ``"0.4.20+cuda12.cudnn89"`` -> ``"cuda12"``, a CPU wheel -> ``"cpu"``."""
    major = cuda_major(jaxlib_version)
    return f"cuda{major}" if major else "cpu"


_PLUGIN = re.compile(r"^jax-cuda(\d+)-plugin$")


def cuda_plugin(versions: Mapping[str, str]) -> Optional[Tuple[str, int]]:
    """The installed CUDA plugin of PyPI's jaxlib and its CUDA major version:
    ``{"jax-cuda12-plugin": "0.4.23"}`` -> ``("jax-cuda12-plugin", 12)``."""
    for name in sorted(versions):
        m = _PLUGIN.match(name)
        if m:
            return name, int(m.group(1))
    return None


def jax_build(versions: Mapping[str, str], cudnn_build: str = "") -> str:
    """The build of the installed JAX, spelled as a jaxlib version (canonical names -> versions in, "" without jaxlib).

    A CUDA jaxlib says it itself (``"0.4.20+cuda11.cudnn86"``). PyPI's jaxlib with ``jax-cuda12-plugin`` is the
    plugin's CUDA build: ``"0.4.23+cuda12.cudnn89"`` where ``cudnn_build`` (the manifest's, ``"8.9"``) names the
    cuDNN it was built against, ``"0.4.23+cuda12"`` where nothing does. Anything else is jaxlib's own version.
    """
    jaxlib = versions.get("jaxlib", "")
    plugin = cuda_plugin(versions)
    if not jaxlib or local_tag(jaxlib) or plugin is None:
        return jaxlib
    name, major = plugin
    cudnn = f".cudnn{cudnn_build.replace('.', '')}" if cudnn_build else ""
    return f"{versions[name]}+cuda{major}{cudnn}"
