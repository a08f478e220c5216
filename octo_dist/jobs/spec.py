"""What a job script is rendered from: a validated ``JobSpec``, and the small tables behind its defaults.

Everything here is pure: ``build(...)`` takes plain values (and an ``image_exists`` predicate, so tests need no
image) and either returns a ``JobSpec`` or raises ``JobSpecError`` naming what was found, what was expected and
the fix, before anything is written or submitted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Callable, Optional, Sequence

SCHEDULERS = ("pbs", "sge", "slurm")
WANDB_MODES = ("online", "offline", "disabled")
DEFAULT_STOP_MARGIN_S = 300  # ranks checkpoint this long before the wall time; an Octo checkpoint takes well under it


@dataclasses.dataclass(frozen=True)
class ResourceType:
    scheduler: str
    gpus: int
    about: str


# ABCI resource types: a job asks for N whole nodes of one of these.
RESOURCE_TYPES = {
    "rt_HF": ResourceType("pbs", 8, "ABCI 3.0 full node, 8x H200"),
    "rt_F": ResourceType("sge", 4, "ABCI 2.0 full node, 4x V100 (the seed's)"),
    "rt_AF": ResourceType("sge", 8, "ABCI 2.0 A-node, 8x A100"),
}
DEFAULT_RESOURCE_TYPE = {"pbs": "rt_HF", "sge": "rt_F"}

# Environment modules per scheduler: hpcx provides the mpirun built for ABCI's InfiniBand; ABCI 2.0 needs
# singularitypro for containers (ABCI 3.0 has SingularityCE 4.x without a module). SLURM sites differ: --module.
DEFAULT_MODULES = {"pbs": ("hpcx/2.20",), "sge": ("hpcx/2.12",), "slurm": ()}
IMAGE_MODULES = {"pbs": (), "sge": ("singularitypro",), "slurm": ()}


@dataclasses.dataclass(frozen=True)
class Command:
    """How to start one training program on every rank, and which of its flags carry the job's settings.

    ``program`` is looked up in the venv's ``bin/`` (no container) or on the image's PATH; a flag that is None
    is not passed (the program has no such setting: the script still exports WANDB_MODE, which wandb reads).
    """

    program: tuple
    batch: str            # the GLOBAL batch (examples per step over all ranks)
    steps: str
    save_dir: str
    data_dir: Optional[str]
    wandb_mode: Optional[str]
    resume: Optional[str]
    environment: tuple = ()  # (name, value, why) exported by the script and passed to every rank


# The one place the job's settings meet each program's flag names (issue 7).
COMMANDS = {
    "smoke": Command(("octo-dist", "smoke"), batch="--global-batch", steps="--steps", save_dir="--save-dir",
                     data_dir=None, wandb_mode="--wandb-mode", resume="--resume"),
    "finetune": Command(("python", "scripts/finetune.py"), batch="--config.batch_size", steps="--config.num_steps",
                        save_dir="--config.save_dir", data_dir="--config.dataset_kwargs.data_dir",
                        wandb_mode=None, resume="--resume",
                        environment=(("HF_HUB_OFFLINE", "1", "no download on every rank (compute nodes may be "
                                      "offline): weights and T5 tokenizer from `make weights` on a login node"),)),
}
DEFAULT_COMMAND = "smoke"


class JobSpecError(ValueError):
    """A job that must not be rendered: what was found, what was expected, and the fix."""

    def __init__(self, found: str, expected: str, fix: str):
        super().__init__(f"{found}\n  expected: {expected}\n  fix: {fix}")
        self.found, self.expected, self.fix = found, expected, fix


@dataclasses.dataclass(frozen=True)
class JobSpec:
    scheduler: str
    nodes: int
    gpus_per_node: int
    ranks_per_node: int
    resource_type: Optional[str]   # "rt_HF"; None for SLURM
    walltime_s: int
    group: Optional[str]           # ABCI group (qsub -P / -g) or SLURM account
    name: str
    image: Optional[str]           # a .sif; None runs from ``venv``
    venv: str
    save_dir: str
    data_dir: Optional[str]
    wandb_mode: str
    coordinator: Optional[str]     # "host:port" only when asked; octo-dist agrees one otherwise
    modules: tuple
    stop_margin_s: int
    command: str                   # a key of COMMANDS
    job_args: tuple                # the job's settings as the command's flags: ("--global-batch=64", "--steps=100")
    user_args: tuple               # the training command's own flags, after `--`
    resume: bool                   # pass the command's resume flag (continue from save_dir after a stop)
    global_batch: Optional[int]
    steps: Optional[int]
    command_line: tuple = ()       # the `octo-dist launch ...` argv that rendered it, for the script's header

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


WALLTIME_RE = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d)(?::([0-5]\d))?")


def parse_walltime(text: str) -> int:
    """``"1:30:00"`` / ``"01:30"`` (H:MM) / ``"2-00:00:00"`` (D-H:MM:SS) -> seconds."""
    m = WALLTIME_RE.fullmatch(text.strip())
    if not m or not any(int(g or 0) for g in m.groups()):
        raise JobSpecError(f"--walltime {text!r} is not a wall time",
                           "H:MM:SS, H:MM or D-H:MM:SS, more than zero (e.g. 1:30:00)",
                           "--walltime 1:30:00")
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_walltime(seconds: int) -> str:
    """Seconds -> ``"HH:MM:SS"`` with hours past 24 (``"72:00:00"``), which PBS, SGE and SLURM all accept."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def scaled_steps(steps: int, reference_batch: int, global_batch: int) -> int:
    """Steps that see as many examples at ``global_batch`` as ``steps`` did at ``reference_batch`` (rounded up)."""
    return math.ceil(steps * reference_batch / global_batch)


def _positive(name: str, value: Optional[int], fix: str) -> None:
    if value is not None and value < 1:
        raise JobSpecError(f"{name} {value}", f"{name} of at least 1", fix)


def _flag_given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def build(scheduler: str, *, nodes: int, gpus_per_node: Optional[int] = None, ranks_per_node: Optional[int] = None,
          resource_type: Optional[str] = None, walltime: str = "1:00:00", group: Optional[str] = None,
          name: str = "octo-dist", image: Optional[str] = None, check_image: bool = True, venv: str = ".venv",
          save_dir: str = "runs/octo-dist", data_dir: Optional[str] = None, wandb_mode: str = "offline",
          coordinator: Optional[str] = None, modules: Optional[Sequence[str]] = None,
          stop_margin_s: int = DEFAULT_STOP_MARGIN_S, per_gpu_batch: Optional[int] = None,
          global_batch: Optional[int] = None, steps: Optional[int] = None, keep_samples_from: Optional[int] = None,
          resume: bool = True, train: Sequence[str] = (), command_line: Sequence[str] = (),
          image_exists: Callable[[str], bool] = os.path.isfile) -> JobSpec:
    """A validated JobSpec, or JobSpecError.

    Args:
      train: the training command after ``--``: ``["smoke", "--model", "tiny"]``, ``["finetune", "--config=..."]``;
        empty for the smoke job with its defaults.
      per_gpu_batch / global_batch: one or neither; global = per-GPU x ranks per node x nodes (one rank per GPU).
      steps, keep_samples_from: with ``keep_samples_from=B``, ``steps`` were planned for a global batch of B and
        are scaled so the job sees as many examples at its own global batch.
      check_image: False when the image lives on the cluster, not here (the script checks it at run time).
    """
    if scheduler not in SCHEDULERS:
        raise JobSpecError(f"scheduler {scheduler!r}", f"one of {', '.join(SCHEDULERS)}", "octo-dist launch pbs ...")
    _positive("--nodes", nodes, "--nodes 1 (or more)")

    if scheduler == "slurm":
        if resource_type:
            raise JobSpecError(f"--resource-type {resource_type} for slurm", "none: SLURM has no ABCI resource types",
                               "drop --resource-type and give --gpus-per-node")
        if gpus_per_node is None:
            raise JobSpecError("slurm without --gpus-per-node", "the GPUs of one node (SLURM sites differ)",
                               "--gpus-per-node 8 (or what your nodes have)")
        node_gpus = gpus_per_node
    else:
        resource_type = resource_type or DEFAULT_RESOURCE_TYPE[scheduler]
        rt = RESOURCE_TYPES.get(resource_type)
        if rt is None or rt.scheduler != scheduler:
            known = ", ".join(f"{k} ({v.about})" for k, v in RESOURCE_TYPES.items() if v.scheduler == scheduler)
            raise JobSpecError(f"--resource-type {resource_type} for {scheduler}", f"one of: {known}",
                               f"--resource-type {DEFAULT_RESOURCE_TYPE[scheduler]}")
        node_gpus = rt.gpus
        if gpus_per_node is None:
            gpus_per_node = rt.gpus
        elif gpus_per_node > rt.gpus:
            raise JobSpecError(f"--gpus-per-node {gpus_per_node} on {resource_type}",
                               f"at most {rt.gpus} ({rt.about})", f"--gpus-per-node {rt.gpus}")
    _positive("--gpus-per-node", gpus_per_node, f"--gpus-per-node {node_gpus}")
    ranks_per_node = gpus_per_node if ranks_per_node is None else ranks_per_node
    _positive("--ranks-per-node", ranks_per_node, f"--ranks-per-node {gpus_per_node}")
    if ranks_per_node > gpus_per_node:
        raise JobSpecError(f"--ranks-per-node {ranks_per_node} with --gpus-per-node {gpus_per_node}",
                           "at most one rank per GPU (JAX binds one GPU per process; two ranks on one GPU fail "
                           "or share its memory)", f"--ranks-per-node {gpus_per_node}")

    walltime_s = parse_walltime(walltime)
    if not 0 <= stop_margin_s < walltime_s:
        raise JobSpecError(f"--stop-margin {stop_margin_s} s with --walltime {walltime}",
                           "a margin of 0 s or more, shorter than the wall time (the ranks need time to train)",
                           f"--stop-margin {min(DEFAULT_STOP_MARGIN_S, walltime_s // 10)} or a longer --walltime")

    if scheduler == "pbs" and not group:
        raise JobSpecError("pbs without --group", "your ABCI group (qsub -P): ABCI 3.0 refuses a job without one",
                           "--group gXXXXXXXX")
    for label, value in (("--group", group), ("--name", name)):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise JobSpecError(f"{label} {value!r}", "letters, digits, '_', '.', '-' (it goes into #PBS/#$/#SBATCH lines)",
                               f"{label} {re.sub(r'[^A-Za-z0-9_.-]', '-', value).strip('-') or 'octo-dist'}")
    if wandb_mode not in WANDB_MODES:
        raise JobSpecError(f"--wandb-mode {wandb_mode!r}", f"one of {', '.join(WANDB_MODES)}", "--wandb-mode offline")
    if coordinator is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+:\d{1,5}", coordinator):
        raise JobSpecError(f"--coordinator {coordinator!r}", "HOST:PORT (e.g. g0001:23456)",
                           "drop --coordinator (octo-dist agrees one), or --coordinator g0001:23456")

    if image:
        if check_image:
            if not image_exists(image):
                raise JobSpecError(f"--image {image}: no such file", "a Singularity image (.sif) that exists here",
                                   "build it (make sif), fix the path, or --skip-image-check when it exists "
                                   "only on the cluster")
            image = os.path.abspath(image)  # the job runs from another directory than the one it was rendered in

    # The training command and the job settings it gets through COMMANDS.
    train = list(train) or [DEFAULT_COMMAND]
    command_name, user_args = train[0], train[1:]
    if command_name not in COMMANDS:
        raise JobSpecError(f"training command {command_name!r} after --", f"one of {', '.join(COMMANDS)}",
                           "-- smoke --model tiny   or   -- finetune --config.pretrained_path=hf://rail-berkeley/octo-small")
    cmd = COMMANDS[command_name]
    if data_dir and not cmd.data_dir:
        raise JobSpecError(f"--data-dir with {command_name}", f"no --data-dir: {command_name} reads no dataset",
                           "drop --data-dir")

    _positive("--per-gpu-batch", per_gpu_batch, "--per-gpu-batch 32")
    _positive("--global-batch", global_batch, "--global-batch 256")
    _positive("--steps", steps, "--steps 1000")
    _positive("--keep-samples-from", keep_samples_from, "--keep-samples-from 256")
    ranks = nodes * ranks_per_node
    if per_gpu_batch is not None and global_batch is not None:
        raise JobSpecError(f"--per-gpu-batch {per_gpu_batch} and --global-batch {global_batch}", "one of them",
                           f"--per-gpu-batch {per_gpu_batch} alone (global = {per_gpu_batch * ranks})")
    if per_gpu_batch is not None:
        global_batch = per_gpu_batch * ranks
    if global_batch is not None and global_batch % ranks:
        lower, upper = global_batch // ranks * ranks, (global_batch // ranks + 1) * ranks
        raise JobSpecError(f"--global-batch {global_batch} over {ranks} GPU(s) ({nodes} node(s) x {ranks_per_node})",
                           f"a multiple of {ranks}: every GPU gets the same share",
                           f"--global-batch {upper}" + (f" (or {lower})" if lower else "")
                           + f", or --per-gpu-batch {max(global_batch // ranks, 1)}")
    if keep_samples_from is not None:
        if steps is None or global_batch is None:
            raise JobSpecError("--keep-samples-from without --steps and a batch",
                               "--steps N (planned for that global batch) and --per-gpu-batch or --global-batch",
                               "--steps 50000 --keep-samples-from 256 --per-gpu-batch 32")
        steps = scaled_steps(steps, keep_samples_from, global_batch)

    mapped = []
    if global_batch is not None:
        mapped.append(f"{cmd.batch}={global_batch}")
    if steps is not None:
        mapped.append(f"{cmd.steps}={steps}")
    if cmd.wandb_mode:
        mapped.append(f"{cmd.wandb_mode}={wandb_mode}")
    for flag in mapped:
        flag_name = flag.split("=", 1)[0]
        if _flag_given(user_args, flag_name):
            raise JobSpecError(f"{flag_name} after -- while octo-dist launch sets it ({flag})", "each setting given once",
                               f"drop {flag_name} after --")
    for flag in (cmd.save_dir, cmd.data_dir, cmd.resume):
        if flag and _flag_given(user_args, flag):
            raise JobSpecError(f"{flag} after --", "the job's directories and resumption set by octo-dist launch "
                               "(they are bound into the container and created by the script)",
                               f"drop {flag} after -- and use launch's own option (--save-dir, --data-dir, --no-resume)")

    return JobSpec(
        scheduler=scheduler, nodes=nodes, gpus_per_node=gpus_per_node, ranks_per_node=ranks_per_node,
        resource_type=resource_type if scheduler != "slurm" else None, walltime_s=walltime_s, group=group, name=name,
        image=image or None, venv=venv, save_dir=save_dir, data_dir=data_dir, wandb_mode=wandb_mode,
        coordinator=coordinator,
        modules=tuple(modules) if modules is not None else DEFAULT_MODULES[scheduler] + (IMAGE_MODULES[scheduler] if image else ()),
        stop_margin_s=stop_margin_s, command=command_name,
        job_args=tuple(mapped), user_args=tuple(user_args), resume=bool(resume and cmd.resume),
        global_batch=global_batch, steps=steps, command_line=tuple(command_line))
