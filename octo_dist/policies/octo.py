"""Octo as an octo_dist policy (``policy.Policy``): parameters from ``OctoModel.from_config``, the fork's loss.

Importing this module imports Octo: ``ImportError`` where the fork is not installed (``smoke --model auto`` then
falls back to the tiny policy). The model never sees processes: ``init`` receives the engine's *global* example
batch, which ``from_config``'s ``process_allgather`` turns into the global value on every rank (see ``gather.py``:
that is the seed's "horizon must be <= max_horizon" crash, fixed without editing Octo).
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
    """``config`` is an Octo model config (``{"model": {...}, "text_processor": ...}``, what ``config.json`` holds).

    ``pretrained_params``: carried over into the fresh parameters by ``init`` wherever key and shape match
    (``merge_params``, as the fork's fine-tuning does), e.g. everything but a new action head.
    """

    name = "octo"

    def __init__(self, config: Mapping[str, Any], text_processor=None, dataset_statistics=None,
                 pretrained_params=None):
        self.config = dict(config)
        self.text_processor = text_processor
        self.dataset_statistics = dataset_statistics
        self.pretrained_params = pretrained_params
        # The same module from_config builds: flax modules compare by their fields, so loss() needs no model yet.
        self.module = OctoModule.create(**self.config["model"])
        self.model: Optional[OctoModel] = None

    def init(self, rng, example_batch):
        """Fresh parameters (merged with the pretrained ones, if any). ``example_batch`` is global; see gather.py."""
        model = OctoModel.from_config(self.config, example_batch, self.text_processor, rng=rng,
                                      dataset_statistics=self.dataset_statistics)
        params = model.params
        if self.pretrained_params is not None:
            params = merge_params(params, self.pretrained_params)
        # Kept for writing a checkpoint OctoModel.load_pretrained can read (config, example batch, statistics).
        self.model = model.replace(params=params)
        return params

    def loss(self, params, batch, rng, train: bool) -> Tuple[jax.Array, dict]:
        """The fork's ``scripts/finetune.py`` ``loss_fn``: the transformer, then the action head's loss."""
        bound = self.module.bind({"params": params}, rngs={"dropout": rng})
        embeddings = bound.octo_transformer(batch["observation"], batch["task"],
                                            batch["observation"]["timestep_pad_mask"], train=train)
        return bound.heads["action"].loss(embeddings, batch["action"], batch["observation"]["timestep_pad_mask"],
                                          batch["action_pad_mask"], train=train)


def smoke_config(spec: data.Spec = SMOKE_SPEC) -> dict:
    """The tiny Octo config of the smoke job: no weights, no text model, nothing downloaded."""
    return {"model": tiny_model_config(spec.action_horizon, spec.action_dim), "text_processor": None}


def example_spec() -> data.Spec:
    """Shapes of the synthetic batches ``data.SyntheticData`` must make for :func:`smoke_policy`."""
    return SMOKE_SPEC


def smoke_policy() -> Tuple[OctoPolicy, data.Spec]:
    """(policy, batch spec) for ``octo-dist smoke --model octo``."""
    return OctoPolicy(smoke_config(SMOKE_SPEC)), SMOKE_SPEC
