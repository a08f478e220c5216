"""The start-up clock: where the time from process start to the first step goes, phase by phase.

    startclock.done("checks")                      # the time since the previous mark went to flags and checks
    compiling = startclock.Background("compile", engine.compile, abstract_state, batch)
    ...                                            # the main thread goes on (parameters, data)
    compiled = compiling.result()                  # waits, re-raises what the thread raised
    startclock.done("compile")                     # only the wait is on the main thread's timeline

Phases are marked on the main thread in the order start-up passes them; the time between two marks belongs to the
later mark's phase, so the phases add up to the time to the first step however many a job marks. A phase marked
twice adds up (``imports``: the command line's, then the job's TensorFlow and Octo). Work a background thread did
beside the main thread is recorded with its own duration (``beside()``), outside the sum.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

_lock = threading.Lock()
_marks: List[Tuple[str, float]] = []  # [("imports", 1733353200.1), ("checks", 1733353200.4), ...]
_beside: Dict[str, float] = {}  # {"compile": 14.2}: seconds of work done beside the main thread


def done(phase: str, at: Optional[float] = None) -> float:
    """The main thread finished ``phase`` now (or ``at``, ``time.time()``); returns the mark's time."""
    t = time.time() if at is None else at
    with _lock:
        _marks.append((phase, t))
    return t


def beside(name: str, seconds: float) -> None:
    """``seconds`` of ``name``'s work ran in a background thread, overlapped with the main thread's phases."""
    with _lock:
        _beside[name] = _beside.get(name, 0.0) + seconds


def marks() -> List[Tuple[str, float]]:
    with _lock:
        return list(_marks)


def besides() -> Dict[str, float]:
    with _lock:
        return dict(_beside)


def clear() -> None:
    """Forget every mark (a process that starts a second job, tests)."""
    with _lock:
        _marks.clear()
        _beside.clear()


class Background:
    """``fn(*args)`` started now in a daemon thread, its duration recorded as ``name``'s work beside the main
    thread. ``result()`` waits and returns its value, or raises what it raised (in the caller's thread, so a
    failure is reported where the job would have met it without the overlap)."""

    def __init__(self, name: str, fn: Callable[..., Any], *args: Any):
        self.name = name
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(
            target=self._run, args=(fn, args), name=f"octo-dist {name}", daemon=True
        )
        self._thread.start()

    def _run(self, fn, args) -> None:
        started = time.perf_counter()
        try:
            self._value = fn(*args)
        except BaseException as e:  # handed to result(): the caller's thread raises it
            self._error = e
        finally:
            beside(self.name, time.perf_counter() - started)

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value
