"""`--deep`: import jax in a subprocess and see which backend it really ends on, how long the driver takes before
the first kernel runs, and which CUDA architectures jaxlib's binaries carry code for (octo_dist.envcheck.archs)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from octo_dist.stack import manifest as mf
from octo_dist.envcheck import archs
from octo_dist.envcheck.result import FAIL, OK, Check

_PROBE = r"""
import json, jax
out = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
try:
    from jax._src.lib import cuda_versions  # present in CUDA jaxlibs of this era
    if cuda_versions is None:  # PyPI's jaxlib: the CUDA plugin carries the same module (jax[cuda12] 0.4.23)
        import importlib.util
        if importlib.util.find_spec("jax_cuda12_plugin") is not None:
            import jax_cuda12_plugin._versions as cuda_versions
    if cuda_versions is not None:
        out["cudnn_build"] = cuda_versions.cudnn_build_version()
        out["cudnn_runtime"] = cuda_versions.cudnn_get_version()
except Exception as e:
    out["cudnn_error"] = repr(e)
if out["backend"] in ("gpu", "cuda"):
    # The first kernel, timed in three parts (run with CUDA_CACHE_DISABLE=1, so the driver's JIT cache cannot hide
    # a PTX compile): XLA's compile, the first execution (module load + any driver JIT), the same one again.
    # jax.random.bits lowers to jaxlib's own threefry CUDA kernel (the plugin's, from 0.4.23 on PyPI): a kernel
    # from jaxlib's binaries.
    import time
    key = jax.random.PRNGKey(0)
    t0 = time.perf_counter()
    compiled = jax.jit(lambda k: jax.random.bits(k, (1 << 16,))).lower(key).compile()
    t1 = time.perf_counter()
    compiled(key).block_until_ready()
    t2 = time.perf_counter()
    compiled(key).block_until_ready()
    t3 = time.perf_counter()
    out["first_kernel"] = {"compile_s": t1 - t0, "first_run_s": t2 - t1, "steady_run_s": t3 - t2}
print("OCTO_DIST_DEEP " + json.dumps(out))
"""


def parse_probe(stdout: str) -> Optional[dict]:
    for line in stdout.splitlines():
        if line.startswith("OCTO_DIST_DEEP "):
            return json.loads(line[len("OCTO_DIST_DEEP ") :])
    return None


def judge(result: Optional[dict], stderr: str, profile: mf.Profile) -> Check:
    """Pure: a GPU profile that ends on the CPU backend is JAX's silent fallback (a cuDNN it cannot load)."""
    if result is None:
        tail = stderr.strip().splitlines()[-1:] or ["no output"]
        return Check(
            "deep.backend",
            FAIL,
            f"`import jax` failed: {tail[0]}",
            "jax imports",
            f"make env PROFILE={profile.name}",
        )
    found = f"{result['backend']} backend, {len(result['devices'])} device(s)"
    if "cudnn_runtime" in result:
        found += f", cuDNN build {result.get('cudnn_build')} runtime {result['cudnn_runtime']}"
    want = "gpu" if profile.gpu else "cpu"
    # The CUDA plugin's backend may name itself "cuda"; a CUDA jaxlib's is "gpu".
    ok = result["backend"] in (("gpu", "cuda") if profile.gpu else ("cpu",))
    return Check(
        "deep.backend",
        OK if ok else FAIL,
        found,
        f"{want} backend",
        ""
        if ok
        else "see the cudnn.* checks above; a CUDA jaxlib that cannot load cuDNN falls back to the CPU",
    )


def jit_check(result: Optional[dict]) -> Check:
    """``deep.jit`` from the probe: skipped with the reason where no kernel ran on a GPU."""
    if result is None:
        return archs.check_jit(None, "`import jax` failed (see deep.backend)")
    if "first_kernel" not in result:
        return archs.check_jit(
            None, f"JAX runs on the {result['backend']} backend here: no GPU kernel to time"
        )
    return archs.check_jit(result["first_kernel"])


def arch_check(
    site_dirs: Sequence[str], environ: Mapping[str, str], compute_cap: Optional[str]
) -> Check:
    """``jaxlib.arch``: cuobjdump's listing of jaxlib's binaries, judged for the visible GPU (else sm_90).

    ``compute_cap`` is ``nvidia-smi --query-gpu=compute_cap --format=csv,noheader``'s output ("9.0"), None
    without a GPU. Skipped with the reason where cuobjdump or jaxlib's binaries are missing.
    """
    libraries = archs.kernel_libraries(site_dirs)
    if not libraries:
        return archs.check_listing(
            None,
            None,
            [],
            "no JAX CUDA binaries found (jaxlib/xla_extension.so, jax_plugins/xla_cuda12, nvidia/*/lib)",
        )
    exe = archs.cuobjdump_path(environ)
    if exe is None:
        return archs.check_listing(
            None,
            None,
            libraries,
            f"cuobjdump not found on PATH nor in $CUDA_HOME/bin; {archs.CUOBJDUMP_FIX}",
        )
    text, errors = archs.run_cuobjdump(exe, libraries)
    target = archs.target_arch(compute_cap) if compute_cap else None
    return archs.check_listing(archs.parse_listing(text), target, libraries, errors=errors)


def run_deep(
    profile: mf.Profile,
    environ: Mapping[str, str],
    site_dirs: Sequence[str] = (),
    compute_cap: Optional[str] = None,
    timeout: float = 300.0,
) -> list[Check]:
    """``deep.backend``, ``deep.jit`` and, for a GPU profile, ``jaxlib.arch``."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        env=dict(environ, CUDA_CACHE_DISABLE="1"),
        timeout=timeout,
    )
    result = parse_probe(proc.stdout)
    checks = [judge(result, proc.stderr, profile), jit_check(result)]
    if profile.gpu:
        checks.append(arch_check(site_dirs, environ, compute_cap))
    return checks
