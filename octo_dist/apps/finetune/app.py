"""Octo fine-tuning on the octo_dist engine: the fork's ``scripts/finetune.py`` flow, on any number of processes.

    mpirun -npernode $NUM_GPUS -hostfile $SGE_JOB_HOSTLIST \
        python scripts/finetune.py --config.pretrained_path=weights/octo-small

The flow is the fork's: load the pretrained model, apply ``config_delete_keys`` / ``update_config``, build the
fine-tuned model with ``OctoModel.from_config`` and carry the pretrained parameters over (``merge_params``), freeze
keys per ``finetuning_mode``, the optimizer from the config (``create_optimizer``), ``make_single_dataset``. What
differs is what the seed had to discover:

* the config is checked before the runtime starts (``finetune_config.validate``): an unreachable ``hf://`` path or
  a missing dataset ends every rank within seconds, not after start-up and compilation;
* each process reads only ``batch_size / process_count`` examples per step, with its own seed (the fork has
  every process build the full global batch);
* ``from_config`` gets a global example batch (``gather.for_from_config``), so its ``process_allgather`` returns
  ``(B, ...)`` instead of stacking a process axis (the seed's "horizon must be <= max_horizon");
* rank 0 builds the dataset first: the statistics file Octo caches beside the data is written once, not raced;
* the train step, checkpoints (``<run dir>/train_state``, resumable with ``--resume``), stop signals and rank-0
  logging are ``octo_dist.engine.train``'s; start-up and shutdown are ``octo_dist.dist.runtime``'s;
* at the end (or on a stop signal) the model is also saved with ``OctoModel.save_pretrained`` into the run
  directory, which ``OctoModel.load_pretrained`` and the fork's eval scripts read.

Not carried over: the fork's validation/visualisation/rollout callbacks (``eval_interval``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from octo_dist.apps.finetune import config as fc
from octo_dist.dist import runtime
from octo_dist.dist import tracking

log = logging.getLogger("octo_dist.apps.finetune.app")

EXIT_CONFIG = 2
TRAIN_STATE_DIR = "train_state"
RUN_ID_FILE = "wandb_run_id"


def data_seed(seed: int, process_index: int, start_step: int) -> int:
    """TensorFlow's seed for one process's data stream from ``start_step`` on.

    Different per process (each shuffles and augments its own stream: together they draw ``batch_size`` examples
    per step, as one process would) and per resume point (a resumed run does not replay the first batches; tf.data
    shuffle buffers are not checkpointed, so a resumed run's batches are fresh draws, not the uninterrupted run's).
    """
    return int(np.random.SeedSequence([seed, process_index, start_step]).generate_state(1)[0] >> 1)


def process_batch(batch: dict, text_processor) -> dict:
    """The fork's ``process_batch``: encode (or drop) the language instruction, drop the dataset name (strings)."""
    from octo.utils.train_utils import process_text

    batch = process_text(batch, text_processor)
    del batch["dataset_name"]
    return batch


class OctoData:
    """This process's slice of the global batch from ``make_single_dataset`` (``train.fit``'s data interface)."""

    def __init__(self, config: Mapping[str, Any], text_processor, local_batch_size: int, process_index: int,
                 process_count: int):
        self.config = config
        self.text_processor = text_processor
        self.local_batch_size = local_batch_size
        self.process_index = process_index
        # Octo computes the action/proprio statistics on first use and caches them beside the data (or in
        # ~/.cache/octo): rank 0 first, then the rest read the cache instead of N ranks writing one file at once.
        self.dataset_statistics = self._statistics_rank0_first(process_count)

    def _build(self):
        from octo.data.dataset import make_single_dataset

        c = self.config
        return make_single_dataset(c["dataset_kwargs"], traj_transform_kwargs=c.get("traj_transform_kwargs", {}),
                                   frame_transform_kwargs=c.get("frame_transform_kwargs", {}), train=True)

    def _statistics_rank0_first(self, process_count: int):
        from jax.experimental import multihost_utils

        stats = self._build().dataset_statistics if self.process_index == 0 else None
        if process_count > 1:
            multihost_utils.sync_global_devices("octo_dist.apps.finetune.app: dataset statistics written")
        return stats if stats is not None else self._build().dataset_statistics

    def batches(self, start_step: int = 0) -> Iterator[dict]:
        import tensorflow as tf

        # The seed must be set before the pipeline is built: tf.data fixes shuffle and augmentation seeds then.
        tf.random.set_seed(data_seed(int(self.config["seed"]), self.process_index, start_step))
        with warnings.catch_warnings():
            # "Seed ... from outer graph might be getting used by function Dataset_map_aug_and_dropout": it is, on
            # purpose (Octo's augmentation draws from the global seed set above).
            warnings.filterwarnings("ignore", message="Seed .* from outer graph", category=UserWarning)
            dataset = (self._build().repeat().unbatch().shuffle(int(self.config["shuffle_buffer_size"]))
                       .batch(self.local_batch_size))
        for batch in dataset.iterator():
            yield process_batch(batch, self.text_processor)


class ScheduleTracker(tracking.Tracker):
    """Adds the learning rate at each logged step (the fork logs it from inside its train step)."""

    def __init__(self, inner: tracking.Tracker, schedule):
        super().__init__(inner.run_id)
        self.inner, self.schedule = inner, schedule

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.inner.log({**metrics, "learning_rate": float(self.schedule(step))}, step)

    def finish(self) -> None:
        self.inner.finish()


def resolve_pretrained(path: str) -> str:
    """A directory for ``load_pretrained``: ``hf://`` paths from the HF cache (or the Hub, where reachable); local
    paths made absolute (orbax refuses relative ones: "Checkpoint path should be absolute")."""
    if not path.startswith(fc.HF_PREFIX):
        return path if re.match(r"^[a-z][a-z0-9+.-]*://", path) else os.path.abspath(path)
    import huggingface_hub

    return huggingface_hub.snapshot_download(fc.hf_repo(path))


def _json_default(o):
    if isinstance(o, (np.ndarray, np.generic)):
        return o.tolist()
    return repr(o)


def run(config, *, name: str = "experiment", debug: bool = False, resume: bool = False, step_fn: str = "jit",
        compile_cache: Optional[str] = None, probe: Optional[fc.HfProbe] = None,
        runtime_kwargs: Optional[Mapping[str, Any]] = None) -> int:
    """Fine-tune as ``config`` (a ConfigDict or dict shaped like octo_dist/apps/finetune/configs/finetune_config.py) says.

    Call on every rank. Returns the exit code: 0 done (or stopped by a signal after saving), 2 a configuration
    that cannot run (printed once, before anything is compiled).
    """
    cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if probe is None:
        from octo_dist.apps.finetune import weights

        probe = weights.probe
    try:
        fc.validate(cfg, probe)
        out_dir = fc.run_dir(cfg, name)
        refused = fc.resume_problem(os.path.join(out_dir, TRAIN_STATE_DIR) if out_dir else None, resume)
        if refused:
            raise fc.ConfigError(refused)
    except fc.ConfigError as e:
        # Every rank checks the same files and fails alike; mpirun ends the job at the first non-zero exit.
        print(f"octo-dist finetune: error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    from octo_dist.dist import ranklog
    from octo_dist.dist import stopping

    with runtime.distributed(**dict(runtime_kwargs or {})) as rt:
        # After start-up (jax.distributed.initialize installs TSL's own SIGTERM handler), before the model loads
        # and compiles: a scheduler's signal from here on stops the job at its first step.
        stop = stopping.StopSignal()
        ranklog.setup(rt.process_index, rt.process_count)
        from octo_dist.engine.checkpoint import CheckpointError
        from octo_dist.engine.data import BatchSizeError

        try:
            return _finetune(cfg, rt, name=name, debug=debug, resume=resume, step_fn=step_fn,
                             compile_cache=compile_cache, stop=stop)
        except (BatchSizeError, CheckpointError, fc.ConfigError) as e:
            # The same on every rank (the same flags and shared directories): refuse together, shut down cleanly.
            if rt.is_main:
                print(f"octo-dist finetune: error: {e}", file=sys.stderr, flush=True)
            return EXIT_CONFIG


def _finetune(cfg: dict, rt, *, name: str, debug: bool, resume: bool, step_fn: str,
              compile_cache: Optional[str], stop=None) -> int:
    import jax
    import tensorflow as tf

    # TensorFlow only reads data; left alone it reserves GPU memory JAX needs.
    tf.config.set_visible_devices([], "GPU")
    from octo.model.octo_model import OctoModel
    from octo.utils.spec import ModuleSpec
    from octo.utils.train_utils import check_config_diff, create_optimizer

    from octo_dist.dist import compile_cache as cc
    from octo_dist.engine import data
    from octo_dist.engine import parallel as engine
    from octo_dist.policies import gather
    from octo_dist.engine import train
    from octo_dist.policies.octo import OctoPolicy

    cc.enable(compile_cache)
    local_batch = data.local_batch_size(int(cfg["batch_size"]), rt.process_count, rt.device_count)
    run_name = fc.format_name(name, cfg)
    log.info("Octo fine-tuning: %s\n  pretrained: %s\n  dataset: %s in %s\n  mode: %s, modality: %s\n"
             "  global batch %d = %d per process x %d processes (%d devices), %d steps",
             rt.describe(), cfg.get("pretrained_path") or "none (model_config)", cfg["dataset_kwargs"]["name"],
             cfg["dataset_kwargs"]["data_dir"], cfg.get("finetuning_mode"), cfg.get("modality"), cfg["batch_size"],
             local_batch, rt.process_count, rt.device_count, int(cfg["num_steps"]))

    # --- the model config: the pretrained model's, edited (or the config's own model_config) ----------------------
    pretrained = None
    if cfg.get("pretrained_path"):
        pretrained = OctoModel.load_pretrained(resolve_pretrained(str(cfg["pretrained_path"])),
                                               step=cfg.get("pretrained_step"))
        base = pretrained.config
    else:
        base = cfg["model_config"]
    model_config = fc.edit_model_config(base, cfg.get("config_delete_keys"), cfg.get("update_config"))
    check_config_diff(model_config, base)
    spec = model_config.get("text_processor")
    text_processor = ModuleSpec.instantiate(spec)() if spec else None

    # --- data: this process's share, its own seed ------------------------------------------------------------------
    source = OctoData(cfg, text_processor, local_batch, rt.process_index, rt.process_count)
    example = next(source.batches(0))

    # --- model: from_config on a global example batch, pretrained parameters merged in ------------------------------
    policy = OctoPolicy(model_config, text_processor, source.dataset_statistics,
                        pretrained.params if pretrained is not None else None)
    del pretrained
    init_rng = jax.random.split(jax.random.PRNGKey(int(cfg["seed"])))[0]
    params = policy.init(init_rng, gather.for_from_config(example, engine.make_mesh()))

    optimizer_kwargs = dict(cfg["optimizer"], frozen_keys=fc.resolve_frozen_keys(cfg, model_config))
    tx, lr_schedule, _ = create_optimizer(params, **optimizer_kwargs)

    # --- where it goes -------------------------------------------------------------------------------------------
    out_dir = fc.run_dir(cfg, name)
    if out_dir and not re.match(r"^[a-z][a-z0-9+.-]*://", out_dir):
        out_dir = os.path.abspath(out_dir)   # orbax (save_pretrained) refuses relative paths; every rank has one cwd
    window = int(example["observation"]["timestep_pad_mask"].shape[1])
    if out_dir is None:
        log.warning("save_dir not set (--config.save_dir=...): no checkpoints, nothing to resume from")
    elif rt.is_main:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "finetune_config.json"), "w") as f:
            json.dump(cfg, f, indent=1, default=_json_default)
    run_id = None
    if out_dir and resume and os.path.exists(os.path.join(out_dir, RUN_ID_FILE)):
        with open(os.path.join(out_dir, RUN_ID_FILE)) as f:
            run_id = f.read().strip() or None   # the resumed run continues the same wandb run
    wandb_cfg = cfg.get("wandb") or {}
    tracker = tracking.make_tracker(
        rt.process_index, project=wandb_cfg.get("project") or "octo_finetune", group=wandb_cfg.get("group"),
        entity=wandb_cfg.get("entity"), name=run_name, run_id=run_id, mode="disabled" if debug else None,
        config={**cfg, "run_dir": out_dir, "processes": rt.process_count, "devices": rt.device_count},
        launch=rt.launch)
    if out_dir and rt.is_main:
        with open(os.path.join(out_dir, RUN_ID_FILE), "w") as f:
            f.write(tracker.run_id)

    fit_cfg = train.TrainConfig(
        steps=int(cfg["num_steps"]), seed=int(cfg["seed"]), step_fn=step_fn,
        save_dir=os.path.join(out_dir, TRAIN_STATE_DIR) if out_dir else None,
        save_every=int(cfg.get("save_interval") or 0), resume=resume, log_every=int(cfg.get("log_interval") or 1))
    fingerprint = {"batch_size": int(cfg["batch_size"]), "seed": int(cfg["seed"]), "step_fn": step_fn,
                   "pretrained_path": str(cfg.get("pretrained_path")), "dataset": str(cfg["dataset_kwargs"]["name"]),
                   "finetuning_mode": str(cfg.get("finetuning_mode"))}
    try:
        result = train.fit(policy, tx, source, fit_cfg, tracker=ScheduleTracker(tracker, lr_schedule), params=params,
                           fingerprint=fingerprint, stop=stop)
    finally:
        tracker.finish()

    if out_dir and result.end_step > result.start_step:
        # Octo's own layout too (config.json, example_batch.msgpack, dataset_statistics.json, <step>/default), so
        # load_pretrained and the fork's eval scripts read the result. Collective: every process calls it.
        model = policy.model.replace(params=result.state.params, config={**model_config, "window_size": window})
        model.save_pretrained(result.end_step, out_dir)
    losses = [result.losses[k] for k in sorted(result.losses)]
    if rt.is_main:
        print(f"octo-dist finetune: {rt.process_count} process(es), {rt.device_count} device(s), global batch "
              f"{cfg['batch_size']} ({local_batch} per process); steps {result.start_step} -> {result.end_step} of "
              f"{fit_cfg.steps}" + (f", loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "")
              + (f"; stopped by {result.stopped_by}" if result.stopped_by else "")
              + (f"; run dir {out_dir}" if out_dir else ""), flush=True)
    return 0


def main(argv) -> int:
    """``scripts/finetune.py``: parse the fork's flags (``argv[0]`` is the program), then :func:`run`."""
    try:
        flags = fc.parse_flags(argv)
    except Exception as e:  # absl's flags.Error, or get_config refusing its config string
        print(f"octo-dist finetune: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    return run(flags.config, name=flags.name, debug=flags.debug, resume=flags.resume, step_fn=flags.step_fn,
               compile_cache=flags.compile_cache)
