"""dlimp's image augmentations on the host, in TensorFlow: what the fork's ``augment`` frame transform runs, the same
ops, arguments and draws (``tests/test_frames.py`` compares them with dlimp's where it imports).

    image = hostaugment.augment_image(image, seed, {"random_brightness": [0.1], "augment_order": ["random_brightness"]})

TensorFlow only: no dlimp import. :mod:`.frames` calls it where the host augments (``augment_on = "host"``).
"""

from __future__ import annotations

import math
from typing import Mapping


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
