"""Run by tests/test_engine.py in one process with forced host devices, on jax 0.4.20 (the production pin) and
0.4.22: prints one JSON object of what it observed.

usage: XLA_FLAGS=--xla_force_host_platform_device_count=4 python sharding.py
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from octo_dist.engine import data
from octo_dist.engine import parallel
from octo_dist.policies.tiny import TinyPolicy
from octo_dist.runtime import startclock

out = {"jax": jax.__version__, "devices": jax.device_count()}
ndev = jax.device_count()
tx = optax.adam(1e-3)


def run(devices, step_fn, steps=2, ahead=False, params=None):
    """(losses of ``steps`` steps on ``devices``, the engine, the last state, the first parameters on the host).
    ``ahead``: the step compiled first, in a thread, from the state's and batch's shapes only (what train.fit and
    the fine-tune job do while parameters are made and data loads), then called. ``params``: the parameters to
    start from, as a fine-tune hands init_state pretrained ones (None: ``policy.init``, a compilation of the whole
    model)."""
    eng = parallel.Engine(parallel.make_mesh(devices), policy.loss, tx, step_fn=step_fn)
    src = data.SyntheticData(data.Spec(), 2 * ndev, 0, 1, len(devices))
    first = eng.global_batch(src.batch(0))
    if ahead:
        shapes = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), first
        )
        compiling = startclock.Background(
            "compile", eng.compile, eng.abstract_state(policy, shapes), shapes
        )
    state = eng.init_state(policy, first, params=params)
    start = jax.device_get(state.params) if params is None else params  # before the step donates it
    if ahead:
        compiling.result()
        out.setdefault("compiled_ahead", {})[step_fn] = eng.compiled
    got = []
    for s in range(steps):
        batch = eng.global_batch(src.batch(s))
        out.setdefault("batch_sharding", {})[step_fn] = str(batch["action"].sharding.spec)
        # Any implicit host<->device copy inside the step (numpy sneaking in) raises here.
        with jax.transfer_guard("disallow"):
            state, metrics = eng.step(state, batch)
        got.append(float(parallel.to_host(metrics)["loss"]))
    out.setdefault("replicated", {})[step_fn] = all(
        x.sharding.is_fully_replicated for x in jax.tree_util.tree_leaves(state.params)
    )
    # Progress on stderr, one line a run: the test waits while these come (a loaded machine compiles slowly).
    print(f"sharding.py: {step_fn} on {len(devices)} device(s) done", file=sys.stderr, flush=True)
    return got, eng, state, start


# The same global batches on 1 device and on every device, with jit and with shard_map: the same losses.
# (Without dropout: shard_map draws masks per device, so with dropout its losses depend on the device count.)
# policy.init runs twice, on 1 device (jit_one) and on every device (jit_many), whose losses are compared; every
# other run starts from one of their parameters (the step compiled ahead from jit_many's, compared with it bit for bit).
policy = TinyPolicy(dropout=0.0)
jit_one, _, _, one = run(jax.devices()[:1], "jit")
out["losses"] = {
    "jit_one": jit_one,
    "shard_map_one": run(jax.devices()[:1], "shard_map", params=one)[
        0
    ],  # one device: no all-reduce
    "shard_map_many": run(jax.devices(), "shard_map", params=one)[0],
}
out["losses"]["jit_many"], eng, state, many = run(jax.devices(), "jit")
out["losses"]["jit_ahead"] = run(jax.devices(), "jit", ahead=True, params=many)[0]
out["losses"]["shard_map_ahead"] = run(jax.devices(), "shard_map", ahead=True, params=one)[0]
out["compile_beside_s"] = startclock.besides().get("compile")

# Batch sizes at NDEV-1, NDEV, NDEV+1: the odd ones are refused before anything is compiled.
out["batch_sizes"] = {}
for b in (ndev - 1, ndev, ndev + 1):
    try:
        data.SyntheticData(data.Spec(), b, 0, 1, ndev)
        out["batch_sizes"][b] = "ok"
    except data.BatchSizeError as e:
        out["batch_sizes"][b] = str(e)

# numpy straight into the sharded step: an implicit transfer, refused under the guard.
src = data.SyntheticData(data.Spec(), 2 * ndev, 0, 1, ndev)
try:
    with jax.transfer_guard("disallow"):
        eng.step(state, src.batch(0))
    out["numpy_input"] = "accepted"
except Exception as e:  # noqa: BLE001 - the type differs across versions; the message is what matters
    out["numpy_input"] = f"{type(e).__name__}: {e}"[:200]

# The checkpoint template, by shape only, is the state init_state builds; a batch-sharded value is not replicated.
batch = eng.global_batch(src.batch(0))
template, fresh = eng.abstract_state(policy, batch, 3), eng.init_state(policy, batch, 3)
out["template_matches"] = all(
    (t.shape, t.dtype, t.sharding.is_equivalent_to(x.sharding, x.ndim)) == (x.shape, x.dtype, True)
    for t, x in zip(jax.tree_util.tree_leaves(template), jax.tree_util.tree_leaves(fresh))
)
out["template_is_abstract"] = all(
    isinstance(t, jax.ShapeDtypeStruct) for t in jax.tree_util.tree_leaves(template)
)
try:
    parallel.assert_replicated(batch)
    out["sharded_batch"] = "accepted"
except parallel.NotReplicatedError as e:
    out["sharded_batch"] = str(e)


# shard_map's replication check: erf_inv (Octo's diffusion head) has a rule only from 0.4.22 on.
def erf_loss(params, batch, rng, train):
    return jnp.mean(jax.scipy.special.erfinv(jnp.tanh(params["w"] * batch["x"]))), {}


x = {"x": np.linspace(-0.5, 0.5, ndev * 2, dtype=np.float32).reshape(ndev * 2, 1)}
out["check_rep_default"] = parallel.default_check_rep(jax.__version__)
for check in (True, None):
    key = "forced" if check else "default"
    try:
        e2 = parallel.Engine(
            parallel.make_mesh(), erf_loss, optax.sgd(0.1), step_fn="shard_map", check_rep=check
        )
        st = e2.init_state(None, None, params={"w": np.ones((1,), np.float32)})
        e2.step(st, e2.global_batch(x))
        out.setdefault("erf_inv", {})[key] = "ok"
    except Exception as e:  # noqa: BLE001
        out.setdefault("erf_inv", {})[key] = f"{type(e).__name__}: {e}"[:200]

print(json.dumps(out))
