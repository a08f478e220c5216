"""``octo-dist bench-input``: samples/s per core of the fine-tune's input pipeline, ours and the fork's, and whether
a node's cores feed its GPUs.

    octo-dist bench-input runs/bench_input_rlds --config=finetune_config.py:full,image_conditioned \\
        --set window_size=2 --set dataset_kwargs.name=octo_dist_synthetic \\
        --set dataset_kwargs.image_obs_keys.wrist=wrist_image

Run it on a compute node before spending GPU hours: it pins itself to ``--cores`` cores (1 by default), measures the
CPU time per sample of each pipeline (:mod:`.measure`), and prints them side by side with the split of ours into
read-and-batch / decode / resize / augment, then a verdict per pipeline for a node of ``--cores-per-node`` cores and
``--gpus-per-node`` GPUs (:mod:`.verdict`). Timings are printed, never checked.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import sys
from typing import Mapping, Optional, Sequence, Tuple

from octo_dist.apps.benchinput import verdict as vd
from octo_dist.problems import Refusal

# What `--help` says: the docstring's paragraph without its markup (no ``--cores`` or :mod:`.measure` on a terminal).
DESCRIPTION = (
    "Run it on a compute node before spending GPU hours: it pins itself to --cores cores (1 by default), measures "
    "the CPU time per sample of each pipeline, and prints them side by side with the split of ours into "
    "read-and-batch / decode / resize / augment, then a verdict per pipeline for a node of --cores-per-node cores "
    "and --gpus-per-node GPUs. Timings are printed, never checked."
)

LABELS = {
    "device-resize": "ours, resize + augmentation on the device (host: decode)",
    "device-resize-scaled": "the same, JPEGs decoded at 1/2-1/8 by libjpeg (opt-in)",
    "resize": "ours, augmentation on the device (host: decode + batch)",
    "augment": "ours, augmentation on the host",
    "every-resize": "ours, host augmentation, every resize run (the fork's way)",
    "fork": "fork (Octo's apply_frame_transforms)",
}


# Why a row has no figures (the fork's: the reason Octo is not importable, given to report).
SKIPPED = {
    "device-resize": "the frames' stored sizes are not in features.json",
    "device-resize-scaled": "no camera's frames stored at 2x, 4x or 8x the model's size",
    "resize": "not measured",
    "augment": "not measured",
    "every-resize": "not measured",
}


class BenchError(Refusal):
    """A benchmark that cannot run as asked (exit 2, before anything is measured)."""


def apply_settings(config, settings: Sequence[str]):
    """``["window_size=2", "dataset_kwargs.image_obs_keys.wrist=wrist_image"]`` set on an ml_collections config, as
    ``--config.window_size=2`` would for the fine-tune (values read as Python literals, else as text; a field that
    is a FieldReference, ``window_size``, moves every field sharing it)."""
    for item in settings:
        path, eq, text = item.partition("=")
        if not eq or not path:
            raise BenchError(f"--set {item}", "FIELD.PATH=VALUE", "--set window_size=2")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        *parents, leaf = path.split(".")
        node = config
        for p in parents:
            if p not in node:
                raise BenchError(
                    f"--set {item}: the config has no field {path}", fix="check the config file"
                )
            node = node[p]
        try:
            node[leaf] = value
        except (TypeError, KeyError, AttributeError) as e:
            raise BenchError(f"--set {item}: {e}", fix="a value of the field's type") from None
    return config


def image_sizes(config: Mapping) -> dict:
    """Camera -> (height, width) the model sees: the cameras the config reads, at their resize_size."""
    from octo_dist.apps.benchinput import reader
    from octo_dist.apps.finetune import frames

    transforms = frames.FrameTransforms.for_sizes(config)
    return {
        camera: transforms.size_of(camera)
        for camera, feature in reader.image_features(config).items()
        if feature is not None and transforms.size_of(camera) is not None
    }


def _table(
    medians: Mapping[str, float],
    cores_per_node: int,
    why_no_fork: str,
    spread: Mapping[str, Sequence[float]],
) -> list:
    """The table's heading and one row a pipeline (a skipped one says why), its x-fork column against the fork's
    median where the fork ran."""
    lines = [
        f"{'pipeline':<60} {'ms/sample':>9} {'samples/s/core':>14} {'per node':>10} {'x fork':>7}"
        f"  rounds (ms/sample)",
    ]
    fork = medians.get("fork")
    for name in (
        "device-resize",
        "device-resize-scaled",
        "resize",
        "augment",
        "every-resize",
        "fork",
    ):
        if name not in medians:
            lines.append(f"{LABELS[name]:<60} skipped: {SKIPPED.get(name, why_no_fork)}")
            continue
        rate = 1.0 / medians[name]
        ratio = f"{fork / medians[name]:7.2f}" if fork else f"{'-':>7}"
        rounds = spread.get(name) or [medians[name]]
        lines.append(
            f"{LABELS[name]:<60} {medians[name] * 1e3:9.2f} {rate:14.1f} "
            f"{rate * cores_per_node:10,.0f} {ratio}  {min(rounds) * 1e3:.2f}-{max(rounds) * 1e3:.2f}"
        )
    return lines


def report(
    medians: Mapping[str, float],
    split: Mapping[str, float],
    *,
    gpu_rate: float,
    basis: str,
    model: str,
    cores_per_node: int,
    gpus_per_node: int,
    why_no_fork: str = "",
    spread: Optional[Mapping[str, Sequence[float]]] = None,
    stored: Optional[Mapping[str, Tuple[int, int]]] = None,
    sizes: Optional[Mapping[str, Tuple[int, int]]] = None,
) -> list:
    """The result lines from the measured medians (CPU seconds per sample; ``spread``: each round's, for the
    min-max column): the table, the split, the verdicts, and what converting the data would change (``stored``:
    camera -> the size its frames are stored at; ``sizes``: the model's)."""
    lines = _table(medians, cores_per_node, why_no_fork, spread or {})
    parts = " + ".join(f"{stage} {seconds * 1e3:.2f}" for stage, seconds in split.items())
    total = sum(split.values())
    lines.append(
        f"split of ours with host augmentation (ms/sample): {parts} = {total * 1e3:.2f} (the total above)"
    )

    def fed(seconds):
        return vd.verdict(
            1.0 / seconds,
            cores=cores_per_node,
            gpu_rate=gpu_rate,
            gpus=gpus_per_node,
            model=model,
            basis=basis,
        )

    for name in ("device-resize", "device-resize-scaled", "resize", "augment", "fork"):
        if name in medians:
            lines.append(f"verdict, {LABELS[name]}: {fed(medians[name])}")
    lines.append(_conversion_line(medians, stored or {}, sizes or {}, fed))
    return lines


def _conversion_line(medians: Mapping[str, float], stored: Mapping, sizes: Mapping, fed) -> str:
    """What a copy by convert-frames would change (``fed``: CPU seconds per sample -> the verdict in words)."""
    converted = vd.converted_rate(
        medians.get("rest", 0.0), medians.get("decode", 0.0), stored, sizes
    )
    smaller = [
        c for c in stored if c in sizes and stored[c][0] * stored[c][1] < sizes[c][0] * sizes[c][1]
    ]
    if converted is None:
        return "convert-frames: the frames are stored at the model's sizes; a copy would change nothing"
    elif smaller:
        return (
            f"convert-frames: {', '.join(smaller)} stored smaller than the model's sizes; a copy at those sizes "
            "would decode more pixels, not fewer: leave the data as it is and the resize to the device"
        )
    else:
        return (
            f"convert-frames (frames stored at the model's sizes) would take the device rows to: "
            f"{fed(converted)} (estimated: {converted * 1e3:.2f} ms/sample, decoding scaled by the pixels stored)"
        )


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench-input",
        help="samples/s per core of the input pipeline (ours and the fork's) and whether a node feeds its GPUs",
        description=DESCRIPTION,
    )
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data_dir", metavar="DATA_DIR", help="the tensorflow_datasets data_dir to read")
    p.add_argument(
        "--config",
        default="finetune_config.py",
        help="the fine-tune config (default: %(default)s); its dataset, window, cameras and frame transforms",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="change a config field, as --config.FIELD=VALUE does for finetune (repeatable)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument(
        "--batches", type=int, default=5, help="per pipeline per round (default: %(default)s)"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds (default: %(default)s)"
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="batches before the rounds (default: %(default)s)"
    )
    p.add_argument("--shuffle-buffer", type=int, default=256, help="frames (default: %(default)s)")
    p.add_argument("--cores", type=int, default=1, help="cores to pin to (default: %(default)s)")
    p.add_argument(
        "--model",
        default="octo-small",
        choices=sorted(vd.MODELS),
        help="the model whose step the GPUs run, for their consumption (default: %(default)s)",
    )
    # the node the verdict speaks of: flag, type, default, what it is
    for flag, kind, default, text in (
        (
            "--utilisation",
            float,
            vd.DEFAULT_UTILISATION,
            "share of the H200's peak the step reaches",
        ),
        (
            "--step-rate",
            float,
            None,
            "measured samples/s per GPU of the train step (instead of the FLOP estimate)",
        ),
        (
            "--cores-per-node",
            int,
            vd.DEFAULT_CORES_PER_NODE,
            "CPU cores of a node for the verdict; ABCI 3.0's rt_HF by default",
        ),
        ("--gpus-per-node", int, vd.DEFAULT_GPUS_PER_NODE, "GPUs of a node for the verdict"),
    ):
        if default is not None:
            text += " (default: %(default)s)"
        p.add_argument(flag, type=kind, default=default, help=text)
    p.set_defaults(func=main)


def _pin(cores: int) -> list:
    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= cores <= len(allowed):
        raise BenchError(
            f"--cores {cores}", f"1 to {len(allowed)} (the cores this process may use)", "--cores 1"
        )
    chosen = allowed[:cores]
    os.sched_setaffinity(0, chosen)
    return chosen


def check_numbers(args) -> None:
    """Every number flag within its bounds (``--utilisation nan`` and ``--gpus-per-node 0`` included), else a
    BenchError naming the flag, its bounds and a value that works."""
    counts = [
        ("--batch-size", args.batch_size, 1, 64),
        ("--batches", args.batches, 1, 5),
        ("--rounds", args.rounds, 1, 3),
        ("--warmup", args.warmup, 0, 2),
        ("--shuffle-buffer", args.shuffle_buffer, 1, 256),
        ("--cores-per-node", args.cores_per_node, 1, vd.DEFAULT_CORES_PER_NODE),
        ("--gpus-per-node", args.gpus_per_node, 1, vd.DEFAULT_GPUS_PER_NODE),
    ]
    for flag, value, low, good in counts:
        if value < low:
            expected = "a positive number" if low == 1 else f"a number >= {low}"
            raise BenchError(f"{flag} {value}", expected, f"{flag} {good}")
    # NaN fails every comparison: the bounds are written so that it fails them
    if not 0 < args.utilisation <= 1:
        raise BenchError(
            f"--utilisation {args.utilisation}",
            "a share of the GPU's peak above 0 and at most 1",
            f"--utilisation {vd.DEFAULT_UTILISATION}",
        )
    if args.step_rate is not None and not 0 < args.step_rate < math.inf:
        raise BenchError(
            f"--step-rate {args.step_rate}", "a positive number of samples/s", "--step-rate 1600"
        )


def _config(args) -> dict:
    from octo_dist.apps.finetune import config as finetune_config
    from octo_dist.apps.finetune.configfile import load_config

    check_numbers(args)
    config = apply_settings(load_config(args.config), args.set).to_dict()
    problems = finetune_config.augment_config_problems(config)
    if problems:
        # the fine-tune's wording, with bench-input's flag: "Fix: --set augment_on=auto"
        raise BenchError("; ".join(problems).replace("Fix: --config.", "Fix: --set "))
    return config


def stored_sizes(data_dir: str, config: Mapping, sizes: Mapping) -> dict:
    """Camera -> (height, width) its frames are stored at (the dataset's features.json), for the cameras the
    model resizes (``sizes``); a camera whose size features.json does not fix is left out."""
    from octo_dist.apps.benchinput import reader
    from octo_dist.apps.finetune import convertframes

    name = (config.get("dataset_kwargs") or {}).get("name") or ""
    version_dir = convertframes.dataset_version_dir(data_dir, name, "", error=BenchError)
    by_feature = convertframes.stored_image_sizes(version_dir)
    features = reader.image_features(config)
    return {
        camera: by_feature[features[camera]]
        for camera in sizes
        if features.get(camera) in by_feature
    }


def check_data(data_dir: str, config: Mapping) -> None:
    """The config's dataset is in ``data_dir`` (``<data_dir>/<name>/<version>/dataset_info.json``), else a
    BenchError saying what the directory holds."""
    from octo_dist.apps.finetune import convertframes

    convertframes.dataset_version_dir(
        data_dir,
        (config.get("dataset_kwargs") or {}).get("name") or "",
        "the data_dir the fine-tune reads (--config.dataset_kwargs.data_dir), and --set "
        "dataset_kwargs.name=NAME where the config names another dataset",
        error=BenchError,
    )


def main(args) -> int:
    """``octo-dist bench-input DATA_DIR [--config C] [--set F=V ...]``."""
    from octo_dist.apps.finetune import tfquiet

    # TensorFlow's C++ notes (cost estimates, CPU features) and AutoGraph's fallback lines bury the table.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tfquiet.quiet_autograph(os.environ)
    try:
        config = _config(args)
        chosen = _pin(args.cores)
        check_data(args.data_dir, config)
        sizes = image_sizes(config)
        from octo_dist.apps.benchinput import reader

        shape = vd.model_shape(args.model)
        gpu_rate, basis, how = vd.consumption(
            shape, reader.window_of(config), sizes, args.utilisation, args.step_rate
        )
    except (Refusal, ValueError) as e:
        print(f"octo-dist bench-input: error: {e}".replace("\n", " "), file=sys.stderr)
        return getattr(e, "exit_status", 2)
    return run(args, config, chosen, sizes, gpu_rate, basis, how, shape.name)


def run(args, config, chosen, sizes, gpu_rate, basis, how, model, out=print) -> int:
    from octo_dist.apps.benchinput import measure, reader

    src = measure.source(args.data_dir, config)
    stored = stored_sizes(args.data_dir, config, sizes)
    out(
        f"bench-input: {args.data_dir}, dataset {config['dataset_kwargs']['name']}, window "
        f"{reader.window_of(config)}, cameras "
        + ", ".join(f"{c} {h}x{w}" for c, (h, w) in sizes.items())
        + f"; batch {args.batch_size}; pinned to {len(chosen)} core(s) {chosen}; {args.rounds} interleaved "
        f"round(s) of {args.batches} batches; CPU time per sample (all threads)"
    )
    out(
        "frames: Octo's make_dataset_from_rlds + apply_trajectory_transforms"
        if src.octo
        else "frames: the minimal RLDS reader (octo not importable: its trajectory transforms not run)"
    )
    if stored:
        window = reader.window_of(config)
        shipped = sum(h * w * 3 for h, w in stored.values()) * window
        needed = sum(sizes[c][0] * sizes[c][1] * 3 for c in stored) * window
        out(
            "frames as stored: "
            + ", ".join(f"{c} {h}x{w}" for c, (h, w) in stored.items())
            + f" (the device-resize row sends them so, {shipped / 1e3:,.0f} kB of uint8 images a sample per "
            f"window to the device where the model's sizes are {needed / 1e3:,.0f} kB; the step resizes them)"
        )
    ratios = scaled_decode(src, stored, sizes, out)
    datasets = measure.pipelines(
        src, config, args.batch_size, args.shuffle_buffer, stored=stored, decode_ratio=ratios
    )
    held: list = []  # the iterators, torn down after the table (measure.rounds)
    times = measure.rounds(
        datasets,
        held=held,
        batch_size=args.batch_size,
        batches=args.batches,
        rounds=args.rounds,
        warmup=args.warmup,
        progress=lambda line: print(f"bench-input: {line}", file=sys.stderr, flush=True),
    )
    medians = measure.medians(times)
    out(how)
    for line in report(
        medians,
        measure.split(medians),
        gpu_rate=gpu_rate,
        basis=basis,
        model=model,
        cores_per_node=args.cores_per_node,
        gpus_per_node=args.gpus_per_node,
        why_no_fork=src.why_no_fork,
        spread=times,
        stored=stored,
        sizes=sizes,
    ):
        out(line)
    sys.stdout.flush()  # the table before the pipelines' teardown, piped or not
    held.clear()
    return 0


def scaled_decode(src, stored: Mapping, sizes: Mapping, out=print, count: int = 8) -> dict:
    """Camera -> the ratio (2, 4 or 8) libjpeg could decode its JPEGs at, for the cameras stored at least that many
    times the model's size (``decodescale.ratio_for``); for each, a line with what that decode changes in the
    pixels of ``count`` of its frames (:mod:`.decodescale`), so the opt-in row is read with its cost in pixels."""
    from octo_dist.apps.benchinput import decodescale

    ratios = {c: decodescale.ratio_for(stored[c], sizes[c]) for c in stored if c in sizes}
    ratios = {c: r for c, r in ratios.items() if r > 1}
    for camera, ratio in ratios.items():
        images = decodescale.encoded_frames(src.make(), camera, count)
        if not images or not images[0].startswith(b"\xff\xd8"):
            out(f"{camera}: its frames are not JPEGs; no reduced-scale decode")
            ratios = {c: r for c, r in ratios.items() if c != camera}
            continue
        differences = [decodescale.difference(x, ratio) for x in images]
        out(
            f"{camera}: stored at {ratio}x the model's size; {decodescale.words(differences)}: the device-resize "
            "row decodes in full (FrameTransforms.decode_ratio is an opt-in, its row beside it)"
        )
    return ratios


def main_argv(argv: Optional[Sequence[str]] = None) -> int:
    """``bench/input.py``'s entry: the same command without ``octo-dist``."""
    parser = argparse.ArgumentParser(prog="bench/input.py", description=DESCRIPTION)
    _arguments(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return args.func(args)
