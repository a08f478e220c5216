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
import os
import sys
import time
from typing import Mapping, Optional, Sequence

from octo_dist import EXIT_FAILED, EXIT_OK, EXIT_USAGE, savelayout, subcommand
from octo_dist.apps import harness
from octo_dist.apps.smoke import flags
from octo_dist.runtime import runtime
from octo_dist.problems import Problem, Refusal

log = logging.getLogger(__name__)
HELP = "data-parallel smoke training on synthetic Octo-shaped data (run under mpirun)"


def add_parser(sub) -> argparse.ArgumentParser:
    p = subcommand.parser(sub, "smoke", HELP, __doc__, main)
    flags.add_flags(p)
    runtime.argv_options(p)
    return p


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


def train(job: harness.Job, args, environ: Mapping[str, str], training) -> int:
    """The smoke job on this rank, inside the harness; ``training``: the engine's input (:func:`train_config`), made in
    main before start-up."""
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
        training,
        tracker=tracker,
        fingerprint=fingerprint,
        on_step=Pace(args.step_time) if args.step_time else None,
    )
    rec = _record(rt, policy, args, source, result, tracker.run_id)
    return _report(job, args, rec, result, timing, training)


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


def train_config(args, layout: Optional[savelayout.RunLayout], resume):
    """The engine's input for this job, the same dataclass the fine-tune builds (``train.TrainConfig``): steps,
    seed, step function, the run's ``layout`` (None without --save-dir), ``--save-every`` (default
    ``flags.DEFAULT_SAVE_EVERY`` with a save directory, else 0: only at the end) and where to resume."""
    from octo_dist.engine import train

    save_every = args.save_every
    if save_every is None:
        save_every = flags.DEFAULT_SAVE_EVERY if layout else 0
    return train.TrainConfig(
        steps=args.steps,
        seed=args.seed,
        step_fn=args.step_fn,
        # The engine's checkpoints and the run's lock: smoke's are the save directory itself (RunLayout's tree).
        layout=layout,
        save_every=save_every,
        resume=resume,  # checkpoint.decide's, made in main before start-up
    )


def _report(job: harness.Job, args, rec: dict, result, timing, training) -> int:
    """Rank 0's verdict, the run's summary and ``--record``; fails when the ranks' parameters differ."""
    rt = job.runtime
    harness.say(job, verdict(rec))
    # summary.json and loss.png where the layout names them (RunLayout.summary, .loss_plot)
    summary = harness.summary(
        job, "smoke", result, timing, args.global_batch, training, digests=rec["digests"]
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
    problem = flags.argument_problem(args)
    if problem:  # "--steps -5; expected at least 1 step. Fix: ..." -> "--steps -5 (expected at least 1 step)"
        found, _, rest = problem.partition("; expected ")
        raise ValueError(f"{found} (expected {rest.partition('. Fix: ')[0]})")


def main(args, environ: Mapping[str, str] = os.environ) -> int:
    """``octo-dist smoke``: the equivalence check (this process only orchestrates), or the job on every rank."""
    problem = flags.argument_problem(args)
    if problem:
        # The same flags on every rank: each refuses alike before start-up, so no rank waits for another.
        print(f"octo-dist smoke: error: {problem}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    if args.check_equivalence:
        from octo_dist.apps.smoke import equivalence

        args.np = flags.DEFAULT_NP if args.np is None else args.np
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
    cfg = train_config(args, layout, resume)
    options = harness.Options.from_environment(runtime.from_args(args), args.compile_cache, environ)
    return harness.run("smoke", options, lambda job: train(job, args, environ, cfg))
