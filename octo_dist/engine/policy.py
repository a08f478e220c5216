"""What the engine needs from a model: parameters and a loss. Nothing about processes, meshes or devices.

The smoke job's tiny policy (``octo_dist/policies/tiny.py``) and Octo (``octo_dist/policies/octo.py``) both implement
this; the engine (``parallel.py``) turns any of them into a data-parallel train step.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Tuple

Params = Any
Batch = Mapping[str, Any]


class Policy(Protocol):
    name: str

    def init(self, rng, example_batch: Batch) -> Params:
        """Parameters for ``example_batch`` (the *global* batch: jax.Arrays sharded along axis 0 over every device
        of every process). Pure and traceable: the engine calls it inside ``jit`` (replicated ``out_shardings``)
        and inside ``jax.eval_shape`` (a checkpoint's template), on every process with the same ``rng``."""

    def loss(self, params: Params, batch: Batch, rng, train: bool) -> Tuple[Any, Mapping[str, Any]]:
        """(scalar loss, scalar metrics) for ``batch``; pure, traced inside ``jit``. The loss is a mean over the
        batch, so the global mean is the mean of equal per-device means."""
