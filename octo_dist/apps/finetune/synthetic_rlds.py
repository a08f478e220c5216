"""A small synthetic RLDS dataset, written by tensorflow_datasets as real TFRecord files, for the Octo smoke run.

    python -m octo_dist.apps.finetune.synthetic_rlds runs/synthetic_rlds      # what `make synthetic-data` runs

It has the layout of the Bridge data the fork's default fine-tune config reads (``octo_dist_synthetic/1.0.0/``,
``train`` and ``val`` splits), so the fork's own ``bridge_dataset_transform`` standardizes it and
``make_single_dataset`` loads it with the same ``image_obs_keys={"primary": "image_0"}``,
``proprio_obs_key="proprio"`` and ``language_key="language_instruction"``. Each step::

    observation: {image_0: uint8[S, S, 3] (JPEG), state: float32[7]}   # + wrist_image: uint8[W, W, 3] (JPEG)
    action: float32[7]        # 6 movement dims + gripper in {0, 1}; bridge_dataset_transform relabels the movement
    language_instruction: str, is_first / is_last / is_terminal: bool, reward / discount: float32

The state is a smooth random walk and the image's colour follows it, so a policy has something to learn. Only
numpy and tensorflow_datasets are needed: writing it does not need Octo. ``--wrist-size 128`` adds a second camera
(``wrist_image``; the config's ``image_obs_keys={"primary": "image_0", "wrist": "wrist_image"}``) and
``--texture`` adds pixel noise, so the JPEGs are about as large (and as slow to decode) as a real camera's: the input
benchmark's data (``--image-size 256 --wrist-size 128 --texture``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

NAME = "octo_dist_synthetic"
DATASET_VERSION = "1.0.0"
ACTION_DIM = 7
INSTRUCTIONS = (
    "pick up the red block",
    "open the drawer",
    "push the cup to the left",
    "wipe the table",
)


@dataclasses.dataclass(frozen=True)
class Layout:
    """How much to write: ``train_episodes`` + ``val_episodes`` episodes of ``steps`` steps, ``image_size`` pixels
    (and a ``wrist_size`` wrist camera when not 0; pixel noise with ``texture``)."""

    train_episodes: int = 16
    val_episodes: int = 4
    steps: int = 12
    image_size: int = 64
    seed: int = 0
    wrist_size: int = 0
    texture: bool = False


def _images(colour: np.ndarray, size: int, rng, texture: bool) -> np.ndarray:
    """(n, 3) uint8 colours -> (n, size, size, 3) uint8 frames: the colour over a top-to-bottom ramp (+ noise)."""
    ramp = np.linspace(0.5, 1.0, size, dtype=np.float32)[None, :, None, None]
    if not texture:
        images = (colour[:, None, None, :] * ramp).astype(np.uint8)  # (n, size, 1, 3): rows below
        return np.broadcast_to(images, (len(colour), size, size, 3)).copy()
    # Noise (a camera's grain and clutter): 256x256 JPEGs of about 18 KB, as real frames (10-30 KB; a ramp: 2 KB).
    noise = rng.normal(0, 4, (len(colour), size, size, 3)).astype(np.float32)
    return np.clip(colour[:, None, None, :] * ramp + noise, 0, 255).astype(np.uint8)


def episode(layout: Layout, index: int) -> dict:
    """Episode ``index`` as plain numpy (the same bytes for the same layout, seed and index)."""
    rng = np.random.default_rng([layout.seed, index])
    n, s = layout.steps, layout.image_size
    state = np.cumsum(0.05 * rng.standard_normal((n, ACTION_DIM)), axis=0).astype(np.float32)
    state[:, -1] = (np.arange(n) < n // 2).astype(np.float32)  # gripper open, then closed
    action = np.concatenate(
        [np.diff(state[:, :6], axis=0, append=state[-1:, :6]), state[:, -1:]], axis=1
    )
    # (n, 3): the state shows in the image
    colour = (np.tanh(state[:, :3]) * 100 + 128).astype(np.uint8)
    images = _images(colour, s, rng, layout.texture)
    observation = [{"image_0": images[t], "state": state[t]} for t in range(n)]
    if layout.wrist_size:
        wrist = _images(255 - colour, layout.wrist_size, rng, layout.texture)
        for t in range(n):
            observation[t]["wrist_image"] = wrist[t]
    instruction = INSTRUCTIONS[index % len(INSTRUCTIONS)]
    return {
        "steps": [
            {
                "observation": observation[t],
                "action": action[t].astype(np.float32),
                "language_instruction": instruction,
                "is_first": t == 0,
                "is_last": t == n - 1,
                "is_terminal": t == n - 1,
                "reward": np.float32(t == n - 1),
                "discount": np.float32(1.0),
            }
            for t in range(n)
        ],
        "episode_metadata": {"file_path": f"synthetic/episode_{index:05d}"},
    }


@functools.lru_cache(maxsize=None)
def _builder_class():
    # Defined on first use, once: tensorflow_datasets registers a builder class by name when the class is created
    # (a second class of that name is refused), and importing tensorflow is slow, so a plain
    # `import octo_dist.apps.finetune.synthetic_rlds` stays cheap.
    import tensorflow_datasets as tfds

    class OctoDistSynthetic(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version(DATASET_VERSION)
        RELEASE_NOTES = {
            DATASET_VERSION: "Synthetic Bridge-layout RLDS episodes for the octo-dist smoke run."
        }

        def __init__(self, *, layout: Layout = Layout(), **kwargs):
            self._layout = layout
            super().__init__(**kwargs)

        def _info(self):
            # DatasetInfo directly: dataset_info_from_configs looks for a README beside the defining module.
            return tfds.core.DatasetInfo(
                builder=self, description=__doc__, features=_features(tfds, self._layout)
            )

        def _split_generators(self, dl_manager):
            lay = self._layout
            return {
                "train": self._generate_examples(range(lay.train_episodes)),
                "val": self._generate_examples(
                    range(lay.train_episodes, lay.train_episodes + lay.val_episodes)
                ),
            }

        def _generate_examples(self, indices) -> Iterator:
            for i in indices:
                yield f"episode_{i:05d}", episode(self._layout, i)

    return OctoDistSynthetic


def _features(tfds, layout: Layout):
    """An episode's features: Bridge's names and shapes, with the images at ``layout``'s sizes."""

    def scalar(dtype):
        return tfds.features.Scalar(dtype=dtype)

    def jpeg(side):
        return tfds.features.Image(shape=(side, side, 3), dtype=np.uint8, encoding_format="jpeg")

    cameras = {"image_0": jpeg(layout.image_size)}
    if layout.wrist_size:
        cameras["wrist_image"] = jpeg(layout.wrist_size)
    return tfds.features.FeaturesDict(
        {
            "steps": tfds.features.Dataset(
                {
                    "observation": tfds.features.FeaturesDict(
                        {
                            **cameras,
                            "state": tfds.features.Tensor(shape=(ACTION_DIM,), dtype=np.float32),
                        }
                    ),
                    "action": tfds.features.Tensor(shape=(ACTION_DIM,), dtype=np.float32),
                    "language_instruction": tfds.features.Text(),
                    "is_first": scalar(np.bool_),
                    "is_last": scalar(np.bool_),
                    "is_terminal": scalar(np.bool_),
                    "reward": scalar(np.float32),
                    "discount": scalar(np.float32),
                }
            ),
            "episode_metadata": tfds.features.FeaturesDict({"file_path": tfds.features.Text()}),
        }
    )


def write(data_dir: str | Path, layout: Layout = Layout()) -> Path:
    """Write the dataset under ``data_dir`` (kept if already there); returns ``data_dir/octo_dist_synthetic/1.0.0``."""
    data_dir = Path(data_dir).resolve()
    builder = _builder_class()(layout=layout, data_dir=str(data_dir))
    # Nothing is downloaded; without download_dir tfds would still create ~/tensorflow-datasets/downloads.
    builder.download_and_prepare(download_dir=str(data_dir / "downloads"))
    return data_dir / NAME / DATASET_VERSION


# The layout's whole-number fields, each a flag of its name (train_episodes: --train-episodes), with its help.
LAYOUT_FLAGS = {
    "train_episodes": "episodes in the train split",
    "val_episodes": "episodes in the val split",
    "steps": "steps per episode",
    "image_size": "side of the square camera images, in pixels",
    "seed": "seed of the images, actions and instructions",
    "wrist_size": "side of a second (wrist) camera's square images, wrist_image; 0: none",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m octo_dist.apps.finetune.synthetic_rlds", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "data_dir", help="where to write (the smoke config's --config.dataset_kwargs.data_dir)"
    )
    for field, what in LAYOUT_FLAGS.items():
        p.add_argument(
            "--" + field.replace("_", "-"),
            type=int,
            default=getattr(Layout, field),
            help=f"{what} (default: %(default)s)",
        )
    p.add_argument(
        "--texture",
        action="store_true",
        help="add pixel noise: JPEGs about as large (and as slow to decode) as a real camera's",
    )
    a = p.parse_args(argv)
    layout = Layout(**{field: getattr(a, field) for field in LAYOUT_FLAGS}, texture=a.texture)
    out = write(a.data_dir, layout)
    print(f"synthetic RLDS dataset {NAME} {DATASET_VERSION}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
