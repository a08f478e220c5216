"""A small Flax transformer policy with Octo's inputs and outputs, for plumbing checks where Octo is absent.

Patches of each observation frame and of the goal image become tokens; a few pre-norm transformer blocks mix
them; each timestep's tokens are pooled and mapped to an ``action_horizon x action_dim`` chunk. The loss is the
mean squared error over unpadded actions. Dropout is there so the train step's RNG handling is exercised.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from octo_dist.engine.data import Spec


class Block(nn.Module):
    width: int
    heads: int
    dropout: float

    @nn.compact
    def __call__(self, x, mask, train: bool):
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(
            num_heads=self.heads, deterministic=not train, dropout_rate=self.dropout
        )(h, h, mask=mask)
        x = x + h
        h = nn.LayerNorm()(x)
        h = nn.Dense(self.width * 2)(h)
        h = nn.gelu(h)
        h = nn.Dropout(self.dropout, deterministic=not train)(h)
        return x + nn.Dense(self.width)(h)


class TinyTransformer(nn.Module):
    spec: Spec
    width: int = 64
    depth: int = 2
    heads: int = 4
    patch: int = 8
    dropout: float = 0.1

    @nn.compact
    def __call__(self, observation, task, train: bool = False):
        frames = observation["image_primary"].astype(jnp.float32) / 255.0 - 0.5  # (B, T, H, W, 3)
        b, t = frames.shape[:2]
        embed = nn.Conv(
            self.width, (self.patch, self.patch), strides=(self.patch, self.patch), name="patch"
        )
        obs = embed(frames.reshape((b * t,) + frames.shape[2:]))  # (B*T, h, w, D)
        n = obs.shape[1] * obs.shape[2]
        obs = obs.reshape(b, t * n, self.width)
        goal = embed(task["image_primary"].astype(jnp.float32) / 255.0 - 0.5).reshape(
            b, n, self.width
        )
        x = jnp.concatenate([goal, obs], axis=1)
        x = x + self.param("pos", nn.initializers.normal(0.02), (1, x.shape[1], self.width))
        # Padded timesteps are neither attended to nor attend.
        keep = jnp.concatenate(
            [jnp.ones((b, n), bool), jnp.repeat(observation["timestep_pad_mask"], n, axis=1)],
            axis=1,
        )
        mask = nn.make_attention_mask(keep, keep)
        for i in range(self.depth):
            x = Block(self.width, self.heads, self.dropout, name=f"block{i}")(x, mask, train)
        x = nn.LayerNorm()(x[:, n:].reshape(b, t, n, self.width).mean(axis=2))  # (B, T, D)
        out = nn.Dense(self.spec.action_horizon * self.spec.action_dim, name="action")(x)
        return out.reshape(b, t, self.spec.action_horizon, self.spec.action_dim)


@dataclasses.dataclass(frozen=True)
class TinyPolicy:
    spec: Spec = Spec()
    dropout: float = 0.1
    name: str = "tiny"

    @property
    def module(self) -> TinyTransformer:
        return TinyTransformer(self.spec, dropout=self.dropout)

    def init(self, rng, example_batch) -> Any:
        # Traced inside the engine's jit, so a global batch spread over several processes is fine.
        return self.module.init(rng, example_batch["observation"], example_batch["task"])["params"]

    def loss(self, params, batch, rng, train: bool):
        pred = self.module.apply(
            {"params": params},
            batch["observation"],
            batch["task"],
            train=train,
            rngs={"dropout": rng},
        )
        mask = (
            batch["action_pad_mask"] & batch["observation"]["timestep_pad_mask"][:, :, None, None]
        )
        err = jnp.where(mask, (pred - batch["action"]) ** 2, 0.0)
        loss = err.sum() / jnp.maximum(mask.sum(), 1)
        return loss, {"mse": loss}
