"""``octo-dist convert-frames``: a copy of an RLDS dataset with its camera frames stored at the model's sizes.

    octo-dist convert-frames data/ data-256/ --config=finetune_config.py      # sizes from the config
    octo-dist convert-frames data/ data-256/ --name bridge_dataset --size image_0=256x256 --size image_1=128

Then train on the copy (``--config.dataset_kwargs.data_dir=data-256``): its frames need no resize on the host, every
step of training long. The copy has the source's layout (``<name>/<version>/``, the same splits, shards, episodes
and fields); only the camera images of the named features change: each one not already at its size is decoded,
resized (the config's ``resize_method``, lanczos3 by default: the pixels the fine-tune's own resize makes) and
re-encoded in its feature's format (JPEG at ``--quality``, 95 by default: tensorflow_datasets' own and dlimp's
``read_resize_encode_image``'s). An image already at its size is copied byte for byte. The source is only read:
a destination equal to it or inside it, or one that exists and is not empty, is refused before anything is written.

Works on the raw records (``tf.train.Example``: the ``steps/observation/<feature>`` byte lists), so whatever else a
dataset holds is copied unchanged; ``features.json`` gets the new shapes and ``dataset_info.json`` the new sizes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Mapping, Tuple

from octo_dist.apps.finetune import frames
from octo_dist.problems import Problem, Refusal

DEFAULT_QUALITY = 95
PREFIX = "steps/observation/"  # a step's camera image in an RLDS record: steps/observation/image_0
# A tensorflow_datasets name or version: "bridge_dataset", "1.0.0"; never "..", "a/b" or "".
DATASET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
MAX_SIDE = 4096  # pixels: beyond any model's input (Octo's are 64-256); JPEG itself stops at 65,535
SIZE = re.compile(r"^([A-Za-z0-9_]+)=(\d+)(?:x(\d+))?$")  # "image_0=256x256", "wrist_image=128"


class ConvertError(Refusal):
    """What convert-frames refuses before writing anything (exit 2)."""


def parse_size(value: str) -> Tuple[str, Tuple[int, int]]:
    """``"image_0=256x192"`` -> ``("image_0", (256, 192))`` (height x width); ``"wrist=128"`` -> square."""
    m = SIZE.match(value)
    sides = [int(x) for x in m.group(2, 3) if x] if m else []
    if not m or not all(1 <= side <= MAX_SIDE for side in sides):
        raise ConvertError(
            f"--size {value}",
            f"FEATURE=HEIGHTxWIDTH or FEATURE=SIDE, each side 1 to {MAX_SIDE} pixels",
            "--size image_0=256x256",
        )
    h = int(m.group(2))
    return m.group(1), (h, int(m.group(3) or h))


def sizes_from_config(config: Mapping) -> dict:
    """Feature name -> (height, width) from a fine-tune config: ``image_obs_keys`` maps cameras to features,
    ``frame_transform_kwargs.resize_size`` cameras to sizes. ``{"image_0": (256, 256), "wrist_image": (128, 128)}``."""
    keys = (config.get("dataset_kwargs") or {}).get("image_obs_keys") or {}
    transforms = frames.FrameTransforms.for_sizes(config)
    out = {}
    for camera, feature in keys.items():
        size = transforms.size_of(camera)
        if feature is not None and size is not None:
            out[feature] = size
    return out


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def check_paths(src: Path, dst: Path, name: str) -> Path:
    """The source version directory (``src/name/<latest version>``); a ConvertError for a destination that would
    write into the source or over something."""
    src, dst = src.resolve(), dst.resolve()
    if _inside(dst, src):
        raise ConvertError(
            f"destination {dst} is the source {src} or inside it",
            "a new directory outside the source (the source is never written)",
            f"octo-dist convert-frames {src} {src.parent / (src.name + '-converted')} ...",
        )
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ConvertError(
            f"destination {dst} already exists and is not empty",
            "a new or empty directory",
            f"another destination, or rm -r {dst} if it is an old copy",
        )
    return dataset_version_dir(
        src,
        name,
        "the data_dir the fine-tune reads (--config.dataset_kwargs.data_dir), and --name or the config's name",
        error=ConvertError,
    )


def dataset_version_dir(data_dir: Path, name: str, fix: str, error=Refusal) -> Path:
    """``data_dir/name/<version>`` with a ``dataset_info.json`` (the newest version, or the one ``name`` names:
    ``"bridge_dataset:1.0.0"``), as tensorflow_datasets reads it; ``error`` (found, expected, ``fix``) otherwise.
    ``name`` is a dataset's name, never a path (``"../other"`` is refused: it would leave the data dir)."""
    base, _, version = name.partition(":")
    if not DATASET_NAME.match(base) or (version and not DATASET_NAME.match(version)):
        raise error(
            f"dataset name {name!r}",
            "a tensorflow_datasets name (letters, digits, _ and -; optionally :VERSION), not a path",
            "--name bridge_dataset",
        )
    data_dir = Path(data_dir).resolve()
    versions = sorted(
        (p for p in (data_dir / base).glob(version or "*") if (p / "dataset_info.json").is_file()),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name.split(".")],
    )
    if not versions:
        found = (
            sorted(p.name for p in data_dir.iterdir()) if data_dir.is_dir() else "no such directory"
        )
        raise error(
            f"no RLDS dataset {name!r} in {data_dir} (found: {found})",
            f"{data_dir}/{base}/<version>/dataset_info.json (a tensorflow_datasets data_dir)",
            fix,
        )
    return versions[-1]


def _set_shapes(features: dict, sizes: Mapping[str, Tuple[int, int]]) -> None:
    """In features.json's tree, the image features named in ``sizes`` get their new size (height, width)."""
    for key, value in features.items():
        if not isinstance(value, dict):
            continue
        image = value.get("image")
        if key in sizes and isinstance(image, dict) and "shape" in image:
            dims = image["shape"]["dimensions"]
            image["shape"]["dimensions"] = [str(sizes[key][0]), str(sizes[key][1]), *dims[2:]]
        else:
            _set_shapes(value, sizes)


def stored_image_sizes(version_dir: Path) -> dict:
    """Image feature -> (height, width) its frames are stored at, from ``features.json`` (``{"image_0": (256,
    256)}``); a feature of unknown or varying size (``"dimensions": ["-1", "-1", "3"]``) is left out."""
    out = {}

    def walk(tree):
        for key, value in tree.items():
            if not isinstance(value, dict):
                continue
            image = value.get("image")
            if isinstance(image, dict):
                dims = (image.get("shape") or {}).get("dimensions") or []
                if len(dims) >= 2 and all(str(d).isdigit() and int(d) > 0 for d in dims[:2]):
                    out[key] = (int(dims[0]), int(dims[1]))
            else:
                walk(value)

    walk(json.loads((Path(version_dir) / "features.json").read_text()))
    return out


def _image_formats(features: dict, out: dict) -> dict:
    for key, value in features.items():
        if isinstance(value, dict):
            if isinstance(value.get("image"), dict):
                out[key] = value["image"].get("encodingFormat") or "png"
            else:
                _image_formats(value, out)
    return out


def _converter(size: Tuple[int, int], method: str, encoding: str, quality: int):
    import tensorflow as tf

    @tf.function
    def convert(encoded):
        def one(x):
            image = tf.io.decode_image(x, channels=3, expand_animations=False, dtype=tf.uint8)
            image = frames.resize_image(image, size, method)
            if encoding == "jpeg":
                return tf.io.encode_jpeg(image, quality=quality)
            return tf.io.encode_png(image)

        return tf.map_fn(one, encoded, fn_output_signature=tf.string)

    def shape(x):
        # A JPEG's header says its size (no decode); other formats are decoded.
        if encoding == "jpeg":
            return tf.io.extract_jpeg_shape(x)
        return tf.shape(tf.io.decode_image(x, expand_animations=False))

    @tf.function
    def sizes(encoded):
        return tf.map_fn(shape, encoded, fn_output_signature=tf.int32)

    return convert, sizes


def convert_record(raw: bytes, converters: Mapping) -> Tuple[bytes, int, int]:
    """One serialized episode with its named cameras' images at their sizes: (bytes, images resized, copied)."""
    import tensorflow as tf

    example = tf.train.Example.FromString(raw)
    resized = copied = 0
    for feature, (convert, sizes, size) in converters.items():
        if PREFIX + feature not in example.features.feature:
            continue
        values = example.features.feature[PREFIX + feature].bytes_list.value
        encoded = list(values)
        if not encoded:
            continue
        shapes = sizes(tf.constant(encoded)).numpy()[:, :2]
        todo = [i for i, s in enumerate(shapes) if tuple(s) != tuple(size)]
        copied += len(encoded) - len(todo)
        if todo:
            out = convert(tf.constant([encoded[i] for i in todo])).numpy()
            for i, data in zip(todo, out):
                encoded[i] = bytes(data)
            resized += len(todo)
            del values[:]
            values.extend(encoded)
    return example.SerializeToString(), resized, copied


def convert(
    src: Path,
    dst: Path,
    name: str,
    sizes: Mapping[str, Tuple[int, int]],
    *,
    quality: int = DEFAULT_QUALITY,
    method: str = "lanczos3",
    log=print,
) -> Path:
    """Write the converted copy of ``src/name/<version>`` to ``dst/name/<version>``; returns that directory."""
    version_dir = check_paths(src, dst, name)
    features = json.loads((version_dir / "features.json").read_text())
    formats = _image_formats(features, {})
    unknown = sorted(set(sizes) - set(formats))
    if unknown or not sizes:
        raise ConvertError(
            f"camera features {unknown or '(none named)'} to resize in {version_dir}",
            f"image features among {sorted(formats)}",
            "--size FEATURE=HEIGHTxWIDTH with one of those, or a config whose image_obs_keys names them",
        )
    # TensorFlow is imported (by _converter) after every check: a refusal is one line, without its start-up notes
    _set_shapes(features, sizes)
    converters = {
        f: (*_converter(tuple(s), method, formats[f], quality), tuple(s)) for f, s in sizes.items()
    }
    out = Path(dst).resolve() / name.partition(":")[0] / version_dir.name
    partial = out.with_name(out.name + ".incomplete")
    made = [d for d in (partial, *partial.parents) if not d.exists()]
    partial.mkdir(parents=True)
    try:
        with _interruptible() as interrupted:
            _write_copy(version_dir, partial, converters, features, log, interrupted)
    except BaseException:
        # Ctrl-C, a corrupt record, a full disk: nothing that looks like a copy stays behind, and nothing that was
        # there before is touched (only the directories made here, the deepest first).
        shutil.rmtree(partial, ignore_errors=True)
        for d in made[1:]:
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
    partial.rename(out)
    return out


@contextlib.contextmanager
def _interruptible():
    """While the copy is written, Ctrl-C (SIGINT) only sets the event it yields; the writer checks it between
    records and stops with KeyboardInterrupt. Python's own KeyboardInterrupt can surface inside TensorFlow's
    callbacks, which swallow it ("Exception ignored in ...") and let the copy run on to the end."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.set())
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        raise KeyboardInterrupt


def _write_copy(
    version_dir: Path, partial: Path, converters: Mapping, features: dict, log, interrupted
) -> None:
    """Every file of ``version_dir`` into ``partial``: the TFRecords converted, the rest copied; stops with
    KeyboardInterrupt once ``interrupted`` is set."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    for path in sorted(version_dir.iterdir()):
        if path.name in ("features.json", "dataset_info.json") or not path.is_file():
            continue
        if ".tfrecord" not in path.name:
            shutil.copy2(path, partial / path.name)
            continue
        resized = copied = 0
        try:
            with tf.io.TFRecordWriter(str(partial / path.name)) as writer:
                for raw in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
                    if interrupted.is_set():
                        raise KeyboardInterrupt
                    record, r, c = convert_record(raw, converters)
                    writer.write(record)
                    resized, copied = resized + r, copied + c
        except (tf.errors.OpError, DecodeError) as e:
            found = getattr(e, "message", None) or str(e) or type(e).__name__
            raise Problem(
                f"{path}: not a readable TFRecord of RLDS episodes ({found.splitlines()[0]})",
                "the shards tensorflow_datasets wrote, whole",
                "download or build that dataset again; nothing was written",
            ) from None
        log(
            f"convert-frames: {path.name}: {resized} image(s) resized, {copied} already at their size"
        )
    (partial / "features.json").write_text(json.dumps(features, indent=4))
    info = json.loads((version_dir / "dataset_info.json").read_text())
    name = version_dir.parent.name
    for split in info.get("splits", []):
        files = partial.glob(f"{name}-{split.get('name')}.tfrecord*")
        split["numBytes"] = str(sum(f.stat().st_size for f in files))
    (partial / "dataset_info.json").write_text(json.dumps(info, indent=2))


# What `--help` says: the docstring's paragraph without its markup.
DESCRIPTION = (
    "Copy an RLDS dataset with its camera frames stored at the model's sizes, then train on the copy "
    "(--config.dataset_kwargs.data_dir=DST_DATA_DIR): its frames need no resize on the host, every step of training "
    "long. The copy has the source's layout (<name>/<version>/, the same splits, shards, episodes and fields); "
    "only the camera images of the named features change: each one not already at its size is decoded, resized "
    "(the config's resize_method, lanczos3 by default: the pixels the fine-tune's own resize makes) and re-encoded "
    "in its feature's format (JPEG at --quality, 95 by default). An image already at its size is copied byte for "
    "byte. The source is only read: a destination equal to it or inside it, or one that exists and is not empty, "
    "is refused before anything is written; an interrupted copy (Ctrl-C, a corrupt shard) is removed."
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert-frames",
        help="copy an RLDS dataset with its camera frames stored at the model's sizes (no resize when training)",
        description=DESCRIPTION,
    )
    p.add_argument("src", metavar="SRC_DATA_DIR", help="the tensorflow_datasets data_dir to read")
    p.add_argument(
        "dst", metavar="DST_DATA_DIR", help="where to write the copy (new or empty; outside SRC)"
    )
    p.add_argument(
        "--config",
        help="a fine-tune config (finetune_config.py:full,multimodal): the dataset name, the cameras' sizes "
        "(image_obs_keys, frame_transform_kwargs.resize_size) and resize_method",
    )
    p.add_argument("--name", help="the dataset's name (default: the config's dataset_kwargs.name)")
    p.add_argument(
        "--size",
        action="append",
        default=[],
        metavar="FEATURE=HxW",
        help="an image feature's size (image_0=256x256); repeat per camera; over the config's",
    )
    p.add_argument(
        "--quality",
        type=int,
        default=DEFAULT_QUALITY,
        help="JPEG quality of re-encoded frames (default: %(default)s)",
    )
    p.set_defaults(func=main)
    return p


def _settings(args) -> Tuple[str, dict, str]:
    from octo_dist.apps.finetune.configfile import load_config

    config = load_config(args.config).to_dict() if args.config else {}
    sizes = sizes_from_config(config) if config else {}
    sizes.update(parse_size(v) for v in args.size)
    name = args.name or (config.get("dataset_kwargs") or {}).get("name")
    if not name:
        raise ConvertError(
            "no dataset name",
            "--name or a --config naming dataset_kwargs.name",
            "--name bridge_dataset",
        )
    if not 1 <= args.quality <= 100:
        raise ConvertError(f"--quality {args.quality}", "1 to 100", f"--quality {DEFAULT_QUALITY}")
    method = config.get("resize_method", "lanczos3")
    return name, sizes, method


def main(args) -> int:
    """``octo-dist convert-frames SRC DST [--config C] [--size F=HxW ...]``."""
    os.environ.setdefault(
        "TF_CPP_MIN_LOG_LEVEL", "2"
    )  # TensorFlow's C++ start-up notes (CUDA plugins, CPU flags)
    try:
        try:
            name, sizes, method = _settings(args)
        except (
            ValueError
        ) as e:  # a config value FrameTransforms does not know (resize_method="bicubic")
            raise ConvertError(f"--config {args.config}: {e}") from None
        out = convert(
            Path(args.src), Path(args.dst), name, sizes, quality=args.quality, method=method
        )
    except Problem as e:
        print(f"octo-dist convert-frames: error: {e}".replace("\n", " "), file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        print(
            f"octo-dist convert-frames: interrupted; no copy left at {args.dst} (run it again to convert)",
            file=sys.stderr,
        )
        return 130
    print(
        f"convert-frames: wrote {out} (train on it with --config.dataset_kwargs.data_dir={args.dst})"
    )
    return 0
