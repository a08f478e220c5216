"""A persistent compilation cache shared by every rank of a job (and by later jobs).

Both pinned JAX versions write cache entries from process 0 only, atomically (temp file + rename), so one
directory on a shared filesystem is safe for every rank to read. jax 0.4.20 has only
``compilation_cache.initialize_cache(path)``; 0.4.22 has the ``jax_compilation_cache_dir`` option (and deprecates
the function). On the CPU, JAX caches only with ``--xla_cpu_use_xla_runtime=true`` in XLA_FLAGS.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

log = logging.getLogger(__name__)


def problem(directory: Optional[str]) -> Optional[str]:
    """Why ``directory`` cannot hold the cache ("found; expected. Fix: ..."), checked before start-up; None when it can."""
    if not directory:
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


def enable(directory: Optional[str], min_compile_secs: float = 1.0) -> Optional[str]:
    """Use ``directory`` (None: off) as JAX's persistent cache; returns it."""
    if not directory:
        return None
    import jax

    os.makedirs(directory, exist_ok=True)
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
