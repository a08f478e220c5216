#!/usr/bin/env python3
"""Step time of 2 processes x 1 device vs 1 process x 2 devices, same global batch, side by side in one run.

Runs the smoke job both ways (the commands and environments of `octo-dist smoke --check-equivalence`), for each
train step variant, and prints the median steady step time of each, their ratio (target <= 1.15), and the
examples each rank read per step (must be global batch / N). Prints; asserts nothing.

On the CPU the ranks talk through gloo over TCP, where every all-reduce is a round trip: the compiled jit step of
the tiny policy holds 46 all-reduces (about one per parameter leaf; XLA's GPU pipeline combines them for NCCL), the
shard_map step one, over a flat vector.

usage: bench/engine.py [--steps 40] [--global-batch 32] [--np 2] [--model tiny] [--rounds 2]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from octo_dist.apps.smoke import equivalence


def measure(a, step_fn: str, tmp: Path) -> dict:
    job = argparse.Namespace(model=a.model, steps=a.steps, global_batch=a.global_batch, seed=0, learning_rate=1e-3,
                             step_fn=step_fn, np=a.np, init_timeout=120)
    ref_env, dist_env = equivalence.environments(a.np)
    ref_argv, dist_argv = equivalence.commands(job, tmp, sys.executable)
    best = {"reference": float("inf"), "distributed": float("inf")}
    reads = None
    for _ in range(a.rounds):  # alternate, so drift in the machine's load hits both alike
        for name, argv, env in (("reference", ref_argv, ref_env), ("distributed", dist_argv, dist_env)):
            subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rec = json.loads((tmp / f"{name}.json").read_text())
            best[name] = min(best[name], rec["step_time_median_s"])
            if name == "distributed":
                reads = rec["reads_per_step"]
    return dict(best, reads=reads)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step-fn", nargs="+", default=["jit", "shard_map"], choices=("jit", "shard_map"))
    a = p.parse_args()
    print(f"model {a.model}, global batch {a.global_batch}, {a.steps} steps, median step time, best of {a.rounds} round(s)")
    print(f"{'step':<10} {f'1 process x {a.np} devices':>24} {f'{a.np} processes x 1 device':>24} {'ratio':>7}"
          f"  (target <= 1.15)  examples read per rank per step")
    with tempfile.TemporaryDirectory() as tmp:
        for fn in a.step_fn:
            m = measure(a, fn, Path(tmp))
            print(f"{fn:<10} {m['reference'] * 1e3:21.1f} ms {m['distributed'] * 1e3:21.1f} ms "
                  f"{m['distributed'] / m['reference']:7.2f}                    {m['reads']} (expected "
                  f"{a.global_batch // a.np} = {a.global_batch} / {a.np})", flush=True)


if __name__ == "__main__":
    main()
