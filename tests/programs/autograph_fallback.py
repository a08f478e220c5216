"""Run by tests/test_tfquiet.py: a tf.data map over a function whose source file is gone (as AutoGraph meets the
fork's transforms), before and after ``tfquiet.quiet_autograph``. Prints, as JSON, the ``tensorflow`` logger's
records of each run and the values mapped.

usage: autograph_fallback.py WORKDIR
"""

import importlib
import json
import linecache
import logging
import os
import sys

import tensorflow as tf

from octo_dist.apps.finetune import tfquiet

workdir = sys.argv[1]
seen = []


class Keep(logging.Handler):
    def emit(self, record):
        seen.append(record.getMessage().split("\n")[0])


logging.getLogger("tensorflow").addHandler(Keep())
sys.path.insert(0, workdir)


def mapped_with_source_gone(name: str) -> list:
    """A module with one plain function, imported, then its file removed: AutoGraph cannot read the source."""
    path = os.path.join(workdir, f"{name}.py")
    with open(path, "w") as f:
        f.write("def add_one(x):\n    return x + 1\n")
    module = importlib.import_module(name)
    os.unlink(path)
    linecache.clearcache()
    return [int(v) for v in tf.data.Dataset.range(3).map(module.add_one).as_numpy_iterator()]


out = {"before": {"values": mapped_with_source_gone("gone_a")}}
out["before"]["records"], seen[:] = list(seen), []
out["installed"] = tfquiet.quiet_autograph(os.environ)
out["after"] = {"values": mapped_with_source_gone("gone_b"), "records": list(seen)}
print(json.dumps(out))
