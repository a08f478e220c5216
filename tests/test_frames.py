"""The host frame transforms (octo_dist.apps.finetune.frames): the fork's pixels, without the work that changes nothing.

Frames are made here as Octo's trajectory transforms hand them over (a window of 2 encoded frames per camera, a
goal image in the task, ``pad_mask_dict``), from real JPEGs; the oracle is a plain ``tf.image.resize`` (dlimp's
lanczos3 path) of the decoded image. Where Octo and dlimp are importable, their own functions are the oracle too.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import fork_augment

tf = pytest.importorskip("tensorflow")

from octo_dist.apps.benchinput import decodescale, measure  # noqa: E402
from octo_dist.apps.finetune import frames, pipeline  # noqa: E402

PRIMARY, WRIST = (256, 256), (128, 128)
CONFIG = {
    "frame_transform_kwargs": {
        "resize_size": {"primary": PRIMARY, "wrist": WRIST},
        "image_augment_kwargs": {
            "primary": fork_augment.PRIMARY,
            "wrist": {"random_brightness": [0.1], "augment_order": ["random_brightness"]},
        },
    }
}


def photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A uint8 image with detail at every scale (a ramp plus noise), so a wrong resize shows in the pixels."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, w, dtype=np.float32)[None, :, None]
    return np.clip(ramp + rng.normal(0, 30, (h, w, 3)), 0, 255).astype(np.uint8)


def jpeg(image: np.ndarray) -> bytes:
    return tf.io.encode_jpeg(image, quality=95).numpy()


def decoded(data: bytes) -> np.ndarray:
    return tf.io.decode_image(data, expand_animations=False, dtype=tf.uint8).numpy()


def plain_resize(image: np.ndarray, size, method: str = "lanczos3") -> np.ndarray:
    """The oracle: ``tf.image.resize`` as dlimp's ``resize_image`` calls it (antialiased, rounded, clipped)."""
    out = tf.image.resize(image, size, method=method, antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8).numpy()


def within_bound(mine: np.ndarray, theirs: np.ndarray) -> None:
    """The resize's bound: 1 uint8 level on at most ``frames.RESIZE_SHARE`` of the values (the host resizes by
    matrix products with TensorFlow's weights: float32 sums in another order tip a value that rounds at .5)."""
    diff = np.abs(np.asarray(mine).astype(int) - np.asarray(theirs).astype(int))
    assert diff.max() <= frames.RESIZE_LEVELS and (diff > 0).mean() <= frames.RESIZE_SHARE


def frame(primary: list, wrist: list, goal: bytes = b"") -> dict:
    """One frame of a window as Octo's trajectory transforms make it: encoded images, "" where padding."""
    present = lambda xs: tf.constant([len(x) > 0 for x in xs])  # noqa: E731
    return {
        "observation": {
            "image_primary": tf.constant(primary),
            "image_wrist": tf.constant(wrist),
            "proprio": tf.zeros((len(primary), 7)),
            "pad_mask_dict": {
                "image_primary": present(primary),
                "image_wrist": present(wrist),
            },
        },
        "task": {
            "image_primary": tf.constant(goal),
            "pad_mask_dict": {"image_primary": tf.constant(len(goal) > 0)},
        },
        "action": tf.zeros((len(primary), 4, 7)),
    }


def trajectories(primary: bytes):
    """OctoData's ``build`` for 2 trajectories of 3 frames as Octo's trajectory transforms hand them over (window
    2): ``primary`` (encoded) in both frames and as the goal, the wrist camera padding, no dataset statistics."""

    def build():
        one = frame([primary, primary], [b"", b""], goal=primary)
        trajectory = tf.nest.map_structure(lambda x: tf.stack([x] * 3), one)
        dataset = tf.data.Dataset.from_tensors(trajectory).repeat(2)
        dataset.dataset_statistics = {}
        return dataset

    return build


class Counting:
    """The real resize, counting the times it runs (a variable bumped inside the graph, not at trace time)."""

    def __init__(self):
        self.calls = tf.Variable(0)

    def __call__(self, image, size, method):
        with tf.control_dependencies([self.calls.assign_add(1)]):
            return frames.resize_image(image, size, method)


def transformed(transforms: frames.FrameTransforms, one: dict) -> dict:
    """``one`` through the transform as training runs it: a tf.data map (graph mode)."""
    dataset = tf.data.Dataset.from_tensors(one)
    return next(iter(transforms(dataset).as_numpy_iterator()))


def host(**overrides) -> frames.FrameTransforms:
    return frames.FrameTransforms.from_config(
        {**CONFIG, **overrides.pop("config", {})}, **overrides
    )


@pytest.mark.parametrize("method", frames.RESIZE_METHODS)
def test_the_forks_resize_to_the_same_size_gives_the_same_pixels(method):
    # Why skipping is exact: the antialiased resize to an image's own size returns it unchanged (noise: the worst case).
    for h, w in [PRIMARY, WRIST, (60, 80)]:
        image = np.random.default_rng(h).integers(0, 256, (h, w, 3), dtype=np.uint8)
        np.testing.assert_array_equal(plain_resize(image, (h, w), method), image)


def test_images_of_another_size_get_the_plain_resizes_pixels():
    counting = Counting()
    small, odd = jpeg(photo(64, 64, 1)), jpeg(photo(150, 200, 2))
    out = transformed(
        host(augment=False, resize=counting), frame([small, odd], [odd, small], goal=odd)
    )
    obs = out["observation"]
    np.testing.assert_array_equal(obs["image_primary"][0], plain_resize(decoded(small), PRIMARY))
    np.testing.assert_array_equal(obs["image_primary"][1], plain_resize(decoded(odd), PRIMARY))
    np.testing.assert_array_equal(obs["image_wrist"][0], plain_resize(decoded(odd), WRIST))
    np.testing.assert_array_equal(obs["image_wrist"][1], plain_resize(decoded(small), WRIST))
    np.testing.assert_array_equal(out["task"]["image_primary"], plain_resize(decoded(odd), PRIMARY))
    assert obs["image_primary"].dtype == np.uint8 and obs["image_primary"].shape == (2, *PRIMARY, 3)
    assert int(counting.calls.numpy()) == 5


def test_an_image_at_the_target_size_passes_through_unchanged_and_is_never_resized():
    counting = Counting()
    primary, wrist = jpeg(photo(*PRIMARY, 3)), jpeg(photo(*WRIST, 4))
    out = transformed(
        host(augment=False, resize=counting), frame([primary, primary], [wrist, wrist], primary)
    )
    np.testing.assert_array_equal(out["observation"]["image_primary"][1], decoded(primary))
    np.testing.assert_array_equal(out["observation"]["image_wrist"][0], decoded(wrist))
    np.testing.assert_array_equal(out["task"]["image_primary"], decoded(primary))
    assert int(counting.calls.numpy()) == 0
    # The fork's way (skip_same_size=False, only the input benchmark's comparison) runs all 5 resizes.
    out = transformed(
        host(augment=False, resize=counting, skip_same_size=False),
        frame([primary, primary], [wrist, wrist], primary),
    )
    assert int(counting.calls.numpy()) == 5
    np.testing.assert_array_equal(out["observation"]["image_primary"][1], decoded(primary))


def test_padding_images_are_zeros_at_the_target_size_and_never_resized():
    counting = Counting()
    primary = jpeg(photo(64, 64, 5))
    out = transformed(
        host(augment=False, resize=counting), frame([primary, primary], [b"", b""], b"")
    )
    for image, size in [
        (out["observation"]["image_wrist"], (2, *WRIST, 3)),
        (out["task"]["image_primary"], (*PRIMARY, 3)),
    ]:
        assert image.shape == size and image.dtype == np.uint8 and not image.any()
    assert int(counting.calls.numpy()) == 2  # the two real 64x64 primary images only
    # A camera without a target size: Octo's 1x1 padding image (one image, eagerly: no pipeline to build for it).
    no_size = host(augment=False, config={"frame_transform_kwargs": {}})
    assert no_size.image(tf.constant(b""), "wrist").shape == (1, 1, 3)


def test_bilinear_is_an_opt_in_for_the_resizes_that_remain():
    # The default's (lanczos3's) pixels in a pipeline:
    # test_the_fine_tunes_pipeline_uses_these_transforms_without_octo.
    image = jpeg(photo(100, 100, 6))
    bilinear = transformed(
        host(augment=False, config={"resize_method": "bilinear"}), frame([image], [image])
    )
    bilinear = bilinear["observation"]["image_primary"][0]
    within_bound(bilinear, plain_resize(decoded(image), PRIMARY, "bilinear"))
    assert (bilinear != plain_resize(decoded(image), PRIMARY)).any()
    with pytest.raises(ValueError, match="resize_method='bicubic'; expected one of"):
        host(config={"resize_method": "bicubic"})


def test_the_host_augments_only_when_augment_on_is_host():
    primary, wrist = jpeg(photo(*PRIMARY, 7)), jpeg(photo(*WRIST, 8))
    one = frame([primary, primary], [wrist, b""], goal=primary)
    tf.random.set_seed(1)
    on_host = transformed(host(), one)
    # augmented on the device: the host's transforms are those that never augment
    assert host(config={"augment_on": "device"}) == host(augment=False)
    assert not host(config={"augment_on": "device"}).host_augments and host().host_augments
    plain = transformed(host(augment=False), one)
    np.testing.assert_array_equal(plain["task"]["image_primary"], decoded(primary))
    aug = on_host["observation"]
    assert (aug["image_primary"] != plain["observation"]["image_primary"]).any()
    assert (aug["image_wrist"][0] != plain["observation"]["image_wrist"][0]).any()
    # Every frame of a window alike (one seed per frame, as Octo's); a padding image stays zeros.
    np.testing.assert_array_equal(aug["image_primary"][0], aug["image_primary"][1])
    assert not aug["image_wrist"][1].any()
    with pytest.raises(ValueError, match="augment_on='gpu'; expected one of"):
        host(config={"augment_on": "gpu"})


def test_augment_image_follows_the_order_and_seed():
    image = tf.constant(photo(*WRIST, 9))
    seed = tf.constant([3, 4])
    kwargs = CONFIG["frame_transform_kwargs"]["image_augment_kwargs"]["primary"]
    a = frames.augment_image(image, seed, kwargs).numpy()
    np.testing.assert_array_equal(a, frames.augment_image(image, seed, kwargs).numpy())
    assert (a != frames.augment_image(image, seed + 1, kwargs).numpy()).any()
    # Brightness alone is the TensorFlow op on [0, 1] floats, clipped, back to uint8.
    bright = frames.augment_image(
        image, seed, {"random_brightness": [0.1], "augment_order": ["random_brightness"]}
    )
    float_image = tf.image.convert_image_dtype(image, tf.float32)
    expected = tf.clip_by_value(tf.image.stateless_random_brightness(float_image, 0.1, seed), 0, 1)
    np.testing.assert_array_equal(
        bright, tf.image.convert_image_dtype(expected, tf.uint8, saturate=True)
    )
    with pytest.raises(ValueError, match=r"augment_order names \['random_blur'\]"):
        frames.augment_image(image, seed, {"augment_order": ["random_blur"]})


def test_stage_variants_switch_the_stages_off_in_turn():
    primary = jpeg(photo(64, 64, 10))
    one = frame([primary, primary], [b"", b""])
    variants = dict(measure.stage_variants(host()))
    assert list(variants) == ["rest", "decode", "resize", "augment"]
    rest = transformed(variants["rest"], one)["observation"]["image_primary"]
    assert rest.dtype == object and rest[0] == primary
    cropped = transformed(variants["decode"], one)["observation"]["image_primary"]
    assert cropped.shape == (2, *PRIMARY, 3)
    # padded, not resized
    np.testing.assert_array_equal(cropped[0][96:160, 96:160], decoded(primary))


def test_what_the_fork_does_that_these_do_not_is_named():
    assert pipeline.unsupported(CONFIG["frame_transform_kwargs"]) == []
    assert pipeline.unsupported({"image_dropout_prob": 0.0, "depth_resize_size": {}}) == []
    assert pipeline.unsupported({"image_dropout_prob": 0.5}) == ["image_dropout_prob=0.5"]
    spec = {"observation": {"depth_primary": None, "image_primary": None}}
    assert pipeline.unsupported({}, spec) == ["observation.depth_primary (depth images)"]


def test_depth_cameras_of_the_config_choose_the_forks_transforms_before_any_data_is_read():
    depth = {**CONFIG, "augment_on": "device"}
    depth["dataset_kwargs"] = {"depth_obs_keys": {"primary": "depth_0", "wrist": None}}
    reasons = [
        "observation.depth_primary (depth images)",
        "observation.depth_wrist (depth images)",
    ]
    assert pipeline.forks_transforms_for(depth) == reasons
    # the dataset's element spec names the same images once: each reason once
    spec = {"observation": {"depth_primary": None, "image_primary": None}}
    assert pipeline.forks_transforms_for(depth, spec) == reasons
    # so no camera is left to the device, whatever its stored size
    assert pipeline.device_resized(depth, {"primary": (64, 64)}) == {}
    plain = {**depth, "dataset_kwargs": {}}
    assert pipeline.forks_transforms_for(plain) == []
    assert pipeline.device_resized(plain, {"primary": (64, 64)}) == {"primary": (64, 64)}


def test_the_forks_own_frame_transforms_give_the_same_pixels():
    """With Octo importable (a source tree on PYTHONPATH): its apply_frame_transforms without augmentation, and
    dlimp's augment_image on the same seed, against these."""
    pytest.importorskip("octo")
    from dlimp.augmentations import augment_image
    from octo.data.dataset import apply_frame_transforms
    import dlimp as dl

    small, at_size, wrist = (
        jpeg(photo(64, 64, 11)),
        jpeg(photo(*PRIMARY, 12)),
        jpeg(photo(*WRIST, 13)),
    )
    one = frame([small, at_size], [wrist, b""], goal=b"")
    kwargs = CONFIG["frame_transform_kwargs"]
    dataset = tf.data.Dataset.from_tensors(one)
    # a DLataset of frames, as dlimp's flatten() makes one
    dataset.__class__ = type("DLataset", (dl.DLataset, type(dataset)), {})
    dataset.is_flattened = True
    forks = apply_frame_transforms(dataset, resize_size=kwargs["resize_size"], train=False)
    fork_out = next(iter(forks.as_numpy_iterator()))
    ours = transformed(host(augment=False), one)
    for part in ("observation", "task"):
        for key, value in fork_out[part].items():
            if key.startswith("image_"):
                within_bound(ours[part][key], value)
    image, seed = tf.constant(photo(*PRIMARY, 14)), tf.constant([5, 6])
    for name in ("primary", "wrist"):
        augment = kwargs["image_augment_kwargs"][name]
        np.testing.assert_array_equal(
            frames.augment_image(image, seed, augment), augment_image(image, seed=seed, **augment)
        )


def test_the_fine_tunes_pipeline_uses_these_transforms_without_octo():
    """OctoData's default frame transforms are these (no Octo import): its batches come decoded and resized, the
    padding camera at its target size, and not augmented when the step augments."""
    from ml_collections import FrozenConfigDict

    from octo_dist.apps.finetune import config as fc
    from octo_dist.apps.finetune import pipeline

    primary = jpeg(photo(64, 64, 15))

    settings = {**CONFIG, "augment_on": "device", "seed": 0, "shuffle_buffer_size": 4}
    job = fc.FinetuneJob(config=FrozenConfigDict(settings), name="frames")
    source = pipeline.OctoData(job, None, 2, 0, 1, build=trajectories(primary), process=lambda b: b)
    batch = source.example
    assert batch["observation"]["image_primary"].shape == (2, 2, *PRIMARY, 3)
    within_bound(
        batch["observation"]["image_primary"][0, 1], plain_resize(decoded(primary), PRIMARY)
    )
    assert batch["observation"]["image_wrist"].shape == (2, 2, *WRIST, 3)
    assert not batch["observation"]["image_wrist"].any()
    within_bound(batch["task"]["image_primary"][1], plain_resize(decoded(primary), PRIMARY))


@pytest.mark.parametrize(
    "said, platform, host_augments",
    [({}, "gpu", False), ({}, "cpu", True), ({"augment_on": "host"}, "gpu", True)],
)
def test_the_pipeline_decides_who_augments_as_the_step_does(said, platform, host_augments):
    """A config that does not name augment_on (a fork's own config file) says "auto": on a GPU the device augments
    (the host must then not augment too), on the CPU the host does; the pipeline reads the resolved value."""
    from ml_collections import FrozenConfigDict

    from octo_dist.apps.finetune import config as fc
    from octo_dist.apps.finetune import pipeline
    from octo_dist.apps.finetune.stepimages import step_augmenter

    job = fc.for_platform(fc.FinetuneJob(FrozenConfigDict({**CONFIG, **said}), "frames"), platform)
    transform = pipeline.frame_transform(job.plain_config())
    assert job.config.augment_on == ("host" if host_augments else "device")
    assert transform.augment is host_augments
    assert (step_augmenter(job.config) is None) is host_augments


def test_an_unresolved_auto_is_refused_by_the_pipeline():
    """ "auto" means nothing to the pipeline until the rank's platform resolved it: refused, not guessed."""
    from octo_dist.apps.finetune import pipeline

    with pytest.raises(ValueError, match="augment_on 'auto' reached the data pipeline"):
        pipeline.frame_transform({**CONFIG, "augment_on": "auto"})


def test_an_unknown_resize_method_is_refused_with_the_config_problems():
    """Before start-up, in one line with the fix, not a ValueError once the pipeline is built."""
    from octo_dist.apps.finetune import config as fc

    assert fc.augment_config_problems({"resize_method": "bicubic", "augment_on": "host"}) == [
        "resize_method 'bicubic'; expected one of lanczos3, bilinear. Fix: --config.resize_method=lanczos3"
    ]
    assert fc.augment_config_problems({"resize_method": "bilinear", "augment_on": "host"}) == []


# --- the host decodes, the device resizes ---------------------------------------------------------------------------


def test_cameras_with_a_stored_size_leave_the_host_decoded_at_that_size_never_resized():
    counting = Counting()
    primary, wrist = jpeg(photo(64, 80, 7)), jpeg(photo(160, 160, 8))
    stored = {"primary": (64, 80), "wrist": (160, 160)}
    out = transformed(
        host(augment=False, resize=counting, stored_size=stored),
        frame([primary, primary], [wrist, b""], b""),
    )
    np.testing.assert_array_equal(out["observation"]["image_primary"][0], decoded(primary))
    np.testing.assert_array_equal(out["observation"]["image_wrist"][0], decoded(wrist))
    # padding at the stored size, so the batch has one shape per camera
    assert out["observation"]["image_wrist"].shape == (2, 160, 160, 3)
    assert not out["observation"]["image_wrist"][1].any()
    assert out["task"]["image_primary"].shape == (64, 80, 3)
    assert int(counting.calls.numpy()) == 0


def test_decoded_on_the_host_then_resized_on_the_device_is_the_hosts_resize_to_one_level():
    jax = pytest.importorskip("jax")
    from octo_dist.engine import augment

    primary, wrist = jpeg(photo(96, 128, 9)), jpeg(photo(256, 256, 10))
    one = frame([primary, primary], [wrist, wrist], primary)
    whole = transformed(host(augment=False), one)
    shipped = transformed(
        host(augment=False, stored_size={"primary": (96, 128), "wrist": (256, 256)}), one
    )
    resized = jax.jit(lambda b: augment.resize_batch(b, {"primary": PRIMARY, "wrist": WRIST}))(
        {k: shipped[k] for k in ("observation", "task")}
    )
    for part, key in [
        ("observation", "image_primary"),
        ("observation", "image_wrist"),
        ("task", "image_primary"),
    ]:
        diff = np.abs(np.asarray(resized[part][key]).astype(int) - whole[part][key].astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() <= 0.002, (part, key)


def test_a_reduced_scale_decode_is_chosen_only_where_the_stored_frame_is_that_many_times_larger():
    assert decodescale.ratio_for((480, 640), (128, 128)) == 2
    assert decodescale.ratio_for((512, 512), (128, 128)) == 4
    assert decodescale.ratio_for((1024, 1024), (128, 128)) == 8
    assert decodescale.ratio_for((256, 256), (256, 256)) == 1
    assert decodescale.ratio_for((64, 64), (256, 256)) == 1
    image = jpeg(photo(512, 512, 11))
    transforms = host(
        augment=False, stored_size={"primary": (512, 512)}, decode_ratio={"primary": 2}
    )
    assert transforms.shipped_size("primary") == (256, 256)
    out = transformed(transforms, frame([image, image], [jpeg(photo(*WRIST, 12))] * 2, b""))
    assert out["observation"]["image_primary"].shape == (2, 256, 256, 3)
    assert out["task"]["image_primary"].shape == (256, 256, 3)


# Each a batch of its own (3 copies of one frame), through one pipeline: (the wrist camera's two frames' sizes, 0:
# padding; the goal image's height, 0: none).
BATCH_CASES = [
    ([160, 160], 64),  # every image present and at its stored size: one branch a camera's batch
    ([160, 0], 64),  # a padding image in the wrist camera's batch: image by image
    ([160, 120], 0),  # a wrist frame of another size (resized to the stored one) and no goal image
]


def test_decoding_after_batching_gives_the_frame_maps_pixels():
    primary = [jpeg(photo(64, 80, 20)), jpeg(photo(64, 80, 21))]
    cases = []
    for wrist, goal in BATCH_CASES:
        wrists = [jpeg(photo(n, n, 22 + i)) if n else b"" for i, n in enumerate(wrist)]
        goal_image = jpeg(photo(goal, 80, 24)) if goal else b""
        cases.append(tf.data.Dataset.from_tensors(frame(primary, wrists, goal_image)).repeat(3))
    frames_ds = functools.reduce(lambda a, b: a.concatenate(b), cases)
    stored = {"primary": (64, 80), "wrist": (160, 160)}
    transforms = host(augment=False, stored_size=stored)
    assert transforms.host_augments is False
    batches = list(transforms.batched(frames_ds, 3).as_numpy_iterator())
    per_frame = list(transforms(frames_ds).batch(3).as_numpy_iterator())
    assert len(batches) == len(per_frame) == len(BATCH_CASES)
    for case, batched, expected in zip(BATCH_CASES, batches, per_frame):
        for part, key in [
            ("observation", "image_primary"),
            ("observation", "image_wrist"),
            ("task", "image_primary"),
        ]:
            np.testing.assert_array_equal(
                batched[part][key], expected[part][key], err_msg=str(case)
            )
        assert batched["observation"]["image_wrist"].shape == (3, 2, 160, 160, 3)
        np.testing.assert_array_equal(
            batched["observation"]["image_primary"][0, 1], decoded(primary[1])
        )
        np.testing.assert_array_equal(
            batched["observation"]["proprio"], expected["observation"]["proprio"]
        )


def test_the_host_augmenting_decodes_frame_by_frame_before_batching():
    stored = {"primary": (64, 80)}
    one = frame([jpeg(photo(64, 80, 25))] * 2, [jpeg(photo(*WRIST, 26))] * 2, b"")
    frames_ds = tf.data.Dataset.from_tensors(one).repeat(2)
    augmenting = host(augment=True, stored_size=stored)
    assert augmenting.host_augments
    out = next(iter(augmenting.batched(frames_ds, 2).as_numpy_iterator()))
    assert out["observation"]["image_primary"].shape == (2, 2, 64, 80, 3)
