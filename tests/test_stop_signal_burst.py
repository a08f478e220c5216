"""A qdel's SIGTERM, the rank guard's copy of it and the job runtime's SIGUSR1 reach a rank within microseconds: the
stop handler takes the first and drops the rest without a word, in a real process with real signals.

Made deterministic: the program blocks the signals, sends itself SIGTERM and SIGUSR1, and unblocks them; the kernel
then delivers both at once and Python runs their handlers one after the other (SIGUSR1, the lower number, first)."""

from __future__ import annotations

import sys

import pytest

import helpers

PROGRAM = """
import os, signal, sys
from octo_dist.runtime import stopping

stop = stopping.StopSignal()
burst = [signal.Signals[name] for name in sys.argv[1:]]
signal.pthread_sigmask(signal.SIG_BLOCK, burst)
for s in burst:
    os.kill(os.getpid(), s)
signal.pthread_sigmask(signal.SIG_UNBLOCK, burst)  # both delivered here, their handlers run on return
print("stopping on", stop.name(stop.pending), flush=True)
stop.close()
os.kill(os.getpid(), signal.SIGTERM)  # after close: ignored
print("handlers", " ".join(signal.Handlers(signal.getsignal(s)).name for s in stopping.SIGNALS), flush=True)
"""


@pytest.mark.parametrize(
    "burst, first",
    [
        (("SIGTERM", "SIGUSR1"), "SIGUSR1"),
        # Ctrl-C (or kill -INT) beside a qdel's signals; before: a KeyboardInterrupt traceback
        (("SIGTERM", "SIGUSR1", "SIGINT"), "SIGINT"),
    ],
)
def test_a_burst_of_stop_signals_is_one_stop_and_no_traceback(burst, first):
    """Before: the first handler set SIG_IGN for the others, and Python reported the one it had already noted as
    "OSError: Signal 15 ignored due to race condition" with a traceback in the rank's log. The kernel delivers the
    lowest number first: SIGINT (2), then SIGUSR1 (10), then SIGTERM (15)."""
    proc = helpers.run_captured([sys.executable, "-c", PROGRAM, *burst])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"stopping on {first}",
        "handlers SIG_IGN SIG_IGN SIG_IGN SIG_IGN",
    ], proc.stdout + proc.stderr
    assert "race condition" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
