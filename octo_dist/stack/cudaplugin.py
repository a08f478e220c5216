"""JAX's CUDA plugin (jax[cuda12]) on a machine without a GPU: one line from octo-dist, and JAX on the CPU.

PyPI's jaxlib with ``jax-cuda12-plugin`` does not fall back to the CPU by itself, as a CUDA jaxlib did: the plugin's
backend is registered to fail loudly, so the first ``jax.devices()`` on a login node, an image build host or CI
raises ``RuntimeError: Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices`` (jax
0.4.23). Where the machine has no NVIDIA device at all, octo-dist's start-up points JAX at the CPU before any backend
exists and says so once (:func:`cpu_fallback`). Where a device exists, JAX is left to start CUDA and a failure
stays an error (:func:`backend_error`): a GPU node that silently trains on the CPU is the failure check-env exists
to catch. Standard library only; nothing here imports jax.
"""

from __future__ import annotations

import glob
from importlib import metadata
from typing import Callable, Mapping, Optional, Sequence

# The plugin's distribution, whose presence makes PyPI's CPU jaxlib a CUDA install.
PLUGIN_DISTS = ("jax-cuda12-plugin",)
# The device files of the NVIDIA driver's GPUs; JAX's own hint looks for /dev/nvidia0. `docker run --gpus` and
# `singularity --nv` (and singularity's default /dev) bring them into a container.
DEVICE_GLOB = "/dev/nvidia[0-9]*"
_PLATFORM_VARS = ("JAX_PLATFORMS", "JAX_PLATFORM_NAME")


def installed_plugin(
    version: Callable[[str], str] = metadata.version, names: Sequence[str] = PLUGIN_DISTS
) -> Optional[str]:
    """``"jax-cuda12-plugin 0.4.23"`` when a CUDA plugin is installed, else None."""
    for name in names:
        try:
            return f"{name} {version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def gpu_devices(pattern: str = DEVICE_GLOB, find: Callable[[str], list] = glob.glob) -> list[str]:
    """The NVIDIA GPU device files here: ``["/dev/nvidia0", "/dev/nvidia1"]``, ``[]`` without a GPU."""
    return sorted(find(pattern))


def cpu_fallback(
    environ: Mapping[str, str], plugin: Optional[str], devices: Sequence[str]
) -> Optional[str]:
    """The one line to say when JAX is pointed at the CPU, or None to leave JAX as it is.

    Only for an installed plugin, no NVIDIA device here, and no platform chosen by the user (``JAX_PLATFORMS``).
    """
    if plugin is None or devices or any(environ.get(v) for v in _PLATFORM_VARS):
        return None
    return (
        f"no NVIDIA GPU on this machine (no {DEVICE_GLOB}): JAX runs on the CPU, {plugin} stays unused "
        f"(on a GPU node, a container needs --nv / --gpus all; JAX_PLATFORMS=cpu silences this line)"
    )


def backend_error(
    error: BaseException, plugin: Optional[str], devices: Sequence[str]
) -> Optional[str]:
    """One line for JAX's failure to start the plugin's CUDA backend on a machine with GPUs; None for others."""
    text = str(error)
    if plugin is None or "Unable to initialize backend 'cuda'" not in text:
        return None
    cause = text.split(": ", 1)[-1].split(" (you may need", 1)[0].rstrip(". ")
    return (
        f"JAX's CUDA backend ({plugin}) did not start with {len(devices)} NVIDIA device(s) here "
        f"({', '.join(devices) or 'none'}): {cause}. Expected the GPUs through the host's driver (libcuda.so.1, "
        f"a CUDA 12 driver). Fix: octo-dist check-env --deep names the cause; in a container run it with --nv "
        f"(singularity) or --gpus all (docker); JAX_PLATFORMS=cpu runs on the CPU instead"
    )
