"""Per-process data: every process makes only its own slice of each global batch.

Loading the full global batch on every rank multiplies the input work by the rank count. Here process ``p`` of ``P``
produces examples ``[p*B/P, (p+1)*B/P)`` of global batch ``B`` at every step, and nothing else. Synthetic examples
are keyed by (seed, step, global example index), so the same global batch comes out whatever the number of
processes: that is what lets the smoke job compare 1 process x N devices with N processes x 1 device, and resume at
a step.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

import numpy as np

from octo_dist.problems import Refusal


class BatchSizeError(Refusal, ValueError):
    """The global batch cannot be split evenly; raised before anything is compiled."""


def local_batch_size(global_batch: int, process_count: int, device_count: int) -> int:
    """``global_batch / process_count``, refused unless every device gets the same number of examples.

    >>> local_batch_size(8, 2, 2)
    4
    """
    if global_batch <= 0:
        raise BatchSizeError(
            f"global batch {global_batch}; expected a positive multiple of {device_count} (the device count)"
        )
    if global_batch % device_count:
        lo = global_batch // device_count * device_count
        hint = f"{lo} or {lo + device_count}" if lo else str(device_count)
        raise BatchSizeError(
            f"global batch {global_batch} does not divide by the {device_count} devices "
            f"({process_count} process(es) x {device_count // process_count}); expected a multiple of {device_count}. "
            f"Fix: use a global batch of {hint} (smoke: --global-batch, finetune: --config.batch_size)"
        )
    return global_batch // process_count


@dataclasses.dataclass(frozen=True)
class Spec:
    """Shapes of an Octo-style batch: observation history ``horizon``, ``action_horizon`` x ``action_dim`` chunks."""

    image_size: int = 32
    horizon: int = 2
    action_horizon: int = 4
    action_dim: int = 7


def example(spec: Spec, seed: int, step: int, index: int) -> dict:
    """Global example ``index`` of the batch at ``step``: the same bytes on any process that makes it.

    The action is a fixed function of the last frame's per-channel means plus noise, so a policy can learn it
    and the smoke job's loss falls.
    """
    rng = np.random.default_rng([seed, step, index])
    s, t = spec.image_size, spec.horizon
    frames = rng.integers(0, 256, size=(t, s, s, 3), dtype=np.uint8)
    goal = rng.integers(0, 256, size=(s, s, 3), dtype=np.uint8)
    means = frames[-1].reshape(-1, 3).mean(0) / 255.0  # (3,)
    mix = np.random.default_rng([seed, 7]).standard_normal(
        (3, spec.action_dim)
    )  # the same for every example
    base = (means - 0.5) @ mix  # (action_dim,)
    action = base[None, None, :] + 0.05 * rng.standard_normal(
        (t, spec.action_horizon, spec.action_dim)
    )
    pad = np.ones((t,), bool)
    return {
        "observation": {
            "image_primary": frames,
            "timestep": np.arange(step * t, step * t + t, dtype=np.int32),
            "timestep_pad_mask": pad,
            "pad_mask_dict": {"image_primary": pad.copy(), "timestep": pad.copy()},
        },
        "task": {"image_primary": goal, "pad_mask_dict": {"image_primary": np.ones((), bool)}},
        "action": action.astype(np.float32),
        "action_pad_mask": np.ones((t, spec.action_horizon, spec.action_dim), bool),
    }


def stack(examples) -> dict:
    """A list of example dicts -> one batch dict (leading axis = examples)."""
    first = examples[0]
    if isinstance(first, Mapping):
        return {k: stack([e[k] for e in examples]) for k in first}
    return np.stack(examples)


@dataclasses.dataclass
class SyntheticData:
    """This process's slice of synthetic Octo-shaped global batches. ``reads`` counts examples made, ``batches_made``
    the batches they went into (the smoke job's check that a rank reads its slice, not the global batch)."""

    spec: Spec
    global_batch: int
    process_index: int
    process_count: int
    device_count: int
    seed: int = 0
    reads: int = 0
    batches_made: int = 0

    def __post_init__(self):
        self.local_batch_size = local_batch_size(
            self.global_batch, self.process_count, self.device_count
        )

    def indices(self) -> range:
        lo = self.process_index * self.local_batch_size
        return range(lo, lo + self.local_batch_size)

    def batch(self, step: int) -> dict:
        self.reads += self.local_batch_size
        self.batches_made += 1
        return stack([example(self.spec, self.seed, step, i) for i in self.indices()])

    def batches(self, start_step: int = 0) -> Iterator[dict]:
        """From ``start_step`` on: the data position a resumed run continues from."""
        step = start_step
        while True:
            yield self.batch(step)
            step += 1
