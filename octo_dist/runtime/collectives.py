"""Small host-side values shared across processes (run ids, per-rank reports) through JAX's collectives.

No second communication library is needed: after ``runtime.initialize`` these work wherever training works
(NCCL on GPUs, gloo on CPU). Values travel as int32 codes of UTF-8 bytes, padded to a fixed length, because
every process must pass arrays of one shape.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

MAX_BYTES = 8192


def _encode(text: str, max_bytes: int) -> np.ndarray:
    raw = text.encode()
    if len(raw) > max_bytes:
        raise ValueError(
            f"{len(raw)} bytes to share across processes; at most {max_bytes} fit (raise max_bytes)"
        )
    out = np.zeros(max_bytes + 1, np.int32)
    out[0] = len(raw)
    out[1 : 1 + len(raw)] = np.frombuffer(raw, np.uint8)
    return out


def _decode(codes: np.ndarray) -> str:
    n = int(codes[0])
    return bytes(codes[1 : 1 + n].astype(np.uint8)).decode()


def broadcast_str(value: Optional[str], max_bytes: int = MAX_BYTES) -> str:
    """Process 0's ``value`` on every process (other processes' values are ignored and may be None)."""
    import jax

    if jax.process_count() == 1:
        assert value is not None
        return value
    from jax.experimental import multihost_utils

    mine = _encode(value if jax.process_index() == 0 and value is not None else "", max_bytes)
    return _decode(np.asarray(multihost_utils.broadcast_one_to_all(mine)))


def allgather_json(value: Any, max_bytes: int = MAX_BYTES) -> list:
    """Every process's JSON-able ``value``, in process order, on every process.

    ``process_allgather`` is called with ``tiled=True`` and reshaped: without it, jax 0.4.20 returns the input
    unchanged on one process but stacks a leading axis on several (Octo's from_config then fails on several
    processes: "horizon must be <= max_horizon").
    """
    import jax
    from jax.experimental import multihost_utils

    mine = _encode(json.dumps(value, sort_keys=True), max_bytes)
    if jax.process_count() == 1:
        return [json.loads(_decode(mine))]
    every = np.asarray(multihost_utils.process_allgather(mine, tiled=True)).reshape(
        jax.process_count(), -1
    )
    return [json.loads(_decode(row)) for row in every]
