"""octo-dist smoke: a few steps of data-parallel training on synthetic Octo-shaped batches, on every rank.

    mpirun -np 2 octo-dist smoke                   # the cluster smoke job (make smoke adds the equivalence check)
    octo-dist smoke --check-equivalence --np 2     # 1 process x 2 devices vs 2 processes x 1 device

--model auto uses a tiny Octo (parameters as OctoModel.from_config makes them) when octo is importable, else a tiny Flax
transformer (octo_dist/policies/tiny.py), and says which. Ends with a verdict from rank 0: ranks, devices, steps,
loss first -> last, and whether every rank holds bit-identical parameters.
"""

from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import sys
import time
from typing import Mapping, Optional, Sequence

from octo_dist import EXIT_FAILED, EXIT_OK, EXIT_USAGE, savelayout
from octo_dist.apps import harness
from octo_dist.engine import stepfns
from octo_dist.runtime import runtime
from octo_dist.problems import Problem, Refusal

log = logging.getLogger(__name__)

MODELS = ("auto", "tiny", "octo")
DEFAULT_SAVE_EVERY = 10
DEFAULT_NP = 2  # --check-equivalence: 2 processes x 1 device vs 1 process x 2 devices
# The synthetic batch is built in host memory on every rank before the first step, where no stop signal is seen
# yet: 65,536 examples is far beyond any smoke run and still fits; more would only hang a node.
MAX_GLOBAL_BATCH = 65536
# --step-time: a stop signal is seen between steps, so a longer step would delay every stop by as much.
MAX_STEP_TIME_S = 60.0


class _Once(argparse.Action):
    """Stores a flag's one value: a second, different value (``--steps 3 --steps 5``) is refused, as ``octo-dist
    launch`` refuses its own, where argparse would keep the last without a word; the same value twice is one."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "given." + self.dest, None)
        if given is not None and given[1] != values:
            parser.error(
                f"{given[0]} {given[1]} and {option_string} {values} set the same flag twice; expected one "
                f"value. Fix: keep one of them"
            )
        setattr(namespace, "given." + self.dest, (option_string, values))
        setattr(namespace, self.dest, values)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "smoke",
        help="data-parallel smoke training on synthetic Octo-shaped data (run under mpirun)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_training_flags(p)
    _add_checkpoint_flags(p)
    _add_output_flags(p)
    _add_pace_and_check_flags(p)
    runtime.argv_options(p)
    p.set_defaults(func=main)
    return p


def _add_training_flags(p: argparse.ArgumentParser) -> None:
    """What is trained: the model, steps, batch, seed, learning rate and step function."""
    p.add_argument(
        "--model",
        choices=MODELS,
        default="auto",
        help="auto: octo when importable, else tiny (default: %(default)s)",
        action=_Once,
    )
    p.add_argument(
        "--steps",
        type=int,
        default=20,
        help="total optimizer steps; a resumed run does the rest (default: %(default)s)",
        action=_Once,
    )
    p.add_argument(
        "--global-batch",
        type=int,
        default=8,
        help="examples per step over all ranks; must divide by the device count (default: %(default)s)",
        action=_Once,
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the parameters, dropout and data (default: %(default)s)",
        action=_Once,
    )
    p.add_argument(
        "--learning-rate",
        type=float,
        default=1e-3,
        help="Adam's learning rate (default: %(default)s)",
        action=_Once,
    )
    p.add_argument(
        "--step-fn",
        choices=stepfns.STEP_FNS,
        default="auto",
        help="auto: shard_map (one flat all-reduce) over 2+ CPU devices, jit (XLA combines the all-reduces) "
        "on GPUs and on one device; or either by name (default: %(default)s)",
        action=_Once,
    )


def _add_checkpoint_flags(p: argparse.ArgumentParser) -> None:
    """Where the run's checkpoints go, how often, and whether it continues from them."""
    p.add_argument(
        "--save-dir",
        help="orbax checkpoint directory, shared by every rank (default: none, no checkpoints)",
        action=_Once,
    )
    p.add_argument(
        "--save-every",
        type=int,
        default=None,
        help=f"checkpoint every N steps; 0: at the end and on a stop signal only (default: "
        f"{DEFAULT_SAVE_EVERY} with --save-dir, so a killed job loses little)",
        action=_Once,
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the latest checkpoint in --save-dir (default: off)",
    )


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """What else the run writes: wandb, the compile cache and rank 0's record."""
    p.add_argument(
        "--wandb-mode",
        choices=("online", "offline", "disabled"),
        default=None,
        help="wandb logging (default: $WANDB_MODE, else disabled: a smoke job needs no account)",
        action=_Once,
    )
    p.add_argument(
        "--wandb-project",
        default="octo-dist-smoke",
        help="wandb project (default: %(default)s)",
        action=_Once,
    )
    p.add_argument(
        "--compile-cache",
        help="persistent compilation cache directory, or off "
        "(default: $OCTO_DIST_COMPILE_CACHE, else on GPUs ~/.cache/octo-dist/compile-cache)",
        action=_Once,
    )
    p.add_argument(
        "--record",
        help="rank 0 writes the run's losses, digests and input counts here as JSON "
        "(default: none)",
        action=_Once,
    )


def _add_pace_and_check_flags(p: argparse.ArgumentParser) -> None:
    """The run's pace (``--step-time``) and the equivalence check's flags."""
    p.add_argument(
        "--step-time",
        type=float,
        default=0.0,
        help="each step lasts at least this many seconds (the rest slept): a rehearsal of a long job's time "
        "limit, chain or lost node at its own pace, without its compute (default: %(default)s, full speed)",
        action=_Once,
    )
    p.add_argument(
        "--check-equivalence",
        action="store_true",
        help="run 1 process x NP devices and NP processes x 1 device (mpirun) on the CPU and compare "
        "(default: off)",
    )
    p.add_argument(
        "--np",
        type=int,
        default=None,
        help=f"processes for --check-equivalence, and only with it: a plain smoke job runs as many "
        f"processes as its launcher starts (default: {DEFAULT_NP})",
        action=_Once,
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        help="largest relative loss difference --check-equivalence accepts (default: %(default)s)",
        action=_Once,
    )


class ModelError(Refusal, ValueError):
    """--model octo where octo cannot be imported."""


def pick_model(name: str):
    """(policy, data spec, what was used and why)."""
    from octo_dist.engine import data
    from octo_dist.policies.tiny import TinyPolicy

    if name in ("auto", "octo"):
        try:
            from octo_dist.policies import octo
        except ImportError as e:
            if name == "octo":
                raise ModelError(
                    f"--model octo, but octo cannot be imported ({e}); expected the pinned fork. "
                    f"Fix: make git-deps (needs GitHub), or --model tiny"
                ) from None
            return TinyPolicy(), data.Spec(), f"tiny (octo not importable: {e})"
        policy, spec = octo.smoke_policy()
        return policy, spec, "octo (a tiny Octo config, initialised as OctoModel.from_config does)"
    return TinyPolicy(), data.Spec(), "tiny"


def verdict(rec: dict) -> str:
    """The closing line(s) a person reads."""
    losses = [rec["losses"][k] for k in sorted(rec["losses"], key=int)]
    loss = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "no steps run"
    same = len(set(rec["digests"])) == 1
    reads = sorted(set(rec["reads_per_step"]))
    lines = [
        f"octo-dist smoke: model {rec['model']}, {rec['ranks']} rank(s) x {rec['local_devices']} {rec['platform']} "
        f"device(s) = {rec['devices']} device(s), global batch {rec['global_batch']} "
        f"({rec['global_batch'] // rec['ranks']} per rank, read per rank per step: {reads})",
        f"  steps {rec['start_step']} -> {rec['end_step']} of {rec['steps']}, {loss}"
        + (f", stopped by {rec['stopped_by']} (checkpoint saved)" if rec["stopped_by"] else ""),
        (
            f"  parameters of the one rank: {', '.join(rec['digests'])} (one rank: nothing to compare)"
            if len(rec["digests"]) == 1
            else f"  parameters {'identical on every rank' if same else 'DIFFER across ranks'}: "
            f"{', '.join(rec['digests'])}"
        ),
    ]
    return "\n".join(lines)


class Pace:
    """``on_step`` for ``--step-time``: sleeps what the step since the last call left of ``seconds``.

    Steps are read one behind their dispatch (train.fit), so the sleep holds back the next dispatch: from the
    second step on, step to step takes ``max(seconds, the step's own time)``. The parameters are the same as at
    full speed; only the wall time changes."""

    def __init__(self, seconds: float, clock=time.monotonic, sleep=time.sleep):
        self.seconds, self.clock, self.sleep = seconds, clock, sleep
        self.last: Optional[float] = None

    def __call__(self, step: int, values) -> None:
        now = self.clock()
        if self.last is not None and now - self.last < self.seconds:
            self.sleep(self.seconds - (now - self.last))
            now = self.clock()
        self.last = now


def train(
    job: harness.Job,
    args,
    environ: Mapping[str, str],
    resume=None,
    layout: Optional[savelayout.RunLayout] = None,
) -> int:
    """The smoke job on this rank, inside the harness; ``layout``: the run's files (None without --save-dir)."""
    import optax

    from octo_dist.engine import data

    rt = job.runtime
    policy, spec, model_note = pick_model(args.model)
    source = data.SyntheticData(
        spec, args.global_batch, rt.process_index, rt.process_count, rt.device_count, args.seed
    )
    log.info(
        "model: %s; %s; global batch %d = %d per rank",
        model_note,
        rt.describe(),
        args.global_batch,
        source.local_batch_size,
    )
    fingerprint = {
        "model": policy.name,
        "global_batch": args.global_batch,
        "seed": args.seed,
        "step_fn": args.step_fn,
        "learning_rate": args.learning_rate,
    }
    tracker = _make_tracker(rt, args, environ, fingerprint)
    result, timing = harness.fit(
        job,
        policy,
        optax.adam(args.learning_rate),
        source,
        _train_config(args, resume, layout),
        tracker=tracker,
        fingerprint=fingerprint,
        on_step=Pace(args.step_time) if args.step_time else None,
    )
    rec = _record(rt, policy, args, source, result, tracker.run_id)
    return _report(job, args, rec, result, timing, layout)


def _make_tracker(rt, args, environ: Mapping[str, str], fingerprint: dict):
    """wandb on rank 0 (disabled unless asked: a smoke job needs no account), a no-op tracker elsewhere."""
    from octo_dist.runtime import tracking

    return tracking.make_tracker(
        rt.process_index,
        project=args.wandb_project,
        launch=rt.launch,
        environ=environ,
        mode=tracking.resolve_mode(environ, args.wandb_mode, default="disabled"),
        config={**fingerprint, "ranks": rt.process_count, "devices": rt.device_count},
    )


def _train_config(args, resume, layout: Optional[savelayout.RunLayout]):
    """The engine's settings for this job: steps, seed, step function, checkpoints and where to resume."""
    from octo_dist.engine import train

    return train.TrainConfig(
        steps=args.steps,
        seed=args.seed,
        step_fn=args.step_fn,
        # The engine's checkpoints and the run's lock: smoke's are the save directory itself (RunLayout's tree).
        save_dir=layout.train_state if layout else None,
        save_every=args.save_every,
        resume=resume,  # checkpoint.decide's, made in main before start-up
    )


def _report(job: harness.Job, args, rec: dict, result, timing, layout) -> int:
    """Rank 0's verdict, the run's summary and ``--record``; fails when the ranks' parameters differ."""
    rt = job.runtime
    harness.say(job, verdict(rec))
    run_dir = (
        layout.run_dir if layout else None
    )  # summary.json and loss.png: RunLayout.summary, .loss_plot
    summary = harness.summary(
        job, "smoke", result, timing, args.global_batch, run_dir, digests=rec["digests"]
    )
    rec["step_time_median_s"] = summary.median_step_s
    if rt.is_main and args.record:
        with open(args.record, "w") as f:
            json.dump(rec, f, indent=1)
    return EXIT_OK if len(set(rec["digests"])) == 1 else EXIT_FAILED


def _record(rt, policy, args, source, result, run_id) -> dict:
    """What the run did, gathered from every rank: its losses, each rank's parameter digest, reads and host."""
    from octo_dist.runtime import collectives

    # Examples this rank made per batch it made (a run stopped by a signal has made one batch ahead of its last step).
    ranks = collectives.allgather_json(
        {
            "digest": result.params_digest,
            "reads_per_step": source.reads // source.batches_made if source.batches_made else 0,
            "host": rt.host,
        }
    )
    return {
        "model": policy.name,
        "ranks": rt.process_count,
        "devices": rt.device_count,
        "local_devices": rt.local_device_count,
        "platform": rt.platform,
        "global_batch": args.global_batch,
        "steps": args.steps,
        "start_step": result.start_step,
        "end_step": result.end_step,
        "losses": {str(k): v for k, v in result.losses.items()},
        "stopped_by": result.stopped_by,
        "digests": [r["digest"] for r in ranks],
        "reads_per_step": [r["reads_per_step"] for r in ranks],
        "hosts": [r["host"] for r in ranks],
        "run_id": run_id,
    }


def _bad(flag, found, expected, fix) -> str:
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


class _Refusing(argparse.ArgumentParser):
    """A parser that raises instead of printing usage and exiting: for checking a command line without running it."""

    def error(self, message):
        raise ValueError(message)


def check_command(argv: Sequence[str]) -> None:
    """Raise ValueError naming the first flag of ``octo-dist smoke ARGV`` that a run would refuse.

    ``octo-dist launch`` calls this on the arguments every rank will get, when it renders a job script, so a typo
    (``--stepz 3``) is found on the login node instead of after the job waited in the queue. Imports no JAX."""
    parser = add_parser(_Refusing(prog="octo-dist").add_subparsers())
    args, unknown = parser.parse_known_args(list(argv))
    if unknown:
        flag = unknown[0].split("=", 1)[0]
        close = difflib.get_close_matches(
            flag, [o for o in parser._option_string_actions if o.startswith("--")], n=1
        )
        raise ValueError(
            f"unknown flag {unknown[0]}" + (f", did you mean {close[0]}?" if close else "")
        )
    problem = argument_problem(args)
    if problem:  # "--steps -5; expected at least 1 step. Fix: ..." -> "--steps -5 (expected at least 1 step)"
        found, _, rest = problem.partition("; expected ")
        raise ValueError(f"{found} (expected {rest.partition('. Fix: ')[0]})")


def main(args, environ: Mapping[str, str] = os.environ) -> int:
    """``octo-dist smoke``: the equivalence check (this process only orchestrates), or the job on every rank."""
    problem = argument_problem(args)
    if problem:
        # The same flags on every rank: each refuses alike before start-up, so no rank waits for another.
        print(f"octo-dist smoke: error: {problem}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if args.save_every is None:
        args.save_every = DEFAULT_SAVE_EVERY if args.save_dir else 0
    if args.check_equivalence:
        from octo_dist.apps.smoke import equivalence

        args.np = DEFAULT_NP if args.np is None else args.np
        return equivalence.main(args)
    from octo_dist.engine import checkpoint

    # The run's files, named once: smoke's run and checkpoints are the save directory itself (savelayout's tree).
    layout = savelayout.RunLayout(os.path.abspath(args.save_dir)) if args.save_dir else None
    try:
        # Whether to resume, and from which step, decided once from the verified steps and passed down.
        resume = checkpoint.decide(layout.train_state if layout else None, args.resume)
    except Problem as e:  # the same directory on every rank: each refuses alike before start-up
        print(f"octo-dist smoke: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    options = harness.Options.from_environment(runtime.from_args(args), args.compile_cache, environ)
    return harness.run("smoke", options, lambda job: train(job, args, environ, resume, layout))
