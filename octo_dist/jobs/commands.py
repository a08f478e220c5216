"""The training programs a job runs on every rank, and which of their flags carry the job's settings.

The one place the job's settings meet each program's flag names (``COMMANDS``); ``render`` builds the ranks' argv
from it, ``spec.build`` checks that the user's own flags after ``--`` do not set the same things twice.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Optional, Sequence, Tuple

# Exported variables with these prefixes reach every rank on every node (Open MPI's -x takes names, not patterns;
# srun passes the whole environment). UCX_ tunes hpcx's transport and must match across nodes. Not CUDA_: the
# scheduler sets CUDA_VISIBLE_DEVICES per node (a shared rt_HG node), and node 0's value is wrong elsewhere.
# Not "TF_": Terraform owns much of it (TF_CLI_CONFIG_FILE, TF_LOG, TF_VAR_region, TF_DATA_DIR), so TensorFlow's
# own names are listed (TF_CPP_MIN_LOG_LEVEL and its siblings by their TF_CPP_ prefix).
FORWARD_PREFIXES = ("NCCL_", "XLA_", "JAX_", "TF_CPP_", "OCTO_DIST_", "HF_", "WANDB_", "UCX_")
TENSORFLOW_NAMES = (
    "TF_ENABLE_ONEDNN_OPTS",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "TF_GPU_ALLOCATOR",
    "TF_GPU_THREAD_COUNT",
    "TF_GPU_THREAD_MODE",
    "TF_NUM_INTEROP_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_DETERMINISTIC_OPS",
    "TF_XLA_FLAGS",
)
FORWARD_NAMES = ("COORDINATOR_ADDRESS", "PYTHONUNBUFFERED", *TENSORFLOW_NAMES)
# What every rank runs before training, under the job's launcher: it fails the job before any GPU time is spent.
PREFLIGHT = ("octo-dist", "check-env", "--launch")


# The job's directories: the script passes them as "@{save_dir}", which the runtime makes absolute on the node.
PATH_SETTINGS = ("save_dir", "data_dir", "compile_cache")
# Settings launch always decides for every rank: refused after `--` even when launch leaves them at the program's
# own default ("--devices-per-process" sizes the ranks and the batch).
ALWAYS_LAUNCHS = (*PATH_SETTINGS, "devices_per_rank")


@dataclasses.dataclass(frozen=True)
class Command:
    """How to start one training program on every rank, and which of its flags carry the job's settings.

    ``program`` is looked up in the venv's ``bin/`` (no container) or on the image's PATH. ``flags`` maps a
    launch setting (a field of ``LaunchOptions``, or what launch derives from them: ``global_batch``, ``steps``,
    ``devices_per_rank``) to the program's flag for it, in the order they are passed; a setting the program has
    no flag for is not in it (the script still exports WANDB_MODE, which wandb reads), and one left unset is not
    passed (the program's own default). A new launch setting that reaches training is one ``LaunchOptions``
    field and one entry here per program.
    """

    program: tuple
    flags: Mapping[
        str, str
    ]  # {"global_batch": "--global-batch", "steps": "--steps", "save_dir": ...}
    resume: Optional[str]  # passed alone: continue from the save directory after a stop
    environment: tuple = ()  # (name, value, why) exported by the script and passed to every rank

    @property
    def devices(self) -> str:
        """The flag for the GPUs each rank binds: ``"--devices-per-process"``, given when more than one."""
        return self.flags["devices_per_rank"]


# The one place the job's settings meet each program's flag names.
COMMANDS = {
    "smoke": Command(
        ("octo-dist", "smoke"),
        flags={
            "global_batch": "--global-batch",  # the GLOBAL batch (examples per step over all ranks)
            "steps": "--steps",
            "wandb_mode": "--wandb-mode",
            "devices_per_rank": "--devices-per-process",
            "save_dir": "--save-dir",
            "compile_cache": "--compile-cache",
        },
        resume="--resume",
    ),
    "finetune": Command(
        ("octo-dist", "finetune"),
        flags={
            "global_batch": "--config.batch_size",
            "steps": "--config.num_steps",
            "devices_per_rank": "--devices-per-process",
            "save_dir": "--config.save_dir",
            "data_dir": "--config.dataset_kwargs.data_dir",
            "compile_cache": "--compile_cache",
        },
        resume="--resume",
        environment=(
            (
                "HF_HUB_OFFLINE",
                "1",
                "no download on every rank (compute nodes may be "
                "offline): weights and T5 tokenizer from `make weights` on a login node",
            ),
        ),
    ),
}
DEFAULT_COMMAND = "smoke"

# A checker for a training command's arguments: raises ValueError (one line naming the bad flag and the closest
# valid one) when the program would refuse them; a flag it does not know reads "unknown flag --stepz[, did you mean
# --steps?]" (launch reads that name back to tell a launch flag given after -- apart). Supplied by the caller, so
# jobs/ never imports the applications.
Checker = Callable[[Sequence[str]], None]


def config_file_first(args: Sequence[str]) -> Tuple[list, list]:
    """(the config file's flag, the rest): ml_collections refuses ``--config.save_dir=...`` before ``--config=FILE``
    ("Found --config.save_dir in argv before a value for --config was specified"), and the job's own
    ``--config.<field>`` settings come before the user's flags, so ``--config=`` / ``--config FILE`` go first."""
    first, rest, i = [], [], 0
    args = list(args)
    while i < len(args):
        if args[i].startswith("--config="):
            first.append(args[i])
        elif args[i] == "--config" and i + 1 < len(args):
            first += args[i : i + 2]
            i += 1
        else:
            rest.append(args[i])
        i += 1
    return first, rest


# Start-up flags every training program reads (runtime.argv_options) that a job decides for all its ranks: each
# rank detects the scheduler's launcher, and the coordinator is agreed, or given by launch's own --coordinator
# (checked there). After `--` they would bypass that: "--launcher single" makes every rank train alone,
# "--coordinator g0001:99999" is a port no rank can use.
JOB_DECIDES = {
    "--launcher": "drop --launcher after --: every rank detects the scheduler's launcher",
    "--coordinator": "drop --coordinator after --, and give launch's own --coordinator HOST:PORT before --",
}


def job_decides(user_args: Sequence[str]) -> Optional[Tuple[str, str, str]]:
    """``(found, expected, fix)`` for the first start-up flag after ``--`` that the job decides
    (``["--steps=5", "--launcher", "single"]`` -> ``("--launcher single after --", ...)``), else None."""
    for i, arg in enumerate(user_args):
        flag, eq, value = arg.partition("=")
        if flag in JOB_DECIDES:
            value = value if eq else (user_args[i + 1] if i + 1 < len(user_args) else "")
            return (
                f"{flag} {value} after --".replace("  ", " "),
                "the ranks' launcher and coordinator decided by the job for every rank",
                JOB_DECIDES[flag],
            )
    return None
