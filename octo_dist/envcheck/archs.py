"""Which CUDA architectures the installed jaxlib (or its CUDA plugin) carries code for: SASS or PTX (JIT-compiled).

A CUDA library embeds, per kernel, machine code (SASS, in ``.cubin`` ELF images) for the architectures it was
built for, and optionally PTX, which the driver compiles for the GPU at hand when the library is loaded. SASS of
``sm_80`` does not run on an H200 (``sm_90``); PTX of ``compute_80`` or ``compute_90`` does, after the driver's
JIT compile (cached in ``~/.nv/ComputeCache``; ``CUDA_CACHE_DISABLE=1`` turns the cache off). Whether the pinned
jaxlib carries SASS for sm_90 decides between the ``cuda11`` and ``cuda12`` profiles on ABCI 3.0, and it can
only be read from the binaries: ``cuobjdump --list-elf --list-ptx FILE`` prints one line per image, in the order
the fatbins hold them, each kind numbered from 1 (recorded from cuobjdump 13.5 on libcusparse.so.12)::

    ELF file   19: libcusparse.so.19.sm_89.cubin
    PTX file    1: libcusparse.so.1.sm_90.ptx
    ELF file   20: libcusparse.so.20.sm_90.cubin

(A PTX image is named after its virtual architecture's number: ``sm_90.ptx`` is ``compute_90`` PTX.) A file
without device code prints nothing and exits 255 (``cuobjdump info    : File '...' does not contain device
code`` on stderr); a fatbin it cannot read stops the listing part way with ``cuobjdump fatal   : Invalid ELF in
'...'`` and exit 1, which is why its errors travel with the listing. The parsing and the verdict are pure
functions over that text; :func:`run_cuobjdump` is the one place that runs the tool.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
from typing import Callable, Iterable, Mapping, Optional, Sequence

from octo_dist.envcheck.result import FAIL, OK, SKIP, WARN, Check

# "ELF file    2: xla_extension.2.sm_90.cubin", "PTX file   14: _prng.sm_90a.ptx"
_IMAGE = re.compile(r"^\s*(ELF|PTX) file\s+\d+:\s+(\S+?)\.(sm_(\d+)([a-z]?))\.(cubin|ptx)\s*$")
# The default target when no GPU is visible: ABCI 3.0's H200 (compute capability 9.0).
DEFAULT_TARGET = "sm_90"
# PyPI's nvidia-cuda-cuobjdump exists for CUDA 13 only, and its 13.5 cuobjdump stops with "Invalid ELF" part way
# through CUDA 12.2's libraries (tried here on libcusparse.so.12): a CUDA 12 toolkit's cuobjdump is the one to use.
CUOBJDUMP_FIX = (
    "module load cuda (a CUDA 12 toolkit: its bin/ holds cuobjdump), or set CUDA_HOME to one"
)
_NO_DEVICE_CODE = "does not contain device code"


@dataclasses.dataclass(frozen=True)
class Listing:
    """Architecture -> number of images: ``sass={"sm_80": 12, "sm_90": 12}``, ``ptx={"sm_90": 12}``."""

    sass: Mapping[str, int]
    ptx: Mapping[str, int]

    def __bool__(self) -> bool:
        return bool(self.sass or self.ptx)


def _arch_key(arch: str) -> tuple:
    """``"sm_90a"`` -> ``(90, "a")``, for sorting and comparing architectures."""
    m = re.fullmatch(r"sm_(\d+)([a-z]?)", arch)
    return (int(m.group(1)), m.group(2)) if m else (0, arch)


def parse_listing(text: str) -> Listing:
    """``cuobjdump --list-elf`` and/or ``--list-ptx`` output (any number of files, concatenated) -> :class:`Listing`.

    Lines that are not image lines (``cuobjdump info    : File '...' does not contain device code``, blank
    lines, a file name header) are ignored.
    """
    sass: dict[str, int] = {}
    ptx: dict[str, int] = {}
    for line in text.splitlines():
        m = _IMAGE.match(line)
        if not m:
            continue
        kind, arch = m.group(1), m.group(3)
        table = sass if kind == "ELF" else ptx
        table[arch] = table.get(arch, 0) + 1
    return Listing(sass=sass, ptx=ptx)


def target_arch(compute_cap: str) -> Optional[str]:
    """``nvidia-smi --query-gpu=compute_cap`` output (``"9.0\\n9.0\\n"``) -> ``"sm_90"``; None when unreadable.

    Several GPUs of one node share one architecture on the clusters here; the first line decides.
    """
    for line in compute_cap.splitlines():
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", line)
        if m:
            return f"sm_{m.group(1)}{m.group(2)}"
    return None


def describe(listing: Listing) -> str:
    """``"SASS sm_52 sm_60 sm_70 sm_80; PTX compute_90"``: what the binaries carry, oldest first."""
    sass = " ".join(sorted(listing.sass, key=_arch_key)) or "none"
    ptx = " ".join("compute_" + a[3:] for a in sorted(listing.ptx, key=_arch_key)) or "none"
    return f"SASS {sass}; PTX {ptx}"


def sass_runs_on(arch: str, target: str) -> bool:
    """SASS of ``arch`` runs on ``target``: the same major at the same or a higher minor; ``sm_90a`` only on sm_90."""
    (have, suffix), (want, _) = _arch_key(arch), _arch_key(target)
    if suffix:
        return have == want
    return have // 10 == want // 10 and have <= want


def verdict(listing: Listing, target: str) -> tuple[str, str]:
    """(status, why) for running the listed kernels on ``target`` (``"sm_90"``).

    SASS runs on its own major architecture at the same or a higher minor (``sm_90`` on sm_90 and a later
    sm_9x; ``sm_90a`` only on sm_90); PTX runs on any architecture at or above its own, after the driver's JIT.
    """
    runs = sorted((a for a in listing.sass if sass_runs_on(a, target)), key=_arch_key)
    if runs:
        have = sum(listing.sass[a] for a in runs)
        most_arch = max(listing.sass, key=lambda a: listing.sass[a])
        if have < listing.sass[most_arch]:
            # Some kernels were built for the target, others only for older architectures (JIT from PTX).
            return WARN, (
                f"SASS for {target} in {have} image(s) only, {listing.sass[most_arch]} for {most_arch}: "
                f"the other kernels are JIT-compiled from PTX by the driver when first loaded"
            )
        return OK, f"SASS for {target} ({', '.join(runs)}) in {have} image(s): no JIT at start-up"
    jit = [
        a for a in listing.ptx if _arch_key(a)[0] <= _arch_key(target)[0] and not _arch_key(a)[1]
    ]
    if jit:
        newest = max(jit, key=_arch_key)
        return WARN, (
            f"no SASS for {target}: the driver JIT-compiles every kernel from compute_{newest[3:]} PTX "
            f"when it is first loaded, and that code cannot use {target}-only features"
        )
    return (
        FAIL,
        f"neither SASS for {target} nor PTX at or below it: no kernel image runs on this GPU",
    )


def kernel_libraries(
    site_dirs: Sequence[str], find: Callable[[str], list] = glob.glob
) -> list[str]:
    """The binaries JAX's CUDA backend runs kernels from, found in the site dirs without importing jaxlib.

    A CUDA jaxlib (0.4.20+cuda11.cudnn86): ``jaxlib/xla_extension.so`` (XLA and its runtime) and
    ``jaxlib/cuda/_*.so`` (the custom kernels: threefry, solvers, sparse, ...). PyPI's jaxlib with the CUDA 12
    plugin (jax[cuda12] 0.4.23): XLA's CUDA backend in ``jax_plugins/xla_cuda12/xla_cuda_plugin.so`` and the
    custom kernels in ``jax_cuda12_plugin/_*.so`` (PyPI's ``jaxlib/xla_extension.so`` has no device code). Both
    call cuBLAS, cuDNN, cuFFT, cuSOLVER, cuSPARSE and NCCL from the ``nvidia-*`` wheels (``nvidia/*/lib``), whose
    kernels are most of a fine-tune's GPU time: listed after JAX's own.
    """
    patterns = (
        "jaxlib/xla_extension.so",
        "jaxlib/cuda/*.so",
        "jax_plugins/xla_cuda*/*.so",
        "jax_cuda*_plugin/*.so",
        "jaxlib/cuda/*/*.so",
        "nvidia/*/lib/lib*.so*",
    )
    out: list[str] = []
    for site in site_dirs:
        for pattern in patterns:
            out += [p for p in sorted(find(os.path.join(site, pattern))) if p not in out]
    return out


def cuobjdump_path(
    environ: Mapping[str, str], which: Callable[[str], Optional[str]] = shutil.which
) -> Optional[str]:
    """``cuobjdump`` on PATH, else under ``$CUDA_HOME/bin`` (``module load cuda`` sets both on ABCI)."""
    exe = which("cuobjdump")
    if exe:
        return exe
    home = environ.get("CUDA_HOME") or environ.get("CUDA_PATH")
    candidate = os.path.join(home, "bin", "cuobjdump") if home else ""
    return candidate if candidate and os.access(candidate, os.X_OK) else None


def cuobjdump_error(library: str, returncode: int, stderr: str) -> str:
    """One line for a listing that did not finish; ``""`` for success or a file without device code.

    ``cuobjdump_error("/s/jaxlib/xla_extension.so", 1, "cuobjdump fatal   : Invalid ELF in '...'")`` ->
    ``"xla_extension.so: cuobjdump fatal   : Invalid ELF in '...' (exit 1)"``.
    """
    if returncode == 0 or _NO_DEVICE_CODE in stderr:
        return ""
    last = (stderr.strip().splitlines() or ["no message"])[-1].strip()
    return f"{os.path.basename(library)}: {last} (exit {returncode})"


def run_cuobjdump(
    exe: str, libraries: Iterable[str], timeout: float = 300.0
) -> tuple[str, list[str]]:
    """``cuobjdump --list-elf --list-ptx`` of every library: stdout concatenated, and one line per failed listing."""
    out, errors = [], []
    for lib in libraries:
        try:
            proc = subprocess.run(
                [exe, "--list-elf", "--list-ptx", lib],
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            errors.append(f"{os.path.basename(lib)}: cuobjdump did not finish in {timeout:g} s")
            continue
        out.append(proc.stdout)
        error = cuobjdump_error(lib, proc.returncode, proc.stderr)
        if error:
            errors.append(error)
    return "\n".join(out), errors


def check_listing(
    listing: Optional[Listing],
    target: Optional[str],
    libraries: Sequence[str],
    skipped: str = "",
    errors: Sequence[str] = (),
) -> Check:
    """The ``jaxlib.arch`` check: what the binaries carry, judged for ``target`` (None: judged for sm_90).

    Args:
      listing: parsed cuobjdump output; None when it did not run.
      target: the visible GPU's architecture (``"sm_90"``); None when no GPU is visible here.
      libraries: the binaries listed (for the report).
      skipped: why cuobjdump did not run (``listing`` None).
      errors: listings that stopped part way (:func:`cuobjdump_error`): the verdict is then a warning.
    """
    if listing is None:
        return Check("jaxlib.arch", SKIP, f"skipped: {skipped}", "", "")
    names = ", ".join(sorted({os.path.basename(p) for p in libraries})) or "no jaxlib binaries"
    incomplete = f"; listing incomplete: {'; '.join(errors)}" if errors else ""
    if not listing:
        return Check(
            "jaxlib.arch",
            WARN,
            f"no CUDA device code in {names} (a CPU jaxlib without the CUDA plugin?){incomplete}",
            "a CUDA jaxlib (0.4.20+cuda11.cudnn86) or PyPI's jaxlib with jax-cuda12-plugin (jax[cuda12])",
            CUOBJDUMP_FIX if errors else "",
        )
    judged = target or DEFAULT_TARGET
    status, why = verdict(listing, judged)
    where = "" if target else f" (no GPU visible: judged for {DEFAULT_TARGET}, ABCI 3.0's H200)"
    fix = ""
    if errors:
        # Part of the listing is missing: neither "SASS for all" nor "nothing runs" can be concluded from it.
        status = WARN
        fix = f"{CUOBJDUMP_FIX}, then run it again; "
    if status != OK:
        fix += (
            "on an H200 node, compare the profiles: octo-dist check-env --deep --profile cuda12 in a cuda12 "
            "venv or image; docs/abci.md (ABCI 3.0's H200) says which to use"
        )
    return Check(
        "jaxlib.arch",
        status,
        f"{describe(listing)} in {names}: {why}{where}{incomplete}",
        f"SASS for {judged} (no driver JIT at start-up)",
        fix,
    )


def check_jit(first: Optional[Mapping[str, float]], skipped: str = "") -> Check:
    """The ``deep.jit`` check from the probe's timings of the first kernel (seconds), run with the driver cache off.

    ``first`` is ``{"compile_s": 0.41, "first_run_s": 1.9, "steady_run_s": 0.0004}``: XLA's compile (its own
    ptxas), the first execution (module load, and the driver's JIT of any PTX-only kernel), then the same
    executable again. Their difference is what the driver spends before the first kernel runs.
    """
    if first is None:
        return Check("deep.jit", SKIP, f"skipped: {skipped}", "", "")
    load = max(first["first_run_s"] - first["steady_run_s"], 0.0)
    return Check(
        "deep.jit",
        OK,
        f"first kernel: {load * 1000:.0f} ms of module load and driver JIT (first run "
        f"{first['first_run_s'] * 1000:.0f} ms, then {first['steady_run_s'] * 1000:.1f} ms; XLA compile "
        f"{first['compile_s'] * 1000:.0f} ms; driver JIT cache off)",
        "informational: seconds here mean the driver compiles PTX (see jaxlib.arch)",
        "",
    )
