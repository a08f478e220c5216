"""The fine-tuned model before and after training: its config (the pretrained model's, edited), the pretrained
weights, the parameters' init and the train step compiled from the first batch's shapes while the shuffle buffer
fills, the initial parameters (pretrained ones carried over), and the trained model saved in Octo's own layout.

    pretrained_dir, model_config, text_processor = model.load_model_config(c, plain)   # before the data
    made = model.make_model(cfg, plain, pretrained_dir, model_config, text_processor, source)
    ...  # training (app.py)
    model.save_pretrained(made, model_config, plain, result, run_dir)

Octo and JAX are imported inside the functions, so ``octo-dist finetune --help`` starts without them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

from octo_dist.apps.finetune import checks, config, modelconfig, stepimages, weights

log = logging.getLogger(__name__)


def resolve_pretrained(path: str) -> str:
    """A directory for ``load_pretrained``: ``hf://`` paths from the HF cache (or the Hub, where reachable); local
    paths made absolute (orbax refuses relative ones: "Checkpoint path should be absolute")."""
    if not path.startswith(checks.HF_PREFIX):
        return path if checks.is_url(path) else os.path.abspath(path)
    import huggingface_hub

    return huggingface_hub.snapshot_download(checks.hf_repo(path))


def pretrained_config(directory: str) -> dict:
    """The model config ``OctoModel.load_pretrained(directory)`` would give (its ``config.json``, with the same shim
    for configs that name the action horizon ``pred_horizon``), read without the weights."""
    with open(os.path.join(directory, "config.json")) as f:
        model_config = json.load(f)
    action = model_config["model"]["heads"]["action"]["kwargs"]
    if "pred_horizon" in action:
        action["action_horizon"] = action.pop("pred_horizon")
    return model_config


@dataclasses.dataclass
class Ahead:
    """What :func:`compile_ahead` made: the parameters' init (compiled), the optimizer, the engine (its step
    compiled unless asked otherwise)."""

    init: Any
    tx: Any
    lr_schedule: Any
    engine: Any


def output_shapes(lowered, trace_again):
    """A lowered function's outputs as ``jax.ShapeDtypeStruct`` leaves, without tracing it again: later JAX has
    ``Lowered.out_info``; 0.4.20-0.4.22 keep the avals in the lowering's compile arguments. ``trace_again()`` where
    neither is there (``jax.eval_shape``: a second trace)."""
    import jax

    info = getattr(lowered, "out_info", None)
    if info is not None:
        return info
    try:
        avals = lowered._lowering.compile_args["global_out_avals"]
    except (AttributeError, KeyError, TypeError):
        return trace_again()
    return jax.tree_util.tree_unflatten(
        lowered.out_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]
    )


def shape_differences(spec, batch) -> str:
    """The leaves whose shape or dtype differ between ``spec`` and ``batch`` ("" when none), e.g.
    ``"['observation']['image_primary']: (8, 1, 256, 256, 3) uint8 vs (8, 1, 256, 256, 1) uint8"``."""
    import jax
    import numpy as np

    found = []
    for (path, want), got in zip(
        jax.tree_util.tree_flatten_with_path(spec)[0], jax.tree_util.tree_leaves(batch)
    ):
        if (tuple(want.shape), np.dtype(want.dtype)) != (np.shape(got), np.asarray(got).dtype):
            found.append(
                f"{jax.tree_util.keystr(path)}: {tuple(want.shape)} {np.dtype(want.dtype)} vs "
                f"{np.shape(got)} {np.asarray(got).dtype}"
            )
    if jax.tree_util.tree_structure(spec) != jax.tree_util.tree_structure(batch):
        found.append("the batch's keys")
    return "; ".join(found)


def compile_ahead(
    policy,
    mesh,
    local_spec,
    init_rng,
    optimizer_kwargs,
    step_fn,
    seed,
    compile_step=True,
    augment=None,
    resizes=False,
) -> Ahead:
    """Compile the parameters' init and the train step for one global batch of ``local_spec``'s shapes (this
    process's batch: ``jax.ShapeDtypeStruct`` or arrays), before any batch exists: nothing is computed, so it runs
    while the shuffle buffer fills. The optimizer is made from the parameters' shapes (``create_optimizer`` takes
    shapes), so the real parameters are made once, by the compiled init. ``augment``: the step's image
    augmentation (``stepimages.step_augmenter``), or None. ``resizes``: it resizes some cameras' frames (shipped at
    their stored size): the model's shapes are then its output's, initialised on and trained at the model's sizes."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from octo.utils.train_utils import create_optimizer

    from octo_dist.engine import augment as augment_module
    from octo_dist.engine import parallel
    from octo_dist.runtime import startclock

    sharded = NamedSharding(mesh, P(parallel.BATCH_AXIS))
    processes = jax.process_count()
    global_spec = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(
            (x.shape[0] * processes, *x.shape[1:]), x.dtype, sharding=sharded
        ),
        local_spec,
    )
    model_spec = global_spec
    if (
        resizes
    ):  # what the loss sees: the images at the model's sizes (traced only where the step resizes)
        model_spec = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharded),
            augment_module.output_spec(augment, global_spec),
        )
    lowered = jax.jit(policy.init).lower(init_rng, model_spec)  # Octo's init traced once, for both
    params_spec = output_shapes(lowered, lambda: jax.eval_shape(policy.init, init_rng, model_spec))
    # XLA compiles without Python's lock: the init's compilation in a thread, beside the step's (the larger).
    init = startclock.Background("init_compile", lowered.compile)
    tx, lr_schedule, _ = create_optimizer(params_spec, **optimizer_kwargs)
    engine = parallel.Engine(mesh, policy.loss, tx, step_fn=step_fn, augment=augment)
    if compile_step:
        engine.compile(engine.abstract_state(policy, model_spec, seed, params_spec), global_spec)
    return Ahead(init=init.result(), tx=tx, lr_schedule=lr_schedule, engine=engine)


def load_model_config(c, plain: dict) -> tuple:
    """The model config: the pretrained model's config.json, edited (or the config's own model_config); and the text
    processor it names. ``(pretrained_dir or None, model_config, text_processor or None)``.

    Only the config now (the text processor encodes the data); the weights are read while the data loads."""
    from octo.utils.spec import ModuleSpec
    from octo.utils.train_utils import check_config_diff

    pretrained_path = c.get("pretrained_path") or None
    pretrained_dir = resolve_pretrained(str(pretrained_path)) if pretrained_path else None
    base = pretrained_config(pretrained_dir) if pretrained_dir else plain["model_config"]
    model_config = modelconfig.edit_model_config(
        base, plain.get("config_delete_keys"), plain.get("update_config")
    )
    check_config_diff(model_config, base)
    spec = model_config.get("text_processor")
    text_processor = ModuleSpec.instantiate(spec)() if spec else None
    return pretrained_dir, model_config, text_processor


@dataclasses.dataclass
class Model:
    """The model before training: its policy, its parameters (pretrained ones carried over), what
    :func:`compile_ahead` made (optimizer, engine), and what ``save_pretrained`` records."""

    policy: Any
    params: Any
    ahead: Ahead
    frozen_keys: Any  # the optimizer's, resolved from finetuning_mode
    first_example: Any  # the global batch's first example, the same on every rank
    window: int  # the batch's observation window


def make_model(
    cfg: config.FinetuneJob, plain: dict, pretrained_dir, model_config, text_processor, source
) -> Model:
    """While the first batch fills the shuffle buffer: read the pretrained weights and compile the parameters' init
    and the train step from the batch's shapes. Then initialise fresh parameters on the global example batch and
    carry the pretrained ones over."""
    import jax
    import numpy as np

    from octo_dist.engine import parallel
    from octo_dist.policies import gather
    from octo_dist.policies import octo
    from octo_dist.runtime import startclock

    c = cfg.config
    # --- meanwhile: the pretrained weights read, the parameters' init and the train step compiled from shapes -------
    pretrained = None
    if pretrained_dir:
        pretrained = weights.pretrained_params(pretrained_dir, c.get("pretrained_step"))
        startclock.done("model_load")
    policy = octo.OctoPolicy(model_config, text_processor, source.dataset_statistics)
    mesh = parallel.make_mesh()
    init_rng, _ = parallel.init_keys(c.seed)
    optimizer_kwargs = dict(
        plain["optimizer"], frozen_keys=modelconfig.resolve_frozen_keys(plain, model_config)
    )
    batch_spec = source.batch_spec()
    startclock.done("dataset")
    compile_for = _compiler(cfg, policy, mesh, init_rng, optimizer_kwargs, source.device_sizes)
    ahead = compile_for(batch_spec)
    startclock.done("compile")

    # --- model: fresh parameters on the global example batch, pretrained ones carried over ---------------------------
    example = source.example
    startclock.done("dataset")
    differ = shape_differences(batch_spec, example)
    if differ:
        # The pipeline makes batches of other shapes than its first example had: compile for the real batch.
        log.warning(
            "the first batch differs from the shapes compiled for (%s); compiling again", differ
        )
        ahead = compile_for(example)
        startclock.done("compile")
    # The model is made and saved at its own sizes, whatever size the frames travel at (resized as the step does).
    example = _at_model_sizes(example, source.device_sizes, c)
    params = _initial_params(ahead, init_rng, example, mesh, pretrained)
    del pretrained
    startclock.done("parameters")
    # What save_pretrained records as the example batch: the global batch's first example, the same on every rank.
    first_example = jax.tree_util.tree_map(
        lambda x: np.asarray(x)[:1], gather.gathered(example, mesh)
    )
    window = int(example["observation"]["timestep_pad_mask"].shape[1])
    return Model(policy, params, ahead, optimizer_kwargs["frozen_keys"], first_example, window)


def _compiler(cfg: config.FinetuneJob, policy, mesh, init_rng, optimizer_kwargs, device_sizes):
    """:func:`compile_ahead` for this job's model, optimizer and step, given a batch's shapes: the first
    compilation and, where the first batch differs from them, the second are alike but for the shapes."""
    c = cfg.config
    # augment_on="device": the pipeline left the images as decoded; the step augments them (the same ops, per camera),
    # after resizing those it left at their stored size (source.device_sizes).
    augment = stepimages.step_augmenter(c, mesh.devices.flat[0].platform, device_sizes)

    def compile_for(spec) -> Ahead:
        return compile_ahead(
            policy,
            mesh,
            spec,
            init_rng,
            optimizer_kwargs,
            cfg.training.step_fn,
            c.seed,
            augment=augment,
            resizes=bool(device_sizes),
        )

    return compile_for


def _at_model_sizes(example, device_sizes, c):
    """The example batch with the frames the host left at their stored size resized to the model's, as the step
    resizes them (``resize_method``, lanczos3 by default)."""
    from octo_dist.engine import augment as augment_module

    return augment_module.resize_on_host(
        example, device_sizes, c.get("resize_method") or "lanczos3"
    )


def _initial_params(ahead: Ahead, init_rng, example, mesh, pretrained):
    """Fresh parameters from the compiled init on the global example batch, the pretrained ones (where the config
    names a pretrained model) carried over."""
    from octo_dist.policies import gather
    from octo_dist.policies import octo

    params = ahead.init(init_rng, gather.for_from_config(example, mesh))
    if pretrained is not None:
        params = octo.with_pretrained(params, pretrained)
    return params


def save_pretrained(model: Model, model_config: dict, plain: dict, result, out_dir: str) -> None:
    """Octo's own layout too (config.json, example_batch.msgpack, dataset_statistics.json, <step>/default), so
    load_pretrained and the fork's eval scripts read the result. Collective: every process calls it."""
    octo_model = model.policy.model(
        result.state.params,
        model.first_example,
        # "optimizer": what Octo's own checkpoints hold, and what the fork's finetune.py reads in full mode
        # (model.config["optimizer"]["frozen_keys"]: a KeyError without it): this run's, its frozen keys resolved.
        {
            **model_config,
            "window_size": model.window,
            "optimizer": {
                **plain["optimizer"],
                "frozen_keys": list(model.frozen_keys),
            },
        },
    )
    octo_model.save_pretrained(result.end_step, out_dir)
