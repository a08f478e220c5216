"""One fine-tune job, checked and parsed once before any rank starts: no Octo, no JAX here.

    job = config.parse(flags.config, probe, name="ft_{batch_size}", resume=True)
    job.config.batch_size, job.config.dataset_kwargs.name   # the config, read directly (a FrozenConfigDict)
    job.run_dir, job.training.resume.start                   # what the command line adds
    job.training                                             # the engine's input (train.TrainConfig), as smoke's
    job.config.augment_on                                    # "auto", "device" or "host": always set here
    job = config.for_platform(job, "gpu")                    # on the rank: "auto" resolved ("device" on GPUs)

:func:`parse` checks the config (:mod:`.checks`: every problem at once), names the run directory, and decides once
whether to resume (``checkpoint.decide`` over ``<run dir>/train_state``). The other concerns have their own
modules: loading config files (:mod:`.configfile`), the model config's merge rules (:mod:`.modelconfig`), the
command line (:mod:`.commandline`, :mod:`.flagerrors`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional

from octo_dist import savelayout
from octo_dist.apps.finetune.checks import HfProbe, is_url, problems
from octo_dist.apps.finetune.configfile import ConfigError
from octo_dist.apps.finetune.frames import RESIZE_METHODS
from octo_dist.apps.finetune.modelconfig import flat_keys
from octo_dist.engine import checkpoint, stepfns, train


DEFAULT_PROJECT = "octo_finetune"  # wandb.project when the config leaves it empty


def format_name(name: str, config: Mapping) -> str:
    """The fork's ``format_name_with_config``: ``"ft_{batch_size}_{finetuning_mode}"`` -> ``"ft_256_full"``.

    Keys are a leaf's name or its full path joined by ``_`` (``{dataset_kwargs_name}``).
    """
    flat = {"_".join(map(str, k)): v for k, v in flat_keys(config).items()}
    values = {**{k.split("_")[-1]: v for k, v in flat.items()}, **flat}
    try:
        return name.format(**values)
    except (KeyError, IndexError) as e:
        raise ConfigError(
            f"--name={name!r} names {e} which is not a config field; expected fields like "
            f"{{batch_size}} or {{dataset_kwargs_name}}"
        ) from None


def augment_on(config: Mapping) -> str:
    """Where the batch's images are augmented: ``config.augment_on``, ``"auto"`` when a config file does not say
    (the fork's own configs); :func:`for_platform` resolves ``"auto"`` on the rank, once JAX's platform is known."""
    return str(config.get("augment_on") or stepfns.DEFAULT_AUGMENT_ON)


def for_platform(job: "FinetuneJob", platform: str) -> "FinetuneJob":
    """``job`` with ``config.augment_on`` resolved for JAX's ``platform`` (``"gpu"``, ``"cpu"``): ``"auto"`` ->
    ``"device"`` on accelerators, ``"host"`` on the CPU (``stepfns.resolve_augment_on``). Called once on each rank
    after the runtime started: the data pipeline and the train step then read the same ``"device"`` or ``"host"``."""
    from ml_collections import FrozenConfigDict

    where = stepfns.resolve_augment_on(augment_on(job.config), platform)
    if where == job.config.get("augment_on"):
        return job
    config = job.config.as_configdict()
    config.augment_on = where
    return dataclasses.replace(job, config=FrozenConfigDict(config))


def augment_config_problems(config: Mapping) -> list:
    """What is wrong with ``augment_on`` and, for ``"device"`` or ``"auto"``, the augmentation the device is asked for.

    >>> augment_config_problems({"augment_on": "gpu"})
    ["augment_on 'gpu'; expected one of auto, device, host. Fix: --config.augment_on=auto"]
    """
    method = config.get("resize_method") or "lanczos3"
    if method not in RESIZE_METHODS:
        return [
            f"resize_method {method!r}; expected one of {', '.join(RESIZE_METHODS)}. "
            "Fix: --config.resize_method=lanczos3"
        ]
    where = augment_on(config)
    if where not in stepfns.AUGMENT_ON:
        return [
            f"augment_on {where!r}; expected one of {', '.join(stepfns.AUGMENT_ON)}. "
            f"Fix: --config.augment_on={stepfns.DEFAULT_AUGMENT_ON}"
        ]
    if where == "host":
        return []
    # "auto" too: it is "device" on the GPUs the job will run on
    kwargs = (config.get("frame_transform_kwargs") or {}).get("image_augment_kwargs") or {}
    return [
        f"frame_transform_kwargs.image_augment_kwargs: {p}. Fix: --config.augment_on=host augments on the host "
        "with TensorFlow, as the fork does"
        for p in stepfns.augment_problems(kwargs)
    ]


def layout(config: Mapping, name: str) -> Optional[savelayout.RunLayout]:
    """The run's files: ``<save_dir>/<wandb.project>/[<wandb.group>/]<name>`` and its ``train_state`` (a
    ``savelayout.RunLayout``), or None without a save_dir; absolute unless a URL (orbax and ``save_pretrained``
    refuse relative paths; every rank has the same working directory).

    The fork appends a timestamp (a new directory each launch). Here the directory depends only on the flags, so a
    job requeued after its wall time finds its own checkpoints (``--resume``), and a second run with the same name
    is refused instead of mixed in.
    """
    if not config.get("save_dir"):
        return None
    wandb = config.get("wandb") or {}
    save_dir = str(config["save_dir"])
    return savelayout.RunLayout.finetune(
        save_dir if is_url(save_dir) else os.path.abspath(save_dir),
        str(wandb.get("project") or DEFAULT_PROJECT),
        str(wandb["group"]) if wandb.get("group") else None,
        format_name(name, config),
    )


def run_dir(config: Mapping, name: str) -> Optional[str]:
    """``<save_dir>/<wandb.project>/[<wandb.group>/]<name>`` (``layout(...).run_dir``), or None without a save_dir."""
    found = layout(config, name)
    return found.run_dir if found else None


@dataclasses.dataclass(frozen=True)
class FinetuneJob:
    """One fine-tune job (:func:`parse`): the config as the fork reads it, and what the command line adds to it.

    ``config`` is read directly (``job.config.batch_size``, ``job.config.dataset_kwargs.name``): a
    ``FrozenConfigDict``, so no later step can change what was checked; ``plain_config()`` is the plain dict Octo's
    calls, ``finetune_config.json`` and wandb take.
    """

    config: Any  # ml_collections.FrozenConfigDict
    name: str  # the run's name, formatted: "ft_{batch_size}" -> "ft_256"
    # The run's files (run directory, train_state, lock) under --config.save_dir; None without one.
    layout: Optional[savelayout.RunLayout] = None
    debug: bool = False  # wandb disabled
    # The engine's input, the same dataclass smoke builds (:func:`train_config`): steps, seed, --step_fn, the local
    # layout, save_every (the config's save_interval), log_every and where training starts (``resume``: decided in
    # parse, once, from the verified steps; the data pipeline and train.fit both read it). None only on a job made
    # for its config alone (the data pipeline's tests).
    training: Optional[train.TrainConfig] = None
    compile_cache: Optional[str] = None
    runtime: Mapping[str, Any] = dataclasses.field(
        default_factory=dict
    )  # runtime.initialize's options

    @property
    def run_dir(self) -> Optional[str]:
        """The run's directory, absolute (or a URL); None without --config.save_dir."""
        return self.layout.run_dir if self.layout else None

    @property
    def local_layout(self) -> Optional[savelayout.RunLayout]:
        """The layout whose files octo-dist writes itself (the engine's checkpoints and lock in ``train_state``, the
        run's summary): ``layout``, or None without a save_dir or when it is a URL (they need a file system; Octo's
        ``save_pretrained`` still writes the model to ``run_dir``)."""
        if self.layout is None or is_url(self.layout.save_dir):
            return None
        return self.layout

    def plain_config(self) -> dict:
        """The config as plain data (lists, not the frozen tuples)."""
        return self.config.as_configdict().to_dict()

    def fingerprint(self) -> dict:
        """The settings a resumed run must share with the run it continues (checked against the checkpoint)."""
        c = self.config
        return {
            "batch_size": c.batch_size,
            "seed": c.seed,
            "step_fn": self.training.step_fn,
            "pretrained_path": str(c.get("pretrained_path") or None),
            "dataset": c.dataset_kwargs.name,
            "finetuning_mode": c.get("finetuning_mode", "full"),
        }


def parse(
    config,
    probe: HfProbe,
    *,
    name: str = "experiment",
    debug: bool = False,
    resume: bool = False,
    step_fn: str = "auto",
    compile_cache: Optional[str] = None,
    runtime: Optional[Mapping[str, Any]] = None,
) -> FinetuneJob:
    """Check ``config`` (a ConfigDict or a mapping; every problem at once, as a ConfigError) and return the job.

    Whether to resume is decided here too (``checkpoint.decide``: a CheckpointError for a run directory that
    already holds checkpoints without ``resume``), before any rank loads data or compiles the model.
    """
    from ml_collections import ConfigDict, FrozenConfigDict

    checked = ConfigDict(config.to_dict() if hasattr(config, "to_dict") else dict(config))
    # Decided here, once: the data pipeline (augments on the host or not) and the train step (augments or not)
    # both read job.config.augment_on, so a config without the field cannot leave the images augmented twice.
    checked.augment_on = augment_on(checked)
    plain = checked.to_dict()
    found = problems(plain, probe) + augment_config_problems(plain)
    if found:
        raise ConfigError("the fine-tune configuration cannot run:\n  - " + "\n  - ".join(found))
    job = FinetuneJob(
        config=FrozenConfigDict(checked),
        name=format_name(name, plain),
        layout=layout(plain, name),
        debug=debug,
        compile_cache=compile_cache,
        runtime=dict(runtime or {}),
    )
    local = job.local_layout
    decision = checkpoint.decide(
        local.train_state if local else None,
        resume,
        elsewhere="pick another --name or --config.save_dir",
    )
    return dataclasses.replace(job, training=train_config(job.config, local, step_fn, decision))


def train_config(
    c: Mapping, local: Optional[savelayout.RunLayout], step_fn: str, resume: checkpoint.Decision
) -> train.TrainConfig:
    """The engine's input for the checked config ``c``: its num_steps, seed, save_interval (``save_every``, the
    engine's name; 0 or unset: only at the end and on a stop signal) and log_interval, with the run's ``local``
    layout, ``--step_fn`` and where training starts."""
    return train.TrainConfig(
        steps=c["num_steps"],
        seed=c["seed"],
        step_fn=step_fn,
        layout=local,
        save_every=c.get("save_interval") or 0,
        resume=resume,
        log_every=c.get("log_interval") or 1,
    )
