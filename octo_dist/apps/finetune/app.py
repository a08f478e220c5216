"""octo-dist finetune: Octo fine-tuning on the octo_dist engine, the fork's scripts/finetune.py flow on any number of
processes.

    mpirun -npernode $NUM_GPUS -hostfile $SGE_JOB_HOSTLIST \
        octo-dist finetune --config.pretrained_path=weights/octo-small

The flow is the fork's: load the pretrained model, apply ``config_delete_keys`` / ``update_config``, build the
fine-tuned model and carry the pretrained parameters over (``merge_params``), freeze keys per
``finetuning_mode``, the optimizer from the config (``create_optimizer``), ``make_single_dataset``. What differs is
what several processes need:

* the config is checked and parsed before the runtime starts (``config.parse``): an unreachable ``hf://`` path or
  a missing dataset ends every rank within seconds, not after start-up and compilation;
* each process reads only ``batch_size / process_count`` examples per step, with its own data seed (the fork has
  every process build the full global batch);
* the parameters are initialised on the *global* example batch inside the engine's ``jit``, so every rank gets the
  same ``(B, ...)`` example (the fork's ``from_config`` stacks a process axis: "horizon must be <= max_horizon");
* rank 0 builds the dataset first: the statistics file Octo caches beside the data is written once, not raced;
* the train step, checkpoints (``<run dir>/train_state``, resumable with ``--resume``), stop signals and rank-0
  logging are the engine's and the job harness's (``octo_dist.apps.harness``);
* on GPUs and TPUs the images are augmented on the device by a program of their own, run on a worker thread ahead
  of each step (``augment_on="auto"``, the default, or ``"device"``: the fork's ``image_augment_kwargs`` ops in JAX,
  ``octo_dist.engine.augment``, ``Engine.prepare``); a camera the dataset never fills is skipped; frames stored at
  another size than the model's (the dataset's ``features.json``) leave the host as decoded and are resized in that
  program first (the fork's lanczos3), while the model, its example batch and checkpoints keep the model's sizes;
  ``"host"`` (what ``"auto"`` means on the CPU) keeps the fork's tf.data resize and augmentation;
* at the end (or on a stop signal) the model is also saved with ``OctoModel.save_pretrained`` into the run
  directory, which ``OctoModel.load_pretrained`` and the fork's eval scripts read.

Not carried over: the fork's validation/visualisation/rollout callbacks (``eval_interval``).

The data pipeline (``make_single_dataset``'s, this process's share of each batch) is :mod:`.pipeline`'s, the model
(its config, the pretrained weights, the compiled init and step, the saved result) :mod:`.model`'s; here :func:`run`
goes through the flow one named step at a time (the model config, the model, the run directory, the report), each
marking its phase of the start-up profile. TensorFlow and Octo are imported inside those steps only,
so ``--help`` and the config checks start without them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any, Mapping, Optional, Sequence

from octo_dist import EXIT_FAILED, EXIT_OK
from octo_dist.apps import harness
from octo_dist.apps.finetune import (
    arguments,
    checks,
    commandline,
    config,
    model,
    pipeline,
    stepimages,
    tfquiet,
)
from octo_dist.problems import Problem
from octo_dist.runtime import tracking

log = logging.getLogger(__name__)


class ScheduleTracker(tracking.Tracker):
    """Adds the learning rate at each logged step (the fork logs it from inside its train step)."""

    def __init__(self, inner: tracking.Tracker, schedule):
        import jax

        super().__init__(inner.run_id)
        # jitted once: optax's schedule run eagerly compiled a dozen small programs at the first log step and
        # dispatched them at every one after (measured by bench/step_profile.py: 13 compiles in a steady step)
        self.inner, self.schedule = inner, jax.jit(schedule)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.inner.log({**metrics, "training/learning_rate": float(self.schedule(step))}, step)

    def finish(self) -> None:
        self.inner.finish()


def _json_default(o):
    import numpy as np

    if isinstance(o, (np.ndarray, np.generic)):
        return o.tolist()
    return repr(o)


def run(job_config: config.FinetuneJob, environ: Mapping[str, str] = os.environ) -> int:
    """Fine-tune as ``job_config`` says (:func:`config.parse` made it). Call on every rank; returns the exit code:
    0 done (or stopped by a signal after saving), 2 refused before anything was compiled (printed once)."""
    options = harness.Options.from_environment(
        job_config.runtime, job_config.compile_cache, environ
    )
    return harness.run(
        "finetune",
        options,
        lambda job: _finetune(job, job_config, environ),
    )


def _finetune(job: harness.Job, cfg: config.FinetuneJob, environ: Mapping[str, str]) -> int:
    """The fork's flow on this rank: the model config, the data, the model (compiled beside the data's first
    batch), the run directory and tracker, training, the saved model, the report."""
    from octo_dist.engine import data
    from octo_dist.runtime import startclock

    _import_the_stack(environ)
    startclock.done("imports")  # TensorFlow, Octo and the engine

    # augment_on "auto" decided for this platform, once: the pipeline and the step read the same answer.
    cfg = config.for_platform(cfg, job.runtime.platform)
    # The config read directly (c.batch_size), and as plain data where Octo, JSON and wandb take a dict.
    rt, c, plain = job.runtime, cfg.config, cfg.plain_config()
    local_batch = data.local_batch_size(c.batch_size, rt.process_count, rt.device_count)
    # which cameras' frames the host leaves at their stored size for the step to resize: decided once, here
    resized = pipeline.resized_on_device(plain)
    _log_plan(rt, c, local_batch, resized)
    pretrained_dir, model_config, text_processor = model.load_model_config(c, plain)
    startclock.done("model_load")

    # --- data: this process's share, its own seed; the first batch fills the shuffle buffer in a thread ------------
    source = pipeline.OctoData(
        cfg,
        text_processor,
        local_batch,
        rt.process_index,
        rt.process_count,
        start_step=cfg.training.resume.start,
        stored=resized,
    )
    startclock.done("dataset")

    made = model.make_model(cfg, plain, pretrained_dir, model_config, text_processor, source)
    tracker = _open_run(cfg, rt, plain, environ)
    result, timing = harness.fit(
        job,
        made.policy,
        made.ahead.tx,
        source,
        cfg.training,
        tracker=ScheduleTracker(tracker, made.ahead.lr_schedule),
        params=made.params,
        fingerprint=cfg.fingerprint(),
        engine=made.ahead.engine,
    )
    out_dir = cfg.run_dir
    if out_dir and result.end_step > result.start_step:
        model.save_pretrained(made, model_config, plain, result, out_dir)
    return _report(job, cfg, result, timing, local_batch)


def _import_the_stack(environ: Mapping[str, str]) -> None:
    """Import TensorFlow (kept off the GPUs), Octo and the engine: the start-up profile's "imports" phase."""
    import jax  # noqa: F401
    import tensorflow as tf

    # TensorFlow only reads data; left alone it reserves GPU memory JAX needs.
    tf.config.set_visible_devices([], "GPU")
    tfquiet.quiet_autograph(environ)
    import octo.model.octo_model  # noqa: F401
    import octo.utils.spec  # noqa: F401
    import octo.utils.train_utils  # noqa: F401

    import numpy  # noqa: F401

    import octo_dist.engine.data  # noqa: F401
    import octo_dist.engine.parallel  # noqa: F401
    import octo_dist.engine.train  # noqa: F401
    import octo_dist.policies.gather  # noqa: F401
    import octo_dist.policies.octo  # noqa: F401


def _log_plan(rt, c, local_batch: int, resized: Mapping) -> None:
    """One log line with what this run does: processes, weights, dataset, mode, images, batch and steps."""
    pretrained_path = c.get("pretrained_path") or None
    log.info(
        "Octo fine-tuning: %s\n  pretrained: %s\n  dataset: %s in %s\n  mode: %s, modality: %s, images %s\n"
        "  global batch %d = %d per process x %d processes (%d devices), %d steps",
        rt.describe(),
        pretrained_path or "none (model_config)",
        c.dataset_kwargs.name,
        c.dataset_kwargs.data_dir,
        c.get("finetuning_mode", "full"),
        c.get("modality"),
        stepimages.images_plan(c.augment_on, resized),
        c.batch_size,
        local_batch,
        rt.process_count,
        rt.device_count,
        c.num_steps,
    )


def _open_run(
    cfg: config.FinetuneJob, rt, plain: dict, environ: Mapping[str, str]
) -> tracking.Tracker:
    """The run directory (its finetune_config.json, written by rank 0) and the tracker; a resumed run continues
    the wandb run whose id the directory keeps."""
    # A URL's run directory gets Octo's saved model alone: its other files need a file system.
    c, layout, out_dir = cfg.config, cfg.local_layout, cfg.run_dir
    if cfg.layout is None:
        log.warning(
            "save_dir not set (--config.save_dir=...): no checkpoints, nothing to resume from"
        )
    elif layout is not None and rt.is_main:
        os.makedirs(layout.run_dir, exist_ok=True)
        with open(layout.run_config, "w") as f:
            json.dump(plain, f, indent=1, default=_json_default)
    run_id = None
    if layout and cfg.training.resume.step is not None and os.path.exists(layout.run_id_file):
        with open(layout.run_id_file) as f:
            run_id = f.read().strip() or None  # the resumed run continues the same wandb run
    tracker = tracking.make_tracker(
        rt.process_index,
        project=c.wandb.get("project") or config.DEFAULT_PROJECT,
        group=c.wandb.get("group"),
        entity=c.wandb.get("entity"),
        name=cfg.name,
        run_id=run_id,
        mode=tracking.resolve_mode(environ, "disabled" if cfg.debug else None),
        environ=environ,
        config={
            **plain,
            "run_dir": out_dir,
            "processes": rt.process_count,
            "devices": rt.device_count,
        },
        launch=rt.launch,
    )
    if layout and rt.is_main:
        with open(layout.run_id_file, "w") as f:
            f.write(tracker.run_id)
    return tracker


def _report(job: harness.Job, cfg: config.FinetuneJob, result, timing, local_batch: int) -> int:
    """Rank 0's closing lines and the run's summary; fails when the ranks' parameters differ."""
    rt, c, out_dir = job.runtime, cfg.config, cfg.run_dir
    losses = [result.losses[k] for k in sorted(result.losses)]
    digests = harness.parameter_digests(result)
    same = len(set(digests)) == 1
    harness.say(
        job,
        f"octo-dist finetune: {rt.process_count} process(es), {rt.device_count} device(s), global batch "
        f"{c.batch_size} ({local_batch} per process); steps {result.start_step} -> {result.end_step} "
        f"of {c.num_steps}"
        + (f", loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "")
        + (f"; stopped by {result.stopped_by}" if result.stopped_by else "")
        + (f"; run dir {out_dir}" if out_dir else "")
        + f"\n  parameters {'identical on every rank' if same else 'DIFFER across ranks'}: "
        + ", ".join(digests),
    )
    harness.summary(job, "finetune", result, timing, c.batch_size, cfg.training, digests=digests)
    if not same:
        # Data parallelism keeps one set of parameters; ranks that disagree trained different models.
        harness.say(
            job,
            "octo-dist finetune: error: the ranks' parameters differ after training; expected one "
            "model on every rank. Fix: rerun with OCTO_DIST_LOG_ALL_RANKS=1 and report the output",
        )
        return EXIT_FAILED
    return EXIT_OK


# --- the command line ---------------------------------------------------------------------------------------------


def add_parser(sub) -> argparse.ArgumentParser:
    """Lists ``finetune`` in ``octo-dist --help``; its flags are the fork's absl flags (``octo_dist.cli`` hands
    them to :func:`main` unparsed, since ``--config.<field>=`` cannot be declared to argparse)."""
    p = sub.add_parser(
        "finetune",
        add_help=False,
        help="fine-tune Octo on every rank (run under mpirun); "
        "octo-dist finetune --help lists its flags and config fields",
    )
    p.set_defaults(func=None)
    return p


TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"


def main(
    argv: Sequence[str],
    environ: Mapping[str, str] = os.environ,
    probe: Optional[checks.HfProbe] = None,
) -> int:
    """``octo-dist finetune`` / ``scripts/finetune.py`` (``argv[0]`` is the program): the flags read and the config
    checked in one place (:func:`arguments.job_config`), then :func:`run`."""
    if commandline.wants_help(argv):
        print(commandline.help_text(argv), end="")
        return EXIT_OK
    _quiet_tensorflow(environ)
    try:
        job_config = arguments.job_config(argv, environ, probe)
    except Problem as e:  # a flag, dataset, weights or save directory the run cannot use
        # Every rank checks the same files and fails alike; mpirun ends the job at the first non-zero exit.
        print(f"octo-dist finetune: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    return run(job_config, environ)


def _quiet_tensorflow(environ: Mapping[str, str]) -> None:
    """TensorFlow (tf.data) logs "Unable to register cuDNN factory" and "TF-TRT Warning" at start-up, at ERROR
    level, on every rank: noise that buries the job's own lines. Real failures still raise in Python; a user who
    wants TF's log sets TF_CPP_MIN_LOG_LEVEL (0 shows everything)."""
    if environ is os.environ and TF_LOG_LEVEL_ENV not in environ:
        os.environ[TF_LOG_LEVEL_ENV] = "3"
