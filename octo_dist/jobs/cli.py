"""``octo-dist launch {pbs,sge,slurm}``: render a job script; ``--dry-run`` prints it, ``-o FILE`` writes it."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Sequence

from octo_dist.jobs import spec as spec_mod
from octo_dist.jobs.render import render

EXIT_USAGE = 2
SUBMIT = {"pbs": "qsub {file}", "sge": "qsub -g {group} {file}", "slurm": "sbatch {file}"}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "launch", help="render a job script for PBS (ABCI 3.0), SGE (ABCI 2.0) or SLURM",
        description="Render a complete job script: modules, one rank per GPU, the scheduler's node list, the container, "
                    "a preflight (octo-dist check-env --launch) and a checkpoint before the wall time. Bad choices are "
                    "refused (exit 2) before anything is written. The training command follows `--` "
                    "(default: the smoke job): -- smoke --model tiny | -- finetune --config.pretrained_path=...")
    # One sub-parser per scheduler, so that the training command after `--` is the only positional: argparse would
    # otherwise fill an optional positional with nothing as soon as it meets the scheduler's name.
    schedulers = p.add_subparsers(dest="scheduler", metavar="{pbs,sge,slurm}", required=True)
    common = _options()
    for name, about in SCHEDULER_HELP.items():
        sp = schedulers.add_parser(name, parents=[common], help=about, description=p.description,
                                   usage=f"octo-dist launch {name} [options] [-- {{smoke,finetune}} [ARGS...]]")
        sp.add_argument("train", nargs="*", metavar="-- COMMAND ARGS",
                        help="the training command after --: smoke (default) or finetune, then its own flags")
        sp.set_defaults(func=run, launch_parser=sp)
    return p


SCHEDULER_HELP = {"pbs": "ABCI 3.0 (PBS Professional, rt_HF: 8x H200)",
                  "sge": "ABCI 2.0 (Grid Engine, rt_F: 4x V100; the seed's flow)",
                  "slurm": "SLURM clusters"}


def _options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("resources")
    g.add_argument("--nodes", type=int, required=True)
    g.add_argument("--resource-type", help="ABCI resource type: " + ", ".join(
        f"{k} ({v.scheduler}, {v.gpus} GPUs)" for k, v in spec_mod.RESOURCE_TYPES.items())
        + "; default rt_HF for pbs, rt_F for sge")
    g.add_argument("--gpus-per-node", type=int, help="default: the resource type's GPUs (required for slurm)")
    g.add_argument("--ranks-per-node", type=int, help="default: one per GPU")
    g.add_argument("--walltime", default="1:00:00", help="H:MM:SS, H:MM or D-H:MM:SS (default 1:00:00)")
    g.add_argument("--group", help="ABCI group (qsub -P on ABCI 3.0, -g on ABCI 2.0) or SLURM account")
    g.add_argument("--name", default="octo-dist", help="job name")
    g.add_argument("--module", dest="modules", action="append",
                   help="module to load (repeatable; replaces the defaults: hpcx/2.20 on pbs, hpcx/2.12 on sge)")
    e = p.add_argument_group("environment")
    e.add_argument("--image", help="Singularity image (.sif) every rank runs in (default: none, run from --venv)")
    e.add_argument("--skip-image-check", action="store_true",
                   help="the image exists only on the cluster: do not check it here (the script checks at run time)")
    e.add_argument("--venv", default=".venv", help="environment to run from without an image (default .venv)")
    e.add_argument("--coordinator", help="HOST:PORT to force (default: octo-dist agrees one at start-up)")
    t = p.add_argument_group("training")
    t.add_argument("--per-gpu-batch", type=int, help="examples per GPU per step; global batch = this x GPUs x nodes")
    t.add_argument("--global-batch", type=int, help="examples per step over all GPUs (must divide by their number)")
    t.add_argument("--steps", type=int, help="optimizer steps")
    t.add_argument("--keep-samples-from", type=int, metavar="BATCH",
                   help="--steps were planned for this global batch: scale them to see as many examples")
    t.add_argument("--save-dir", default="runs/octo-dist", help="checkpoint directory, bound into the container")
    t.add_argument("--data-dir", help="dataset directory (finetune), bound into the container")
    t.add_argument("--wandb-mode", choices=spec_mod.WANDB_MODES, default="offline",
                   help="online needs WANDB_API_KEY or a key file only you can read (default offline)")
    t.add_argument("--no-resume", dest="resume", action="store_false",
                   help="do not pass the command's resume flag (default: resume from --save-dir when it has one)")
    t.add_argument("--stop-margin", type=int, default=spec_mod.DEFAULT_STOP_MARGIN_S, metavar="SECONDS",
                   help=f"ask the ranks to checkpoint and stop this long before the wall time "
                        f"(default {spec_mod.DEFAULT_STOP_MARGIN_S})")
    o = p.add_argument_group("output")
    o.add_argument("--dry-run", action="store_true", help="print the script instead of writing it")
    o.add_argument("-o", "--output", help="file to write (default: octo-dist-SCHEDULER.sh)")
    return p


# Namespace entries that are not launch options, and the options whose flag is not --<dest>.
NOT_OPTIONS = ("scheduler", "train", "func", "launch_parser", "dry_run", "output", "command")
FLAGS = {"modules": "--module", "resume": "--no-resume"}


def command_line(args: argparse.Namespace) -> list:
    """The canonical ``octo-dist launch ...`` for these arguments (non-default options only), for the header."""
    out = ["octo-dist", "launch", args.scheduler]
    for dest, value in vars(args).items():
        if dest in NOT_OPTIONS or value == args.launch_parser.get_default(dest):
            continue
        flag = FLAGS.get(dest, "--" + dest.replace("_", "-"))
        if isinstance(value, bool):
            out.append(flag)
        else:
            for v in value if isinstance(value, list) else [value]:
                out += [flag, str(v)]
    return out + (["--", *args.train] if args.train else [])


def spec_from_args(args: argparse.Namespace) -> spec_mod.JobSpec:
    return spec_mod.build(
        args.scheduler, nodes=args.nodes, gpus_per_node=args.gpus_per_node, ranks_per_node=args.ranks_per_node,
        resource_type=args.resource_type, walltime=args.walltime, group=args.group, name=args.name, image=args.image,
        check_image=not args.skip_image_check, venv=args.venv, save_dir=args.save_dir, data_dir=args.data_dir,
        wandb_mode=args.wandb_mode, coordinator=args.coordinator, modules=args.modules, stop_margin_s=args.stop_margin,
        per_gpu_batch=args.per_gpu_batch, global_batch=args.global_batch, steps=args.steps,
        keep_samples_from=args.keep_samples_from, resume=args.resume, train=args.train,
        command_line=command_line(args))


def parse(argv: Sequence[str]) -> spec_mod.JobSpec:
    """``octo-dist launch`` argv (without "launch") -> JobSpec; for the examples and tests."""
    parser = argparse.ArgumentParser(prog="octo-dist")
    add_parser(parser.add_subparsers())
    return spec_from_args(parser.parse_args(["launch", *argv]))


def run(args: argparse.Namespace) -> int:
    try:
        job = spec_from_args(args)
    except spec_mod.JobSpecError as e:
        print(f"octo-dist launch: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = args.output or f"octo-dist-{job.scheduler}.sh"
    text = render(job, os.path.basename(out))
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    with open(out, "w") as f:
        f.write(text)
    os.chmod(out, 0o755)
    submit = SUBMIT[job.scheduler].format(file=shlex.quote(out), group=job.group or "GROUP")
    print(f"wrote {out}: {job.nodes} node(s) x {job.ranks_per_node} rank(s), {job.command}"
          + (f", global batch {job.global_batch}" if job.global_batch else "")
          + (f", {job.steps} steps" if job.steps else "") + f". Submit: {submit}")
    return 0
