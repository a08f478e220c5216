"""Run by tests/test_gather.py, alone (forced CPU devices) or under mpirun: what ``process_allgather`` makes of an
Octo-shaped example batch, raw and through ``octo_dist.policies.gather``; one JSON line per rank.

usage: gather.py [--global-batch B]

Process p's slice holds example indices p*B/P .. (p+1)*B/P-1 in every element, so the report can say whether the
gathered batch is the processes' slices concatenated in process order.
"""

import argparse
import json
import sys

from octo_dist.runtime import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--global-batch", type=int, default=4)
args = parser.parse_args()

with runtime.distributed(timeout_s=60) as rt:
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh

    from octo_dist.policies import gather

    local_b = args.global_batch // rt.process_count
    first = rt.process_index * local_b
    index = np.arange(first, first + local_b)

    def octo_like(idx):
        b, t = len(idx), 2
        return {
            "observation": {
                "image_primary": np.broadcast_to(
                    idx[:, None, None, None, None], (b, t, 8, 8, 3)
                ).astype(np.uint8),
                "timestep_pad_mask": np.ones((b, t), bool),
                "pad_mask_dict": {"image_primary": np.ones((b, t), bool)},
                "timestep": np.broadcast_to(idx[:, None], (b, t)).astype(np.int32),
            },
            "task": {
                "image_primary": np.broadcast_to(idx[:, None, None, None], (b, 8, 8, 3)).astype(
                    np.uint8
                )
            },
            "action": np.broadcast_to(idx[:, None, None, None], (b, t, 4, 7)).astype(np.float32),
        }

    mesh = Mesh(np.array(jax.devices()), (gather.BATCH_AXIS,))
    raw = multihost_utils.process_allgather(octo_like(index))
    fixed = gather.gathered(octo_like(index), mesh)
    image = np.asarray(fixed["observation"]["image_primary"])
    print(
        json.dumps(
            {
                "rank": rt.process_index,
                "world": rt.process_count,
                "devices": jax.device_count(),
                "jax": jax.__version__,
                "raw_shape": list(np.shape(raw["observation"]["image_primary"])),
                "fixed_shape": list(image.shape),
                "fixed_shapes": {
                    "/".join(str(k.key) for k in path): list(np.shape(v))
                    for path, v in jax.tree_util.tree_flatten_with_path(fixed)[0]
                },
                "fixed_order": image[:, 0, 0, 0, 0].tolist(),
                "fixed_action_order": np.asarray(fixed["action"])[:, 0, 0, 0].tolist(),
                # What from_config keeps after its x[:1]: the first example's window, not a process's whole slice.
                "from_config_keeps": list(image[:1].shape),
            }
        ),
        flush=True,
    )
sys.exit(0)
