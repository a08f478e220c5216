"""A rank outlives nothing it depends on: the real rank guard between a stand-in launcher and a stand-in rank (small
Python programs), the launcher or the guard SIGKILLed as ``kill -9`` or the out-of-memory killer would.

The whole job's view (the supervisor ends the launcher's process group first) is in ``test_qdel_stops.py``; here the
guard's own watch is what ends the rank, as on a node where the launcher's daemon died and no supervisor runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers
from helpers import REPO, clean_env

WAIT_S = 60  # the guard looks once a second: a minute whatever the load

# Stands in for mpirun (or its daemon on another node): starts its arguments (the guard) and waits.
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.Popen(sys.argv[1:]).wait())"
# Stands in for a rank: says its pid, then trains for ten minutes.
RANK = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"


def running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except OSError:
        return False


def children(pid: int) -> list:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                text = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            if int(text[text.rfind(")") + 1 :].split()[1]) == pid:
                out.append(int(name))
    return out


def start(tmp_path: Path):
    """(launcher, guard pid, rank pid): the launcher in a session of its own, the guard below it, the rank below."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    said = tmp_path / "rank.pid"
    launcher = helpers.popen(
        [sys.executable, "-c", LAUNCHER, sys.executable, "-m", "octo_dist.jobs.supervisor"]
        + ["octo-dist-rank", str(job_dir), sys.executable, "-c", RANK, str(said)],
        env=clean_env(OMPI_COMM_WORLD_RANK="1"),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + WAIT_S
    while not said.exists() or not said.read_text():
        assert launcher.poll() is None and time.monotonic() < deadline, "the rank did not start"
        time.sleep(0.05)
    (guard,) = children(launcher.pid)
    return launcher, guard, int(said.read_text())


def gone_within(pid: int, seconds: float = WAIT_S) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not running(pid)


def end(launcher: subprocess.Popen, *pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launcher.wait()


def test_a_guard_whose_launcher_is_killed_ends_its_rank_and_says_so(tmp_path):
    """Before: the guard waited for its rank, which trained on for as long as it liked."""
    launcher, guard, rank = start(tmp_path)
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        rank_gone, guard_gone = gone_within(rank), gone_within(guard)
    finally:
        end(launcher, guard, rank)
    assert rank_gone and guard_gone, (rank_gone, guard_gone)
    note = (tmp_path / "job" / "failed" / "rank-1").read_text()
    assert note.startswith("rank 1 on ") and "lost its launcher (pid " in note, note
    assert note.strip().endswith("ended with status 137"), note


def test_a_rank_whose_guard_is_killed_ends(tmp_path):
    """Before: a SIGKILLed guard left its rank to the init process, training on."""
    launcher, guard, rank = start(tmp_path)
    try:
        os.kill(guard, signal.SIGKILL)
        rank_gone = gone_within(rank)
    finally:
        end(launcher, guard, rank)
    assert rank_gone
