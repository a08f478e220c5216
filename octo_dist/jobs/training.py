"""The training command every rank runs: which program, the job's settings as its flags (``COMMANDS``), the
user's own flags after ``--``, checked by the program's own parser (``checkers``) without importing it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple

from octo_dist.jobs import schedulers
from octo_dist.jobs.allocation import Placement
from octo_dist.jobs.commands import (
    COMMANDS,
    DEFAULT_COMMAND,
    PATH_SETTINGS,
    Checker,
    Command,
    config_file_first,
)
from octo_dist.jobs.flagchecks import JobSpecError, flag_given
from octo_dist.jobs.options import LaunchOptions, flag_of, option_fields


def scaled_steps(steps: int, reference_batch: int, global_batch: int) -> int:
    """Steps that see as many examples at ``global_batch`` as ``steps`` did at ``reference_batch`` (rounded up)."""
    return math.ceil(steps * reference_batch / global_batch)


class Training(NamedTuple):
    """The training command and the job settings it gets through its flags (``COMMANDS``)."""

    command: str
    lead_args: tuple
    user_args: tuple
    job_args: tuple  # ("--global-batch=64", "--steps=100")
    global_batch: Optional[int]
    steps: Optional[int]
    resume: bool
    argv: (
        tuple  # what every rank runs, the directories as "@{save_dir}": ("octo-dist", "smoke", ...)
    )


def _batch_and_steps(
    o: LaunchOptions, gpus: int, nodes_x_gpus: str
) -> Tuple[Optional[int], Optional[int]]:
    """(global batch, steps): the batch counted in GPUs, not ranks (a rank with 2 GPUs takes 2 GPUs' share); each
    within its bound already (``options.check_bounds``)."""
    global_batch, steps = o.global_batch, o.steps
    if o.per_gpu_batch is not None and global_batch is not None:
        raise JobSpecError(
            f"--per-gpu-batch {o.per_gpu_batch} and --global-batch {global_batch}",
            "one of them",
            f"--per-gpu-batch {o.per_gpu_batch} alone (global = {o.per_gpu_batch * gpus})",
        )
    if o.per_gpu_batch is not None:
        global_batch = o.per_gpu_batch * gpus
    if global_batch is not None and global_batch % gpus:
        lower, upper = global_batch // gpus * gpus, (global_batch // gpus + 1) * gpus
        raise JobSpecError(
            f"--global-batch {global_batch} over {gpus} GPU(s) ({nodes_x_gpus})",
            f"a multiple of {gpus}, so every GPU gets the same share",
            f"--global-batch {upper}"
            + (f" (or {lower})" if lower else "")
            + f", or --per-gpu-batch {max(global_batch // gpus, 1)}",
        )
    if o.keep_samples_from is not None:
        if steps is None or global_batch is None:
            raise JobSpecError(
                "--keep-samples-from without --steps and a batch",
                "--steps N (planned for that global batch) and --per-gpu-batch or --global-batch",
                "--steps 50000 --keep-samples-from 256 --per-gpu-batch 32",
            )
        steps = scaled_steps(steps, o.keep_samples_from, global_batch)
    return global_batch, steps


def training(o: LaunchOptions, alloc: Placement, checkers: Mapping[str, Checker]) -> Training:
    train = list(o.train) or [DEFAULT_COMMAND]
    command_name, user_args = train[0], train[1:]
    lead_args, user_args = config_file_first(user_args)
    if command_name not in COMMANDS:
        raise JobSpecError(
            f"training command {command_name!r} after --",
            f"one of {', '.join(COMMANDS)}",
            "-- smoke --model tiny   or   -- finetune --config.pretrained_path=hf://rail-berkeley/octo-small",
        )
    cmd = COMMANDS[command_name]
    if o.data_dir and "data_dir" not in cmd.flags:
        raise JobSpecError(
            f"--data-dir with {command_name}",
            f"no --data-dir: {command_name} reads no dataset",
            "drop --data-dir",
        )
    gpus = o.nodes * alloc.gpus_per_node
    global_batch, steps = _batch_and_steps(o, gpus, f"{o.nodes} node(s) x {alloc.gpus_per_node}")
    values = {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    devices = (
        alloc.devices_per_rank if alloc.devices_per_rank > 1 else None
    )  # 1: the programs' default
    values.update(global_batch=global_batch, steps=steps, devices_per_rank=devices)
    given = {s: values.get(s) for s in cmd.flags if values.get(s) not in (None, "", False)}
    job_args = [f"{cmd.flags[s]}={v}" for s, v in given.items() if s not in PATH_SETTINGS]
    check_not_given_twice(cmd, job_args, user_args)
    resume = bool(o.resume and cmd.resume)
    tail = [*user_args, *([cmd.resume] if resume else [])]
    checker = checkers.get(command_name)
    if checker is not None:
        try:
            checker([*lead_args, *job_args, *_path_args(cmd, given, placeholders=False), *tail])
        except ValueError as e:
            refuse_launch_flags(o, user_args, command_name, str(e))
            raise JobSpecError(
                f"-- {command_name}: {e}",
                f"flags that octo-dist {command_name} accepts",
                f"octo-dist {command_name} --help lists them",
            ) from None
    argv = (*cmd.program, *lead_args, *job_args, *_path_args(cmd, given, placeholders=True), *tail)
    return Training(
        command_name,
        tuple(lead_args),
        tuple(user_args),
        tuple(job_args),
        global_batch,
        steps,
        resume,
        argv,
    )


def _path_args(cmd: Command, given: Mapping[str, object], placeholders: bool) -> list:
    """The job's directories as the program's flags: ``--save-dir=@{save_dir}`` in the script (the runtime makes
    them absolute on the node), ``--save-dir=runs/x`` for the render-time check."""
    return [
        f"{cmd.flags[s]}=" + (f"@{{{s}}}" if placeholders else str(given[s]))
        for s in PATH_SETTINGS
        if s in given
    ]


def check_not_given_twice(cmd: Command, job_args: Sequence[str], user_args: Sequence[str]) -> None:
    """The training command's own flags after ``--`` must not set what launch sets."""
    for flag in job_args:
        flag_name = flag.split("=", 1)[0]
        if flag_given(user_args, flag_name):
            raise JobSpecError(
                f"{flag_name} after -- while octo-dist launch sets it ({flag})",
                "each setting given once",
                f"drop {flag_name} after --",
            )
    for flag in (*(cmd.flags.get(s) for s in PATH_SETTINGS), cmd.resume):
        if flag and flag_given(user_args, flag):
            raise JobSpecError(
                f"{flag} after --",
                "the job's directories and resumption set by octo-dist launch "
                "(they are bound into the image and created by the script)",
                f"drop {flag} after -- and use launch's own option (--save-dir, --data-dir, "
                f"--compile-cache, --no-resume)",
            )
    if flag_given(user_args, cmd.devices):
        raise JobSpecError(
            f"{cmd.devices} after --",
            "the GPUs of each rank set by octo-dist launch, which also sizes the ranks and the batch",
            f"drop {cmd.devices} after -- and use --devices-per-process",
        )


def refuse_launch_flags(
    o: LaunchOptions, user_args: Sequence[str], command_name: str, refusal: str
) -> None:
    """A flag of launch's own given after ``--`` (``-- finetune -o job.sh``): say where it belongs.

    Only when the command itself called that flag unknown (its checker's "unknown flag -o"): smoke's own
    ``--steps -5`` is smoke's refusal to report, though launch has a ``--steps`` too."""
    unknown = re.match(r"unknown flag (\S+?)(?:=\S*)?(?:,|$)", refusal)
    if unknown is None:
        return
    own = {flag_of(f, o.scheduler) for f in option_fields()} | {
        "--" + f.name.replace("_", "-") for f in option_fields()
    }
    own |= {opt.option for opt in schedulers.get(o.scheduler).options}
    # Compared without dashes: absl names the -o it refused "--o".
    name = unknown.group(1).lstrip("-")
    if name not in {f.lstrip("-") for f in own}:
        return
    for i, arg in enumerate(user_args):
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and flag.lstrip("-") == name:
            value = user_args[i + 1] if i + 1 < len(user_args) and "=" not in arg else ""
            arg = f"{arg} {value}" if value and not value.startswith("-") else arg
            raise JobSpecError(
                f"{flag} after -- {command_name}: it is octo-dist launch's, and {command_name} has no such flag",
                "launch's flags before --, the training command's after it",
                f"octo-dist launch {o.scheduler} ... {arg} -- {command_name} ...",
            )


def pretrained_bind(train: Training) -> Tuple[str, ...]:
    """The fine-tune's pretrained checkpoint directory, bound into the image as ``--data-dir`` is (it may lie outside
    the submit directory, which singularity binds by itself): ``--config.pretrained_path=/groups/g/weights/octo-small``
    -> ``("/groups/g/weights/octo-small",)``; () for a URL (``hf://...``) or none given."""
    path = None
    for arg in (*train.lead_args, *train.user_args):
        if arg.startswith("--config.pretrained_path="):
            path = arg.partition("=")[2]
    return (path,) if path and "://" not in path else ()
