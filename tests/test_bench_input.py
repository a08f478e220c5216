"""The input benchmark (octo-dist bench-input): its verdict arithmetic on given numbers, and a real run on an RLDS
dataset written here at realistic sizes (256x256 primary and 128x128 wrist JPEGs with camera-like noise, window 2).

Timings are never asserted: the run is checked for what it prints and for its arithmetic (the split sums to the
total; each verdict follows from the numbers printed beside it).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from helpers import HANG_S, clean_env
from octo_dist.apps.benchinput import verdict as vd

OCTO_DIST = [sys.executable, "-m", "octo_dist"]
WINDOW_2_WRIST = [
    "--config=finetune_config.py:full,image_conditioned",
    "--set",
    "window_size=2",
    "--set",
    "dataset_kwargs.name=octo_dist_synthetic",
    "--set",
    "dataset_kwargs.image_obs_keys.wrist=wrist_image",
]


def test_the_verdict_counts_the_gpus_a_nodes_cores_feed():
    line = vd.verdict(
        62, cores=96, gpu_rate=1600, gpus=8, model="Octo-Small", basis="at 40% utilisation"
    )
    assert line == (
        "feeds 3 of 8 GPUs of Octo-Small at 40% utilisation (5,952 samples/s from 96 cores; 8 GPUs need 12,800)"
    )
    assert vd.gpus_fed(696 * 96, 1600, 8) == 8  # 66,816 samples/s: all 8, with margin
    assert "feeds 8 of 8" in vd.verdict(696, cores=96, gpu_rate=1600, gpus=8, model="M", basis="b")
    assert "4.2x what they need" in vd.verdict(
        700, cores=96, gpu_rate=2000, gpus=8, model="M", basis="b"
    )
    assert vd.gpus_fed(1599.9, 1600, 8) == 0
    with pytest.raises(ValueError, match="expected a positive rate"):
        vd.gpus_fed(100, 0, 8)


def test_the_gpus_consumption_follows_the_models_shape():
    small = vd.model_shape("Octo-Small")
    assert (small.layers, small.width, small.params) == (12, 384, 21_233_664)
    # window 2 x (256 patches of the 256x256 primary + 64 of the 128x128 wrist + 1 readout) + 16 language tokens
    tokens = vd.tokens_per_sample(small, 2, {"primary": (256, 256), "wrist": (128, 128)})
    assert tokens == 658
    assert vd.tokens_per_sample(small, 1, {"primary": (256, 256)}) == 273
    flops = 6 * 21_233_664 * 658 + 12 * 12 * 658**2 * 384
    assert vd.flops_per_sample(small, tokens) == flops
    rate, basis, how = vd.consumption(small, 2, {"primary": (256, 256), "wrist": (128, 128)})
    assert rate == pytest.approx(989e12 * 0.4 / flops) and basis == "at 40% utilisation"
    assert "658 tokens/sample" in how and "107.8 GFLOP/sample" in how
    rate, basis, _ = vd.consumption(small, 2, {"primary": (256, 256)}, step_rate=1600)
    assert rate == 1600 and basis == "at the measured 1,600 samples/s per GPU"
    with pytest.raises(ValueError, match="expected one of"):
        vd.model_shape("octo-huge")


def test_what_converting_the_frames_would_change_follows_the_pixels_decoded():
    # 512x512 primary for a 256x256 model: decoding a quarter of the pixels
    rate = vd.converted_rate(0.001, 0.005, {"primary": (512, 512)}, {"primary": (256, 256)})
    assert rate == pytest.approx(0.001 + 0.004 / 4)
    # stored at the model's sizes: a copy would be the same data
    assert vd.converted_rate(0.001, 0.005, {"primary": (256, 256)}, {"primary": (256, 256)}) is None


@pytest.mark.parametrize(
    "stored, says",
    [
        ({"primary": (256, 256), "wrist": (128, 128)}, "a copy would change nothing"),
        (
            {"primary": (64, 64), "wrist": (64, 64)},
            "primary, wrist stored smaller than the model's sizes",
        ),
        (
            {"primary": (512, 512), "wrist": (256, 256)},
            "would take the device rows to: feeds 8 of 8",
        ),
    ],
)
def test_the_report_says_what_convert_frames_would_change(stored, says):
    from octo_dist.apps.benchinput import cli

    medians = {
        "rest": 1e-4,
        "decode": 1.6e-3,
        "resize": 5e-3,
        "augment": 9e-3,
        "device-resize": 1.7e-3,
    }
    lines = cli.report(
        medians,
        {"rest": 1e-4},
        gpu_rate=3671,
        basis="at 40% utilisation",
        model="Octo-Small",
        cores_per_node=96,
        gpus_per_node=8,
        stored=stored,
        sizes={"primary": (256, 256), "wrist": (128, 128)},
    )
    assert says in lines[-1]
    # the data as stored, its resize on the device: its own verdict, first
    assert lines[1].startswith("ours, resize + augmentation on the device (host: decode)")
    assert any(
        line.startswith("verdict, ours, resize + augmentation on the device") for line in lines
    )


@pytest.fixture(scope="module")
def realistic(tmp_path_factory):
    pytest.importorskip("tensorflow_datasets")
    from octo_dist.apps.finetune import synthetic_rlds

    root = tmp_path_factory.mktemp("rlds")
    layout = synthetic_rlds.Layout(
        train_episodes=3, val_episodes=1, steps=6, image_size=256, wrist_size=128, texture=True
    )
    synthetic_rlds.write(root, layout)
    return root


def numbers(line: str) -> list:
    return [float(x.replace(",", "")) for x in re.findall(r"-?[\d,]*\d\.?\d*", line)]


@pytest.mark.slow
def test_the_benchmark_prints_ours_and_the_forks_the_split_and_verdicts_that_follow(realistic):
    proc = subprocess.run(
        [*OCTO_DIST, "bench-input", str(realistic), *WINDOW_2_WRIST]
        + ["--batch-size", "4", "--batches", "1", "--rounds", "2", "--warmup", "1"]
        # every core this test may use: pinned to one, it would queue behind whatever else runs there
        + ["--cores", str(len(os.sched_getaffinity(0)))],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.splitlines()
    assert "window 2, cameras primary 256x256, wrist 128x128; batch 4; pinned to " in out[0]
    rows = {}
    for label in vd_labels():
        row = next(line for line in out if line.startswith(label))
        rows[label] = row
    fork = rows["fork (Octo's apply_frame_transforms)"]
    try:
        import octo  # noqa: F401

        assert "skipped" not in fork
    except ImportError:
        assert "skipped: octo not importable" in fork
        assert any("minimal RLDS reader" in line for line in out)

    # ms/sample, samples/s/core, per node: one from the other
    ours = {}
    for label, row in rows.items():
        if "skipped" in row:
            continue
        ms, per_core, per_node = numbers(row[len(label) :])[:3]
        assert per_core == pytest.approx(1000 / ms, rel=0.01, abs=0.1)
        assert per_node == pytest.approx(per_core * 96, rel=0.01, abs=96)
        ours[label] = (ms, per_core)

    split = next(line for line in out if line.startswith("split of ours"))
    parts = dict(re.findall(r"(rest|decode|resize|augment) (-?\d+\.\d+)", split))
    assert list(parts) == ["rest", "decode", "resize", "augment"]
    total = float(re.search(r"= (-?\d+\.\d+) \(the total above\)", split).group(1))
    # each part printed to 0.01 ms: their sum is the total within 4 x 0.005
    assert sum(float(v) for v in parts.values()) == pytest.approx(total, abs=0.021)
    assert total == pytest.approx(ours["ours, augmentation on the host"][0], abs=0.011)

    # the frames are stored at the model's sizes: the device-resize row ships them so, converting changes nothing
    assert "frames as stored: primary 256x256, wrist 128x128" in "\n".join(out)
    assert (
        "convert-frames: the frames are stored at the model's sizes; a copy would change nothing"
        in out
    )

    gpu_line = next(line for line in out if line.startswith("GPU consumption:"))
    need = float(re.search(r"([\d,]+) samples/s per GPU", gpu_line).group(1).replace(",", ""))
    verdicts = [line for line in out if line.startswith("verdict, ")]
    assert len(verdicts) == len(ours) - 1  # not the every-resize comparison
    for line in verdicts:
        label = line[len("verdict, ") :].split(": feeds")[0]
        fed, gpus = map(int, re.search(r"feeds (\d+) of (\d+) GPUs", line).groups())
        node = float(
            re.search(r"\(([\d,]+) samples/s from 96 cores", line).group(1).replace(",", "")
        )
        assert node == pytest.approx(ours[label][1] * 96, rel=0.01, abs=96)
        needed = float(re.search(r"8 GPUs need ([\d,]+)", line).group(1).replace(",", ""))
        assert needed == pytest.approx(need * 8, abs=8)  # the per-GPU figure is printed rounded
        assert gpus == 8 and fed == min(8, math.floor(node / (needed / 8)))


def vd_labels():
    from octo_dist.apps.benchinput import cli

    return list(cli.LABELS.values())


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--set", "window_size"], "--set window_size; expected FIELD.PATH=VALUE"),
        (["--set", "no_such.field=1"], "the config has no field no_such.field"),
        (["--cores", "0"], "--cores 0; expected 1 to"),
        (["--batch-size", "0"], "--batch-size 0; expected a positive number"),
        (["--utilisation", "nan"], "--utilisation nan; expected a share of the GPU's peak"),
        (["--utilisation", "1.5"], "--utilisation 1.5; expected a share of the GPU's peak"),
        (["--gpus-per-node", "0"], "--gpus-per-node 0; expected a positive number"),
        (["--cores-per-node", "-1"], "--cores-per-node -1; expected a positive number"),
        (["--warmup", "-3"], "--warmup -3; expected a number >= 0"),
        (["--shuffle-buffer", "-1"], "--shuffle-buffer -1; expected a positive number"),
        (["--step-rate", "nan"], "--step-rate nan; expected a positive number"),
        (["--set", "augment_on=gpu"], "augment_on 'gpu'; expected one of auto, device, host"),
        (["--set", "resize_method=bicubic"], "resize_method 'bicubic'; expected one of"),
        # the directory exists but holds no dataset: what it holds, where the dataset was looked for
        ([], "no RLDS dataset 'bridge_dataset' in"),
        (["--set", "dataset_kwargs.name=../other"], "dataset name '../other'; expected a"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, flags, expected):
    proc = subprocess.run(
        [*OCTO_DIST, "bench-input", str(tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr


@pytest.mark.parametrize(
    "name, text", [("config.yaml", "batch_size: 8\n"), ("noget.py", "x = 1\n")]
)
def test_a_config_that_is_not_a_python_config_file_is_one_line_and_exit_2(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    proc = subprocess.run(
        [*OCTO_DIST, "bench-input", str(tmp_path), f"--config={tmp_path / name}"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--config={tmp_path / name}" in lines[0] and "Fix:" in lines[0]


def test_every_option_says_what_it_does_and_its_default():
    from octo_dist.apps.benchinput import cli

    parser = cli.argparse.ArgumentParser()
    cli._arguments(parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, action.option_strings
            if action.default not in (None, []):
                assert "%(default)s" in action.help, action.option_strings


def test_the_pipelines_outlive_the_rounds_until_the_caller_drops_them():
    # tf.data's teardown of the pipelines took seconds (minutes beside the fork's) and came before the table: the
    # caller holds the iterators through its report, and each is still the same pipeline, where it left off.
    tf = pytest.importorskip("tensorflow")
    from octo_dist.apps.benchinput import measure

    datasets = {
        name: tf.data.Dataset.range(100).map(lambda x: x * k).batch(2)
        for name, k in (("a", 1), ("b", 10))
    }
    held: list = []
    times = measure.rounds(datasets, batch_size=2, batches=2, rounds=2, warmup=1, held=held)
    assert sorted(times) == ["a", "b"] and all(len(v) == 2 for v in times.values())
    (iterators,) = held
    # 1 warm-up + 2 rounds x 2 batches taken from each: the next batch is the sixth
    assert list(next(iterators["a"])) == [10, 11]
    assert list(next(iterators["b"])) == [100, 110]
