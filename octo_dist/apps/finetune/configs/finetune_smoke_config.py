"""The real Octo path at toy size: a tiny Octo from config (no pretrained weights, nothing downloaded) fine-tuned on
the synthetic RLDS dataset (`make synthetic-data` writes it to runs/synthetic_rlds).

    make synthetic-data
    mpirun -np 2 octo-dist finetune --config=finetune_smoke_config.py --debug --config.num_steps=3
    mpirun -np 2 octo-dist finetune --config=finetune_smoke_config.py --debug --resume
                                                        # continues from the step-3 checkpoint to step 6

Same fields as finetune_config.py, so the same overrides work.
"""

from ml_collections import ConfigDict
from ml_collections.config_dict import FieldReference, placeholder

from octo_dist.apps.finetune.configs import finetune_config
from octo_dist.policies.octo_spec import tiny_model_config

ACTION_HORIZON, ACTION_DIM = 4, 7


def get_config(config_string="full"):
    num_steps = FieldReference(
        6
    )  # the learning-rate schedule's decay_steps follows --config.num_steps
    config = dict(
        pretrained_path=placeholder(str),
        pretrained_step=placeholder(int),
        # What OctoModel.from_config gets instead of a pretrained model's config.json.
        model_config=dict(model=tiny_model_config(ACTION_HORIZON, ACTION_DIM), text_processor=None),
        batch_size=8,
        shuffle_buffer_size=64,
        num_steps=num_steps,
        log_interval=1,
        eval_interval=1000,
        save_interval=3,
        save_dir="runs/finetune-smoke",
        seed=42,
        wandb=dict(project="octo_finetune_smoke", group=placeholder(str), entity=placeholder(str)),
        dataset_kwargs=_dataset_kwargs(),
        modality="image_conditioned",
        finetuning_mode=config_string,
        window_size=2,
        # The default config's optimizer, warmed up in one step; frozen_keys None: finetuning_mode decides them.
        optimizer=finetune_config.optimizer(warmup_steps=1, decay_steps=num_steps, frozen=None),
        traj_transform_kwargs=_traj_transform_kwargs(),
        # image_augment_kwargs applied on the device ("host": in tf.data, as the fork; "auto": device on GPUs)
        augment_on="auto",
        resize_method="lanczos3",  # where a resize remains ("bilinear": cheaper, softer)
        frame_transform_kwargs=_frame_transform_kwargs(),
    )
    return ConfigDict(config)


def _dataset_kwargs() -> dict:
    """The default config's dataset in Bridge's layout (the fork's own Bridge transform reads it), but the synthetic
    one, with its one camera, read by one thread."""
    return {
        **finetune_config.dataset_kwargs(),
        "name": "octo_dist_synthetic",
        "data_dir": "runs/synthetic_rlds",
        "image_obs_keys": {"primary": "image_0"},
        "num_parallel_reads": 1,
        "num_parallel_calls": 1,
    }


def _traj_transform_kwargs() -> dict:
    """A window of 2 frames, goals relabelled, the task's language always dropped (image-conditioned)."""
    return dict(
        window_size=2,
        action_horizon=ACTION_HORIZON,
        goal_relabeling_strategy="uniform",
        task_augment_strategy="delete_task_conditioning",
        task_augment_kwargs=dict(keep_image_prob=1.0),
        num_parallel_calls=1,
    )


def _frame_transform_kwargs() -> dict:
    """One 64x64 camera, its brightness augmented."""
    return dict(
        resize_size={"primary": (64, 64)},
        image_augment_kwargs=dict(
            primary=dict(random_brightness=[0.1], augment_order=["random_brightness"])
        ),
        num_parallel_calls=1,
    )
