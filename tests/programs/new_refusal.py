"""Run by tests/test_problems.py under mpirun: a refusal type the harness has never heard of, raised deep inside the
job's work on every rank. The harness must map it from its type alone: exit 2, one line from rank 0.

usage: new_refusal.py
"""

import os
import sys

from octo_dist.apps import harness
from octo_dist.problems import Refusal


class TelescopeError(Refusal):
    """A refusal defined here, after the harness was written: it appears in no list."""


def check_the_telescope(rank: int) -> None:
    raise TelescopeError(
        "the telescope's lens cap is on", "an open lens", "octo-dist telescope --uncap"
    )


def work(job: harness.Job) -> int:
    # Below the harness, two calls deep: the harness cannot know the type by name.
    check_the_telescope(job.runtime.process_index)
    return 0


options = harness.Options.from_environment(
    {"launcher": "auto", "coordinator": None, "timeout_s": 120, "devices": "one"}, None, os.environ
)
sys.exit(harness.run("telescope", options, work))
