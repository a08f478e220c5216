"""Run by tests/test_engine_ahead.py: ``train.fit`` with the images augmented on the device, each batch augmented
ahead of its step (``Engine.prepare`` on fit's worker thread), against the same steps taken by hand with every
batch augmented inside ``Engine.step``, and against no augmentation. Prints one JSON object of losses by step.

usage: python fit_ahead.py STEP_FN SAVE_DIR   (XLA_FLAGS=--xla_force_host_platform_device_count=2)
"""

import json
import sys

import jax
import optax

from octo_dist.engine import augment, data, parallel, train
from octo_dist.policies.tiny import TinyPolicy

STEPS = 4
KWARGS = {
    "augment_order": ["random_resized_crop", "random_brightness", "random_contrast"],
    "random_resized_crop": {"scale": [0.5, 1.0], "ratio": [0.9, 1.1]},
    "random_brightness": [0.3],
    "random_contrast": [0.5, 1.5],
}
step_fn, save_dir = sys.argv[1], sys.argv[2]


def engine(augmenter):
    return parallel.Engine(
        parallel.make_mesh(),
        TinyPolicy().loss,
        optax.adam(1e-2),
        step_fn=step_fn,
        augment=augmenter,
    )


def source():
    return data.SyntheticData(data.Spec(), 4, 0, 1, jax.device_count())


fitted = train.fit(
    TinyPolicy(),
    optax.adam(1e-2),
    source(),
    train.TrainConfig(steps=STEPS, save_dir=save_dir),
    engine=engine(augment.batch_augmenter(KWARGS)),
)


def by_hand(augmenter):
    eng, src = engine(augmenter), source()
    state = eng.init_state(TinyPolicy(), eng.global_batch(src.batch(0)), seed=0)
    losses = {}
    for k in range(STEPS):
        state, metrics = eng.step(
            state, eng.global_batch(src.batch(k))
        )  # augmented inside the step
        losses[k] = float(parallel.to_host(metrics)["loss"])
    return losses


print(
    json.dumps(
        {
            "devices": jax.device_count(),
            "fit": {str(k): v for k, v in sorted(fitted.losses.items())},
            "by_hand": {str(k): v for k, v in by_hand(augment.batch_augmenter(KWARGS)).items()},
            "plain": {str(k): v for k, v in by_hand(None).items()},
        }
    )
)
