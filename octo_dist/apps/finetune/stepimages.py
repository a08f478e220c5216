"""What the fine-tune's train step does to the images, for a config: the augmenter, and the plan's words for it.

    augment = stepimages.step_augmenter(job.config, "gpu", source.device_sizes)   # (batch, key) -> batch, or None
    stepimages.images_plan("device", {"primary": (64, 64)})   # "decoded at 64x64, resized and augmented on the device"

The host's side is :mod:`.frames` (decode, and resize where the step does not); the ops are
:mod:`octo_dist.engine.augment`'s. JAX is imported only when a step augmenter is made.
"""

from __future__ import annotations

from typing import Mapping, Optional

from octo_dist.apps.finetune import config
from octo_dist.engine import stepfns


def step_augmenter(c: Mapping, platform: str = "gpu", sizes: Optional[Mapping] = None):
    """The train step's image augmentation for config ``c``: ``(batch, key) -> batch`` applying
    ``frame_transform_kwargs.image_augment_kwargs`` per camera when ``c.augment_on`` is ``"device"``; None when it
    is ``"host"`` (the data pipeline augmented the images: the step leaves them as they come). ``platform``: the
    devices' (``"tpu"`` resamples the crop with matrix products, ``augment.resampling_for``). ``sizes``: camera ->
    the model's size, for the cameras whose frames come at their stored size (``OctoData.device_sizes``): resized
    first, with ``c.resize_method``; no resize op for the others."""
    where = config.augment_on(c)
    if where not in stepfns.PLACED:  # "auto" is resolved on the rank first (config.for_platform)
        raise ValueError(f"augment_on {where!r}; expected one of {stepfns.PLACED}")
    if where != "device":
        return None
    from octo_dist.engine import augment

    kwargs = (c.get("frame_transform_kwargs") or {}).get("image_augment_kwargs") or {}
    return augment.batch_augmenter(
        augmented_cameras(c, kwargs),
        resample=augment.resampling_for(platform),
        sizes=sizes,
        resize_method=c.get("resize_method") or "lanczos3",
    )


def augmented_cameras(c: Mapping, kwargs: Mapping) -> dict:
    """``image_augment_kwargs`` without the cameras the dataset never fills: ``image_obs_keys = {"primary":
    "image_0", "wrist": None}`` -> the wrist's images are all padding (zeros). The augmentation leaves padding images
    as they are (pad mask false), as the fork's does, but it still computed every op on them and threw the result
    away: 16 images of 128x128 a step at batch 8, window 2 (measured by bench/step_profile.py)."""
    keys = (c.get("dataset_kwargs") or {}).get("image_obs_keys") or {}
    return {name: kw for name, kw in kwargs.items() if name not in keys or keys[name] is not None}


def images_plan(augment_on: str, resized: Mapping) -> str:
    """Where the images are resized and augmented, for the plan's log line: ``"augmented on the host"``, or with
    frames the step resizes (``resized``: camera -> stored size) ``"decoded at 64x64, resized and augmented on the
    device"`` (each camera's size named where they differ: ``"decoded at 256x256 (primary), 480x640 (wrist), ..."``)."""
    if not resized:
        return f"augmented on the {augment_on}"
    sizes = {f"{h}x{w}" for h, w in resized.values()}
    if len(sizes) == 1:
        stored = sizes.pop()
    else:
        stored = ", ".join(f"{h}x{w} ({name})" for name, (h, w) in sorted(resized.items()))
    return f"decoded at {stored}, resized and augmented on the {augment_on}"
