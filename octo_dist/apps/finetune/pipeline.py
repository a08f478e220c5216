"""The fine-tune's data: this process's share of each global batch, from Octo's single-dataset pipeline.

    source = pipeline.OctoData(job_config, text_processor, local_batch_size=4, process_index=0, process_count=2)
    source.batch_spec()        # the batch's shapes before any batch exists (the step compiles from them)
    source.example             # the first batch (made in a thread while the model loads and compiles)
    source.batches(0)          # training's batches: that first batch, then the same stream

``train.fit`` reads it through its data interface (``batches``); :mod:`.app` builds it after the model config (the
text processor encodes the instructions). TensorFlow, dlimp and Octo are imported only inside the functions that
use them: ``octo-dist finetune --help`` and the config checks run without them.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Callable, Iterator, Mapping, Optional, Tuple

from octo_dist.apps.finetune import config, frames

log = logging.getLogger(__name__)
# The frame transform kwargs frames.FrameTransforms takes; any other (depth_resize_size, image_dropout_prob > 0) is
# Octo's.
HANDLED_KWARGS = ("resize_size", "image_augment_kwargs", "num_parallel_calls")


def data_seed(seed: int, process_index: int, start_step: int) -> int:
    """TensorFlow's seed for one process's data stream from ``start_step`` on.

    Different per process (each shuffles and augments its own stream: together they draw ``batch_size`` examples
    per step, as one process would) and per resume point (a resumed run does not replay the first batches; tf.data
    shuffle buffers are not checkpointed, so a resumed run's batches are fresh draws, not the uninterrupted run's).
    """
    import numpy as np

    return int(np.random.SeedSequence([seed, process_index, start_step]).generate_state(1)[0] >> 1)


def octo_trajectories(plain_config: Mapping):
    """The fork's trajectories for a config (``make_dataset_from_rlds``, then ``apply_trajectory_transforms``, as
    ``make_single_dataset`` calls them), ``dataset_statistics`` attached. Needs Octo."""
    from octo.data.dataset import apply_trajectory_transforms, make_dataset_from_rlds

    c = plain_config
    dataset, statistics = make_dataset_from_rlds(**c["dataset_kwargs"], train=True)
    dataset = apply_trajectory_transforms(dataset, **c.get("traj_transform_kwargs", {}), train=True)
    # make_single_dataset's: "seems to reduce memory usage without affecting speed" (a tf.data option)
    dataset = dataset.with_ram_budget(1)
    dataset.dataset_statistics = statistics
    return dataset


def stored_sizes(plain_config: Mapping) -> dict:
    """Camera -> (height, width) its frames are stored at, from the dataset's ``features.json``
    (``<data_dir>/<name>/<version>/``, as tensorflow_datasets reads it): ``{"primary": (256, 256)}``. ``{}`` where
    that file cannot be read here (a ``gs://`` data_dir, a dataset the checks have not seen): the host then
    resizes, as the fork does."""
    from octo_dist.apps.finetune import convertframes
    from octo_dist.problems import Problem

    kwargs = plain_config.get("dataset_kwargs") or {}
    data_dir, name = str(kwargs.get("data_dir") or ""), str(kwargs.get("name") or "")
    if not data_dir or "://" in data_dir:
        return {}
    try:
        version_dir = convertframes.dataset_version_dir(data_dir, name, "")
        by_feature = convertframes.stored_image_sizes(version_dir)
    except (Problem, OSError, ValueError) as e:
        log.info("frames resized on the host: their stored sizes are not readable (%s)", e)
        return {}
    return stored_camera_sizes(plain_config, by_feature)


def resized_on_device(plain_config: Mapping) -> dict:
    """Camera -> the size its frames are stored at, for the cameras the train step resizes
    (:func:`device_resized` of :func:`stored_sizes`): the host decodes them and leaves the resize to the
    device. ``plain_config``'s ``augment_on`` resolved for the rank (``config.for_platform``)."""
    if config.augment_on(plain_config) != "device":
        return {}  # read no file where the host resizes anyway
    return device_resized(plain_config, stored_sizes(plain_config))


def frame_transform(
    plain_config: Mapping,
    element_spec: Optional[Mapping] = None,
    stored: Optional[Mapping] = None,
) -> Callable:
    """The frame transforms for a config: a dataset of frames -> the same frames decoded, resized and augmented.

    octo-dist's own (:class:`frames.FrameTransforms`: the fork's pixels without the resizes that change nothing;
    no augmentation with ``augment_on = "device"``, and the cameras of ``stored`` (:func:`resized_on_device`)
    left at their stored size for the step to resize) wherever they do what the config asks; else the fork's
    ``apply_frame_transforms`` (depth images, image dropout), without its augmentation when the step augments.
    """
    # Decided once, as the train step decides it (config.for_platform resolved "auto" on this rank): the host must
    # not augment what the step augments again, nor leave unaugmented what it does not.
    where = config.augment_on(plain_config)
    if where not in frames.AUGMENT_ON:
        raise ValueError(
            f"augment_on {where!r} reached the data pipeline; expected one of {frames.AUGMENT_ON} "
            "(config.for_platform resolves it on the rank)"
        )
    plain_config = {**plain_config, "augment_on": where}
    kwargs = dict(plain_config.get("frame_transform_kwargs") or {})
    missing = forks_transforms_for(plain_config, element_spec)
    if not missing:
        # the stored sizes also where the host resizes: its resize's weights made once per camera
        return frames.FrameTransforms.from_config(
            plain_config, stored_size=dict(stored or {}), decoded_size=stored_sizes(plain_config)
        )
    if stored:
        # resized_on_device read the config alone; a dataset whose frames hold depth images the config's
        # depth_obs_keys do not name would make the plan line say what the pipeline does not do.
        raise ValueError(
            f"frames left at their stored size for the device ({', '.join(sorted(stored))}) but the fork's frame "
            f"transforms run for {', '.join(missing)}; expected the host to resize them, as resized_on_device "
            "decides for such frames (--config.augment_on=host resizes every camera on the host)"
        )
    from octo.data.dataset import apply_frame_transforms

    log.info("frame transforms: the fork's apply_frame_transforms (for %s)", ", ".join(missing))
    if where == "device":
        kwargs["image_augment_kwargs"] = {}
    return functools.partial(apply_frame_transforms, **kwargs, train=True)


def batched(transform: Callable, frames_ds, batch_size: int):
    """``frames_ds`` through the frame transforms, in batches of ``batch_size`` (``drop_remainder``): octo-dist's
    decode the cameras left at their stored size after batching (``frames.FrameTransforms.batched``); the fork's
    transforms map frame by frame."""
    if isinstance(transform, frames.FrameTransforms):
        return transform.batched(frames_ds, batch_size)
    return transform(frames_ds).batch(batch_size, drop_remainder=True)


def process_batch(batch: dict, text_processor) -> dict:
    """The fork's ``process_batch``: encode (or drop) the language instruction, drop the dataset name (strings)."""
    from octo.utils.train_utils import process_text

    batch = process_text(batch, text_processor)
    del batch["dataset_name"]
    return batch


class OctoData:
    """This process's slice of the global batch, from the fork's single-dataset pipeline (``train.fit``'s data
    interface).

    The pipeline is built once per rank, seeded for the step training starts at, and its first batch is both the
    example the parameters are initialised on and training's first batch: start-up reads the data once, not three
    times (statistics, example, training), and fills the shuffle buffer once.

    It is ``make_single_dataset``'s (``make_dataset_from_rlds``, then ``apply_trajectory_transforms``) with the frame
    transforms (image decoding, resizing, augmentation: :func:`frame_transform`) applied after the shuffle, as
    Octo's own ``make_interleaved_dataset`` orders them, not before it. The shuffle buffer then holds encoded frames:
    the fork's decodes and augments every frame that fills it (10,000 with the default config; 5.9 GB and most of
    its start-up on the debug dataset) although a step takes 8 of them. Each batch's frames are still decoded and
    augmented once, with their own random augmentation, so the batches are drawn from the same distribution.

    The first batch is made in a thread from construction on: the pretrained model is read and the step compiled
    meanwhile, from the batch's shapes (:meth:`batch_spec`). ``example`` waits for it.

    Args:
      start_step: where training will start (``job_config.training.resume.start``, decided before start-up); its
        shuffle and augmentation seeds follow it.
      build: makes the dataset of trajectories, ``dataset_statistics`` attached (default: Octo's, for the job
        config). ``transform``: the frame transforms, over a dataset of frames (default: :func:`frame_transform` for
        the config: octo-dist's, or the fork's for what they do not do). ``process``: one batch -> what the
        model reads (default: Octo's ``process_batch``). ``stored``: camera -> the size its frames are stored at, for
        the cameras the step resizes (:func:`resized_on_device`, decided once for the plan and the step); the
        default transforms leave those frames at that size (``device_sizes`` then names the model's sizes).
    """

    def __init__(
        self,
        job_config: config.FinetuneJob,
        text_processor,
        local_batch_size: int,
        process_index: int,
        process_count: int,
        start_step: int = 0,
        build=None,
        process=None,
        transform=None,
        stored: Optional[Mapping] = None,
    ):
        from octo_dist.runtime import startclock

        self.config = job_config
        self.text_processor = text_processor
        self.local_batch_size = local_batch_size
        self.process_index = process_index
        self.builds = 0  # how many times the pipeline was built on this rank (tests, logs)
        self._build_fn = build or self._make_trajectories
        self._process = process or functools.partial(process_batch, text_processor=text_processor)
        # Octo computes the action/proprio statistics on first use and caches them beside the data (or in
        # ~/.cache/octo): rank 0 builds first, then the rest read the cache instead of N ranks writing one file.
        self.start_step = start_step
        # The others wait on the coordination service, not in a collective: a collective's set-up gives up after
        # 30 s (gloo) while a statistics pass takes minutes; rank 0's failure ends them with its error.
        from octo_dist.runtime import rankwait

        dataset = rankwait.rank_zero_first(
            lambda: self._seeded_build(start_step),
            "the dataset (on a first run it computes and caches the dataset statistics)",
            process_index,
            process_count,
        )
        self.dataset_statistics = dataset.dataset_statistics
        self._frames = self._flattened(dataset)  # examples in file order (batch_spec reads one)
        self._transform = transform or frame_transform(
            self.config.plain_config(), self._frames.element_spec, stored
        )
        # camera -> the model's size, for the cameras whose frames leave the host at their stored size: the step
        # resizes them (stepimages.step_augmenter), and the model's shapes are the resized ones (model.compile_ahead).
        self.device_sizes = dict(getattr(self._transform, "device_sizes", None) or {})
        self._pipeline = self._pipeline_of(dataset, start_step)
        self._stream = self._batches_of(self._pipeline)
        # Training's first batch, kept for the parameters' initialisation; made beside the model's load and
        # compilation. The thread touches TensorFlow only: no JAX collective, so ranks cannot cross them.
        self._first = startclock.Background("first_batch", next, self._stream)

    @property
    def example(self) -> dict:
        """The first batch (waits for the shuffle buffer to fill)."""
        return self._first.result()

    def batch_spec(self) -> dict:
        """This process's batch as ``jax.ShapeDtypeStruct`` leaves, known before the first batch is: tf.data's
        element spec, through ``process`` (on a batch of zeros and empty strings). The batch as it leaves the host:
        the cameras of ``device_sizes`` at their stored size (the model's shapes are the step's resize of it,
        ``augment.output_spec``). Where tf.data does not know a
        dimension (decoded images' channels: ``(1, 256, 256, None)``), from one example read ahead of the shuffle
        buffer (one trajectory decoded)."""
        import jax
        import numpy as np
        import tensorflow as tf

        spec = self._pipeline.element_spec
        leaves = tf.nest.flatten(spec)
        if any(None in s.shape[1:] for s in leaves):
            one = next(iter(batched(self._transform, self._frames.take(1), 1).as_numpy_iterator()))
            shapes = [np.shape(x)[1:] for x in tf.nest.flatten(one)]
        else:
            shapes = [tuple(s.shape[1:]) for s in leaves]

        def zeros(s, shape):
            shape = (self.local_batch_size, *shape)
            if s.dtype == tf.string:
                return np.full(shape, b"", dtype=object)
            return np.zeros(shape, s.dtype.as_numpy_dtype)

        fake = tf.nest.pack_sequence_as(spec, [zeros(s, sh) for s, sh in zip(leaves, shapes)])
        return jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), self._process(fake)
        )

    def _make_trajectories(self):
        return octo_trajectories(self.config.plain_config())

    @staticmethod
    def _flattened(dataset):
        frames = dataset.unbatch()
        # dlimp's frame_map maps frames of trajectories unless told the elements are frames (what its flatten() sets)
        frames.is_flattened = True
        return frames

    def _seeded_build(self, start_step: int):
        import tensorflow as tf

        # Set before the pipeline is built: tf.data fixes its file-shuffle and augmentation seeds then.
        tf.random.set_seed(data_seed(self.config.config.seed, self.process_index, start_step))
        self.builds += 1
        with warnings.catch_warnings():
            # "Seed ... from outer graph might be getting used by function Dataset_map_aug_and_dropout": it is, on
            # purpose (Octo's augmentation draws from the global seed set above).
            warnings.filterwarnings(
                "ignore", message="Seed .* from outer graph", category=UserWarning
            )
            return self._build_fn()

    def _pipeline_of(self, dataset, start_step: int):
        import tensorflow as tf

        seed = data_seed(self.config.config.seed, self.process_index, start_step)
        # dlimp builds its datasets with ``deterministic = False``: parallel reads and maps may then hand elements
        # over in any order, and two runs with the same seeds drew different batches (losses 14.9366 vs 14.8042 at
        # step 0, 2 runs of 7). Deterministic order costs some throughput; reproducible runs and resumes need it.
        options = tf.data.Options()
        options.deterministic = True
        absl_log = logging.getLogger("absl")
        level = absl_log.level
        absl_log.setLevel(
            logging.ERROR
        )  # "Changing the value of option deterministic from False to True"
        try:
            dataset = dataset.with_options(options)
        finally:
            absl_log.setLevel(level)
        # prefetch: tf.data's threads make the next batches while the step runs (dlimp's ``iterator()`` does the same).
        # drop_remainder: the stream repeats forever, so no batch is short; the batch axis is then known up front.
        shuffled = self._flattened(dataset.repeat()).shuffle(
            self.config.config.shuffle_buffer_size, seed=seed
        )
        shuffled.is_flattened = True
        return batched(self._transform, shuffled, self.local_batch_size).prefetch(tf.data.AUTOTUNE)

    def _batches_of(self, pipeline) -> Iterator[dict]:
        for batch in pipeline.as_numpy_iterator():
            yield self._process(batch)

    def batches(self, start_step: int = 0) -> Iterator[dict]:
        """Training's batches from ``start_step``: the example batch first, then the same stream."""
        if start_step != self.start_step:
            # Both come from the one resume decision (config.parse): a difference is a bug, not a case to handle.
            raise RuntimeError(
                f"OctoData.batches({start_step}) for a pipeline built for step {self.start_step}; expected the "
                f"step decided before start-up"
            )
        stream, self._stream = self._stream, None
        if stream is None:
            raise RuntimeError(
                "OctoData.batches was called twice; expected one training stream per process"
            )
        yield self.example
        yield from stream


def unsupported(frame_transform_kwargs: Mapping, element_spec: Optional[Mapping] = None) -> list:
    """Why :class:`frames.FrameTransforms` cannot stand in for Octo's ``apply_frame_transforms`` here ([] when it can):
    ``{"image_dropout_prob": 0.5}`` -> ``["image_dropout_prob=0.5 (image dropout)"]``."""
    out = []
    for key, value in frame_transform_kwargs.items():
        if key in HANDLED_KWARGS:
            continue
        if key == "image_dropout_prob" and not value:
            # Octo's dropout at 0 keeps every image: rands > 0 for uniform draws in [0, 1) fails only on an exact 0.
            continue
        if key in ("image_dropout_keep_key", "depth_resize_size") and not value:
            continue
        out.append(f"{key}={value!r}")
    for part in ("observation", "task"):
        keys = (element_spec or {}).get(part, {})
        out += [f"{part}.{k} (depth images)" for k in keys if k.startswith("depth_")]
    return out


def depth_images(config: Mapping) -> list:
    """The depth images Octo's ``make_dataset_from_rlds`` makes for ``config``, before any data is read: one per
    camera of ``dataset_kwargs.depth_obs_keys``, a camera without a feature included (its depth images are
    padding): ``{"primary": "depth_0", "wrist": None}`` -> ``["observation.depth_primary (depth images)",
    "observation.depth_wrist (depth images)"]``."""
    keys = (config.get("dataset_kwargs") or {}).get("depth_obs_keys") or {}
    return [f"observation.depth_{name} (depth images)" for name in sorted(keys)]


def forks_transforms_for(config: Mapping, element_spec: Optional[Mapping] = None) -> list:
    """Why the fine-tune runs the fork's ``apply_frame_transforms`` for ``config`` instead of
    :class:`frames.FrameTransforms` ([] where these do what it asks): its ``frame_transform_kwargs``
    (:func:`unsupported`), the depth images its ``depth_obs_keys`` make (:func:`depth_images`) and, once the
    dataset exists, those of ``element_spec``. The one decision the plan line, the pipeline and the train step
    follow: the fork's transforms resize on the host, so no camera is left to the device where this is not []."""
    out = unsupported(config.get("frame_transform_kwargs") or {}, element_spec)
    return out + [d for d in depth_images(config) if d not in out]


def device_resized(config: Mapping, stored: Mapping[str, Tuple[int, int]]) -> dict:
    """Camera -> the size its frames are stored at, for the cameras the train step resizes to the model's size.

    ``stored``: camera -> (height, width) from the dataset's features.json (:func:`stored_camera_sizes`). A camera
    is resized on the device where the device augments (``config["augment_on"] == "device"``, resolved), the config
    gives it a model size (``resize_size``) and its stored size differs from it; the frame transforms are this
    module's (:func:`forks_transforms_for` is empty). Any other camera is left out: the host resizes it as before, or,
    stored at the model's size, nothing resizes it at all. ``{"primary": (256, 256), "wrist": (256, 256)}`` with
    resize sizes 256x256 and 128x128 -> ``{"wrist": (256, 256)}``."""
    if config.get("augment_on") != "device":
        return {}
    if forks_transforms_for(config):
        return {}  # the fork's apply_frame_transforms resizes on the host
    sizes = frames.FrameTransforms.for_sizes(config)
    out = {}
    for name, size in stored.items():
        size = (int(size[0]), int(size[1]))
        if sizes.size_of(name) not in (None, size):
            out[name] = size
    return out


def stored_camera_sizes(config: Mapping, by_feature: Mapping[str, Tuple[int, int]]) -> dict:
    """Camera -> its frames' stored size, from features.json's sizes by feature (``{"image_0": (256, 256)}``) and
    the config's ``dataset_kwargs.image_obs_keys`` (``{"primary": "image_0", "wrist": None}`` -> ``{"primary":
    (256, 256)}``); a camera without a feature, or whose feature has no fixed size, is left out."""
    keys = (config.get("dataset_kwargs") or {}).get("image_obs_keys") or {}
    return {name: tuple(by_feature[f]) for name, f in keys.items() if f in by_feature}
