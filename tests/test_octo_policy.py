"""The Octo policy adapter (octo_dist.policies.octo): the tiny Octo of ``smoke --model octo``, its loss, merging
pretrained parameters, and 2 processes reproducing 1 process x 2 devices with it. Needs the fork (``octo``)."""

import subprocess
import sys

import numpy as np
import pytest

from helpers import HANG_S, REPO, clean_env

pytest.importorskip("octo")
pytestmark = pytest.mark.octo


def test_tiny_octo_policy_inits_and_its_loss_trains():
    import jax
    import optax

    from octo.model.octo_model import OctoModel

    from octo_dist.engine import data
    from octo_dist.policies import octo

    policy, spec = octo.smoke_policy()
    assert policy.name == "octo" and spec == octo.SMOKE_SPEC
    batch = data.SyntheticData(spec, 4, 0, 1, 1).batch(0)
    params = jax.jit(policy.init)(jax.random.PRNGKey(0), batch)  # traceable, as the engine calls it
    assert "octo_transformer" in params and "heads_action" in params
    # The same parameters OctoModel.from_config makes with that key.
    reference = OctoModel.from_config(policy.config, batch, rng=jax.random.PRNGKey(0)).params
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reference))
    )
    tx = optax.adam(1e-3)

    @jax.jit
    def step(params, opt, rng):
        (loss, metrics), grads = jax.value_and_grad(policy.loss, has_aux=True)(
            params, batch, rng, True
        )
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    opt, losses = tx.init(params), []
    for i in range(4):
        params, opt, loss = step(
            params, opt, jax.random.PRNGKey(7)
        )  # the same noise: the loss must fall
        losses.append(float(loss))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]

    # pretrained parameters are carried over where key and shape match (merge_params)
    pretrained = jax.tree_util.tree_map(lambda x: x + 1.0, params)
    merged = octo.with_pretrained(policy.init(jax.random.PRNGKey(1), batch), pretrained)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(pretrained))
    )


@pytest.mark.mpi
@pytest.mark.slow
def test_two_processes_reproduce_one_process_with_tiny_octo():
    # The engine's equivalence check (1 process x 2 devices vs 2 processes x 1 device under mpirun) on Octo itself:
    # from_config through the allgather, the diffusion head's noise and dropout RNG, the optimizer.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "octo_dist",
            "smoke",
            "--check-equivalence",
            "--np",
            "2",
            "--model",
            "octo",
            "--steps",
            "3",
            "--global-batch",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "model octo" in proc.stdout
