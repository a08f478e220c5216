"""The host's resize as two matrix products (``frames.resize_products``, ``frames.resize_host``) against
``tf.image.resize`` (dlimp's ``resize_image``, the fork's): within the resize's bound, 1 uint8 level on at most
``frames.RESIZE_SHARE`` of the values.

Inputs are fabricated: blocky textures with camera-like noise (edges where lanczos rings, flat areas where it does
not) and plain noise (the worst case for rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
from fork_augment import RESIZES, textured

tf = pytest.importorskip("tensorflow")

from octo_dist.apps.finetune import frames  # noqa: E402

# The resize tests' cases (fork_augment.RESIZES) and the fork's 64x64 debug frames up to the wrist camera's size:
# where the image grows resize_host multiplies, where it shrinks it keeps TensorFlow's kernel.
RESIZE_CASES = [*RESIZES, ((64, 64), (128, 128)), ((60, 80), (256, 256))]


def images(shape, seed) -> list:
    return [textured(shape, seed), np.random.default_rng(seed).integers(0, 256, shape, np.uint8)]


def within_bound(mine: np.ndarray, theirs: np.ndarray) -> None:
    assert mine.dtype == theirs.dtype == np.uint8 and mine.shape == theirs.shape
    diff = np.abs(mine.astype(int) - theirs.astype(int))
    assert diff.max() <= frames.RESIZE_LEVELS, f"{diff.max()} levels off"
    assert (diff > 0).mean() <= frames.RESIZE_SHARE, f"{(diff > 0).mean():.4%} of values off"


@pytest.mark.parametrize("method", frames.RESIZE_METHODS)
@pytest.mark.parametrize("stored, size", RESIZE_CASES)
def test_the_products_give_tensorflows_resize_to_one_level(stored, size, method):
    for seed in range(2):
        for img in images((*stored, 3), seed):
            mine = frames.resize_products(tf.constant(img), size, method).numpy()
            within_bound(mine, frames.resize_image(img, size, method).numpy())


def test_the_weights_are_tensorflows_kernel_normalised_and_the_identity_at_the_same_size():
    up = frames.resize_weights(64, 256, "lanczos3").numpy()
    assert up.shape == (256, 64)
    np.testing.assert_allclose(up.sum(axis=1), 1.0, atol=1e-6)
    # lanczos3 up by 4 reads at most 7 input pixels per output pixel (its 3-pixel radius either side)
    assert ((np.abs(up) > 0).sum(axis=1) <= 7).all()
    np.testing.assert_allclose(
        frames.resize_weights(64, 64, "lanczos3").numpy(), np.eye(64), atol=1e-6
    )


def test_the_host_grows_by_products_and_shrinks_with_tensorflows_kernel_in_a_data_pipeline():
    """In a tf.data map the decoded image's size is known only when it runs: the choice is made then, and the
    result has the target's static height and width."""
    small, large = textured((64, 64, 3), 1), textured((480, 640, 3), 2)
    encoded = [tf.io.encode_png(x) for x in (small, large)]
    dataset = tf.data.Dataset.from_tensor_slices(encoded).map(
        lambda x: frames.resize_host(tf.io.decode_image(x, expand_animations=False), (256, 256))
    )
    assert dataset.element_spec.shape.as_list() == [256, 256, None]
    grown, shrunk = list(dataset.as_numpy_iterator())
    np.testing.assert_array_equal(grown, frames.resize_products(tf.constant(small), (256, 256)))
    np.testing.assert_array_equal(shrunk, frames.resize_image(large, (256, 256)))


def test_the_frame_transforms_resize_with_the_products_by_default():
    assert frames.FrameTransforms.from_config({}).resize is frames.resize_host


def test_weights_made_once_for_the_stored_size_are_the_same_and_other_sizes_still_resize():
    np.testing.assert_array_equal(
        frames.resize_weights(64, 256, "lanczos3").numpy(),
        frames.resize_weights(tf.constant(64), 256, "lanczos3").numpy(),
    )
    stored, other = textured((64, 64, 3), 3), textured((48, 80, 3), 4)
    encoded = [tf.io.encode_png(x) for x in (stored, other)]
    dataset = tf.data.Dataset.from_tensor_slices(encoded).map(
        lambda x: frames.resize_host(
            tf.io.decode_image(x, expand_animations=False), (256, 256), expected=(64, 64)
        )
    )
    for got, img in zip(dataset.as_numpy_iterator(), (stored, other)):
        np.testing.assert_array_equal(got, frames.resize_products(tf.constant(img), (256, 256)))


def test_the_frame_transforms_give_the_stored_size_to_the_resize():
    config = {"frame_transform_kwargs": {"resize_size": {"primary": (256, 256)}}}
    transforms = frames.FrameTransforms.from_config(config, decoded_size={"primary": (64, 64)})
    img = textured((64, 64, 3), 5)
    one = {"observation": {"image_primary": tf.io.encode_png(img)[None]}}
    out = next(iter(transforms(tf.data.Dataset.from_tensors(one)).as_numpy_iterator()))
    within_bound(
        out["observation"]["image_primary"][0], frames.resize_image(img, (256, 256)).numpy()
    )
