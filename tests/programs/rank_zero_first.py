"""The fine-tune's data built under mpirun as ``octo-dist finetune`` builds it (``harness.run``, then ``OctoData``),
rank 0's build fabricated: ``slow`` takes longer than a collective's set-up may wait (gloo's 30 s), counted from
the moment rank 1 starts waiting; ``fails`` raises a bug's error; ``refused`` a refusal (the same on every rank).
``slow1`` and ``fails1`` are rank 1's build, after rank 0's: slower than that from rank 0's end, or failing.
Modes joined by commas apply together: ``slow,slow1`` makes each rank wait for the other in turn in one run
(the test runs ``slow`` and ``slow1`` side by side instead: one wait's wall time).

    mpirun -np 2 python tests/programs/rank_zero_first.py slow|fails|refused|slow1|fails1[,MODE...] DIR

After the data, a real collective (every rank's first batch to every rank). Each rank prints one JSON line.
"""

import json
import os
import sys
import time

from octo_dist.apps import harness
from octo_dist.problems import Refusal

MODES, DIR = set(sys.argv[1].split(",")), sys.argv[2]
# gloo's set-up waits 30 s for the other rank's address ("GetKeyValue() timed out ... 29.99s"); rank 0 finishes well
# after rank 1 has waited that long.
COLLECTIVE_LIMIT_S = 30
BEYOND_S = 10
WAITING = os.path.join(DIR, "rank1-waits")  # rank 1 writes it as it starts waiting
BUILT = os.path.join(DIR, "rank0-built")  # rank 0 writes it as its build returns


def note(path: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(path + ".tmp", path)


def beyond_the_limit_from(path: str) -> None:
    """Sleep until COLLECTIVE_LIMIT_S + BEYOND_S after the time noted in ``path`` (once it is there)."""
    deadline = time.time() + 600
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.2)
    until = float(open(path).read()) + COLLECTIVE_LIMIT_S + BEYOND_S
    while time.time() < until:
        time.sleep(0.5)


def build(rank: int):
    if rank == 0 and "slow" in MODES:
        beyond_the_limit_from(WAITING)
    if rank == 1 and "slow1" in MODES:
        beyond_the_limit_from(BUILT)
    if rank == 1 and "fails1" in MODES:
        raise ValueError("fabricated read failure on rank 1: bridge/1.0.0 shard 5 is unreadable")
    if rank == 0 and "fails" in MODES:
        raise ValueError("fabricated statistics failure: bridge/1.0.0 shard 3 is truncated")
    if rank == 0 and "refused" in MODES:
        raise Refusal("--config.dataset_kwargs.name='nope'", "a dataset in the data directory")
    import tensorflow as tf  # after the failures: a failing build never pays TensorFlow's import

    trajectories = tf.data.Dataset.range(24).batch(4).map(lambda x: {"action": x})
    trajectories.dataset_statistics = {"action": {"mean": [float(rank)]}}
    if rank == 0:
        note(BUILT)
    return trajectories


def work(job: harness.Job) -> int:
    from ml_collections import FrozenConfigDict

    from octo_dist.apps.finetune import config, pipeline
    from octo_dist.runtime import collectives

    rt = job.runtime
    cfg = config.FinetuneJob(FrozenConfigDict({"seed": 0, "shuffle_buffer_size": 4}), "wait")
    if rt.process_index == 1:
        note(WAITING)
    source = pipeline.OctoData(
        cfg,
        None,
        2,
        rt.process_index,
        rt.process_count,
        build=lambda: build(rt.process_index),
        process=lambda b: b,
        transform=lambda frames: frames,
    )
    first = [int(x) for x in source.example["action"]]
    every = collectives.allgather_json(first)
    print(json.dumps({"rank": rt.process_index, "builds": source.builds, "first_batches": every}))
    return 0


if __name__ == "__main__":
    options = harness.Options.from_environment({}, None, os.environ)
    sys.exit(harness.run("finetune", options, work))
