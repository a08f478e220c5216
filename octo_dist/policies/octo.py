"""Octo as an octo_dist policy (``policy.Policy``): parameters as ``OctoModel.from_config`` makes them, the fork's loss.

Importing this module imports Octo: ``ImportError`` where the fork is not installed (``smoke --model auto`` then
falls back to the tiny policy). The model never sees processes: ``init`` is traced inside the engine's ``jit`` on
the *global* example batch, so the allgather of ``from_config`` (whose stacking of a process axis gave "horizon
must be <= max_horizon" on several processes, see ``gather.py``) is not needed at all.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

import jax
from octo.model.octo_model import OctoModel
from octo.model.octo_module import OctoModule
from octo.utils.train_utils import merge_params

from octo_dist.engine import data
from octo_dist.policies.octo_spec import tiny_model_config

# The smoke job's Octo-shaped batches for the tiny config: 64x64 primary images, a window of 2, 4 x 7 actions.
SMOKE_SPEC = data.Spec(image_size=64, horizon=2, action_horizon=4, action_dim=7)


class OctoPolicy:
    """``config`` is an Octo model config (``{"model": {...}, "text_processor": ...}``, what ``config.json`` holds)."""

    name = "octo"

    def __init__(self, config: Mapping[str, Any], text_processor=None, dataset_statistics=None):
        self.config = dict(config)
        self.text_processor = text_processor
        self.dataset_statistics = dataset_statistics
        # The module OctoModel.from_config builds: flax modules compare by their fields.
        self.module = OctoModule.create(**self.config["model"])

    def init(self, rng, example_batch):
        """Fresh parameters, as ``OctoModel.from_config`` makes them: ``module.init`` on the batch's first example.

        Traceable (the engine jits it, replicated): ``example_batch`` is the global batch, so no allgather is
        needed (``from_config`` gathers eagerly, which is what ``gather.py`` is for)."""
        first = jax.tree_util.tree_map(lambda x: x[:1], example_batch)
        return self.module.init(
            rng,
            first["observation"],
            first["task"],
            first["observation"]["timestep_pad_mask"],
            train=False,
        )["params"]

    def model(self, params, example_batch, config: Optional[Mapping[str, Any]] = None) -> OctoModel:
        """An ``OctoModel`` around ``params``, for ``save_pretrained`` (the layout ``load_pretrained`` reads).

        ``example_batch``: one example as numpy (leading axis 1), the same on every process."""
        return OctoModel(
            module=self.module,
            text_processor=self.text_processor,
            config=dict(config or self.config),
            params=params,
            example_batch=example_batch,
            dataset_statistics=self.dataset_statistics,
        )

    def loss(self, params, batch, rng, train: bool) -> Tuple[jax.Array, dict]:
        """The fork's ``scripts/finetune.py`` ``loss_fn``: the transformer, then the action head's loss."""
        bound = self.module.bind({"params": params}, rngs={"dropout": rng})
        embeddings = bound.octo_transformer(
            batch["observation"],
            batch["task"],
            batch["observation"]["timestep_pad_mask"],
            train=train,
        )
        return bound.heads["action"].loss(
            embeddings,
            batch["action"],
            batch["observation"]["timestep_pad_mask"],
            batch["action_pad_mask"],
            train=train,
        )


def with_pretrained(params, pretrained_params):
    """``params`` with ``pretrained_params`` carried over wherever key and shape match (the fork's
    ``merge_params``), e.g. everything but a new action head."""
    return merge_params(params, pretrained_params)


def smoke_config(spec: data.Spec = SMOKE_SPEC) -> dict:
    """The tiny Octo config of the smoke job: no weights, no text model, nothing downloaded."""
    return {
        "model": tiny_model_config(spec.action_horizon, spec.action_dim),
        "text_processor": None,
    }


def smoke_policy() -> Tuple[OctoPolicy, data.Spec]:
    """(policy, batch spec) for ``octo-dist smoke --model octo``."""
    return OctoPolicy(smoke_config(SMOKE_SPEC)), SMOKE_SPEC
