"""Will NCCL use InfiniBand between hosts? What one rank can see before JAX starts, and the verdict for a job.

NCCL picks its inter-node network at its first collective: the IB plugin when ``libibverbs.so.1`` loads and
lists HCAs, else TCP sockets, with one INFO line (``NET/IB : No device found.``) that nobody reads. A job
spanning several hosts then all-reduces every step over TCP. On a host that has HCAs
(``/sys/class/infiniband/mlx5_ibn1`` ... on ABCI 3.0's H nodes), three things send NCCL to sockets:

* ``libibverbs.so.1`` cannot be loaded where the rank runs (an image without rdma-core's userland);
* the environment turns IB off: ``NCCL_IB_DISABLE=1``, ``NCCL_NET=Socket``;
* ``NCCL_IB_HCA`` selects no HCA that exists (``NCCL_IB_HCA=mlx5_0`` on a host whose HCAs are ``mlx5_ibn*``).

Everything here is pure over a sys root path, a Mapping environment and a library loader, so tests fabricate
``/sys`` trees and a ``libibverbs.so.1`` built with gcc.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence

IB_CLASS_DIR = (
    "sys/class/infiniband"  # under the sys root: /sys/class/infiniband/mlx5_ibn1/ports/1/state
)
# The device files verbs open, one per HCA: /dev/infiniband/uverbs0 ... (rdma_cm beside them). The HCAs under /sys
# are visible in a container whatever is bound; these are there only when /dev/infiniband is (singularity
# --bind /dev/infiniband, or a site whose singularity.conf mounts the host's whole /dev).
UVERBS_DIR = "dev/infiniband"  # under the root
UVERBS_PREFIX = "uverbs"
BIND_FIX = (
    "bind the host's /dev/infiniband into the image (singularity exec --bind /dev/infiniband; octo-dist launch "
    "pbs binds it by default, unless --bind replaces the defaults: add --bind /dev/infiniband)"
)
VERBS_LIBRARY = "libibverbs.so.1"  # what NCCL dlopens (after plain libibverbs.so, which only -dev packages ship)
VERBS_SYMBOL = "ibv_get_device_list"  # the first verbs call NCCL makes
IMAGE_FIX = (
    "run the ranks in the octo-dist image (it installs libibverbs1, ibverbs-providers and librdmacm1; "
    "rebuild an older .sif with `make sif`), or install rdma-core's libibverbs1 and ibverbs-providers "
    "where the ranks run"
)

Loader = Callable[[str], object]


def ib_devices(sys_root: os.PathLike = "/") -> List[str]:
    """HCA names under ``<sys_root>/sys/class/infiniband`` (``["mlx5_ibn1", ...]``); [] when there is none."""
    root = Path(sys_root) / IB_CLASS_DIR
    try:
        return sorted(p.name for p in root.iterdir())
    except OSError:  # no such directory: no InfiniBand on this host
        return []


def uverbs_files(root: os.PathLike = "/") -> List[str]:
    """The verbs device files under ``<root>/dev/infiniband`` (``["uverbs0", ..., "uverbs8"]``); [] when the
    directory or the files are missing (a container without ``--bind /dev/infiniband``)."""
    try:
        return sorted(
            p.name for p in (Path(root) / UVERBS_DIR).iterdir() if p.name.startswith(UVERBS_PREFIX)
        )
    except OSError:
        return []


def active_ports(sys_root: os.PathLike, device: str) -> List[str]:
    """Ports of ``device`` whose state file reads ``4: ACTIVE`` (``["1"]``)."""
    ports = Path(sys_root) / IB_CLASS_DIR / device / "ports"
    out = []
    try:
        for port in sorted(ports.iterdir()):
            try:
                if "ACTIVE" in (port / "state").read_text():
                    out.append(port.name)
            except OSError:
                continue
    except OSError:
        pass
    return out


def load_verbs(
    candidates: Sequence[str] = (VERBS_LIBRARY,), loader: Loader = ctypes.CDLL
) -> Optional[str]:
    """None when a verbs library loads and exports ``ibv_get_device_list``; else why not, for every candidate."""
    errors = []
    for lib in candidates:
        try:
            handle = loader(lib)
        except OSError as e:
            errors.append(f"{lib}: {e}")
            continue
        if not hasattr(handle, VERBS_SYMBOL):
            errors.append(f"{lib}: loaded, but it exports no {VERBS_SYMBOL}")
            continue
        return None
    return "; ".join(errors)


def _truthy(value: str) -> bool:
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def hca_selected(spec: str, devices: Sequence[str]) -> List[str]:
    """The HCAs ``NCCL_IB_HCA`` leaves to NCCL, following NCCL's syntax.

    ``"mlx5_ibn"`` (prefixes), ``"=mlx5_ibn1,mlx5_ibn2"`` (exact names), ``"^mlx5_bond"`` (exclude these
    prefixes), each optionally with ``:port`` (``"mlx5_ibn1:1"``).
    """
    spec = spec.strip()
    exact = spec.startswith("=")
    exclude = spec.startswith("^")
    names = [item.split(":", 1)[0].strip() for item in spec.lstrip("=^").split(",") if item.strip()]

    def match(device: str) -> bool:
        return any(device == n if exact else device.startswith(n) for n in names)

    return [d for d in devices if match(d) != exclude] if names else list(devices)


def socket_settings(environ: Mapping[str, str], devices: Sequence[str]) -> List[str]:
    """Each setting in ``environ`` that makes NCCL skip InfiniBand on a host with ``devices``, and its fix."""
    out = []
    if _truthy(environ.get("NCCL_IB_DISABLE", "")):
        out.append(
            f"NCCL_IB_DISABLE={environ['NCCL_IB_DISABLE']} turns InfiniBand off "
            f"(fix: unset NCCL_IB_DISABLE, and drop it from the job script and mpirun -x)"
        )
    # Only "Socket" is refused: HPC-X's SHARP plugin registers other names ("IBext") that do use the HCAs.
    net = environ.get("NCCL_NET", "")
    if net.strip().lower() == "socket":
        out.append(f"NCCL_NET={net} forces TCP sockets (fix: unset NCCL_NET, or NCCL_NET=IB)")
    if (
        environ.get("NCCL_IB_HCA", "").strip()
        and devices
        and not hca_selected(environ["NCCL_IB_HCA"], devices)
    ):
        out.append(
            f"NCCL_IB_HCA={environ['NCCL_IB_HCA']} selects none of this host's HCAs ({', '.join(devices)}) "
            f"(fix: NCCL_IB_HCA={_common_prefix(devices)} or unset it)"
        )
    return out


def _common_prefix(devices: Sequence[str]) -> str:
    prefix = os.path.commonprefix(list(devices))
    return prefix or ",".join(devices)


def facts(
    sys_root: os.PathLike,
    environ: Mapping[str, str],
    verbs_candidates: Sequence[str] = (VERBS_LIBRARY,),
    loader: Loader = ctypes.CDLL,
) -> dict:
    """What one rank reports: its HCAs, the verbs device files, whether verbs load (only asked when there are
    HCAs), socket settings. ``sys_root`` is the root both ``sys/class/infiniband`` and ``dev/infiniband`` are read
    under ("/" on a node; a fabricated tree in tests).

    ``{"ib_devices": ["mlx5_ibn1"], "uverbs": ["uverbs0"], "verbs_error": None, "socket_settings": []}``
    """
    devices = ib_devices(sys_root)
    return {
        "ib_devices": devices,
        "uverbs": uverbs_files(sys_root) if devices else [],
        "verbs_error": load_verbs(verbs_candidates, loader) if devices else None,
        "socket_settings": socket_settings(environ, devices) if devices else [],
    }


def problems(records: Sequence[Mapping]) -> List[str]:
    """For a job on several hosts: every rank whose NCCL would fall back to TCP sockets although it has HCAs.

    ``records`` are the ranks' records, each with a ``"host"``, a ``"rank"`` and a ``"transport"`` (from
    :func:`facts`). A job on one host is never judged: NCCL uses NVLink/PCIe there, not the network.
    """
    hosts = sorted({r["host"] for r in records})
    if len(hosts) < 2:
        return []
    out = []
    for r in sorted(records, key=lambda r: r["rank"]):
        t = r.get("transport") or {}
        if not t.get("ib_devices"):
            continue
        where = (
            f"rank {r['rank']} on {r['host']} "
            f"({len(t['ib_devices'])} InfiniBand HCA(s): {', '.join(t['ib_devices'])})"
        )
        if t.get("verbs_error"):
            out.append(
                f"{where}: {VERBS_LIBRARY} cannot be loaded ({t['verbs_error']}), so NCCL would all-reduce "
                f"over TCP sockets between the {len(hosts)} hosts; expected the InfiniBand userland. "
                f"Fix: {IMAGE_FIX}"
            )
        # Records without the key come from an older octo-dist: nothing said about the files there.
        if "uverbs" in t and not t["uverbs"]:
            out.append(
                f"{where}: no verbs device files (/dev/infiniband/uverbs*) where the rank runs, so NCCL cannot "
                f"open the HCAs and would all-reduce over TCP sockets between the {len(hosts)} hosts; expected "
                f"the host's /dev/infiniband inside the image. Fix: {BIND_FIX}"
            )
        for setting in t.get("socket_settings") or []:
            out.append(
                f"{where}: {setting}; expected NCCL over InfiniBand between the {len(hosts)} hosts"
            )
    return out
