"""The fine-tune's frame transforms on the host: decode, resize only what needs it, augment only when the host does.

    transform = frames.FrameTransforms.from_config(job_config.plain_config())
    frames_ds = transform(frames_ds)          # a tf.data dataset of frames (one window each), as Octo's yields them

The same output as Octo's ``apply_frame_transforms`` (``octo/data/dataset.py``: ``decode_and_resize``, then
``augment``) for the same frames and augmentation seeds, without the work that changes nothing:

- a resize to the size an image already has is skipped. The fork's lanczos3 resize to the same size gives the
  same pixels (tests/test_frames.py checks it on random images), at 2.1-2.4 ms per 256x256 image;
- a padding image (an absent camera: ``image_obs_keys={"wrist": None}``, a deleted goal image) is made at the
  target size, not made and then resized;
- with ``augment_on = "device"`` (a top-level config field; default ``"host"``) the host only decodes: the train
  step augments the batch (:mod:`octo_dist.engine.augment`), and resizes the cameras whose frames are stored at
  another size than the model's (:func:`device_resized`: the host leaves them at their stored size);
- ``resize_method = "bilinear"`` (top-level config field; default ``"lanczos3"``, the fork's) where a resize
  remains: about 3x cheaper per image, slightly softer.

One map over each frame (Octo's makes two: decode and resize, then augment). TensorFlow only: no Octo or dlimp
import, so it runs (and is tested) where they are not installed. Octo's seed per camera is ``seed + i`` over a
Python ``set`` of the camera names, whose order changes from process to process (string hashing); here ``i``
follows the sorted names, one of the orders Octo's draws.

What this does not do, and so leaves to Octo's ``apply_frame_transforms`` (:func:`forks_transforms_for` says
which, from the config before any data is read, for the plan line, the pipeline and the step alike): depth images
(``dataset_kwargs.depth_obs_keys``), image dropout (``image_dropout_prob`` > 0).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Optional, Sequence, Tuple

from octo_dist.engine import stepfns

# the config's "augment_on" once resolved for the platform (config.for_platform): who augments the images
AUGMENT_ON = stepfns.PLACED
RESIZE_METHODS = (
    "lanczos3",
    "bilinear",
)  # the config's "resize_method" (config.RESIZE_METHODS); the fork's: lanczos3
# The frame transform kwargs this module takes; any other (depth_resize_size, image_dropout_prob > 0) is Octo's.
HANDLED_KWARGS = ("resize_size", "image_augment_kwargs", "num_parallel_calls")
# The resize equivalence bound: the device's resize against TensorFlow's (tests/test_augment.py), and what a
# reduced-scale JPEG decode would have to meet to replace decode + lanczos3 (benchinput.decodescale): at most 1
# uint8 level off, on at most 0.2% of the values (measured: 0.049% at most, docs/measurements.md).
RESIZE_LEVELS, RESIZE_SHARE = 1, 0.002
# What a FrameTransforms may switch off (the input benchmark does).
STAGES = ("decode", "resize", "augment")


def resize_image(image, size: Tuple[int, int], method: str = "lanczos3"):
    """uint8 [H, W, C] -> uint8 [h, w, C]: dlimp's ``resize_image`` (antialiased, rounded, clipped) with a method."""
    import tensorflow as tf

    out = tf.image.resize(image, size, method=method, antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)


def resize_unless_same(image, size: Tuple[int, int], method: str = "lanczos3", resize=resize_image):
    """``image`` resized to ``size`` (``resize(image, size, method)``), or ``image`` itself when it has that size.

    The size is known only once a JPEG is decoded, so the choice is a ``tf.cond``: the resize op does not run for
    an image of the target size. The result's height and width are static (``(256, 256, None)``), as a resize's.
    """
    import tensorflow as tf

    same = tf.reduce_all(tf.shape(image)[:2] == tf.constant(size, tf.int32))
    out = tf.cond(same, lambda: image, lambda: resize(image, size, method))
    return tf.ensure_shape(out, (*size, None))


def padding_image(size: Optional[Tuple[int, int]]):
    """The image of an absent camera: zeros at the target size (uint8 [h, w, 3]); 1x1 where no size is set, as
    Octo's ``decode_and_resize``."""
    import tensorflow as tf

    return tf.zeros((*(size or (1, 1)), 3), dtype=tf.uint8)


def _random_resized_crop(image, scale, ratio, seed):
    """dlimp's ``random_resized_crop`` on one float image: a box of ``scale`` of the area and aspect ``ratio``
    (log-uniform), at a uniform offset, resized back to the image's size; the same draws from ``seed``."""
    import tensorflow as tf

    height, width = tf.shape(image)[0], tf.shape(image)[1]
    area = tf.random.stateless_uniform((1,), seed, scale[0], scale[1])
    aspect = tf.exp(tf.random.stateless_uniform((1,), seed, math.log(ratio[0]), math.log(ratio[1])))
    box_h = tf.clip_by_value(tf.sqrt(area / aspect), 0, 1)
    box_w = tf.clip_by_value(tf.sqrt(area * aspect), 0, 1)
    top = tf.random.stateless_uniform((1,), seed, 0, 1 - box_h)
    left = tf.random.stateless_uniform((1,), seed, 0, 1 - box_w)
    boxes = tf.stack([top, left, top + box_h, left + box_w], axis=1)
    return tf.image.crop_and_resize(image[None], boxes, tf.range(1), (height, width))[0]


def _random_rot90(image, seed):
    import tensorflow as tf

    return tf.image.rot90(image, k=tf.random.stateless_uniform((), seed, 0, 4, dtype=tf.int32))


def _augment_ops() -> dict:
    import tensorflow as tf

    # dlimp's AUGMENT_OPS: the names the fork's configs use in "augment_order".
    return {
        "random_resized_crop": _random_resized_crop,
        "random_brightness": tf.image.stateless_random_brightness,
        "random_contrast": tf.image.stateless_random_contrast,
        "random_saturation": tf.image.stateless_random_saturation,
        "random_hue": tf.image.stateless_random_hue,
        "random_flip_left_right": tf.image.stateless_random_flip_left_right,
        "random_flip_up_down": tf.image.stateless_random_flip_up_down,
        "random_rot90": _random_rot90,
    }


def augment_image(image, seed, augment_kwargs: Mapping):
    """dlimp's ``augment_image``: the ops of ``augment_kwargs["augment_order"]`` in that order, each with its
    arguments (``{"random_brightness": [0.1], "random_resized_crop": {"scale": [0.8, 1], "ratio": [0.9, 1.1]}}``)
    and the one ``seed`` (int32 [2]), in float [0, 1], clipped after each op; uint8 in, uint8 out."""
    import tensorflow as tf

    ops = _augment_ops()
    unknown = [op for op in augment_kwargs["augment_order"] if op not in ops]
    if unknown:
        raise ValueError(
            f"augment_order names {unknown}; expected ops among {sorted(ops)} (dlimp's augmentations)"
        )
    dtype = image.dtype
    image = tf.image.convert_image_dtype(image, tf.float32)
    for op in augment_kwargs["augment_order"]:
        args = augment_kwargs.get(op, ())
        if hasattr(args, "items"):
            image = ops[op](image, seed=seed, **args)
        else:
            image = ops[op](image, *args, seed=seed)
        image = tf.clip_by_value(image, 0, 1)
    return tf.image.convert_image_dtype(image, dtype, saturate=True)


def unsupported(frame_transform_kwargs: Mapping, element_spec: Optional[Mapping] = None) -> list:
    """Why :class:`FrameTransforms` cannot stand in for Octo's ``apply_frame_transforms`` here ([] when it can):
    ``{"image_dropout_prob": 0.5}`` -> ``["image_dropout_prob=0.5 (image dropout)"]``."""
    out = []
    for key, value in frame_transform_kwargs.items():
        if key in HANDLED_KWARGS:
            continue
        if key == "image_dropout_prob" and not value:
            # Octo's dropout at 0 keeps every image: rands > 0 for uniform draws in [0, 1) fails only on an exact 0.
            continue
        if key in ("image_dropout_keep_key", "depth_resize_size") and not value:
            continue
        out.append(f"{key}={value!r}")
    for part in ("observation", "task"):
        keys = (element_spec or {}).get(part, {})
        out += [f"{part}.{k} (depth images)" for k in keys if k.startswith("depth_")]
    return out


def depth_images(config: Mapping) -> list:
    """The depth images Octo's ``make_dataset_from_rlds`` makes for ``config``, before any data is read: one per
    camera of ``dataset_kwargs.depth_obs_keys``, a camera without a feature included (its depth images are
    padding): ``{"primary": "depth_0", "wrist": None}`` -> ``["observation.depth_primary (depth images)",
    "observation.depth_wrist (depth images)"]``."""
    keys = (config.get("dataset_kwargs") or {}).get("depth_obs_keys") or {}
    return [f"observation.depth_{name} (depth images)" for name in sorted(keys)]


def forks_transforms_for(config: Mapping, element_spec: Optional[Mapping] = None) -> list:
    """Why the fine-tune runs the fork's ``apply_frame_transforms`` for ``config`` instead of
    :class:`FrameTransforms` ([] where these do what it asks): its ``frame_transform_kwargs``
    (:func:`unsupported`), the depth images its ``depth_obs_keys`` make (:func:`depth_images`) and, once the
    dataset exists, those of ``element_spec``. The one decision the plan line, the pipeline and the train step
    follow: the fork's transforms resize on the host, so no camera is left to the device where this is not []."""
    out = unsupported(config.get("frame_transform_kwargs") or {}, element_spec)
    return out + [d for d in depth_images(config) if d not in out]


@dataclasses.dataclass(frozen=True)
class FrameTransforms:
    """The frame transforms for one config: decode, resize where the size differs, augment where the host does.

    Attributes:
      resize_size: camera name -> (height, width): ``{"primary": (256, 256), "wrist": (128, 128)}``; a camera not
        named keeps its decoded size (as Octo's).
      augment_kwargs: camera name -> dlimp augment kwargs, or one dict with ``augment_order`` for every camera.
      augment: whether the host augments (``augment_on == "host"``).
      resize_method: ``"lanczos3"`` (the fork's) or ``"bilinear"``.
      skip_same_size: skip resizes to the size an image has (False: resize every image, padding ones included,
        as the fork does; only the input benchmark sets it, to measure what skipping saves).
      stages: the stages that run (the input benchmark switches them off in turn; training runs them all, the
        augmentation as ``augment`` says): without "decode" the images stay encoded; without "resize" a decoded
        image is cropped or padded to its target size (a copy, so batches keep their shapes) instead of resized.
      num_parallel_calls: the map's parallelism (tf.data.AUTOTUNE when None).
      resize: the resize function (``resize_image``).
      stored_size: camera name -> (height, width) its frames are stored at (the dataset's features.json). A camera
        named here is left at that size for the device to resize (``octo_dist.engine.augment.resize_batch``): the
        host only decodes, and makes its padding images at that size, so a batch has one shape per camera.
      decode_ratio: camera name -> 2, 4 or 8: its JPEGs decoded at that fraction of their stored size by libjpeg
        (``tf.io.decode_jpeg(ratio=...)``), for cameras of ``stored_size`` at least that many times the model's
        size (:func:`decode_ratio_for`); an opt-in: its pixels are not the full decode's (docs/measurements.md).
    """

    resize_size: Mapping[str, Tuple[int, int]] = dataclasses.field(default_factory=dict)
    augment_kwargs: Mapping = dataclasses.field(default_factory=dict)
    augment: bool = True
    resize_method: str = "lanczos3"
    skip_same_size: bool = True
    stages: frozenset = frozenset(STAGES)
    num_parallel_calls: Optional[int] = None
    resize: Callable = resize_image
    stored_size: Mapping[str, Tuple[int, int]] = dataclasses.field(default_factory=dict)
    decode_ratio: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Mapping, **overrides) -> "FrameTransforms":
        """From a fine-tune config as a plain mapping: its ``frame_transform_kwargs``, ``augment_on`` and
        ``resize_method``. Raises ValueError naming a value it does not know."""
        kwargs = config.get("frame_transform_kwargs") or {}
        augment_on = config.get("augment_on", "host")
        method = config.get("resize_method", "lanczos3")
        if augment_on not in AUGMENT_ON:
            raise ValueError(f"augment_on={augment_on!r}; expected one of {list(AUGMENT_ON)}")
        if method not in RESIZE_METHODS:
            raise ValueError(f"resize_method={method!r}; expected one of {list(RESIZE_METHODS)}")
        size = kwargs.get("resize_size") or {}
        settings = dict(
            resize_size=dict(size) if hasattr(size, "items") else {"*": tuple(size)},
            augment_kwargs=kwargs.get("image_augment_kwargs") or {},
            augment=augment_on == "host",
            resize_method=method,
            num_parallel_calls=kwargs.get("num_parallel_calls"),
        )
        settings.update(overrides)
        return cls(**settings)

    @classmethod
    def for_sizes(cls, config: Mapping) -> "FrameTransforms":
        """``config``'s transforms for reading target sizes (:meth:`size_of`) before a rank has resolved where
        images are augmented (the packaged configs' ``augment_on = "auto"``): the placement does not change them."""
        return cls.from_config({**config, "augment_on": "host"})

    def size_of(self, name: str) -> Optional[Tuple[int, int]]:
        """The target size of camera ``name`` (``"primary"``), or None (kept as decoded)."""
        size = self.resize_size.get(name, self.resize_size.get("*"))
        return tuple(int(v) for v in size) if size is not None else None

    def augment_kwargs_of(self, name: str) -> Optional[Mapping]:
        """Camera ``name``'s augmentation kwargs, or None (not augmented)."""
        if "augment_order" in self.augment_kwargs:
            return self.augment_kwargs
        return self.augment_kwargs.get(name)

    def image(self, encoded, name: str):
        """One camera's image, decoded (uint8 [h, w, C]) and resized to its target size where it differs."""
        import tensorflow as tf

        size = self.size_of(name)
        if encoded.dtype == tf.string and name in self.stored_size and size is not None:
            return (
                encoded if "decode" not in self.stages else self._decoded_as_stored(encoded, name)
            )
        if encoded.dtype == tf.string:
            if "decode" not in self.stages:
                return encoded
            if size is None:
                return tf.cond(
                    tf.strings.length(encoded) == 0,
                    lambda: padding_image(None),
                    lambda: tf.io.decode_image(encoded, expand_animations=False, dtype=tf.uint8),
                )
            if self.skip_same_size:
                # Padding (an empty string) is made at the target size and never resized.
                return tf.cond(
                    tf.strings.length(encoded) == 0,
                    lambda: padding_image(size),
                    lambda: self._resized(
                        tf.io.decode_image(encoded, expand_animations=False, dtype=tf.uint8), size
                    ),
                )
            # The fork's way: padding made at the target size, then resized like any image.
            image = tf.cond(
                tf.strings.length(encoded) == 0,
                lambda: padding_image(size),
                lambda: tf.io.decode_image(encoded, expand_animations=False, dtype=tf.uint8),
            )
        elif encoded.dtype == tf.uint8:
            image = encoded
        else:
            raise ValueError(
                f"image_{name} has dtype {encoded.dtype.name}; expected encoded images (string) or uint8"
            )
        return image if size is None else self._resized(image, size)

    @property
    def device_sizes(self) -> dict:
        """Camera -> the model's size, for the cameras whose frames leave the host at their stored size (the step
        resizes them: ``augment.batch_augmenter(sizes=...)``); ``{}`` where the host resizes every camera."""
        return {name: self.size_of(name) for name in self.stored_size if self.size_of(name)}

    def shipped_size(self, name: str) -> Optional[Tuple[int, int]]:
        """The size camera ``name``'s images leave the host at: its stored size (divided by its decode ratio,
        rounded up as libjpeg rounds) when the device resizes it, else its target size."""
        if name not in self.stored_size or self.size_of(name) is None:
            return self.size_of(name)
        ratio = self.decode_ratio.get(name, 1)
        return tuple(-(-int(v) // ratio) for v in self.stored_size[name])

    def _decoded_as_stored(self, encoded, name: str):
        """Decoded (at its decode ratio), at the size it was stored at; padding made at that size. A frame stored
        at another size than the camera's others is resized to theirs here (rare: a batch needs one shape)."""
        import tensorflow as tf

        size, ratio = self.shipped_size(name), self.decode_ratio.get(name, 1)

        def decode():
            if ratio > 1:
                image = tf.io.decode_jpeg(encoded, channels=3, ratio=ratio)
            else:
                image = tf.io.decode_image(encoded, expand_animations=False, dtype=tf.uint8)
            return resize_unless_same(image, size, self.resize_method, self.resize)

        return tf.cond(tf.strings.length(encoded) == 0, lambda: padding_image(size), decode)

    def _resized(self, image, size: Tuple[int, int]):
        import tensorflow as tf

        if "resize" not in self.stages:
            return tf.ensure_shape(tf.image.resize_with_crop_or_pad(image, *size), (*size, None))
        if self.skip_same_size:
            return resize_unless_same(image, size, self.resize_method, self.resize)
        return self.resize(image, size, self.resize_method)

    def decoded(self, part: Mapping, window: bool) -> dict:
        """``part`` (an observation or a task dict) with every ``image_*`` decoded and resized; ``window``: its
        images have a leading window axis (``[2]`` strings), each frame decoded on its own."""
        import tensorflow as tf

        out = dict(part)
        for key in sorted(part):
            if not key.startswith("image_"):
                continue
            name = key[len("image_") :]
            if window:
                out[key] = tf.stack([self.image(x, name) for x in tf.unstack(part[key])])
            else:
                out[key] = self.image(part[key], name)
        return out

    def augmented(self, part: Mapping, seed, window: bool) -> dict:
        """``part`` with each augmented camera's images augmented (seed + its index among the sorted camera names;
        every frame of a window alike), padding images left as they are."""
        import tensorflow as tf

        out = dict(part)
        names = sorted(k[len("image_") :] for k in part if k.startswith("image_"))
        for i, name in enumerate(names):
            kwargs = self.augment_kwargs_of(name)
            if kwargs is None:
                continue
            key = f"image_{name}"

            def one(image, present, i=i, kwargs=kwargs):
                return tf.cond(
                    present, lambda: augment_image(image, seed + i, kwargs), lambda: image
                )

            present = part["pad_mask_dict"][key]
            if window:
                frames = zip(tf.unstack(part[key]), tf.unstack(present))
                out[key] = tf.stack([one(x, p) for x, p in frames])
            else:
                out[key] = one(part[key], present)
        return out

    def frame(self, frame: Mapping) -> dict:
        """One frame (``{"observation": {image_primary: string[2], ...}, "task": {...}, ...}``) transformed."""
        import tensorflow as tf

        frame = dict(frame)
        parts = [(p, p == "observation") for p in ("task", "observation") if p in frame]
        for part, window in parts:
            frame[part] = self.decoded(frame[part], window)
        if (
            self.augment
            and "augment" in self.stages
            and "decode" in self.stages
            and self.augment_kwargs
        ):
            # Octo's draw: one seed per frame from the global seed (tf.random.set_seed before the pipeline is built).
            seed = tf.random.uniform([2], maxval=tf.dtypes.int32.max, dtype=tf.int32)
            for part, window in parts:
                frame[part] = self.augmented(frame[part], seed, window)
        return frame

    def __call__(self, dataset):
        """A dataset of frames -> the same frames transformed (one parallel map)."""
        import tensorflow as tf

        calls = self.num_parallel_calls
        return dataset.map(
            self.frame, num_parallel_calls=tf.data.AUTOTUNE if calls is None else calls
        )


def device_resized(config: Mapping, stored: Mapping[str, Tuple[int, int]]) -> dict:
    """Camera -> the size its frames are stored at, for the cameras the train step resizes to the model's size.

    ``stored``: camera -> (height, width) from the dataset's features.json (:func:`stored_camera_sizes`). A camera
    is resized on the device where the device augments (``config["augment_on"] == "device"``, resolved), the config
    gives it a model size (``resize_size``) and its stored size differs from it; the frame transforms are this
    module's (:func:`forks_transforms_for` is empty). Any other camera is left out: the host resizes it as before, or,
    stored at the model's size, nothing resizes it at all. ``{"primary": (256, 256), "wrist": (256, 256)}`` with
    resize sizes 256x256 and 128x128 -> ``{"wrist": (256, 256)}``."""
    if config.get("augment_on") != "device":
        return {}
    if forks_transforms_for(config):
        return {}  # the fork's apply_frame_transforms resizes on the host
    sizes = FrameTransforms.for_sizes(config)
    out = {}
    for name, size in stored.items():
        size = (int(size[0]), int(size[1]))
        if sizes.size_of(name) not in (None, size):
            out[name] = size
    return out


def stored_camera_sizes(config: Mapping, by_feature: Mapping[str, Tuple[int, int]]) -> dict:
    """Camera -> its frames' stored size, from features.json's sizes by feature (``{"image_0": (256, 256)}``) and
    the config's ``dataset_kwargs.image_obs_keys`` (``{"primary": "image_0", "wrist": None}`` -> ``{"primary":
    (256, 256)}``); a camera without a feature, or whose feature has no fixed size, is left out."""
    keys = (config.get("dataset_kwargs") or {}).get("image_obs_keys") or {}
    return {name: tuple(by_feature[f]) for name, f in keys.items() if f in by_feature}


def decode_ratio_for(stored: Tuple[int, int], size: Tuple[int, int]) -> int:
    """The largest of 8, 4, 2 by which a JPEG stored at ``stored`` can be decoded and still be at least ``size``
    on both sides, else 1: ``(480, 640), (128, 128)`` -> 2; ``(512, 512), (128, 128)`` -> 4."""
    for ratio in (8, 4, 2):
        if stored[0] >= ratio * size[0] and stored[1] >= ratio * size[1]:
            return ratio
    return 1


def stage_variants(transforms: FrameTransforms) -> Sequence[Tuple[str, FrameTransforms]]:
    """The cumulative stages the input benchmark times, each with the ones before it: ``rest`` (read and batch,
    images left encoded), ``decode`` (decoded, cropped or padded to the target size), ``resize``, ``augment``
    (the whole transform; augmentation only where ``transforms.augment``)."""
    return tuple(
        (name, dataclasses.replace(transforms, stages=frozenset(STAGES[:i])))
        for i, name in enumerate(("rest", *STAGES))
    )
