"""A persistent compilation cache shared by every rank of a job (and by later jobs).

Both pinned JAX versions write cache entries from process 0 only, atomically (temp file + rename), so one
directory on a shared filesystem is safe for every rank to read. jax 0.4.20 has only
``compilation_cache.initialize_cache(path)``; 0.4.22 has the ``jax_compilation_cache_dir`` option (and deprecates
the function). On the CPU, JAX caches only with ``--xla_cpu_use_xla_runtime=true`` in XLA_FLAGS.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Optional

log = logging.getLogger(__name__)


def problem(directory: Optional[str]) -> Optional[str]:
    """Why ``directory`` cannot hold the cache ("found; expected. Fix: ..."), checked before start-up; None when it
    can."""
    if not directory or directory.strip().lower() in OFF:
        return None
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)  # the nearest part that exists: it will be created below that
    if os.path.exists(directory) and not os.path.isdir(directory):
        return (
            f"compile cache {directory} is a file; expected a directory (or a path to create). "
            f"Fix: pass another --compile-cache, or move the file away"
        )
    if not os.path.isdir(path):
        return (
            f"compile cache {directory}: {path} is a file; expected directories up to it. "
            f"Fix: pass another --compile-cache"
        )
    return None


OFF = (
    "off",
    "none",
    "no",
    "0",
)  # --compile-cache off / OCTO_DIST_COMPILE_CACHE=off: no cache at all
CPU_RUNTIME_FLAG = "--xla_cpu_use_xla_runtime=true"


def default_directory(platform: str, environ: Mapping[str, str]) -> Optional[str]:
    """Where the cache goes when no ``--compile-cache`` was given: on GPUs, the user's cache directory
    (``$XDG_CACHE_HOME`` or ``~/.cache``, then ``octo-dist/compile-cache``: a home directory every node of a cluster
    shares); on the CPU only where JAX can cache there (XLA_FLAGS holding ``--xla_cpu_use_xla_runtime=true``).

    ``default_directory("gpu", {"HOME": "/home/u"})`` -> ``"/home/u/.cache/octo-dist/compile-cache"``."""
    if platform == "cpu" and CPU_RUNTIME_FLAG not in environ.get("XLA_FLAGS", "").split():
        return None
    base = environ.get("XDG_CACHE_HOME") or (
        os.path.join(environ["HOME"], ".cache") if environ.get("HOME") else None
    )
    return os.path.join(base, "octo-dist", "compile-cache") if base else None


def resolve(given: Optional[str], platform: str, environ: Mapping[str, str]) -> Optional[str]:
    """The cache directory a job uses: ``given`` (the flag, or ``$OCTO_DIST_COMPILE_CACHE``), None for ``off``, or
    the platform's default (:func:`default_directory`)."""
    if given and given.strip().lower() in OFF:
        return None
    return given or default_directory(platform, environ)


def enable(directory: Optional[str], min_compile_secs: float = 1.0) -> Optional[str]:
    """Use ``directory`` (None: off) as JAX's persistent cache; returns it, or None where it cannot be created (a
    cache only saves time: the job goes on without one, saying why)."""
    if not directory:
        return None
    import jax

    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        log.warning(
            "compile cache %s cannot be created (%s); compiling without it. Fix: --compile-cache <a writable "
            "directory>, or --compile-cache off",
            directory,
            e.strerror or e,
        )
        return None
    if "jax_compilation_cache_dir" in jax.config.values:
        jax.config.update("jax_compilation_cache_dir", directory)
    else:
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.initialize_cache(directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_secs)
    log.info(
        "persistent compilation cache: %s (entries compiled in >= %g s)",
        directory,
        min_compile_secs,
    )
    return directory
