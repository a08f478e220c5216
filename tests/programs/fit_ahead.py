"""Run by tests/test_engine_ahead.py: ``train.fit`` with the images augmented on the device, each batch augmented
ahead of its step (``Engine.prepare`` on fit's worker thread), against the same steps taken by hand on the same
engine with every batch augmented inside ``Engine.step``, and against the batches unaugmented. Prints one JSON
object of losses by step.

The least work that shows it: two steps (the second batch is the first one made ahead, while step 0 runs), jit
only (the augmentation is a program of its own, run before either step function), one engine, so the step and the
augmentation compile once (the unaugmented losses come from that same step given the raw batch as prepared), and
the policy initialised once: every run starts from those parameters.

usage: python fit_ahead.py   (XLA_FLAGS=--xla_force_host_platform_device_count=2)
"""

import json

import jax
import optax

from octo_dist.engine import augment, data, parallel, train
from octo_dist.policies.tiny import TinyPolicy

STEPS = 2
KWARGS = {
    "augment_order": ["random_resized_crop", "random_brightness", "random_contrast"],
    "random_resized_crop": {"scale": [0.5, 1.0], "ratio": [0.9, 1.1]},
    "random_brightness": [0.3],
    "random_contrast": [0.5, 1.5],
}


def source():
    return data.SyntheticData(data.Spec(), 4, 0, 1, jax.device_count())


eng = parallel.Engine(
    parallel.make_mesh(),
    TinyPolicy().loss,
    optax.adam(1e-2),
    step_fn="jit",
    augment=augment.batch_augmenter(KWARGS),
)
# On the host: every run below starts from these (the step donates the state it is given).
PARAMS = jax.device_get(
    eng.init_state(TinyPolicy(), eng.global_batch(source().batch(0)), seed=0).params
)
fitted = train.fit(
    TinyPolicy(),
    optax.adam(1e-2),
    source(),
    train.TrainConfig(steps=STEPS),
    params=PARAMS,
    engine=eng,
)


def by_hand(augmented: bool) -> dict:
    """Step by step on ``eng``: each batch augmented inside the step, or passed as prepared (unaugmented)."""
    src = source()
    state = eng.init_state(TinyPolicy(), eng.global_batch(src.batch(0)), seed=0, params=PARAMS)
    losses = {}
    for k in range(STEPS):
        state, metrics = eng.step(state, eng.global_batch(src.batch(k)), prepared=not augmented)
        losses[str(k)] = float(parallel.to_host(metrics)["loss"])
    return losses


print(
    json.dumps(
        {
            "devices": jax.device_count(),
            "fit": {str(k): v for k, v in sorted(fitted.losses.items())},
            "by_hand": by_hand(augmented=True),
            "plain": by_hand(augmented=False),
        }
    )
)
