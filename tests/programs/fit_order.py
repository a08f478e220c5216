"""Run by tests/test_engine.py in one process: ``train.fit`` on the tiny policy, recording in order when each batch
is made and when each step's metrics are read, then the same run stopped by a signal. Prints one JSON object.

Both runs share one engine (the step compiles once) and start from the same parameters, initialised once: the
order of making and reading does not depend on either, and compiling and initialising were most of the time.

usage: python fit_order.py SAVE_DIR
"""

import json
import signal
import sys
import time

import jax
import optax

from octo_dist import savelayout
from octo_dist.runtime import stopping, tracking
from octo_dist.engine import data, parallel, train
from octo_dist.policies.tiny import TinyPolicy

STEPS = 6
MAKE_S = (
    0.05  # every batch takes at least this long to make: the input time fit() reports must see it
)
events = []
logged = {}


class Logged(data.SyntheticData):
    def batch(self, step):
        events.append(["make", step])
        time.sleep(MAKE_S)
        return super().batch(step)


class Recording(tracking.Tracker):
    """An in-memory tracker: what fit() would send to wandb, by step."""

    def log(self, metrics, step):
        logged[step] = dict(metrics)


def make_source(cls=data.SyntheticData):
    return cls(data.Spec(), 4, 0, 1, 1)


ENGINE = parallel.Engine(parallel.make_mesh(), TinyPolicy().loss, optax.adam(1e-3))
# On the host: each run starts from these (the step donates the state it is given).
PARAMS = jax.device_get(
    ENGINE.init_state(TinyPolicy(), ENGINE.global_batch(make_source().batch(0)), seed=0).params
)


def run(save_dir, stop_at=None):
    # smoke's layout: the checkpoints in the save directory itself; None: no checkpoints
    layout = savelayout.RunLayout(save_dir) if save_dir else None
    source = make_source(Logged)
    stop = stopping.StopSignal()

    def on_step(step, values):
        events.append(["read", step])
        if step == stop_at:
            signal.raise_signal(
                signal.SIGUSR1
            )  # handled by ``stop``: recorded, passed into the next dispatch

    try:
        result = train.fit(
            TinyPolicy(),
            optax.adam(1e-3),
            source,
            train.TrainConfig(steps=STEPS, layout=layout, log_every=1),
            tracker=Recording("fit-order"),
            on_step=on_step,
            stop=stop,
            params=PARAMS,
            engine=ENGINE,
        )
    finally:
        stop.close()
    return result


events.clear()
full = run(None)
order = list(events)
logged_full = dict(logged)
events.clear()
stopped = run(sys.argv[1], stop_at=1)
print(
    json.dumps(
        {
            "order": order,
            "losses": {str(k): v for k, v in full.losses.items()},
            "input_s": {str(k): v for k, v in full.input_s.items()},
            "logged": {str(k): v for k, v in sorted(logged_full.items())},
            "stopped": {
                "end_step": stopped.end_step,
                "stopped_by": stopped.stopped_by,
                "losses": {str(k): v for k, v in stopped.losses.items()},
                "order": events,
            },
        }
    )
)
