"""Run by tests/test_step_collectives.py in one process with 2 forced CPU devices, on jax 0.4.20 and 0.4.22: prints
one JSON object with the all-reduces (bytes each) in the compiled HLO of the default step and of each named step.

usage: XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0" JAX_PLATFORMS=cpu \
    python collectives.py
"""

import json

import jax
import numpy as np
import optax

from octo_dist.engine import data, hlo
from octo_dist.engine import parallel as engine
from octo_dist.policies.tiny import TinyPolicy

policy = TinyPolicy()
out = {
    "jax": jax.__version__,
    "devices": jax.device_count(),
    "platform": jax.devices()[0].platform,
    "steps": {},
}
# None: the engine's default, exactly as callers get it (shard_map on the CPU: not compiled a second time by name).
for name in (None, "jit"):
    kwargs = {} if name is None else {"step_fn": name}
    eng = engine.Engine(engine.make_mesh(), policy.loss, optax.adam(1e-3), **kwargs)
    src = data.SyntheticData(data.Spec(), 2 * jax.device_count(), 0, 1, jax.device_count())
    batch = eng.global_batch(src.batch(0))
    state = eng.init_state(policy, batch)
    reduces = hlo.all_reduces(eng.compiled_text(state, batch))
    state, metrics = eng.step(state, batch)
    out["steps"][name or "default"] = {
        "runs": eng.step_fn,
        "all_reduces": reduces,
        "metrics": sorted(engine.to_host(metrics)),
        "loss_finite": bool(np.isfinite(engine.to_host(metrics)["loss"])),
    }
    out["params"] = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(state.params)))
    out["max_signal"] = engine.MAX_SIGNAL
print(json.dumps(out))
