"""The start-up watchdog's child process (``octo_dist/runtime/watchdog.py``) and the stop signals a scheduler sends to a
whole job step or session (Slurm's to every process of the step, PBS's qdel to every process of the session): the
child is not the rank, so it ignores them and stays until the rank's pipe closes; and a child killed from outside
costs the rank its backup for a held GIL, never a traceback. Real processes: the watchdog runs in a Python of its
own, and its child is found and signalled as a scheduler would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil

from helpers import HANG_S, clean_env, process_signals, wait_until, with_growing_budget

# A watchdog of argv[1] seconds. The program prints its child's pid, waits for a line on stdin, names a stage
# ("staged"), sleeps argv[2] seconds, cancels the watchdog and says "ok".
PROGRAM = textwrap.dedent(
    """
    import sys, time
    import psutil
    from octo_dist.runtime import watchdog

    dog = watchdog.Watchdog(float(sys.argv[1]), "fired: {stage}", exit_code=7)
    (child,) = psutil.Process().children()
    print(child.pid, flush=True)
    sys.stdin.readline()
    dog.stage("jax.distributed.initialize")
    print("staged", flush=True)
    time.sleep(float(sys.argv[2]))
    dog.cancel()
    print("ok", flush=True)
    """
)
STOPS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)


def start(seconds: float, sleep_after: float) -> tuple:
    """``(process, its watchdog child's pid)``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(seconds), str(sleep_after)],
        env=clean_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, int(proc.stdout.readline())


def test_stop_signals_sent_to_the_watchdogs_child_leave_it_guarding_and_the_rank_unharmed():
    """Broken by hand: without the child's ``SIG_IGN`` lines the child never ignores them (the wait fails); with
    them but sent before the child runs them, it died and the rank ended with a BrokenPipeError traceback at its
    next stage (before ``stage`` caught that)."""
    proc, child = start(HANG_S, 0)
    # Once the child has run its first lines: a Python start, seconds under load; 120 s only ends a child that
    # never ignores them.
    wait_until(
        lambda: set(STOPS) <= process_signals(child, "SigIgn"),
        what="the watchdog's child to ignore the stop signals",
        poll_s=0.01,
        hang_s=120,
    )
    for sig in STOPS:
        os.kill(child, sig)
    out, err = proc.communicate("go\n", timeout=HANG_S)
    assert proc.returncode == 0 and out == "staged\nok\n", (proc.returncode, out, err)
    assert "Traceback" not in err, err


def killed_child(deadline_s: float) -> tuple:
    """``(returncode, stdout, stderr)`` of the program with a ``deadline_s`` watchdog whose child is SIGKILLed, and
    dead, before the program names its stage."""
    proc, child = start(deadline_s, HANG_S)
    os.kill(child, signal.SIGKILL)
    # Dead: a zombie until the watchdog reaps it, its end of the pipe closed.
    wait_until(lambda: dead(child), what="the watchdog's child to die", poll_s=0.01)
    out, err = proc.communicate("go\n", timeout=HANG_S)
    return proc.returncode, out, err


def dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_child_killed_from_outside_costs_the_backup_not_the_deadline_nor_a_traceback():
    """The child SIGKILLed before the rank names its next stage: ``stage`` goes on without it, and the thread still
    ends the process at the deadline with the message and the exit code. The deadline grows when the program could
    not name its stage within it on a busy machine (helpers.with_growing_budget). Broken by hand: without the
    BrokenPipeError branch, exit 1 with a traceback from ``stage``."""
    _, (code, out, err) = with_growing_budget(killed_child, lambda r: "staged" in r[1] or r[0] != 7)
    assert code == 7 and out == "staged\n", (code, out, err)
    assert "fired: jax.distributed.initialize" in err and "Traceback" not in err, err
