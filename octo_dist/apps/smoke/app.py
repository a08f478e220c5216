"""``octo-dist smoke``: a few steps of data-parallel training on synthetic Octo-shaped batches, on every rank.

    mpirun -np 2 octo-dist smoke                          # the cluster smoke job (make smoke adds the equivalence check)
    octo-dist smoke --check-equivalence --np 2            # 1 process x 2 devices vs 2 processes x 1 device

``--model auto`` uses a tiny Octo built with ``OctoModel.from_config`` when octo is importable, else the tiny Flax
transformer kept here (``tiny_policy.py``), and says which. Ends with a verdict from rank 0: ranks, devices, steps,
loss first -> last, and whether every rank holds bit-identical parameters.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from octo_dist.dist import runtime

log = logging.getLogger("octo_dist.apps.smoke.app")

MODELS = ("auto", "tiny", "octo")
EXIT_USAGE = 2


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("smoke", help="data-parallel smoke training on synthetic Octo-shaped data (run under mpirun)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="auto", help="auto: octo when importable, else tiny")
    p.add_argument("--steps", type=int, default=20, help="total optimizer steps (a resumed run does the rest)")
    p.add_argument("--global-batch", type=int, default=8, help="examples per step over all ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--step-fn", choices=("jit", "shard_map"), default="jit",
                   help="jit with shardings (default) or the seed's shard_map variant")
    p.add_argument("--save-dir", help="orbax checkpoint directory (shared by every rank)")
    p.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0: at the end and on a signal)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --save-dir")
    p.add_argument("--wandb-mode", choices=("online", "offline", "disabled"), default=None,
                   help="default: $WANDB_MODE, else disabled (a smoke job needs no account)")
    p.add_argument("--wandb-project", default="octo-dist-smoke")
    p.add_argument("--compile-cache", help="persistent compilation cache directory (default $OCTO_DIST_COMPILE_CACHE)")
    p.add_argument("--record", help="rank 0 writes the run's losses, digests and input counts here as JSON")
    p.add_argument("--check-equivalence", action="store_true",
                   help="run 1 process x NP devices and NP processes x 1 device (mpirun) on the CPU and compare")
    p.add_argument("--np", type=int, default=2, help="processes for --check-equivalence")
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest relative loss difference accepted")
    runtime.argv_options(p)
    p.set_defaults(func=main)
    return p


class ModelError(ValueError):
    """--model octo where octo cannot be imported."""


def pick_model(name: str):
    """(policy, data spec, what was used and why)."""
    from octo_dist.engine import data
    from octo_dist.policies.tiny import TinyPolicy

    if name in ("auto", "octo"):
        try:
            from octo_dist.policies import octo as octo_policy
        except ImportError as e:
            if name == "octo":
                raise ModelError(f"--model octo, but octo cannot be imported ({e}); expected the pinned fork. "
                                 f"Fix: make git-deps (needs GitHub), or --model tiny") from None
            return TinyPolicy(), data.Spec(), f"tiny (octo not importable: {e})"
        policy, spec = octo_policy.smoke_policy()
        return policy, spec, "octo (tiny config from OctoModel.from_config)"
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
        f"  parameters {'identical on every rank' if same else 'DIFFER across ranks'}: {', '.join(rec['digests'])}",
    ]
    return "\n".join(lines)


def run_job(args) -> int:
    """On every rank, inside the distributed runtime."""
    from octo_dist.dist import ranklog
    from octo_dist.dist import stopping
    from octo_dist.engine.checkpoint import CheckpointError
    from octo_dist.engine.data import BatchSizeError

    with runtime.distributed(**runtime.from_args(args)) as rt:
        # Right after start-up, not before: jax.distributed.initialize installs TSL's own SIGTERM handler (its
        # preemption notifier), which would swallow the signal. From here a signal during model building or
        # compilation stops the job at its first step.
        stop = stopping.StopSignal()
        ranklog.setup(rt.process_index, rt.process_count)
        try:
            return _train(args, rt, stop)
        except (BatchSizeError, CheckpointError, ModelError) as e:
            # The same on every rank (a shared directory, the same flags): refuse together, shut down cleanly.
            if rt.is_main:
                print(f"octo-dist smoke: error: {e}", file=sys.stderr, flush=True)
            return EXIT_USAGE


def _train(args, rt, stop) -> int:
    import optax

    from octo_dist.dist import collectives
    from octo_dist.dist import compile_cache
    from octo_dist.engine import data
    from octo_dist.dist import tracking
    from octo_dist.engine import train

    compile_cache.enable(args.compile_cache)
    policy, spec, model_note = pick_model(args.model)
    source = data.SyntheticData(spec, args.global_batch, rt.process_index, rt.process_count, rt.device_count, args.seed)
    log.info("model: %s; %s; global batch %d = %d per rank", model_note, rt.describe(), args.global_batch,
             source.local_batch_size)
    # None: make_tracker reads WANDB_MODE; a smoke job without either logs nowhere.
    mode = args.wandb_mode or (None if os.environ.get("WANDB_MODE") else "disabled")
    fingerprint = {"model": policy.name, "global_batch": args.global_batch, "seed": args.seed, "step_fn": args.step_fn,
                   "learning_rate": args.learning_rate}
    tracker = tracking.make_tracker(rt.process_index, project=args.wandb_project, mode=mode, launch=rt.launch,
                                    config={**fingerprint, "ranks": rt.process_count, "devices": rt.device_count})
    cfg = train.TrainConfig(steps=args.steps, seed=args.seed, step_fn=args.step_fn, save_dir=args.save_dir,
                            save_every=args.save_every, resume=args.resume)
    ticks = [time.perf_counter()]  # after each step (metrics are fetched, so the step has finished)
    try:
        result = train.fit(policy, optax.adam(args.learning_rate), source, cfg, tracker=tracker,
                           fingerprint=fingerprint, on_step=lambda step, values: ticks.append(time.perf_counter()),
                           stop=stop)
    finally:
        tracker.finish()
    # The first two steps compile (the step, then metric reads); the median of the rest is the steady step time.
    durations = sorted(b - a for a, b in zip(ticks[2:], ticks[3:]))
    steps_run = result.end_step - result.start_step
    ranks = collectives.allgather_json({"digest": result.params_digest,
                                        "reads_per_step": source.reads // max(steps_run, 1) if steps_run else 0,
                                        "host": rt.host})
    rec = {"model": policy.name, "ranks": rt.process_count, "devices": rt.device_count,
           "local_devices": rt.local_device_count, "platform": rt.platform, "global_batch": args.global_batch,
           "steps": args.steps, "start_step": result.start_step, "end_step": result.end_step,
           "losses": {str(k): v for k, v in result.losses.items()}, "stopped_by": result.stopped_by,
           "digests": [r["digest"] for r in ranks], "reads_per_step": [r["reads_per_step"] for r in ranks],
           "hosts": [r["host"] for r in ranks], "run_id": tracker.run_id,
           "step_time_median_s": durations[len(durations) // 2] if durations else None}
    if rt.is_main:
        if args.record:
            with open(args.record, "w") as f:
                json.dump(rec, f, indent=1)
        print(verdict(rec), flush=True)
    return 0 if len(set(rec["digests"])) == 1 else 1


def main(args) -> int:
    if args.check_equivalence:
        from octo_dist.apps.smoke import equivalence

        return equivalence.main(args)
    return run_job(args)
