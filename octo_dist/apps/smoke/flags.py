"""`octo-dist smoke`'s flags: each declared once, in the table of its group (what is trained, its checkpoints, what
else it writes, its pace and the equivalence check), and the checks of their values before any rank starts.

    octo-dist smoke --steps 3 --global-batch 8 --save-dir runs/smoke --save-every 2

Every flag but the switches is given at most once (:class:`onevalue.OneValue`, as every octo-dist command's):
``--steps 3 --steps 5`` is refused. Imports no JAX: ``octo-dist launch`` checks a smoke command line on a login node.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Optional

from octo_dist.launchers import onevalue
from octo_dist.engine import stepfns

MODELS = ("auto", "tiny", "octo")
DEFAULT_SAVE_EVERY = 10
DEFAULT_NP = 2  # --check-equivalence: 2 processes x 1 device vs 1 process x 2 devices
# The synthetic batch is built in host memory on every rank before the first step, where no stop signal is seen
# yet: 65,536 examples is far beyond any smoke run and still fits; more would only hang a node.
MAX_GLOBAL_BATCH = 65536
# --step-time: a stop signal is seen between steps, so a longer step would delay every stop by as much.
MAX_STEP_TIME_S = 60.0


# (flag, argparse's keywords, help), in the order --help shows them; each given at most once unless its keywords
# name another action (the switches: store_true).
TRAINING = (
    ("--model", {"choices": MODELS, "default": "auto"}, "auto: octo when importable, else tiny"),
    ("--steps", {"type": int, "default": 20}, "total optimizer steps; a resumed run does the rest"),
    (
        "--global-batch",
        {"type": int, "default": 8},
        "examples per step over all ranks; must divide by the device count",
    ),
    ("--seed", {"type": int, "default": 0}, "seed of the parameters, dropout and data"),
    ("--learning-rate", {"type": float, "default": 1e-3}, "Adam's learning rate"),
    (
        "--step-fn",
        {"choices": stepfns.STEP_FNS, "default": "auto"},
        "auto: shard_map (one flat all-reduce) over 2+ CPU devices, jit (XLA combines the all-reduces) on GPUs "
        "and on one device; or either by name",
    ),
)
CHECKPOINTS = (
    (
        "--save-dir",
        {},
        "orbax checkpoint directory, shared by every rank (default: none, no checkpoints)",
    ),
    (
        "--save-every",
        {"type": int, "default": None},
        f"checkpoint every N steps; 0: at the end and on a stop signal only (default: {DEFAULT_SAVE_EVERY} with "
        f"--save-dir, so a killed job loses little)",
    ),
    (
        "--resume",
        {"action": "store_true"},
        "continue from the latest checkpoint in --save-dir (default: off)",
    ),
)
OUTPUTS = (
    (
        "--wandb-mode",
        {"choices": ("online", "offline", "disabled"), "default": None},
        "wandb logging (default: $WANDB_MODE, else disabled: a smoke job needs no account)",
    ),
    ("--wandb-project", {"default": "octo-dist-smoke"}, "wandb project"),
    (
        "--compile-cache",
        {},
        "persistent compilation cache directory, or off (default: $OCTO_DIST_COMPILE_CACHE, else on GPUs "
        "~/.cache/octo-dist/compile-cache)",
    ),
    (
        "--record",
        {},
        "rank 0 writes the run's losses, digests and input counts here as JSON (default: none)",
    ),
)
PACE_AND_CHECK = (
    (
        "--step-time",
        {"type": float, "default": 0.0},
        "each step lasts at least this many seconds (the rest slept): a rehearsal of a long job's time limit, "
        "chain or lost node at its own pace, without its compute (default: %(default)s, full speed)",
    ),
    (
        "--check-equivalence",
        {"action": "store_true"},
        "run 1 process x NP devices and NP processes x 1 device (mpirun) on the CPU and compare (default: off)",
    ),
    (
        "--np",
        {"type": int, "default": None},
        f"processes for --check-equivalence, and only with it: a plain smoke job runs as many processes as its "
        f"launcher starts (default: {DEFAULT_NP})",
    ),
    (
        "--tolerance",
        {"type": float, "default": 1e-5},
        "largest relative loss difference --check-equivalence accepts",
    ),
)


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every smoke flag of the tables above on ``p``; a help without its own "(default: ...)" gets argparse's."""
    for flag, keywords, text in TRAINING + CHECKPOINTS + OUTPUTS + PACE_AND_CHECK:
        shown = text if "(default: " in text else f"{text} (default: %(default)s)"
        p.add_argument(flag, help=shown, **{"action": onevalue.OneValue, **keywords})


def _bad(flag, found, expected, fix) -> str:
    """One refusal: ``"--steps 0; expected at least 1 step. Fix: --steps 20"``."""
    return f"{flag} {found}; expected {expected}. Fix: {fix}"


def argument_problem(args) -> Optional[str]:
    """The first flag no run could use, as "found; expected. Fix: ..." (None when every flag is sound)."""
    return _training_problem(args) or _run_problem(args) or _record_problem(args.record)


def _training_problem(args) -> Optional[str]:
    """A step count, batch, learning rate or checkpoint interval no training could use."""
    if args.steps < 1:
        return _bad("--steps", args.steps, "at least 1 step", "--steps 20")
    if not 1 <= args.global_batch <= MAX_GLOBAL_BATCH:
        return _bad(
            "--global-batch",
            args.global_batch,
            f"1 to {MAX_GLOBAL_BATCH} examples, a multiple of the device count",
            "--global-batch 8",
        )
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        return _bad(
            "--learning-rate", args.learning_rate, "a finite number above 0", "--learning-rate 1e-3"
        )
    if args.save_every is not None and args.save_every < 0:
        return _bad(
            "--save-every",
            args.save_every,
            "0 (at the end and on a stop only) or a positive number of steps",
            f"--save-every {DEFAULT_SAVE_EVERY}",
        )
    return None


def _run_problem(args) -> Optional[str]:
    """A process count, pace or tolerance the run or its equivalence check could not use."""
    if args.np is not None and not args.check_equivalence:
        # Without the equivalence check the job is whatever the launcher started: `--np 2` alone would run one
        # process and look like a success.
        return _bad(
            "--np",
            args.np,
            "--np only with --check-equivalence (the smoke job runs as many processes as its launcher "
            "starts)",
            f"octo-dist smoke --check-equivalence --np {args.np}, or mpirun -np {args.np} octo-dist smoke",
        )
    if not (math.isfinite(args.step_time) and 0 <= args.step_time <= MAX_STEP_TIME_S):
        return _bad(
            "--step-time",
            args.step_time,
            f"0 (full speed) to {MAX_STEP_TIME_S:g} seconds (a stop is seen between steps)",
            "--step-time 1",
        )
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        return _bad(
            "--tolerance", args.tolerance, "a finite relative difference >= 0", "--tolerance 1e-5"
        )
    return None


def _record_problem(record: Optional[str]) -> Optional[str]:
    """``--record`` naming a directory, or a file in a directory that does not exist (None: no --record)."""
    if not record:
        return None
    parent = os.path.dirname(os.path.abspath(record))
    expected = (
        "a file path in an existing directory (rank 0 writes the run's record there at the end)"
    )
    if os.path.isdir(record):
        return _bad("--record", record, expected, f"--record {os.path.join(record, 'record.json')}")
    if not os.path.isdir(parent):
        return _bad("--record", record, expected, f"mkdir -p {parent}, or another --record")
    return None
