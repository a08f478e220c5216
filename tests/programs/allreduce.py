"""Run under mpirun by tests/test_runtime.py: start through octo_dist, reduce across processes, report as JSON.

usage: allreduce.py [--init-timeout S] [--fail-rank R] [--wandb-dir DIR]
"""

import argparse
import json
import os
import sys
import time

from octo_dist.runtime import ranklog
from octo_dist.runtime import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--init-timeout", type=float, default=60)
parser.add_argument(
    "--fail-rank", type=int, default=None, help="this rank raises after the first reduction"
)
parser.add_argument(
    "--wandb-dir", default=None, help="also make a tracker (WANDB_MODE from the environment) here"
)
args = parser.parse_args()

with runtime.distributed(timeout_s=args.init_timeout) as rt:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    ranklog.setup(
        rt.process_index, rt.process_count, all_ranks=ranklog.all_ranks_requested(os.environ)
    )
    mesh = Mesh(np.array(jax.devices()), ("batch",))

    def reduce_once(step: int) -> float:
        # Every local device holds (process index + 1 + step); the jitted sum runs across all processes.
        local = np.full((jax.local_device_count(),), rt.process_index + 1.0 + step, np.float32)
        global_x = multihost_utils.host_local_array_to_global_array(local, mesh, P("batch"))
        total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(global_x)
        return float(np.asarray(total.addressable_data(0)))

    total = reduce_once(0)
    expected = float(sum((i + 1.0) * jax.local_device_count() for i in range(rt.process_count)))
    tracker_id = None
    if args.wandb_dir:
        from octo_dist.runtime import tracking

        tracker = tracking.make_tracker(
            rt.process_index,
            project="octo-dist-test",
            dir=args.wandb_dir,
            config={"world": rt.process_count, "wandb_api_key": "leak?"},
            launch=rt.launch,
            environ=os.environ,
        )
        tracker.log({"total": total}, step=0)
        tracker.finish()
        tracker_id = tracker.run_id
    if args.fail_rank == rt.process_index:
        raise RuntimeError(f"rank {rt.process_index} fails on purpose")
    if args.fail_rank is not None:
        # The others go on into collectives the failed rank never joins: without an abort they would hang.
        for step in range(1, 10_000):
            reduce_once(step)
            time.sleep(0.01)
    print(
        json.dumps(
            {
                "rank": rt.process_index,
                "world": rt.process_count,
                "devices": jax.device_count(),
                "local_devices": jax.local_device_count(),
                "total": total,
                "expected": expected,
                "launcher": rt.launch.launcher,
                "coordinator": rt.coordinator.address if rt.coordinator else None,
                "run_id": tracker_id,
            }
        ),
        flush=True,
    )
sys.exit(0)
