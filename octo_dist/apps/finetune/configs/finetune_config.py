"""octo-dist's default fine-tune config, modelled on the fork's scripts/configs/finetune_config.py (TMats/octo).

    octo-dist finetune --config=finetune_config.py:<mode>,<modality>
        mode: full | head_only | head_mlp_only; modality: image_conditioned | language_conditioned | multimodal

Every field can be overridden on the command line (--config.batch_size=128). Differences from the fork:
``batch_size`` is the GLOBAL batch over all processes (each process reads batch_size / processes examples);
``dataset_kwargs.data_dir`` defaults to ``data`` (the job scripts' --data-dir); ``model_config`` (unused here)
lets a config build a model from scratch instead of ``pretrained_path`` (see finetune_smoke_config.py);
``augment_on`` (``"auto"``: ``"device"`` on GPUs, ``"host"`` as the fork on the CPU) says where
``image_augment_kwargs`` are applied.
Config files load without Octo: module specs are written as the plain dicts ModuleSpec.create returns.
"""

from ml_collections import ConfigDict
from ml_collections.config_dict import FieldReference, placeholder

from octo_dist.apps.finetune.modelconfig import frozen_keys, parse_mode
from octo_dist.policies.octo_spec import module_spec


def get_config(config_string="full,multimodal"):
    mode, task = parse_mode(config_string)

    max_steps = FieldReference(50000)
    window_size = FieldReference(default=1)

    config = dict(
        pretrained_path=placeholder(
            str
        ),  # a local dir from `make weights` (weights/octo-small), or hf://...
        pretrained_step=placeholder(int),
        model_config=None,
        batch_size=256,  # global: over every process
        shuffle_buffer_size=10000,  # per process
        num_steps=max_steps,
        log_interval=100,
        eval_interval=5000,  # kept for the fork's configs; octo-dist does not run its eval callbacks
        save_interval=5000,
        save_dir=placeholder(str),
        seed=42,
        wandb=dict(project="octo_finetune", group=placeholder(str), entity=placeholder(str)),
        dataset_kwargs=dataset_kwargs(),
        modality=task,
        finetuning_mode=mode,
        window_size=window_size,
        optimizer=optimizer(warmup_steps=2000, decay_steps=max_steps, frozen=frozen_keys(mode)),
        val_kwargs=dict(val_shuffle_buffer_size=1000, num_val_batches=16),
        viz_kwargs=dict(
            eval_batch_size=128, trajs_for_metrics=100, trajs_for_viz=8, samples_per_state=8
        ),
    )

    # Where these run: "device" on the accelerator, ahead of each train step, on each device's share of the batch
    # (the host only decodes and batches); "host" in the fork's tf.data pipeline (TensorFlow on the CPU, per frame);
    # "auto": "device" on GPUs and TPUs, "host" where JAX runs on the CPU (whose device is the host's cores).
    config["augment_on"] = "auto"
    # Where a resize remains (an image stored at another size than resize_size): "lanczos3" as the fork, or
    # "bilinear", about 3x cheaper per image and slightly softer. A resize to the size an image has is skipped.
    config["resize_method"] = "lanczos3"
    config["frame_transform_threads"] = 16  # kept from the fork (unused by make_single_dataset)
    config["traj_transform_kwargs"] = _traj_transform_kwargs(task, window_size)
    config["frame_transform_kwargs"] = _frame_transform_kwargs()
    return ConfigDict(config)


def optimizer(warmup_steps: int, decay_steps, frozen) -> dict:
    """The fork's optimizer settings (``create_optimizer``'s keywords): a cosine learning rate from 0 up to 3e-4
    over ``warmup_steps`` and back to 0 at ``decay_steps`` (a FieldReference to num_steps, so that
    --config.num_steps moves it too), weight decay 0.01, gradients clipped at 1.0; ``frozen``: the frozen keys.
    The smoke config's too (finetune_smoke_config.py), at its own warm-up and steps."""
    return dict(
        learning_rate=dict(
            name="cosine",
            init_value=0.0,
            peak_value=3e-4,
            warmup_steps=warmup_steps,
            decay_steps=decay_steps,
            end_value=0.0,
        ),
        weight_decay=0.01,
        clip_gradient=1.0,
        frozen_keys=frozen,
        grad_accumulation_steps=None,  # if you use grad accumulation, adjust max_steps accordingly
    )


def dataset_kwargs() -> dict:
    """The dataset: the fork's bridge example (the smoke config's synthetic data has its layout too)."""
    # Fill this in for your own dataset! As in the fork: two image keys, the third-person view ("primary") and the
    # wrist view ("wrist", None if not used).
    return {
        "name": "bridge_dataset",
        "data_dir": "data",
        "image_obs_keys": {"primary": "image_0", "wrist": None},
        "proprio_obs_key": "proprio",
        "language_key": "language_instruction",
        "action_proprio_normalization_type": "normal",
        # We want to avoid normalizing the gripper
        "action_normalization_mask": [True, True, True, True, True, True, False],
        # standardize_fn is loaded by name, e.g. "my_package.transforms:my_dataset_transform"
        "standardize_fn": module_spec(
            "octo.data.oxe.oxe_standardization_transforms:bridge_dataset_transform"
        ),
        # If the default data loading speed is too slow, try these:
        # "num_parallel_reads": 8,  # for reading from disk / GCS
        # "num_parallel_calls": 16,  # for initial dataset construction
    }


def _traj_transform_kwargs(task: str, window_size) -> dict:
    """Goal relabelling and task dropping for the modality."""
    if task == "image_conditioned":
        goal_relabeling_strategy = "uniform"
        keep_image_prob = 1.0
    elif task == "language_conditioned":
        goal_relabeling_strategy = None
        keep_image_prob = 0.0
    else:  # multimodal
        goal_relabeling_strategy = "uniform"
        keep_image_prob = 0.5

    return dict(
        window_size=window_size,
        action_horizon=4,
        goal_relabeling_strategy=goal_relabeling_strategy,
        task_augment_strategy="delete_task_conditioning",
        task_augment_kwargs=dict(keep_image_prob=keep_image_prob),
    )


def _frame_transform_kwargs() -> dict:
    """Image sizes and the augmentations of each camera."""
    workspace_augment_kwargs = dict(
        random_resized_crop=dict(scale=[0.8, 1.0], ratio=[0.9, 1.1]),
        random_brightness=[0.1],
        random_contrast=[0.9, 1.1],
        random_saturation=[0.9, 1.1],
        random_hue=[0.05],
        augment_order=[
            "random_resized_crop",
            "random_brightness",
            "random_contrast",
            "random_saturation",
            "random_hue",
        ],
    )
    wrist_augment_kwargs = dict(
        random_brightness=[0.1],
        random_contrast=[0.9, 1.1],
        random_saturation=[0.9, 1.1],
        random_hue=[0.05],
        augment_order=["random_brightness", "random_contrast", "random_saturation", "random_hue"],
    )
    return dict(
        resize_size={
            "primary": (256, 256),  # workspace (3rd person) camera is at 256x256
            "wrist": (128, 128),  # wrist camera is at 128x128
        },
        image_augment_kwargs=dict(primary=workspace_augment_kwargs, wrist=wrist_augment_kwargs),
    )
