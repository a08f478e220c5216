"""The device's image augmentation (octo_dist/engine/augment.py) against the TensorFlow ops the fork's pipeline runs.

Each op on the same parameters as TensorFlow (the same crop box, the same factor) gives the same pixels; the sampler
gives the parameters ``tf.random.stateless_uniform`` gives dlimp for the same draw; the whole chain, uint8 in and
out, matches dlimp's chain (built here from the same TensorFlow calls dlimp makes). Then the batch: per-sample and
per-camera draws, the window sharing one draw, padding images left alone, and on 4 forced CPU devices the train
step's own augmentation: sharded like the batch, no communication, the same images whatever the device count, and
the loss computed on them (``augment_on="host"`` leaves them untouched).

Tolerances: the crop and brightness are TensorFlow's arithmetic in the same order: exact (atol 0). Contrast,
saturation and hue differ in float32 rounding only (a mean summed in another order; saturation and hue from max,
min and the hue's sextant in closed form, not TensorFlow's HSV round trip): measured <= 7.8e-7, asserted <= 2e-6,
1/2000 of one uint8 level. After the uint8 conversion
(truncation of ``x * 255.5``) such a difference can tip a pixel that sits on a level boundary: the chain allows 1
level on at most 0.1% of the pixels, never 2 (measured over 80 draws: 1 level on at most 0.033% of the pixels).
"""

import functools
import inspect
import json
import sys

import numpy as np
import pytest

from fork_augment import KWARGS, PRIMARY, RESIZES, WRIST, textured
from helpers import clean_env, last_json_line

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
tf = pytest.importorskip("tensorflow")

from octo_dist.apps.finetune import frames  # noqa: E402
from octo_dist.engine import augment  # noqa: E402
from octo_dist.engine.stepfns import augment_problems  # noqa: E402

EXACT, FLOAT_ROUNDING = 0.0, 2e-6


def image(seed=0, shape=(48, 40, 3)) -> np.ndarray:
    """A float image in [0, 1] (uint8 levels / 255, as the pipeline's) with the pixels HSV handles specially:
    grey, black, white, pure primaries, and ties between two channels."""
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    img[0, :8] = [
        [0, 0, 0],
        [255, 255, 255],
        [128, 128, 128],
        [255, 0, 0],
        [0, 255, 0],
        [0, 0, 255],
        [200, 200, 10],
        [10, 200, 200],
    ]
    return img.astype(np.float32) * np.float32(1 / 255)


def ours(fn, img, *args):
    return np.asarray(jax.jit(fn)(jnp.asarray(img), *(jnp.float32(a) for a in args)))


# --- each op against its TensorFlow op, on the same parameters -----------------------------------------------------

BOXES = [
    (0.0, 0.0, 1.0, 1.0),  # the whole image: the identity
    (0.1, 0.05, 0.9, 0.97),
    (0.2, 0.3, 0.7, 0.6),  # a small box, stretched
    (0.0345, 0.0053, 0.9872, 0.9980),  # a box dlimp drew (scale 0.8-1, ratio 0.9-1.1)
    (
        0.0,
        0.2,
        1.0000001,
        0.8,
    ),  # past the bottom edge by float rounding: TensorFlow zeroes that row
]


@pytest.mark.parametrize("box", BOXES)
def test_crop_and_resize_matches_tf_on_the_same_box(box):
    img = image()
    want = tf.image.crop_and_resize(img[None], [box], [0], img.shape[:2]).numpy()[0]
    got = np.asarray(augment.crop_and_resize(jnp.asarray(img), jnp.asarray(box, jnp.float32)))
    np.testing.assert_allclose(got, want, rtol=0, atol=EXACT)


@pytest.mark.parametrize("box", BOXES)
def test_the_tpus_matrix_resampling_matches_tf_to_float_rounding(box):
    """The same interpolation as two matrix products (TPUs): a weighted sum instead of TensorFlow's
    ``a + (b - a) * d``, so equal to float32 rounding, not bit for bit; rows past the edge still 0."""
    frames = np.stack([image(1), image(2)])
    got = np.asarray(
        augment.crop_and_resize_matmul(jnp.asarray(frames), jnp.asarray(box, jnp.float32))
    )
    for t in range(2):
        want = tf.image.crop_and_resize(frames[t][None], [box], [0], frames.shape[1:3])
        np.testing.assert_allclose(got[t], want.numpy()[0], rtol=0, atol=FLOAT_ROUNDING)


def test_each_platform_gets_its_resampling_and_an_unknown_one_is_refused():
    assert augment.resampling_for("tpu") == "matmul"
    assert augment.resampling_for("gpu") == augment.resampling_for("cpu") == "gather"
    with pytest.raises(ValueError, match="resample 'bicubic'; expected one of"):
        augment.batch_augmenter({"augment_order": []}, resample="bicubic")


def test_crop_and_resize_crops_every_frame_of_a_window_alike():
    frames = np.stack([image(1), image(2)])
    box = jnp.asarray(BOXES[2], jnp.float32)
    got = np.asarray(augment.crop_and_resize(jnp.asarray(frames), box))
    for t in range(2):
        want = tf.image.crop_and_resize(frames[t][None], [BOXES[2]], [0], frames.shape[1:3])
        np.testing.assert_allclose(got[t], want.numpy()[0], rtol=0, atol=EXACT)


@pytest.mark.parametrize(
    "op, fn, values, atol",
    [
        ("brightness", tf.image.adjust_brightness, [-0.1, 0.0, 0.0732], EXACT),
        ("contrast", tf.image.adjust_contrast, [0.9, 1.0, 1.0871], FLOAT_ROUNDING),
        ("saturation", tf.image.adjust_saturation, [0.0, 0.9, 1.1, 3.0], FLOAT_ROUNDING),
        ("hue", tf.image.adjust_hue, [-0.5, -0.05, 0.0, 0.0312, 0.5], FLOAT_ROUNDING),
    ],
)
def test_colour_ops_match_tf_on_the_same_factor(op, fn, values, atol):
    ours_fn = getattr(augment, f"adjust_{op}")
    for seed in (0, 1):
        img = image(seed)
        for v in values:
            want = fn(img, v).numpy()
            np.testing.assert_allclose(
                ours(ours_fn, img, v), want, rtol=0, atol=atol, err_msg=f"{op} {v}"
            )


def test_colour_ops_apply_to_each_frame_of_a_window_with_its_own_mean():
    frames = np.stack([image(1), image(2) * 0.5])
    got = ours(augment.adjust_contrast, frames, 1.1)
    for t in range(2):
        np.testing.assert_allclose(
            got[t], tf.image.adjust_contrast(frames[t], 1.1).numpy(), atol=FLOAT_ROUNDING
        )


# --- the sampler: dlimp's parameters for the same draw -------------------------------------------------------------


def tf_crop_box(seed, scale, ratio) -> np.ndarray:
    """The box dlimp's random_resized_crop computes for ``seed``: scale, log-ratio and both offsets are
    ``tf.random.stateless_uniform`` draws with that one seed (batch of one image)."""
    u = lambda lo, hi: tf.random.stateless_uniform((1,), seed, lo, hi)  # noqa: E731
    s = u(scale[0], scale[1])
    r = tf.exp(u(tf.math.log(ratio[0]), tf.math.log(ratio[1])))
    h = tf.clip_by_value(tf.sqrt(s / r), 0, 1)
    w = tf.clip_by_value(tf.sqrt(s * r), 0, 1)
    y, x = u(0, 1 - h), u(0, 1 - w)
    return tf.stack([y, x, y + h, x + w], axis=1).numpy()[0]


def tf_uniform(seed) -> float:
    return float(tf.random.stateless_uniform([], seed, 0, 1))


SEEDS = [tf.constant(s, tf.int32) for s in ([0, 0], [5, 9], [123, 4], [2**30, 77], [1, 2**31 - 2])]


@pytest.mark.parametrize("seed", SEEDS, ids=str)
def test_the_sampler_gives_the_parameters_tf_gives_dlimp_for_the_same_draw(seed):
    """dlimp hands every op the same seed: one ``stateless_uniform`` value sets them all. Each random op of
    TensorFlow with that seed equals ours with the parameters :func:`params_from_uniform` makes of that value."""
    params = augment.params_from_uniform(jnp.float32(tf_uniform(seed)), PRIMARY)
    np.testing.assert_allclose(
        np.asarray(params["random_resized_crop"]),
        tf_crop_box(seed, [0.8, 1.0], [0.9, 1.1]),
        rtol=0,
        atol=1e-7,
    )
    img = image(3)
    random_ops = {
        "random_brightness": lambda: tf.image.stateless_random_brightness(img, 0.1, seed),
        "random_contrast": lambda: tf.image.stateless_random_contrast(img, 0.9, 1.1, seed),
        "random_saturation": lambda: tf.image.stateless_random_saturation(img, 0.9, 1.1, seed),
        "random_hue": lambda: tf.image.stateless_random_hue(img, 0.05, seed),
    }
    for op, tf_op in random_ops.items():
        got = np.asarray(augment.APPLY[op](jnp.asarray(img), params[op]))
        np.testing.assert_allclose(got, tf_op().numpy(), rtol=0, atol=FLOAT_ROUNDING, err_msg=op)


def dlimp_chain(img_u8: np.ndarray, seed, kwargs) -> np.ndarray:
    """dlimp's augment_image as the fork calls it, in TensorFlow: to float (convert_image_dtype), each op of
    augment_order with the one seed, a clip to [0, 1] after each, back to uint8 (saturating)."""
    x = tf.image.convert_image_dtype(tf.constant(img_u8), tf.float32)
    for op in kwargs["augment_order"]:
        args = kwargs[op]
        if op == "random_resized_crop":
            box = tf_crop_box(seed, args["scale"], args["ratio"])
            x = tf.image.crop_and_resize(x[None], [box], [0], img_u8.shape[:2])[0]
        else:
            x = getattr(tf.image, f"stateless_{op}")(x, *args, seed=seed)
        x = tf.clip_by_value(x, 0, 1)
    return tf.image.convert_image_dtype(x, tf.uint8, saturate=True).numpy()


@pytest.mark.parametrize("resample", ["gather", "matmul"])
@pytest.mark.parametrize("seed", SEEDS, ids=str)
@pytest.mark.parametrize("kwargs", [PRIMARY, WRIST], ids=["primary", "wrist"])
def test_the_whole_chain_matches_dlimps_on_uint8(seed, kwargs, resample):
    img = (image(4, (64, 64, 3)) * 255).round().astype(np.uint8)
    want = dlimp_chain(img, seed, kwargs)
    params = augment.params_from_uniform(jnp.float32(tf_uniform(seed)), kwargs)
    got = np.asarray(
        jax.jit(augment.apply, static_argnums=(2, 3))(
            jnp.asarray(img), params, tuple(kwargs["augment_order"]), resample
        )
    )
    assert got.dtype == np.uint8
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= 1 and (diff > 0).mean() <= 0.001, (diff.max(), (diff > 0).mean())


def test_uint8_conversion_is_tfs():
    levels = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(
        np.asarray(augment.to_unit(jnp.asarray(levels))),
        tf.image.convert_image_dtype(levels, tf.float32).numpy(),
    )
    unit = np.linspace(-0.1, 1.1, 5001, dtype=np.float32)
    np.testing.assert_array_equal(
        np.asarray(augment.from_unit(jnp.asarray(unit), jnp.uint8)),
        tf.image.convert_image_dtype(unit, tf.uint8, saturate=True).numpy(),
    )


def test_sampled_parameters_stay_in_the_configured_ranges():
    keys = jax.random.split(jax.random.PRNGKey(0), 4000)
    p = {k: np.asarray(v) for k, v in jax.vmap(lambda k: augment.draw(k, PRIMARY))(keys).items()}
    for op, (lo, hi) in {
        "random_brightness": (-0.1, 0.1),
        "random_contrast": (0.9, 1.1),
        "random_saturation": (0.9, 1.1),
        "random_hue": (-0.05, 0.05),
    }.items():
        assert lo <= p[op].min() < lo + 0.01 and hi - 0.01 < p[op].max() <= hi, op
    y1, x1, y2, x2 = p["random_resized_crop"].T
    height, width = y2 - y1, x2 - x1
    assert (y1 >= 0).all() and (x1 >= 0).all() and (y2 <= 1 + 1e-6).all() and (x2 <= 1 + 1e-6).all()
    area, aspect = height * width, width / height
    whole = (height < 1) & (width < 1)  # unclipped: area is the scale, width/height the ratio
    assert 0.8 - 1e-5 <= area[whole].min() and area.max() <= 1 + 1e-5
    assert 0.9 - 1e-5 <= aspect[whole].min() and aspect[whole].max() <= 1.1 + 1e-5
    # dlimp's coupling: one draw sets every parameter of an image
    u = (p["random_brightness"] + 0.1) / 0.2
    np.testing.assert_allclose((p["random_contrast"] - 0.9) / 0.2, u, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"augment_order": ["random_rot90"]}, "random_rot90 (in augment_order): not an op"),
        ({"augment_order": ["random_hue"], "random_hue": [0.6]}, "random_hue max_delta 0.6"),
        ({"augment_order": ["random_contrast"], "random_contrast": [1.1, 0.9]}, "random_contrast"),
        ({"augment_order": ["random_brightness"]}, "random_brightness: no arguments"),
        ({"primary": {"random_brightness": [0.1]}}, "camera primary"),
    ],
)
def test_configs_the_step_cannot_run_are_refused_by_name(kwargs, problem):
    found = augment_problems(kwargs)
    assert len(found) == 1 and problem in found[0], found
    with pytest.raises(ValueError, match="image_augment_kwargs"):
        augment.batch_augmenter(kwargs)
    assert augment_problems(KWARGS) == []


# --- the config switch ----------------------------------------------------------------------------------------------


def smoke_config(tmp_path, **over) -> dict:
    """The packaged smoke config over a dataset directory that exists (what the config checks look for)."""
    from octo_dist.apps.finetune import commandline

    (tmp_path / "data" / "octo_dist_synthetic" / "1.0.0").mkdir(parents=True)
    (tmp_path / "data" / "octo_dist_synthetic" / "1.0.0" / "dataset_info.json").write_text("{}")
    config = commandline.parse_flags(["finetune.py", "--config=finetune_smoke_config.py"]).config
    config = config.to_dict()
    config["dataset_kwargs"]["data_dir"] = str(tmp_path / "data")
    config.update(over)
    return config


def test_the_switch_is_decided_once_and_refused_with_the_other_problems(tmp_path, monkeypatch):
    from octo_dist.apps.finetune import config as fc
    from octo_dist.apps.finetune.stepimages import step_augmenter

    monkeypatch.chdir(tmp_path)
    reachable = lambda repo: None  # noqa: E731
    assert fc.parse(smoke_config(tmp_path), reachable).config.augment_on == "auto"
    # a config file without the field (the fork's own): "auto", resolved on the rank for its platform, where the
    # pipeline and the step then read the same value
    without = smoke_config(tmp_path / "a")
    del without["augment_on"]
    job = fc.parse(without, reachable)
    assert job.config.augment_on == "auto"
    on_gpu, on_cpu = fc.for_platform(job, "gpu"), fc.for_platform(job, "cpu")
    assert on_gpu.config.augment_on == "device" and on_gpu.plain_config()["augment_on"] == "device"
    assert step_augmenter(on_gpu.config) is not None
    assert on_cpu.config.augment_on == "host" and step_augmenter(on_cpu.config) is None
    assert on_cpu.name == job.name and on_cpu.layout == job.layout  # only the placement changed
    # an explicit choice is kept on either platform
    host = fc.parse(smoke_config(tmp_path / "b", augment_on="host"), reachable)
    assert step_augmenter(fc.for_platform(host, "gpu").config) is None
    device = fc.parse(smoke_config(tmp_path / "f", augment_on="device"), reachable)
    assert step_augmenter(fc.for_platform(device, "cpu").config) is not None
    # an unresolved "auto" is refused, not read as "no augmentation"
    with pytest.raises(ValueError, match="augment_on 'auto'"):
        step_augmenter(job.config)

    rot90 = {"augment_order": ["random_rot90"]}
    bad = smoke_config(tmp_path / "c", frame_transform_kwargs={"image_augment_kwargs": rot90})
    bad["batch_size"] = 0
    with pytest.raises(fc.ConfigError) as refused:
        fc.parse(bad, reachable)
    lines = str(refused.value).splitlines()
    assert any("random_rot90" in line and "--config.augment_on=host" in line for line in lines)
    assert any("batch_size" in line for line in lines)  # every problem at once
    with pytest.raises(
        fc.ConfigError, match="augment_on 'gpu'; expected one of auto, device, host"
    ):
        fc.parse(smoke_config(tmp_path / "d", augment_on="gpu"), reachable)
    # the fork's tf.data path takes any op dlimp has
    fc.parse(
        smoke_config(
            tmp_path / "e",
            augment_on="host",
            frame_transform_kwargs={"image_augment_kwargs": rot90},
        ),
        reachable,
    )


# --- a batch in Octo's layout --------------------------------------------------------------------------------------


def octo_batch(size=6, window=2, wrist_present=False, seed=0) -> dict:
    """Octo's batch layout: a primary camera [B, window, 32, 32, 3] uint8, a wrist camera [.., 16, 16, ..] that
    is padding (all zeros, pad mask false) unless ``wrist_present``, a goal image per camera in ``task``."""
    rng = np.random.default_rng(seed)
    primary = rng.integers(0, 256, (size, window, 32, 32, 3), dtype=np.uint8)
    wrist = (
        rng.integers(0, 256, (size, window, 16, 16, 3), dtype=np.uint8)
        if wrist_present
        else np.zeros((size, window, 16, 16, 3), np.uint8)
    )
    return {
        "observation": {
            "image_primary": primary,
            "image_wrist": wrist,
            "proprio": rng.standard_normal((size, window, 7)).astype(np.float32),
            "timestep_pad_mask": np.ones((size, window), bool),
            "pad_mask_dict": {
                "image_primary": np.ones((size, window), bool),
                "image_wrist": np.full((size, window), wrist_present),
            },
        },
        "task": {
            "image_primary": primary[:, -1].copy(),
            "image_wrist": wrist[:, -1].copy(),
            "pad_mask_dict": {
                "image_primary": np.ones((size,), bool),
                "image_wrist": np.full((size,), wrist_present),
            },
        },
        "action": rng.standard_normal((size, window, 4, 7)).astype(np.float32),
    }


@functools.lru_cache(maxsize=None)
def jitted(kwargs_json: str):
    """One compiled augmentation per kwargs (and batch shape): XLA's CPU compile is most of these tests' time."""
    kwargs = json.loads(kwargs_json)
    return jax.jit(lambda b, k: augment.augment_batch(b, k, kwargs))


def run_augment(batch, key=0, kwargs=KWARGS):
    out = jitted(json.dumps(kwargs, sort_keys=True))(batch, jax.random.PRNGKey(key))
    return jax.tree_util.tree_map(np.asarray, out)


def test_each_sample_gets_its_own_draw_and_the_same_key_the_same_images():
    batch = octo_batch()
    # every sample the same images: any difference in the output comes from the draws
    for group, n in (("observation", 2), ("task", 1)):
        for cam in ("image_primary", "image_wrist"):
            batch[group][cam] = np.broadcast_to(
                batch[group][cam][:1], batch[group][cam].shape
            ).copy()
    out = run_augment(batch)
    primary = out["observation"]["image_primary"]
    assert (
        primary.dtype == np.uint8 and primary.shape == batch["observation"]["image_primary"].shape
    )
    assert len({primary[i].tobytes() for i in range(len(primary))}) == len(primary)
    again = run_augment(batch)
    other = run_augment(batch, key=1)
    np.testing.assert_array_equal(again["observation"]["image_primary"], primary)
    assert not np.array_equal(other["observation"]["image_primary"], primary)
    # what is not an image passes through untouched
    np.testing.assert_array_equal(out["observation"]["proprio"], batch["observation"]["proprio"])
    np.testing.assert_array_equal(out["action"], batch["action"])


def test_a_samples_draws_follow_its_index_not_the_batch_it_is_in():
    """Keys per sample from the step's key: the first 3 samples of a batch of 6 get the draws a batch of those 3
    gets (so the images do not depend on how the global batch is split over devices and processes)."""
    batch = octo_batch()
    first = jax.tree_util.tree_map(lambda x: x[:3], batch)
    whole, part = run_augment(batch), run_augment(first)
    np.testing.assert_array_equal(
        whole["observation"]["image_primary"][:3], part["observation"]["image_primary"]
    )


def test_the_window_and_the_goal_image_share_a_draw_and_cameras_do_not():
    """Octo augments every frame of a sample's window and its goal image with the same seed (one draw per
    camera), and each camera with its own: identical frames stay identical, identical cameras do not."""
    batch = octo_batch(wrist_present=True)
    obs, task = batch["observation"], batch["task"]
    obs["image_primary"][:, 1] = obs["image_primary"][:, 0]
    task["image_primary"] = obs["image_primary"][:, 0].copy()
    obs["image_wrist"] = obs["image_primary"].copy()  # the same pixels in both cameras
    task["image_wrist"] = task["image_primary"].copy()
    out = run_augment(batch, kwargs=PRIMARY)  # one dict: every camera
    primary = out["observation"]["image_primary"]
    np.testing.assert_array_equal(primary[:, 1], primary[:, 0])
    np.testing.assert_array_equal(out["task"]["image_primary"], primary[:, 0])
    assert not np.array_equal(primary[:, 0], obs["image_primary"][:, 0])
    wrist = out["observation"]["image_wrist"]
    assert all(not np.array_equal(wrist[i], primary[i]) for i in range(len(primary)))


def test_padding_images_stay_as_the_host_leaves_them():
    """A missing camera's images are zeros with a false pad mask: Octo's tf.cond skips them (brightness would
    make them grey). Present cameras are augmented; a per-timestep mask is followed frame by frame."""
    batch = octo_batch(wrist_present=False)
    batch["observation"]["pad_mask_dict"]["image_primary"][:, 0] = False
    out = run_augment(batch)
    assert not out["observation"]["image_wrist"].any() and not out["task"]["image_wrist"].any()
    np.testing.assert_array_equal(
        out["observation"]["image_primary"][:, 0], batch["observation"]["image_primary"][:, 0]
    )
    assert not np.array_equal(
        out["observation"]["image_primary"][:, 1], batch["observation"]["image_primary"][:, 1]
    )
    present = octo_batch(size=32, wrist_present=True)  # about half of the brightness draws are > 0
    present["observation"]["image_wrist"][:] = 0
    assert run_augment(present)["observation"][
        "image_wrist"
    ].any()  # zeros that are not padding change


def test_cameras_without_kwargs_are_left_alone():
    batch = octo_batch(wrist_present=True)
    out = run_augment(batch, kwargs={"primary": PRIMARY})
    np.testing.assert_array_equal(
        out["observation"]["image_wrist"], batch["observation"]["image_wrist"]
    )
    assert not np.array_equal(
        out["observation"]["image_primary"], batch["observation"]["image_primary"]
    )


# --- the train step, on 4 forced CPU devices -----------------------------------------------------------------------

STEP_PROGRAM = """
import hashlib, json, re
import jax, jax.numpy as jnp, numpy as np, optax
from ml_collections import ConfigDict
from octo_dist.apps.finetune import stepimages
from octo_dist.engine import parallel

COLLECTIVE = re.compile(r"(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\\(")


def loss(params, batch, rng, train):
    return params["w"] * jnp.mean(batch["observation"]["image_primary"].astype(jnp.float32)), {}


given = octo_batch(size=8, seed=3)
out = {"devices": jax.device_count()}
RUNS = [("device", "one", "jit"), ("device", "all", "jit"), ("device", "all", "shard_map"),
        ("host", "all", "jit"), ("host", "all", "shard_map")]
for on, name, step_fn in RUNS:
    config = ConfigDict({"augment_on": on, "frame_transform_kwargs": {"image_augment_kwargs": KWARGS}})
    devices = jax.devices()[:1] if name == "one" else jax.devices()
    eng = parallel.Engine(parallel.make_mesh(devices), loss, optax.sgd(0.0), step_fn=step_fn,
                          augment=stepimages.step_augmenter(config))
    batch = eng.global_batch(given)
    state = eng.init_state(None, batch, params={"w": jnp.float32(1.0)})
    # what the step's loss sees: the engine's own function, compiled alone to read its HLO
    augmented = jax.jit(eng._augmented).lower(state, batch).compile()
    seen = augmented(state, batch)
    _, metrics = eng.step(state, batch)
    images = np.asarray(seen["observation"]["image_primary"])
    leaves = zip(jax.tree_util.tree_leaves(seen), jax.tree_util.tree_leaves(batch))
    out[f"{on}_{name}_{step_fn}"] = {
        "sharding_kept": all(s.sharding.is_equivalent_to(b.sharding, b.ndim) for s, b in leaves),
        "dtype": str(images.dtype),
        "collectives": len(COLLECTIVE.findall(augmented.as_text())),
        "digest": hashlib.sha256(images.tobytes()).hexdigest(),
        "samples_differ": len({images[i].tobytes() for i in range(len(images))}) == len(images),
        "untouched": bool(np.array_equal(images, given["observation"]["image_primary"])),
        "loss": float(parallel.to_host(metrics)["loss"]),
        "loss_of_seen": float(images.astype(np.float64).mean()),
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def step_run():
    """The program above on 4 forced CPU devices: Octo's layout, the engine's step and its augmentation."""
    program = (
        f"import numpy as np\nKWARGS = {KWARGS!r}\n{inspect.getsource(octo_batch)}\n{STEP_PROGRAM}"
    )
    env = clean_env(XLA_FLAGS="--xla_force_host_platform_device_count=4")
    return last_json_line([sys.executable, "-c", program], env)


RUNS = [
    "device_one_jit",
    "device_all_jit",
    "device_all_shard_map",
    "host_all_jit",
    "host_all_shard_map",
]


@pytest.mark.parametrize("run", RUNS)
def test_the_step_sees_uint8_images_sharded_like_the_batch_without_communication(step_run, run):
    assert step_run["devices"] == 4
    got = step_run[run]
    assert (got["sharding_kept"], got["dtype"], got["collectives"]) == (True, "uint8", 0)
    # the loss is computed on the images the step augmented (on the ones it was given, for "host")
    assert abs(got["loss"] - got["loss_of_seen"]) <= 1e-4 * got["loss_of_seen"]


def test_the_step_augments_on_device_and_leaves_images_alone_on_host(step_run):
    for run in RUNS:
        got = step_run[run]
        if run.startswith("host"):
            assert got["untouched"], run
        else:
            assert not got["untouched"] and got["samples_differ"], run


def test_the_steps_images_do_not_depend_on_the_device_count_or_step_function(step_run):
    want = step_run["device_one_jit"]["digest"]
    for run in ("device_all_jit", "device_all_shard_map"):
        assert step_run[run]["digest"] == want, run


def test_a_camera_the_dataset_never_fills_is_not_augmented_on_the_device():
    """The full config's wrist camera has no observation key (``image_obs_keys.wrist = None``): its images are all
    padding, which the fork does not augment; the device must not brighten them or spend a program on them."""
    pytest.importorskip("ml_collections")
    from octo_dist.apps.finetune.stepimages import augmented_cameras
    from octo_dist.apps.finetune.configs import finetune_config

    c = finetune_config.get_config("full,image_conditioned").to_dict()
    kwargs = c["frame_transform_kwargs"]["image_augment_kwargs"]
    assert kwargs == KWARGS  # the fork's, as the tests here augment
    assert (
        set(kwargs) == {"primary", "wrist"}
        and c["dataset_kwargs"]["image_obs_keys"]["wrist"] is None
    )
    assert set(augmented_cameras(c, kwargs)) == {"primary"}
    c["dataset_kwargs"]["image_obs_keys"]["wrist"] = "wrist_image"
    assert set(augmented_cameras(c, kwargs)) == {"primary", "wrist"}


# --- the resize to the model's size on the device, against TensorFlow's (dlimp's resize_image) ----------------------

RESIZE_LEVELS, RESIZE_SHARE = frames.RESIZE_LEVELS, frames.RESIZE_SHARE


@pytest.mark.parametrize("method", augment.RESIZE_METHODS)
@pytest.mark.parametrize("stored, size", RESIZES)
def test_the_devices_resize_gives_tensorflows_pixels_to_one_level(stored, size, method):
    from octo_dist.apps.finetune import frames

    for seed in range(2):
        for img in (
            textured((*stored, 3), seed),
            np.random.default_rng(seed).integers(0, 256, (*stored, 3), np.uint8),
        ):
            theirs = frames.resize_image(img, size, method).numpy().astype(int)
            mine = np.asarray(jax.jit(lambda x: augment.resize(x, size, method))(img))
            assert mine.dtype == np.uint8 and mine.shape == (*size, 3)
            diff = np.abs(mine.astype(int) - theirs)
            assert diff.max() <= RESIZE_LEVELS
            assert (diff > 0).mean() <= RESIZE_SHARE


def test_the_batch_is_resized_per_camera_window_and_goal_alike_and_padding_stays_zeros():
    primary = np.stack([textured((64, 80, 3), s) for s in range(4)]).reshape(2, 2, 64, 80, 3)
    wrist = np.stack([textured((128, 128, 3), s) for s in range(2)])
    batch = {
        "observation": {
            "image_primary": primary,
            "image_wrist": np.zeros((2, 2, 128, 128, 3), np.uint8),
            "pad_mask_dict": {"image_primary": np.ones((2, 2), bool)},
        },
        "task": {"image_primary": primary[:, -1], "image_wrist": wrist},
        "action": np.ones((2, 4), np.float32),
    }
    sizes = {"primary": (96, 96), "wrist": (128, 128)}
    out = jax.jit(lambda b: augment.resize_batch(b, sizes))(batch)
    assert out["observation"]["image_primary"].shape == (2, 2, 96, 96, 3)
    assert out["task"]["image_primary"].shape == (2, 96, 96, 3)
    # every frame of the window is the TensorFlow resize of that frame
    from octo_dist.apps.finetune import frames

    for b in range(2):
        for t in range(2):
            theirs = frames.resize_image(primary[b, t], (96, 96)).numpy().astype(int)
            assert (
                np.abs(
                    np.asarray(out["observation"]["image_primary"][b, t]).astype(int) - theirs
                ).max()
                <= 1
            )
    np.testing.assert_array_equal(
        out["task"]["image_primary"], out["observation"]["image_primary"][:, -1]
    )
    # at its size already: the same array, no resample; padding zeros stay zeros
    np.testing.assert_array_equal(out["task"]["image_wrist"], wrist)
    assert not np.asarray(out["observation"]["image_wrist"]).any()
    np.testing.assert_array_equal(out["action"], batch["action"])


def test_the_step_resizes_before_it_augments():
    stored = np.stack([textured((64, 64, 3), s) for s in range(2)])
    batch = {
        "observation": {
            "image_primary": stored[:, None],
            "pad_mask_dict": {"image_primary": np.ones((2, 1), bool)},
        }
    }
    key = jax.random.PRNGKey(3)
    sized = augment.batch_augmenter({"primary": PRIMARY}, sizes={"primary": (128, 128)})
    at_size = augment.resize_batch(batch, {"primary": (128, 128)})
    direct = augment.batch_augmenter({"primary": PRIMARY})
    np.testing.assert_array_equal(
        jax.jit(sized)(batch, key)["observation"]["image_primary"],
        jax.jit(direct)(at_size, key)["observation"]["image_primary"],
    )
    with pytest.raises(ValueError, match="resize_method 'bicubic'"):
        augment.batch_augmenter({}, sizes={"primary": (128, 128)}, resize_method="bicubic")
