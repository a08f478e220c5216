#!/usr/bin/env python3
"""Run a training script unchanged and record, step by step, where its host's time goes.

    python bench/step_profile.py OUT.json --step train_step FORK/scripts/finetune.py --config=...
    python bench/step_profile.py OUT.json --step compiled -m octo_dist finetune --config=...

Before the script runs, JAX's and tf.data's entry points are wrapped so that every call is stamped
(``time.perf_counter()``, start and end) with what it moved:

* ``step``: a call of the train step, the jitted function named ``--step`` (the fork's ``train_step``) or, with
  ``--step compiled``, an ahead-of-time compiled executable (octo-dist compiles its step with ``.lower().compile()``);
  with the CPU's synchronous dispatch in jax < 0.4.31 the call returns when the step is computed. Numpy arguments
  are implicit host-to-device copies: their bytes are counted as ``h2d``;
* ``h2d``: ``jax.device_put``, ``multihost_utils.host_local_array_to_global_array``,
  ``jax.make_array_from_process_local_data``, ``jax.make_array_from_single_device_arrays`` (bytes of numpy leaves);
* ``fetch``: a device-to-host read: ``jax.device_get``, ``float()``/``int()``/``np.asarray`` of a jax array,
  ``block_until_ready``;
* ``input``: the ``next()`` of a tf.data numpy iterator (``as_numpy_iterator``: both pipelines hand out batches so);
* ``compile``: each XLA compilation (``jax.monitoring``'s backend compile event), stamped at its end.

Steps are the intervals between consecutive step calls. Writes, even when the script fails::

    {"devices": 1, "events": [["step", 12.1, 12.3, 0, true], ["fetch", 12.3, 12.31, 0, true], ...]}

(kind, start, end, bytes moved, whether the main thread made the call).

:func:`breakdown` turns that into medians per step (``bench/startup_fork.py`` prints both sides' side by side).
"""

from __future__ import annotations

import functools
import json
import threading
from concurrent import futures
import runpy
import statistics
import sys
import time
from typing import Mapping, Optional


def _nbytes(tree) -> int:
    import jax
    import numpy as np

    return sum(
        x.nbytes for x in jax.tree_util.tree_leaves(tree) if isinstance(x, (np.ndarray, np.generic))
    )


class Recorder:
    """The wrapped entry points and the events they stamp."""

    def __init__(self, step: str):
        self.step = step
        self.events: list = []
        # per thread: a call inside a wrapped call (device_get calls np.asarray) is stamped once
        self._local = threading.local()
        self._main = threading.main_thread().ident

    def timed(self, kind: str, fn, size=None):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if getattr(self._local, "depth", 0):
                return fn(*args, **kwargs)
            self._local.depth = 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.depth = 0
                moved = size(args, kwargs) if size else 0
                self.record(kind, start, time.perf_counter(), moved)

        return wrapper

    def record(self, kind: str, start: float, end: float, moved: int = 0) -> None:
        """One event; ``main``: whether the main thread (the training loop's) made the call."""
        self.events.append([kind, start, end, moved, threading.get_ident() == self._main])

    def install(self) -> None:
        import jax
        import jax.stages
        import numpy as np
        from jax._src import array
        from jax.experimental import multihost_utils

        args_bytes = lambda args, kwargs: _nbytes((args, kwargs))  # noqa: E731
        for name in (
            "device_put",
            "make_array_from_process_local_data",
            "make_array_from_single_device_arrays",
        ):
            if hasattr(jax, name):
                setattr(jax, name, self.timed("h2d", getattr(jax, name), args_bytes))
        multihost_utils.host_local_array_to_global_array = self.timed(
            "h2d", multihost_utils.host_local_array_to_global_array, args_bytes
        )
        jax.device_get = self.timed("fetch", jax.device_get)
        impl = array.ArrayImpl
        for name in ("__float__", "__int__", "__array__", "item", "block_until_ready"):
            setattr(impl, name, self.timed("fetch", getattr(impl, name)))
        del np  # np.asarray(x) reaches ArrayImpl.__array__

        inner_jit = jax.jit
        recorder = self

        def jit(fun=None, *a, **kw):
            if fun is None:  # jax.jit(static_argnums=...) used as a decorator factory
                return lambda f: jit(f, *a, **kw)
            jitted = inner_jit(fun, *a, **kw)
            if getattr(fun, "__name__", None) != recorder.step:
                return jitted
            return recorder.timed("step", jitted, args_bytes)

        jax.jit = jit
        if self.step == "compiled":
            jax.stages.Compiled.__call__ = self.timed(
                "step", jax.stages.Compiled.__call__, args_bytes
            )

        def compiled(event: str, seconds: float) -> None:
            if event.endswith("backend_compile_duration"):
                now = time.perf_counter()
                self.record("compile", now - seconds, now)

        jax.monitoring.register_event_duration_secs_listener(compiled)
        # The main thread waiting for a batch a worker thread makes (octo-dist's next batch) is waiting for input.
        futures.Future.result = self.timed("input", futures.Future.result)
        self._install_tf()

    def _install_tf(self) -> None:
        try:
            import tensorflow as tf
        except ImportError:  # a script without tf.data: nothing to stamp there
            return

        outer = tf.data.Dataset.as_numpy_iterator
        recorder = self

        class Timed:
            def __init__(self, it):
                self.it = it

            def __iter__(self):
                return self

            def __next__(self):
                start = time.perf_counter()
                try:
                    return next(self.it)
                finally:
                    recorder.record("input", start, time.perf_counter())

        tf.data.Dataset.as_numpy_iterator = lambda ds: Timed(outer(ds))

    def write(self, path: str) -> None:
        import jax

        with open(path, "w") as f:
            json.dump({"devices": jax.device_count(), "events": self.events}, f)


def breakdown(recorded: Mapping, skip: int = 2) -> Optional[dict]:
    """Medians over the steps after the first ``skip`` (as the steady step is measured) of what each step interval
    held (None: fewer than ``skip + 2`` steps recorded)::

        {"steps": 37, "devices": 1, "interval_s": 0.15, "step_s": 0.147, "step_h2d_bytes": 0,
         "h2d_n": 2, "h2d_s": 0.0003, "h2d_bytes": 4, "fetch_n": 5, "fetch_s": 0.0001, "input_n": 1,
         "input_s": 0.0026, "other_s": 0.0001, "beside_s": 0.05, "beside_h2d_bytes": 3.9e6, "compile_n": 0}

    Counts and ``*_s`` (seconds) are the main thread's calls inside the interval, where the training loop waits;
    ``other_s`` is the rest of the interval (Python, logging, the progress bar); ``beside_s`` the time worker
    threads spent in wrapped calls meanwhile (octo-dist's next batch: its transfer and augmentation), overlapped with
    the step; ``compile_n`` the compilations in all those intervals (a total: none in a steady state)."""
    events = sorted(recorded["events"], key=lambda e: e[1])
    steps = [e for e in events if e[0] == "step" and e[4]]
    if len(steps) < skip + 2:
        return None
    rows = []
    for this, after in zip(steps[skip:], steps[skip + 1 :]):
        lo, hi = this[1], after[1]
        inside = [e for e in events if lo <= e[1] < hi and e is not this]
        row = {"interval_s": hi - lo, "step_s": this[2] - this[1], "step_h2d_bytes": this[3]}
        for kind in ("h2d", "fetch", "input"):
            mine = [e for e in inside if e[0] == kind and e[4]]
            row[f"{kind}_n"] = len(mine)
            row[f"{kind}_s"] = sum(e[2] - e[1] for e in mine)
            row[f"{kind}_bytes"] = sum(e[3] for e in mine)
        row["other_s"] = row["interval_s"] - sum(
            row[k] for k in ("step_s", "h2d_s", "fetch_s", "input_s")
        )
        beside = [e for e in inside if not e[4] and e[0] in ("step", "h2d", "input")]
        row["beside_s"] = sum(e[2] - e[1] for e in beside)
        row["beside_h2d_bytes"] = sum(e[3] for e in beside if e[0] == "h2d")
        row["compile_n"] = sum(1 for e in inside if e[0] == "compile")
        rows.append(row)
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["compile_n"] = sum(r["compile_n"] for r in rows)
    return {"steps": len(rows), "devices": recorded.get("devices"), **out}


def main() -> None:
    out, flag, step, *rest = sys.argv[1:]
    if flag != "--step":
        sys.exit(f"usage: {__doc__.splitlines()[2].strip()}")
    recorder = Recorder(step)
    recorder.install()
    try:
        if rest[0] == "-m":
            sys.argv = [rest[1], *rest[2:]]
            runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
        else:
            import os

            sys.argv = list(rest)
            sys.path[0] = os.path.dirname(os.path.abspath(rest[0]))
            runpy.run_path(rest[0], run_name="__main__")
    finally:
        recorder.write(out)


if __name__ == "__main__":
    main()
