"""Which transport NCCL actually chose, read from its ``NCCL_DEBUG=INFO`` log (one rank's file).

NCCL says what it picked in a handful of INFO lines (NCCL 2.19, the cuda11 profile's ``nvidia-nccl-cu11``)::

    g0001:81234:81234 [0] NCCL INFO NET/IB : Using [0]mlx5_ibn1:1/IB [1]mlx5_ibn2:1/IB ; OOB ib0:10.1.0.1<0>
    g0001:81234:81301 [0] NCCL INFO Using network IB
    g0001:81234:81301 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA
    g0001:81234:81301 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read

and, when it falls back to TCP::

    g0001:81234:81301 [0] NCCL INFO Failed to open libibverbs.so[.1]
    g0001:81234:81301 [0] NCCL INFO NET/IB : No device found.
    g0001:81234:81301 [0] NCCL INFO NET/Socket : Using [0]ib0:10.1.0.1<0>
    g0001:81234:81301 [0] NCCL INFO Using network Socket

The parser is pure over the log's text; ``tests/test_validate.py`` feeds it recorded lines.
"""

from __future__ import annotations

import re
from typing import Iterable, List, Mapping, Optional

_VERSION = re.compile(r"NCCL version (\S+)")  # "NCCL version 2.19.3+cuda11.8"
_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")  # "Using network IB"
_IB_USING = re.compile(
    r"NCCL INFO NET/IB\s*: Using (.*?)(?:\s*;|$)"
)  # "[0]mlx5_ibn1:1/IB [1]mlx5_ibn2:1/IB ; OOB ..."
_IB_DEVICE = re.compile(r"\[\d+\]([^:\s]+):\d+/(\w+)")  # "[0]mlx5_ibn1:1/IB" -> mlx5_ibn1, IB
_CHANNEL_VIA = re.compile(
    r"NCCL INFO Channel .* via (\S+)"
)  # "via NET/IB/0/GDRDMA", "via P2P/IPC/read"
_INIT_DONE = re.compile(r"NCCL INFO comm \S+ rank (\d+) nranks (\d+) .*Init COMPLETE")
_PREFIX = re.compile(r"^(\S+?):(\d+):(\d+) \[(\d+)\] NCCL ")  # "host:pid:tid [cudaDev] NCCL ..."


def parse(lines: Iterable[str]) -> dict:
    """Summarise one rank's NCCL INFO log.

    Returns:
        ``{"version": "2.19.3+cuda11.8", "network": "IB", "ib_devices": ["mlx5_ibn1"], "ib_missing": False,
        "ib_disabled": False, "transports": ["NET/IB", "P2P/IPC"], "gdrdma": True, "nranks": 16, "lines": 57}``:
        ``network`` is what NCCL chose between hosts (None when no line said), ``transports`` the distinct
        kinds of channel connections (inter-node ``NET/...``, intra-node ``P2P/...``, ``SHM/...``).
    """
    out: dict = {
        "version": None,
        "network": None,
        "ib_devices": [],
        "ib_missing": False,
        "ib_disabled": False,
        "transports": [],
        "gdrdma": False,
        "nranks": None,
        "lines": 0,
    }
    transports: List[str] = []
    for line in lines:
        if "NCCL" not in line:
            continue
        out["lines"] += 1
        m = _VERSION.search(line)
        if m and out["version"] is None:
            out["version"] = m.group(1)
        m = _NETWORK.search(line)
        if m:
            out["network"] = m.group(1)
        m = _IB_USING.search(line)
        if m:
            out["ib_devices"] = sorted(
                {d for d, _ in _IB_DEVICE.findall(m.group(1))} | set(out["ib_devices"])
            )
        if "NET/IB : No device found" in line or "Failed to open libibverbs" in line:
            out["ib_missing"] = True
        if "NCCL_IB_DISABLE set by environment to 1" in line:
            out["ib_disabled"] = True
        m = _CHANNEL_VIA.search(line)
        if m:
            via = m.group(1)
            if "GDRDMA" in via:
                out["gdrdma"] = True
            kind = "/".join(
                via.split("/")[:2]
            )  # "NET/IB/0/GDRDMA" -> "NET/IB", "SHM/direct/direct" -> "SHM/direct"
            if kind not in transports:
                transports.append(kind)
        m = _INIT_DONE.search(line)
        if m:
            out["nranks"] = int(m.group(2))
    out["transports"] = sorted(transports)
    return out


def inter_node(summary: Mapping) -> Optional[str]:
    """The network between hosts: ``"IB"``, ``"Socket"``, a plugin's name, or None when the log never said.

    Channel lines win over the "Using network" line: they are the connections NCCL actually made.
    """
    nets = [t.split("/", 1)[1] for t in summary.get("transports", ()) if t.startswith("NET/")]
    if nets:
        return "Socket" if "Socket" in nets else nets[0]
    return summary.get("network")


def judge(summaries: Mapping[int, Mapping], hosts: int) -> tuple:
    """(ok, found, fix) for the job: sockets between hosts, or no NCCL line at all, is a failure.

    ``summaries`` maps rank -> :func:`parse` result; ``hosts`` is how many hosts the job spans.
    """
    nets = {rank: inter_node(s) for rank, s in summaries.items()}
    seen = sorted({n or "none" for n in nets.values()})
    silent = sorted(rank for rank, s in summaries.items() if not s.get("lines"))
    found = f"network {'/'.join(seen)}" + (
        f"; transports {', '.join(sorted({t for s in summaries.values() for t in s.get('transports', ())}))}"
        if any(s.get("transports") for s in summaries.values())
        else ""
    )
    if silent:
        return (
            False,
            f"no NCCL INFO line from rank(s) {silent}",
            "NCCL was not used or NCCL_DEBUG_FILE was not honoured; run with NCCL_DEBUG=INFO and read the log",
        )
    if hosts < 2:
        return True, found + " (one host: NVLink/PCIe inside the node, no network)", ""
    sockets = sorted(rank for rank, n in nets.items() if n == "Socket")
    if sockets:
        why = []
        if any(s.get("ib_disabled") for s in summaries.values()):
            why.append("NCCL_IB_DISABLE=1 is set")
        if any(s.get("ib_missing") for s in summaries.values()):
            why.append("NCCL found no usable InfiniBand device (libibverbs missing or no HCA)")
        return (
            False,
            f"{found}: rank(s) {sockets} all-reduce over TCP sockets between {hosts} hosts"
            + (f" ({'; '.join(why)})" if why else ""),
            "run the ranks in the octo-dist image (it carries libibverbs1, ibverbs-providers), unset NCCL_IB_DISABLE "
            "and NCCL_NET, then `mpirun ... octo-dist check-env --launch` to see what is left",
        )
    if any(n is None for n in nets.values()):
        missing = sorted(rank for rank, n in nets.items() if n is None)
        return (
            False,
            f"{found}: rank(s) {missing} logged no inter-node network",
            "run with NCCL_DEBUG=INFO and read the log",
        )
    return True, found, ""
