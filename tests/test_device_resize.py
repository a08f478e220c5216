"""The fine-tune with frames as stored: the host decodes, the train step resizes, the model keeps its sizes.

Where the device augments and a camera's frames are stored at another size than the model's (the dataset's
``features.json``), the pipeline ships them at their stored size, the step resizes them before it augments, and
the model's parameters, its saved example batch and the compiled step see the model's sizes. Stored at the model's
size, or augmented on the host: nothing changes. Inputs are fabricated (a ``features.json``, JPEG frames as Octo's
trajectory transforms hand them over, a toy loss); no Octo.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
jax = pytest.importorskip("jax")

from test_frames import (  # noqa: E402
    CONFIG,
    PRIMARY,
    WRIST,
    decoded,
    jpeg,
    photo,
    plain_resize,
    trajectories,
)

from octo_dist.apps.finetune import pipeline  # noqa: E402
from octo_dist.engine import augment  # noqa: E402

STORED = (64, 64)  # the fork's debug data: every frame resized up to the model's 256x256


def dataset_dir(root, primary=STORED, wrist=WRIST, name="octo_dist_synthetic") -> str:
    """A tensorflow_datasets directory whose features.json stores ``image_0`` and ``wrist_image`` at those sizes."""
    version = root / name / "1.0.0"
    version.mkdir(parents=True)
    (version / "dataset_info.json").write_text("{}")

    def image(size):
        dims = [str(size[0]), str(size[1]), "3"]
        return {
            "image": {"shape": {"dimensions": dims}, "dtype": "uint8", "encodingFormat": "jpeg"}
        }

    features = {
        "featuresDict": {
            "features": {
                "steps": {
                    "sequence": {
                        "feature": {
                            "featuresDict": {
                                "features": {
                                    "observation": {
                                        "featuresDict": {
                                            "features": {
                                                "image_0": image(primary),
                                                "wrist_image": image(wrist),
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    (version / "features.json").write_text(json.dumps(features))
    return str(root)


def config(data_dir: str, augment_on: str = "device", **more) -> dict:
    kwargs = {
        "name": "octo_dist_synthetic",
        "data_dir": data_dir,
        "image_obs_keys": {"primary": "image_0", "wrist": "wrist_image"},
    }
    return {**CONFIG, "augment_on": augment_on, "dataset_kwargs": kwargs, **more}


def test_only_cameras_stored_at_another_size_are_left_to_the_device(tmp_path):
    data_dir = dataset_dir(tmp_path)
    # primary stored at 64x64 for a 256x256 model: the step resizes it; the wrist is stored at its 128x128
    assert pipeline.resized_on_device(config(data_dir)) == {"primary": STORED}
    # augmented on the host: the host resizes before it augments, as the fork does
    assert pipeline.resized_on_device(config(data_dir, "host")) == {}
    # a camera the dataset never fills has no stored size: its padding is made at the model's size on the host
    absent = config(data_dir)
    absent["dataset_kwargs"]["image_obs_keys"] = {"primary": None, "wrist": "wrist_image"}
    assert pipeline.resized_on_device(absent) == {}
    # image dropout: the fork's frame transforms, which resize on the host
    dropout = config(data_dir)
    dropout["frame_transform_kwargs"] = {
        **CONFIG["frame_transform_kwargs"],
        "image_dropout_prob": 0.5,
    }
    assert pipeline.resized_on_device(dropout) == {}
    # no features.json to read here (a bucket): the host resizes
    assert pipeline.resized_on_device(config("gs://bucket/data")) == {}
    assert pipeline.resized_on_device(config(str(tmp_path / "elsewhere"))) == {}


def test_depth_images_keep_the_hosts_resize_in_the_plan_the_pipeline_and_the_step(tmp_path):
    """Depth cameras (``depth_obs_keys``) run the fork's frame transforms, which resize on the host: the plan line
    must not say "resized on the device", the pipeline must not ship stored sizes, the step must not resize."""
    from octo_dist.apps.finetune.stepimages import images_plan, step_augmenter

    depth = config(dataset_dir(tmp_path))
    depth["dataset_kwargs"]["depth_obs_keys"] = {"primary": "depth_0"}
    resized = pipeline.resized_on_device(depth)
    assert resized == {}
    assert images_plan("device", resized) == "augmented on the device"
    # a camera whose depth frames are all padding (no feature) still makes depth images: the fork's transforms
    padding = config(dataset_dir(tmp_path / "padding"))
    padding["dataset_kwargs"]["depth_obs_keys"] = {"wrist": None}
    assert pipeline.resized_on_device(padding) == {}
    # the step, given what the pipeline's transforms ship for the decision, resizes nothing
    step = step_augmenter(depth, "cpu", {})
    batch = {"observation": {"image_primary": jax.ShapeDtypeStruct((2, 1, *PRIMARY, 3), np.uint8)}}
    assert "dot_general" not in jax.jit(step).lower(batch, jax.random.PRNGKey(0)).as_text()


def test_the_pipeline_refuses_stored_sizes_beside_the_forks_transforms(tmp_path):
    """A dataset with depth images the config does not name: the fork's transforms run, so frames left at their
    stored size would reach a step that does not resize them; the pipeline refuses, naming both."""
    c = config(dataset_dir(tmp_path))
    spec = {"observation": {"image_primary": None, "depth_primary": None}}
    with pytest.raises(
        ValueError, match=r"\(primary\).*observation.depth_primary.*augment_on=host"
    ):
        pipeline.frame_transform(c, spec, stored={"primary": STORED})


def test_frames_stored_at_the_models_sizes_get_no_resize_anywhere(tmp_path):
    data_dir = dataset_dir(tmp_path, primary=PRIMARY, wrist=WRIST)
    c = config(data_dir)
    assert pipeline.resized_on_device(c) == {}
    transform = pipeline.frame_transform(c, stored=pipeline.resized_on_device(c))
    assert transform.device_sizes == {}
    # the step gets no resize op: its program is the augmentation's alone
    from octo_dist.apps.finetune.stepimages import step_augmenter

    batch = {"observation": {"image_primary": jax.ShapeDtypeStruct((2, 1, *PRIMARY, 3), np.uint8)}}
    plain = step_augmenter(c, "cpu", transform.device_sizes)
    text = jax.jit(plain).lower(batch, jax.random.PRNGKey(0)).as_text()
    assert (
        "resize" not in text and "dot_general" not in text
    )  # jax.image.resize is products with weight matrices


def test_the_plan_says_where_frames_are_resized():
    from octo_dist.apps.finetune.stepimages import images_plan

    assert images_plan("host", {}) == "augmented on the host"
    assert images_plan("device", {}) == "augmented on the device"
    assert (
        images_plan("device", {"primary": (256, 256), "wrist": (256, 256)})
        == "decoded at 256x256, resized and augmented on the device"
    )
    assert (
        images_plan("device", {"wrist": (480, 640), "primary": (256, 256)})
        == "decoded at 256x256 (primary), 480x640 (wrist), resized and augmented on the device"
    )


@pytest.fixture(scope="module")
def stored_source(tmp_path_factory):
    """OctoData on frames stored at 64x64 (the wrist camera absent), with the device augmenting."""
    from ml_collections import FrozenConfigDict

    from octo_dist.apps.finetune import config as fc

    primary = jpeg(photo(*STORED, 15))

    data_dir = dataset_dir(tmp_path_factory.mktemp("data"))
    settings = {**config(data_dir), "seed": 0, "shuffle_buffer_size": 4}
    settings["dataset_kwargs"]["image_obs_keys"]["wrist"] = None
    job = fc.FinetuneJob(config=FrozenConfigDict(settings), name="stored")
    stored = pipeline.resized_on_device(job.plain_config())
    source = pipeline.OctoData(
        job, None, 2, 0, 1, build=trajectories(primary), process=lambda b: b, stored=stored
    )
    return job, source, primary


def test_the_host_ships_frames_at_their_stored_size_and_the_model_sees_its_own(stored_source):
    from octo_dist.apps.finetune.stepimages import step_augmenter

    job, source, primary = stored_source
    assert source.device_sizes == {"primary": PRIMARY}
    example = source.example
    # decoded only: the frames leave the host at 64x64, a sixteenth of the model's pixels
    assert example["observation"]["image_primary"].shape == (2, 2, *STORED, 3)
    np.testing.assert_array_equal(example["observation"]["image_primary"][0, 1], decoded(primary))
    assert example["task"]["image_primary"].shape == (2, *STORED, 3)
    # the absent wrist camera: padding made at the model's size on the host, as before
    assert example["observation"]["image_wrist"].shape == (2, 2, *WRIST, 3)
    spec = source.batch_spec()
    assert spec["observation"]["image_primary"].shape == (2, 2, *STORED, 3)

    # the model's shapes: what the step's augmentation makes of that batch (compile_ahead initialises on them)
    step = step_augmenter(job.config, "cpu", source.device_sizes)
    model = augment.output_spec(step, spec)
    assert model["observation"]["image_primary"].shape == (2, 2, *PRIMARY, 3)
    assert model["task"]["image_primary"].shape == (2, *PRIMARY, 3)
    assert model["observation"]["image_wrist"].shape == (2, 2, *WRIST, 3)
    assert model["observation"]["image_primary"].dtype == np.uint8

    # the example the parameters are initialised on and save_pretrained records: the model's sizes, the pixels
    # TensorFlow's resize (the host's, before) gives to one level
    at_model = augment.resize_on_host(example, source.device_sizes, "lanczos3")
    images = at_model["observation"]["image_primary"]
    assert isinstance(images, np.ndarray) and images.shape == (2, 2, *PRIMARY, 3)
    theirs = plain_resize(decoded(primary), PRIMARY).astype(int)
    assert np.abs(images[1, 0].astype(int) - theirs).max() <= 1
    assert jax.tree_util.tree_structure(at_model) == jax.tree_util.tree_structure(example)
    np.testing.assert_array_equal(at_model["action"], example["action"])


def test_the_engine_compiles_the_step_for_the_resized_batch():
    """The step is compiled ahead for what the augmentation makes (the model's sizes), the augmentation for what
    the host ships (the stored size); a step on a shipped batch then runs both executables."""
    import jax.numpy as jnp
    import optax

    from octo_dist.engine import parallel

    seen = []

    def loss(params, batch, rng, train):
        seen.append(batch["observation"]["image_primary"].shape)
        return params["w"] * jnp.mean(batch["observation"]["image_primary"].astype(jnp.float32)), {}

    sizes = {"primary": (32, 32)}
    eng = parallel.Engine(
        parallel.make_mesh(jax.devices()[:1]),
        loss,
        optax.sgd(0.0),
        step_fn="jit",
        augment=augment.batch_augmenter({}, sizes=sizes),
    )
    shipped = {
        "observation": {
            "image_primary": np.stack([photo(16, 16, s) for s in range(2)])[:, None],
            "pad_mask_dict": {"image_primary": np.ones((2, 1), bool)},
        }
    }
    batch = eng.global_batch(shipped)
    state = eng.init_state(None, batch, params={"w": jnp.float32(1.0)})
    spec = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), (state, batch)
    )
    eng.compile(*spec)
    assert seen == [(2, 1, 32, 32, 3)]  # traced once, at the model's size
    _, metrics = eng.step(state, batch)
    resized = augment.resize_on_host(shipped, sizes)["observation"]["image_primary"]
    assert float(parallel.to_host(metrics)["loss"]) == pytest.approx(
        resized.astype(np.float64).mean(), rel=1e-5
    )
    assert seen == [(2, 1, 32, 32, 3)]  # no second compilation
