"""Octo's model described as data: module specs and the tiny Octo of smoke runs. Standard library only.

Octo builds its modules from ``ModuleSpec`` dicts (``{"module": ..., "name": ..., "args": ..., "kwargs": ...}``,
what ``octo.utils.spec.ModuleSpec.create`` returns), so configs written with :func:`module_spec` load, print and
get checked on a login node without Octo or JAX installed.
"""

from __future__ import annotations

from typing import Any


def module_spec(target: str, *args: Any, **kwargs: Any) -> dict:
    """``"octo.model.components.tokenizers:ImageTokenizer"`` -> the dict ``ModuleSpec.create`` makes of it."""
    if target.count(":") != 1:
        raise ValueError(f"module spec {target!r}; expected 'package.module:name'")
    module, name = target.split(":")
    return {"module": module, "name": name, "args": tuple(args), "kwargs": dict(kwargs)}


def tiny_model_config(
    action_horizon: int = 4, action_dim: int = 7, *, token_dim: int = 64, layers: int = 2
) -> dict:
    """A tiny Octo (the ``model`` entry of an Octo config) for smoke runs: one image tokenizer over
    ``image_primary`` (observation and goal stacked, as Octo-Small), a diffusion action head as in the fork's
    pretraining config, a 2-layer transformer of width 64. No text model, nothing to download. The image stem is
    Octo's PatchEncoder (one 16x16 convolution): Octo-Small's SmallStem16 doubles the train step's compile time on
    the CPU (measured 14 s vs 7 s here) and a smoke run is mostly compilation."""
    return {
        "observation_tokenizers": {
            "primary": module_spec(
                "octo.model.components.tokenizers:ImageTokenizer",
                obs_stack_keys=["image_primary"],
                task_stack_keys=["image_primary"],
                encoder=module_spec(
                    "octo.model.components.vit_encoders:PatchEncoder",
                    patch_size=16,
                    num_features=token_dim,
                ),
            ),
        },
        "task_tokenizers": {},
        "heads": {
            "action": module_spec(
                "octo.model.components.action_heads:DiffusionActionHead",
                readout_key="readout_action",
                use_map=False,
                action_horizon=action_horizon,
                action_dim=action_dim,
                n_diffusion_samples=1,
                dropout_rate=0.0,
                hidden_dim=64,
                num_blocks=1,
                diffusion_steps=20,
            ),
        },
        "readouts": {"action": 1},
        "token_embedding_size": token_dim,
        "transformer_kwargs": {
            "num_layers": layers,
            "mlp_dim": 2 * token_dim,
            "num_attention_heads": 2,
            "dropout_rate": 0.0,
            "attention_dropout_rate": 0.0,
            "add_position_embedding": False,
        },
        "max_horizon": 10,
        "repeat_task_tokens": True,
        "use_correct_attention": True,
    }
