"""octo-dist convert-frames: a copy of an RLDS dataset with its frames at the model's sizes, never written in place.

The source is a real tensorflow_datasets dataset (the synthetic one: 64x64 primary JPEGs, 128x128 wrist JPEGs); the
copy is read back with tensorflow_datasets, as the fine-tune reads it.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import HANG_S, clean_env

tf = pytest.importorskip("tensorflow")
tfds = pytest.importorskip("tensorflow_datasets")

from octo_dist.apps.finetune import convertframes, frames, synthetic_rlds  # noqa: E402

OCTO_DIST = [sys.executable, "-m", "octo_dist"]
NAME = synthetic_rlds.NAME


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    layout = synthetic_rlds.Layout(
        train_episodes=2, val_episodes=1, steps=5, image_size=64, wrist_size=128, texture=True
    )
    synthetic_rlds.write(root, layout)
    return root


def digests(root) -> dict:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def convert(*argv, cwd=None):
    return subprocess.run(
        [*OCTO_DIST, "convert-frames", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=cwd,
    )


def episodes(data_dir, split="train") -> list:
    builder = tfds.builder_from_directory(str(data_dir / NAME / synthetic_rlds.DATASET_VERSION))
    skip = {"image_0": tfds.decode.SkipDecoding(), "wrist_image": tfds.decode.SkipDecoding()}
    ds = builder.as_dataset(split=split, decoders={"steps": {"observation": skip}})
    out = []
    for episode in ds:
        steps = episode["steps"].batch(100).get_single_element()
        out.append(tf.nest.map_structure(lambda x: x.numpy(), steps))
    return builder, out


def test_the_copy_has_the_frames_at_the_models_sizes_and_the_rest_unchanged(source, tmp_path):
    before = digests(source)
    dst = tmp_path / "converted"
    proc = convert(
        source, dst, "--name", NAME, "--size", "image_0=256x256", "--size", "wrist_image=128"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "train.tfrecord-00000-of-00001: 10 image(s) resized, 10 already at their size"
        in proc.stdout
    )
    assert digests(source) == before  # the source is only read

    old_builder, old = episodes(source)
    new_builder, new = episodes(dst)
    observation = new_builder.info.features["steps"]["observation"]
    assert observation["image_0"].shape == (256, 256, 3)
    assert observation["wrist_image"].shape == (128, 128, 3)
    assert new_builder.info.splits["train"].num_examples == 2
    assert len(new) == len(old) == 2
    for a, b in zip(old, new):
        np.testing.assert_array_equal(a["action"], b["action"])
        np.testing.assert_array_equal(a["language_instruction"], b["language_instruction"])
        # already at their size: copied byte for byte, not re-encoded
        assert list(a["observation"]["wrist_image"]) == list(b["observation"]["wrist_image"])
        for small, big in zip(a["observation"]["image_0"], b["observation"]["image_0"]):
            decoded = tf.io.decode_jpeg(small)
            expected = frames.resize_image(decoded, (256, 256)).numpy().astype(int)
            got = tf.io.decode_jpeg(big).numpy().astype(int)
            assert got.shape == (256, 256, 3)
            # the fine-tune's lanczos3 pixels, through JPEG at quality 95
            assert np.abs(got - expected).mean() < 2.0
    # The fine-tune's frame transforms find nothing to resize in the copy.
    encoded = new[0]["observation"]["image_0"][0]
    np.testing.assert_array_equal(
        frames.resize_unless_same(tf.io.decode_jpeg(encoded), (256, 256)),
        tf.io.decode_jpeg(encoded),
    )


def test_sizes_come_from_the_configs_cameras():
    config = {
        "dataset_kwargs": {"image_obs_keys": {"primary": "image_0", "wrist": None}},
        "frame_transform_kwargs": {"resize_size": {"primary": (256, 256), "wrist": (128, 128)}},
    }
    assert convertframes.sizes_from_config(config) == {"image_0": (256, 256)}
    config["dataset_kwargs"]["image_obs_keys"]["wrist"] = "wrist_image"
    assert convertframes.sizes_from_config(config) == {
        "image_0": (256, 256),
        "wrist_image": (128, 128),
    }
    # the packaged configs' augment_on ("auto", resolved only on a training rank) does not change the sizes
    for where in ("auto", "device", "host"):
        assert convertframes.sizes_from_config({**config, "augment_on": where}) == {
            "image_0": (256, 256),
            "wrist_image": (128, 128),
        }
    assert convertframes.parse_size("image_0=256x192") == ("image_0", (256, 192))
    with pytest.raises(convertframes.ConvertError, match="expected FEATURE=HEIGHTxWIDTH"):
        convertframes.parse_size("image_0=big")


@pytest.mark.parametrize(
    "where, expected",
    [
        ("same", "is the source"),
        ("inside", "is the source"),
        ("non-empty", "already exists and is not empty"),
    ],
)
def test_a_destination_that_would_write_in_place_or_over_something_is_refused(
    source, tmp_path, where, expected
):
    dst = {"same": source, "inside": source / NAME / "copy", "non-empty": tmp_path / "old"}[where]
    if where == "non-empty":
        dst.mkdir()
        (dst / "keep.txt").write_text("mine")
    before_src, before_dst = digests(source), digests(dst) if dst.exists() else None
    proc = convert(source, dst, "--name", NAME, "--size", "image_0=256")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Fix:" in lines[0], proc.stderr
    assert digests(source) == before_src
    assert (digests(dst) if dst.exists() else None) == before_dst
    assert not (source / NAME / "copy").exists()


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--name", "no_such_dataset", "--size", "image_0=256"],
            "no RLDS dataset 'no_such_dataset'",
        ),
        (["--name", NAME, "--size", "image_9=256"], "camera features ['image_9'] to resize"),
        (["--name", NAME, "--size", "image_0=0"], "--size image_0=0; expected FEATURE="),
        (["--size", "image_0=256"], "no dataset name"),
        # a name is a dataset's, never a path out of the data dir
        (["--name", f"../{NAME}", "--size", "image_0=256"], f"dataset name '../{NAME}'; expected"),
        (["--name", "..", "--size", "image_0=256"], "dataset name '..'; expected"),
        (["--name", NAME, "--size", "image_0=100000x100000"], "each side 1 to 4096 pixels"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_with_nothing_written(source, tmp_path, flags, expected):
    dst = tmp_path / "out"
    proc = convert(source, dst, *flags)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert not dst.exists()


def test_a_config_that_is_not_a_python_file_is_one_line_and_exit_2(source, tmp_path):
    (tmp_path / "config.yaml").write_text("batch_size: 8\n")
    proc = convert(source, tmp_path / "out", f"--config={tmp_path / 'config.yaml'}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is not a Python file" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_help_says_first_what_the_command_does():
    proc = subprocess.run(
        [*OCTO_DIST, "convert-frames", "--help"], capture_output=True, text=True, env=clean_env()
    )
    description = proc.stdout.split("\n\n")[1]
    assert description.startswith(
        "Copy an RLDS dataset with its camera frames stored at the model's"
    )


def _copy_of(source, tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(source, copy)
    return copy, copy / NAME / synthetic_rlds.DATASET_VERSION


@pytest.mark.parametrize("damage", ["flipped bytes", "not an episode"])
def test_a_corrupt_shard_is_one_line_and_leaves_no_copy(source, tmp_path, damage):
    src, version = _copy_of(source, tmp_path)
    shard = next(version.glob(f"{NAME}-train.tfrecord*"))
    if damage == "flipped bytes":
        data = bytearray(shard.read_bytes())
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
        shard.write_bytes(bytes(data))
    else:  # framed as a TFRecord, but its record is no tf.train.Example
        shard.unlink()
        with tf.io.TFRecordWriter(str(shard)) as writer:
            writer.write(b"\xff\xfe not a protocol buffer")
    dst = tmp_path / "out"
    proc = convert(src, dst, "--name", NAME, "--size", "image_0=32")
    assert proc.returncode == 1, proc.stderr[-2000:]
    # TensorFlow was imported: its start-up notes may come first (a CPU build's cuDNN lines), never a traceback
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert last.startswith("octo-dist convert-frames: error: ") and shard.name in last
    assert "not a readable TFRecord" in last
    assert not dst.exists()


def test_ctrl_c_ends_in_one_line_and_leaves_nothing_that_looks_like_a_copy(source, tmp_path):
    src, version = _copy_of(source, tmp_path)
    shard = next(version.glob(f"{NAME}-train.tfrecord*"))
    # enough shards, each resized up to 1024x1024, that the copy is still being written when Ctrl-C comes
    for i in range(40):
        shutil.copy(shard, version / f"{NAME}-train.tfrecord-extra{i:03d}")
    dst = tmp_path / "out"
    proc = subprocess.Popen(
        [*OCTO_DIST, "convert-frames", str(src), str(dst), "--name", NAME]
        + ["--size", "image_0=1024", "--size", "wrist_image=1024"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    partial = dst / NAME / f"{synthetic_rlds.DATASET_VERSION}.incomplete"
    while proc.poll() is None and not any(partial.glob("*.tfrecord*")):
        time.sleep(0.02)
    assert proc.poll() is None, "the copy ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("octo-dist convert-frames: interrupted"), err
    assert not dst.exists()
