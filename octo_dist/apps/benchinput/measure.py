"""CPU time per sample of input pipelines, measured side by side: the same data, interleaved rounds.

    pipelines = measure.pipelines("data", config, batch_size=64)   # name -> a tf.data dataset of batches
    times = measure.rounds(pipelines, batch_size=64, batches=5, rounds=3)   # name -> [CPU s per sample, ...]

The CPU time is the whole process's (every tf.data thread: ``time.process_time``), so it counts the cores a pipeline
used, whatever its parallelism. Pipelines run one at a time: a round takes ``batches`` batches from each in turn,
and the clock of each stops only once the process is idle again (its prefetch and shuffle buffers refilled, which
is work for those batches). Before the rounds, each pipeline is warmed up (shuffle buffer filled, graphs traced).

The pipelines (:func:`pipelines`), each a shuffle of frames then the frame transforms then ``batch``:
- ``rest``, ``decode``, ``resize``, ``augment``: octo-dist's frame transforms with the stages switched on one after
  another (:func:`stage_variants`), augmentation on the host; ``resize`` is "augmentation on the device" (the
  host decodes and batches), ``augment`` is "augmentation on the host". Their differences are the split.
- ``device-resize``: the host decodes at the stored size and batches; the step resizes and augments (what the
  train step does with ``frames.FrameTransforms.stored_size``).
- ``device-resize-scaled``: ``device-resize`` with the JPEGs of a camera stored at 2x, 4x or 8x the model's size
  decoded at that fraction by libjpeg (``frames.FrameTransforms.decode_ratio``, an opt-in: its pixels are not
  decode + lanczos3's, :mod:`.decodescale`).
- ``every-resize``: the same with every resize run, the no-op ones and the padding images' too (as the fork does).
- ``fork``: Octo's ``apply_frame_transforms``, where Octo is importable.
The frames come from Octo's ``make_dataset_from_rlds`` and ``apply_trajectory_transforms`` where Octo is importable,
else from :func:`reader.rlds_frames` (no trajectory transforms: said in the report).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from octo_dist.apps.benchinput import reader
from octo_dist.apps.finetune import frames, pipeline

STAGE_NAMES = ("rest", "decode", "resize", "augment")


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the frames come from: ``make()`` -> a fresh dataset of frames (encoded images); ``octo``: Octo's
    trajectory pipeline (else the minimal reader); ``fork_transforms``: Octo's frame transforms, or None."""

    make: Callable
    octo: bool
    fork_transforms: Optional[Callable]
    why_no_fork: str = ""


def source(data_dir: str, config: Mapping) -> Source:
    """Octo's trajectory pipeline on ``data_dir`` where Octo imports, else the minimal RLDS reader."""
    try:
        from octo.data.dataset import apply_frame_transforms
    except ImportError as e:
        return Source(
            make=lambda: reader.rlds_frames(data_dir, config),
            octo=False,
            fork_transforms=None,
            why_no_fork=f"octo not importable ({e})",
        )

    plain = {**config, "dataset_kwargs": {**config["dataset_kwargs"], "data_dir": data_dir}}

    def make():
        frames_ds = pipeline.octo_trajectories(plain).repeat().unbatch()
        frames_ds.is_flattened = (
            True  # dlimp maps frames, not trajectories (what its flatten() sets)
        )
        return frames_ds

    def fork(frames_ds):
        kwargs = plain.get("frame_transform_kwargs") or {}
        return apply_frame_transforms(frames_ds, **kwargs, train=True)

    return Source(make=make, octo=True, fork_transforms=fork)


def pipelines(
    src: Source,
    config: Mapping,
    batch_size: int,
    shuffle: int,
    seed: int = 0,
    stored: Optional[Mapping[str, tuple]] = None,
    decode_ratio: Optional[Mapping[str, int]] = None,
) -> dict:
    """Name -> a dataset of batches, for every pipeline the benchmark compares (see the module's docstring);
    ``stored``: camera -> the size its frames are stored at, for ``device-resize`` (the host decodes only);
    ``decode_ratio``: camera -> 2, 4 or 8, for ``device-resize-scaled`` (none where it is empty)."""
    import tensorflow as tf

    host = frames.FrameTransforms.from_config(
        {**config, "augment_on": "host"}, decoded_size=dict(stored or {})
    )
    variants = dict(stage_variants(host))
    variants["every-resize"] = dataclasses.replace(host, skip_same_size=False)
    if stored:
        variants["device-resize"] = dataclasses.replace(
            host, stored_size=dict(stored), augment=False
        )
        if decode_ratio:
            variants["device-resize-scaled"] = dataclasses.replace(
                variants["device-resize"], decode_ratio=dict(decode_ratio)
            )
    if src.fork_transforms is not None:
        variants["fork"] = src.fork_transforms
    out = {}
    for name, transform in variants.items():
        tf.random.set_seed(seed)  # each pipeline's augmentation draws from the same seed
        shuffled = src.make().shuffle(shuffle, seed=seed)
        shuffled.is_flattened = True
        out[name] = pipeline.batched(transform, shuffled, batch_size).prefetch(2)
    return out


def settle(step: float = 0.05, quiet: float = 0.1, limit: float = 30.0) -> None:
    """Wait until the process's threads are idle: less than ``quiet`` of a core used over ``step`` seconds."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        cpu = time.process_time()
        time.sleep(step)
        if time.process_time() - cpu < quiet * step:
            return


def rounds(
    datasets: Mapping[str, object],
    *,
    batch_size: int,
    batches: int,
    rounds: int,
    warmup: int = 2,
    progress: Callable[[str], None] = lambda line: None,
    held: Optional[list] = None,
) -> Dict[str, List[float]]:
    """Name -> CPU seconds per sample in each round (``batches`` batches per pipeline per round, interleaved).

    ``held``: a list the pipelines' iterators are appended to, so that their teardown comes when the caller drops
    them, after its report: tf.data cancelling a pipeline's threads and buffers took 5 s for the seven pipelines of a
    small run here, minutes beside the fork's, all of it between the last round and the table when it came on
    this function's return."""
    iterators = {name: ds.as_numpy_iterator() for name, ds in datasets.items()}
    if held is not None:
        held.append(iterators)
    for name, it in iterators.items():
        for _ in range(warmup):
            next(it)
        progress(f"warmed up {name}")
    out: Dict[str, List[float]] = {name: [] for name in iterators}
    for r in range(rounds):
        for name, it in iterators.items():
            settle()
            cpu = time.process_time()
            for _ in range(batches):
                next(it)
            settle()
            out[name].append((time.process_time() - cpu) / (batches * batch_size))
        progress(f"round {r + 1}/{rounds} done")
    return out


def medians(times: Mapping[str, List[float]]) -> Dict[str, float]:
    """Name -> the median over rounds of CPU seconds per sample."""
    return {name: statistics.median(values) for name, values in times.items()}


def split(median: Mapping[str, float]) -> Dict[str, float]:
    """Stage -> CPU seconds per sample it adds: the differences of the cumulative pipelines' medians (rest, then
    +decode, +resize, +augment), so the stages sum to the whole (``augment``) exactly; a stage cheaper than the
    noise between rounds may come out slightly negative."""
    out, before = {}, 0.0
    for name in STAGE_NAMES:
        out[name] = median[name] - before
        before = median[name]
    return out


def stage_variants(
    transforms: frames.FrameTransforms,
) -> Sequence[Tuple[str, frames.FrameTransforms]]:
    """The cumulative stages the input benchmark times, each with the ones before it: ``rest`` (read and batch,
    images left encoded), ``decode`` (decoded, cropped or padded to the target size), ``resize``, ``augment``
    (the whole transform; augmentation only where ``transforms.augment``)."""
    return tuple(
        (name, dataclasses.replace(transforms, stages=frozenset(frames.STAGES[:i])))
        for i, name in enumerate(("rest", *frames.STAGES))
    )
