"""Frames from an RLDS dataset without Octo: what the input benchmark reads where Octo is not importable.

    frames = reader.rlds_frames("data", config)   # a tf.data dataset of frames, images still encoded

Each element has the shape Octo's trajectory transforms give a frame (``observation.image_<camera>``: the window's
encoded images, "" for a camera the config leaves out; ``pad_mask_dict``; ``task.image_<camera>`` goal images when
the config relabels goals; ``task.language_instruction``), so the frame transforms do the same work per sample as
in training. What it does not do that Octo's trajectory transforms do: the dataset's standardize_fn, action and
proprio normalization, action chunks, goals drawn uniformly from the future (here: the episode's last frame) and
task augmentation (goals are never deleted). Those move numbers, not pixels: cheap beside decoding and resizing.
"""

from __future__ import annotations

from typing import Mapping


def image_features(config: Mapping) -> dict:
    """Camera -> its RLDS observation feature, or None for an absent camera: the config's ``image_obs_keys``."""
    return dict((config.get("dataset_kwargs") or {}).get("image_obs_keys") or {})


def window_of(config: Mapping) -> int:
    """The observation window: ``traj_transform_kwargs.window_size`` (else ``window_size``, else 1)."""
    traj = config.get("traj_transform_kwargs") or {}
    return int(traj.get("window_size") or config.get("window_size") or 1)


def rlds_frames(data_dir: str, config: Mapping, split: str = "train"):
    """The frames of ``config``'s dataset in ``data_dir`` (``<data_dir>/<name>/<version>``), forever, in file order."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    kwargs = config.get("dataset_kwargs") or {}
    cameras = image_features(config)
    window = window_of(config)
    goals = bool((config.get("traj_transform_kwargs") or {}).get("goal_relabeling_strategy"))
    language = kwargs.get("language_key")
    builder = tfds.builder(kwargs["name"], data_dir=data_dir)
    skip = {f: tfds.decode.SkipDecoding() for f in cameras.values() if f is not None}
    episodes = builder.as_dataset(
        split=split, decoders={"steps": {"observation": skip}}, shuffle_files=False
    )

    def frames_of(episode):
        steps = episode["steps"].batch(1_000_000).get_single_element()
        length = tf.shape(steps["action"])[0]
        # Octo's chunk_act_obs: each frame sees the window ending at it, the first frame repeated before the start.
        history = tf.maximum(tf.range(length)[:, None] + tf.range(-window + 1, 1), 0)
        observation, task, present, goal_present = {}, {}, {}, {}
        for camera, feature in cameras.items():
            key = f"image_{camera}"
            images = steps["observation"][feature] if feature else tf.fill([length], "")
            observation[key] = tf.gather(images, history)
            present[key] = tf.strings.length(observation[key]) > 0
            if goals:
                task[key] = tf.fill([length], images[-1]) if feature else tf.fill([length], "")
                goal_present[key] = tf.strings.length(task[key]) > 0
        observation["pad_mask_dict"] = present
        observation["timestep_pad_mask"] = tf.range(length)[:, None] + tf.range(-window + 1, 1) >= 0
        if language and language in steps:
            task["language_instruction"] = steps[language]
        task["pad_mask_dict"] = goal_present
        frames = {"observation": observation, "task": task, "action": steps["action"]}
        return tf.data.Dataset.from_tensor_slices(frames)

    return episodes.repeat().flat_map(frames_of)
