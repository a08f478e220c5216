#!/usr/bin/env python3
"""One bench run of the train step, on every rank: started by bench/engine.py as 1 process x N devices (forced host
devices) or N processes x 1 device (mpirun). Rank 0 writes one JSON record; nothing is printed for a parser.

Measures the median steady step time (each step waited for), counts the all-reduces in the compiled step's HLO
and their bytes, and, with several processes, times those same all-reduces alone (one psum per all-reduce of the
step, same sizes, nothing else): the step's bytes over that time is its effective all-reduce bandwidth.

usage: step_worker.py --model {tiny,octo-small-sized,octo} --step-fn {auto,jit,shard_map} --global-batch B
                      --steps S --record FILE [--launcher single]
"""

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time

from octo_dist.runtime import runtime


def make_policy(model: str):
    """(policy, data spec). ``octo-small-sized``: the tiny transformer at Octo-Small's parameter count (~27 M)."""
    from octo_dist.engine import data
    from octo_dist.policies.tiny import TinyPolicy, TinyTransformer

    @dataclasses.dataclass(frozen=True)
    class OctoSmallSized(TinyPolicy):
        # Octo-Small: 12 blocks of width 384 with a 4x MLP, plus tokenizers and heads, about 27 M parameters. The
        # tiny transformer's blocks hold 8 W^2 parameters (2x MLP): 4 blocks of width 920 give the same count, and
        # compile about 3x faster than 12 narrower ones (what this bench measures is bytes per all-reduce).
        name: str = "octo-small-sized"

        @property
        def module(self) -> TinyTransformer:
            return TinyTransformer(self.spec, width=920, depth=4, heads=8, dropout=self.dropout)

    if model == "tiny":
        return TinyPolicy(), data.Spec()
    if model == "octo-small-sized":
        return OctoSmallSized(), data.Spec()
    from octo_dist.policies import (
        octo as octo_policy,
    )  # ImportError without octo: the caller skips the model

    return octo_policy.smoke_policy()


def collectives_only(eng, sizes_bytes):
    """A jitted function doing one psum per entry of ``sizes_bytes`` (f32 vectors of those sizes), and its input."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.shard_map import shard_map
    from jax.sharding import PartitionSpec as P

    from octo_dist.engine import parallel as engine

    ndev = eng.mesh.devices.size
    lengths = [max(1, math.ceil(b / 4)) for b in sizes_bytes]
    inputs = [
        jax.jit(lambda n=n: jnp.ones((ndev * n,), jnp.float32), out_shardings=eng.sharded)()
        for n in lengths
    ]
    psums = shard_map(
        lambda xs: [jax.lax.psum(x, engine.BATCH_AXIS) for x in xs],
        mesh=eng.mesh,
        in_specs=(P(engine.BATCH_AXIS),),
        out_specs=P(),
        check_rep=False,
    )
    return jax.jit(psums), inputs


def log(msg: str) -> None:
    # This rank's progress, for a person watching a slow run (bench/engine.py keeps stderr for its error message).
    print(f"step_worker: {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--step-fn", default="auto")
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--record", required=True)
    p.add_argument(
        "--count-collectives",
        action="store_true",
        help="count the HLO's all-reduces and time them alone",
    )
    runtime.argv_options(p)
    a = p.parse_args()
    with runtime.distributed(**runtime.from_args(a)) as rt:
        import jax
        import optax

        from octo_dist.runtime import collectives
        from octo_dist.engine import data, hlo
        from octo_dist.engine import parallel as engine

        policy, spec = make_policy(a.model)
        src = data.SyntheticData(
            spec, a.global_batch, rt.process_index, rt.process_count, rt.device_count
        )
        eng = engine.Engine(engine.make_mesh(), policy.loss, optax.adam(1e-3), step_fn=a.step_fn)
        batch = eng.global_batch(src.batch(0))
        state = eng.init_state(policy, batch)
        params = sum(x.size for x in jax.tree_util.tree_leaves(state.params))
        src.reads = 0  # count the steps' reads only
        log(f"initialised {params:,} parameters")
        reduces = hlo.all_reduces(eng.compiled_text(state, batch)) if a.count_collectives else None
        durations = []
        for s in range(a.steps):
            batch = eng.global_batch(src.batch(s))
            t = time.perf_counter()
            state, metrics = eng.step(state, batch)
            jax.block_until_ready((state, metrics))
            durations.append(time.perf_counter() - t)
            log(f"step {s}: {durations[-1]:.3f} s")
        alone = None
        if reduces and rt.process_count > 1:
            fn, inputs = collectives_only(eng, reduces)
            jax.block_until_ready(fn(inputs))  # compile
            times = []
            for _ in range(5):
                t = time.perf_counter()
                jax.block_until_ready(fn(inputs))
                times.append(time.perf_counter() - t)
            alone = statistics.median(times)
        reads = collectives.allgather_json(src.reads // a.steps if a.steps else 0)
        rec = {
            "model": policy.name,
            "step_fn": a.step_fn,
            "runs": eng.step_fn,
            "params": int(params),
            "ranks": rt.process_count,
            "devices": rt.device_count,
            "global_batch": a.global_batch,
            # The first step compiles; the median of the rest is the steady step time.
            "step_time_median_s": statistics.median(durations[1:]) if len(durations) > 1 else None,
            "all_reduces": reduces,
            "all_reduce_alone_s": alone,
            "reads_per_step": reads,
        }
        if rt.is_main:
            with open(a.record, "w") as f:
                json.dump(rec, f, indent=1)


if __name__ == "__main__":
    main()
