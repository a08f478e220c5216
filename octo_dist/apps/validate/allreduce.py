"""The all-reduce bandwidth of a fixed-size buffer across every device of the job (inside the runtime).

One ``psum`` over a 1-D mesh of all devices (``shard_map``, so the step is exactly one all-reduce of
``mib`` MiB per device), timed after warm-up. Bandwidths follow nccl-tests' convention:
algorithm bandwidth = bytes / time; bus bandwidth = algorithm bandwidth x 2(n-1)/n, comparable with the link speed.
"""

from __future__ import annotations

import statistics
import time


def bus_factor(n: int) -> float:
    """An all-reduce moves 2(n-1)/n of the buffer over each link (ring): 1.0 for 2 devices, 1.75 for 8."""
    return 2.0 * (n - 1) / n if n > 1 else 0.0


def measure(mib: float, iterations: int, warmup: int = 2) -> dict:
    """Time ``iterations`` all-reduces of ``mib`` MiB per device; checks the sum. Call on every process."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.experimental.shard_map import shard_map
    from jax.sharding import Mesh, PartitionSpec as P

    n = jax.device_count()
    elems = max(int(mib * 2**20) // 4, 1)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    local = np.ones((jax.local_device_count() * elems,), np.float32)
    x = multihost_utils.host_local_array_to_global_array(local, mesh, P("d"))
    step = jax.jit(
        shard_map(lambda b: jax.lax.psum(b, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    )
    for _ in range(warmup):
        y = step(x)
        y.block_until_ready()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        y = step(x)
        y.block_until_ready()
        times.append(time.perf_counter() - start)
    got = float(np.asarray(y.addressable_data(0))[0])
    median = statistics.median(times)
    nbytes = elems * 4
    return {
        "devices": n,
        "bytes": nbytes,
        "iterations": iterations,
        "median_s": median,
        "algbw_gbs": nbytes / median / 1e9,
        "busbw_gbs": nbytes / median / 1e9 * bus_factor(n),
        "sum": got,
        "sum_expected": float(n),
    }
