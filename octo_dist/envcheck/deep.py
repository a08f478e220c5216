"""`--deep`: import jax in a subprocess and see which backend it really ends on."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Mapping, Optional

from octo_dist.stack import manifest as mf
from octo_dist.envcheck.result import FAIL, OK, Check

_PROBE = r"""
import json, jax
out = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()]}
try:
    from jax._src.lib import cuda_versions  # present in CUDA jaxlibs of this era
    if cuda_versions is not None:
        out["cudnn_build"] = cuda_versions.cudnn_build_version()
        out["cudnn_runtime"] = cuda_versions.cudnn_get_version()
except Exception as e:
    out["cudnn_error"] = repr(e)
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
    ok = result["backend"] == want
    return Check(
        "deep.backend",
        OK if ok else FAIL,
        found,
        f"{want} backend",
        ""
        if ok
        else "see the cudnn.* checks above; a CUDA jaxlib that cannot load cuDNN falls back to the CPU",
    )


def run_deep(profile: mf.Profile, environ: Mapping[str, str], timeout: float = 300.0) -> Check:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        env=dict(environ),
        timeout=timeout,
    )
    return judge(parse_probe(proc.stdout), proc.stderr, profile)
