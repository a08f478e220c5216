"""Load libcudnn the way jaxlib would and ask it its version (ctypes, no jax import)."""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Optional, Sequence


def decode_version(v: int) -> str:
    """``cudnnGetVersion()`` -> dotted version.

    cuDNN 8 encodes major*1000 + minor*100 + patch (8600 -> 8.6.0); cuDNN 9 encodes
    major*10000 + minor*100 + patch (91000 -> 9.10.0, 90101 -> 9.1.1).
    """
    if v >= 90000:
        return f"{v // 10000}.{(v % 10000) // 100}.{v % 100}"
    return f"{v // 1000}.{(v % 1000) // 100}.{v % 100}"


def candidates(site_dirs: Sequence[str], major: Optional[int] = None) -> list[str]:
    """libcudnn.so* shipped by the nvidia-cudnn-cu11 wheel (``<site>/nvidia/cudnn/lib``), then the system's.

    jaxlib opens ``libcudnn.so.<major>`` of the cuDNN it was built with (``cudnn86`` -> ``.so.8``).
    """
    libs = []
    for site in site_dirs:
        libs += sorted(glob.glob(os.path.join(site, "nvidia", "cudnn", "lib", "libcudnn.so*")))
    return libs + ([f"libcudnn.so.{major}"] if major else []) + ["libcudnn.so"]


def probe(
    site_dirs: Sequence[str], major: Optional[int] = None
) -> tuple[Optional[str], Optional[str], str]:
    """Return (library path, decoded version, error). Version None means it could not be loaded/read."""
    errors = []
    for lib in candidates(site_dirs, major):
        try:
            handle = ctypes.CDLL(lib)
        except OSError as e:
            if os.path.sep in lib:
                errors.append(f"{lib}: {e}")
            continue
        try:
            fn = handle.cudnnGetVersion
        except AttributeError:
            errors.append(f"{lib}: loaded, but it exports no cudnnGetVersion")
            continue
        fn.restype = ctypes.c_size_t
        return lib, decode_version(int(fn())), ""
    return (
        None,
        None,
        "; ".join(errors)
        or "no libcudnn found in nvidia/cudnn/lib of any site dir nor on the system",
    )
