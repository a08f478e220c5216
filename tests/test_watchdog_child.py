"""The start-up watchdog's child process (``octo_dist/runtime/watchdog.py``) and the stop signals a scheduler sends to a
whole job step or session (Slurm's to every process of the step, PBS's qdel to every process of the session): the
child is not the rank, so it ignores them and stays until the rank's pipe closes; and a child killed from outside
costs the rank its backup for a held GIL, never a traceback. Real processes: the watchdog runs in a Python of its
own, and its child is found and signalled as a scheduler would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from helpers import HANG_S, clean_env

# The program's first line is the child's pid, once the child ignores SIGUSR1 (bit 10 of /proc/PID/status SigIgn:
# it has run its first lines); then it waits for one line on stdin, names a stage ("staged"), sleeps, cancels and
# says "ok".
PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    import psutil
    from octo_dist.runtime import watchdog

    dog = watchdog.Watchdog(float(sys.argv[1]), "fired: {stage}", exit_code=7)
    (child,) = psutil.Process().children()

    def ignored(pid):
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
        return mask & (1 << (10 - 1))

    waited = time.monotonic()
    while sys.argv[2] == "ignores" and not ignored(child.pid):
        if time.monotonic() - waited > 90:  # a Python start takes well under a second, seconds under load
            sys.exit("the watchdog's child never ignored SIGUSR1")
        time.sleep(0.01)
    print(child.pid, flush=True)
    sys.stdin.readline()
    dog.stage("jax.distributed.initialize")
    print("staged", flush=True)
    time.sleep(float(sys.argv[3]))
    dog.cancel()
    print("ok", flush=True)
    """
)


def start(seconds: float, wait_for: str, sleep_after: float) -> subprocess.Popen:
    argv = [sys.executable, "-c", PROGRAM, str(seconds), wait_for, str(sleep_after)]
    return subprocess.Popen(
        argv,
        env=clean_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_stop_signals_sent_to_the_watchdogs_child_leave_it_guarding_and_the_rank_unharmed():
    """Broken by hand: without the child's ``SIG_IGN`` lines the program never prints the child's pid (it gives up
    after 90 s); before ``stage`` caught BrokenPipeError, a child killed by SIGUSR1 ended the rank with a
    traceback at its next stage."""
    proc = start(600, "ignores", 0)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), (line, proc.communicate(timeout=HANG_S))
    child = int(line)
    for sig in ("USR1", "USR2", "TERM", "INT"):
        subprocess.run(["kill", f"-{sig}", str(child)], check=True)
    out, err = proc.communicate("go\n", timeout=HANG_S)
    assert proc.returncode == 0 and out == "staged\nok\n", (proc.returncode, out, err)
    assert "Traceback" not in err, err


def test_a_child_killed_from_outside_costs_the_backup_not_the_deadline_nor_a_traceback():
    """The child SIGKILLed before the rank names its next stage: ``stage`` goes on without it, and the thread still
    ends the process at the deadline with the message and the exit code. Broken by hand: without the
    BrokenPipeError branch, exit 1 with a traceback from ``stage``."""
    proc = start(DEADLINE_S, "", HANG_S)
    child = int(proc.stdout.readline())
    subprocess.run(["kill", "-KILL", str(child)], check=True)
    # Dead (a zombie until the watchdog reaps it: its end of the pipe is closed) before the stage is written.
    while state(child) not in ("Z", None):
        time.sleep(0.01)
    out, err = proc.communicate("go\n", timeout=HANG_S)
    assert proc.returncode == 7 and out == "staged\n", (proc.returncode, out, err)
    assert "fired: jax.distributed.initialize" in err and "Traceback" not in err, err


# Long enough that the program names its stage before the deadline on a loaded machine (it does within a second),
# short enough to wait for: the thread's deadline is what ends the process here.
DEADLINE_S = 10


def state(pid: int):
    """``"Z"``, ``"S"``, ... from /proc/PID/status, None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(line.split()[1] for line in f if line.startswith("State:"))
    except FileNotFoundError:
        return None
