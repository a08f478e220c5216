"""Run by tests/test_disk_full.py, alone or under mpirun: the tiny model trained through the harness (as the smoke and
finetune jobs are), saving every 2 steps, while "another job" (rank 0, after step 2) fills the save directory's file
system, so the save at step 4 hits ENOSPC. Prints what the harness prints; exits with its code.

usage: disk_fills.py SAVE_DIR FILLER
"""

import os
import sys

import optax

from octo_dist import savelayout
from octo_dist.apps import harness
from octo_dist.engine import data, train
from octo_dist.policies.tiny import TinyPolicy
from octo_dist.runtime import tracking

save_dir, filler = sys.argv[1], sys.argv[2]


def fill_the_disk() -> None:
    """Write until the file system is full, then free 64 KiB: less than a checkpoint."""
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError:
            pass
    os.truncate(filler, max(os.path.getsize(filler) - (64 << 10), 0))


def work(job: harness.Job) -> int:
    rt = job.runtime

    def on_step(step, values):
        if step == 2 and rt.is_main:
            fill_the_disk()

    source = data.SyntheticData(data.Spec(), 8, rt.process_index, rt.process_count, rt.device_count)
    cfg = train.TrainConfig(steps=12, layout=savelayout.RunLayout(save_dir), save_every=2)
    tracker = tracking.NoopTracker("disk-fills")
    harness.fit(job, TinyPolicy(), optax.adam(1e-3), source, cfg, tracker=tracker, on_step=on_step)
    return 0


options = harness.Options.from_environment(
    {"launcher": "auto", "coordinator": None, "timeout_s": 120, "devices": "one"}, None, os.environ
)
sys.exit(harness.run("disk-fills", options, work))
