#!/usr/bin/env python3
"""Run the Octo fork's ``scripts/finetune.py`` unchanged and record when each iteration of its training loop starts.

The fork's loop is ``for i in tqdm.tqdm(range(0, num_steps), ...)``; this wraps ``tqdm.tqdm.__iter__`` so that every
item a tqdm over a ``range`` hands out is stamped (``time.time()``) first, then runs the script as ``__main__``. The
stamps of other progress bars (the fork's dataset statistics, a ``tqdm`` over a dataset iterator) are not kept. With
``--config.log_interval=1`` the fork calls ``jax.device_get`` on every step's metrics, so iteration i+1 starting means
step i finished; the last stamp is the loop's end. Writes, even when the script fails::

    {"process_started": 1733355600.12, "iteration_starts": [1733355671.5, 1733355673.9, ...], "script": "..."}

usage: bench/fork_timing.py OUT.json FORK/scripts/finetune.py [--config=... --config.FIELD=VALUE ...]
"""

import json
import os
import runpy
import sys
import time

import tqdm

from octo_dist.apps.harness import process_started


def main() -> None:
    out, script, *flags = sys.argv[1:]
    # The process start as octo-dist's summary reads its own (the kernel's boot clock): one definition for both.
    started = process_started()
    stamps = []
    inner = tqdm.tqdm.__iter__

    def stamped(bar):
        timed = isinstance(bar.iterable, range)
        for item in inner(bar):
            if timed:
                stamps.append(time.time())
            yield item
        if timed:  # the loop asked for an item after its last one: the last step is done
            stamps.append(time.time())

    tqdm.tqdm.__iter__ = stamped
    # The script sees its own path, flags and sys.path[0], as `python FORK/scripts/finetune.py FLAGS` gives them.
    sys.argv = [script, *flags]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        with open(out, "w") as f:
            json.dump({"process_started": started, "iteration_starts": stamps, "script": script}, f)


if __name__ == "__main__":
    main()
