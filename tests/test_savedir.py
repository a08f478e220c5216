"""Save directory checks before training: writable from every rank, room for two checkpoints, one run per directory.

A read-only directory is made with a read-only bind mount in a private mount namespace (``unshare -m``): root, which
runs these tests here, ignores permission bits, so ``chmod`` alone would prove nothing."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import helpers
from helpers import HANG_S, PROGRAMS, REPO, clean_env, read_only_namespace_prefix, run_captured

from octo_dist import savelayout
from octo_dist.engine import room, savedir
from octo_dist.engine.savedir import LOCK_NAME, RunLock, SaveDirError

MiB, GiB = 1 << 20, 1 << 30


def one_line_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


# --- writable ------------------------------------------------------------------------------------------------


def test_a_read_only_directory_is_refused_before_training_even_for_root(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    code = (
        "import sys\nfrom octo_dist import savelayout\nfrom octo_dist.engine import savedir\n"
        "try:\n    savedir.prepare(savelayout.RunLayout(sys.argv[1]), state_bytes=1 << 20)\n"
        "except savedir.SaveDirError as e:\n    print(e); sys.exit(2)\n"
    )
    for target in (ro, ro / "run1"):  # the directory itself, and a new one to be created inside it
        p = run_captured([*read_only_namespace_prefix(ro), sys.executable, "-c", code, str(target)])
        assert p.returncode == 2, p.stderr
        line = one_line_error(p.stdout)
        assert f"save directory {target} is not writable from rank 0" in line, line
        assert (
            "Read-only file system" in line
            and "expected a directory every rank can create files in" in line
        )
        assert "Fix: " in line
    assert list(ro.iterdir()) == []  # nothing was written, no lock left behind


def test_a_writable_directory_is_created_probed_and_left_clean(tmp_path):
    target = tmp_path / "new" / "run"
    assert savedir.probe_writable(target, "rank 0 on h") is None
    assert target.is_dir() and list(target.iterdir()) == []


def test_a_save_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "notadir"
    f.write_text("x")
    problem = savedir.probe_writable(f, "rank 0 on h")
    assert "is a file, not a directory" in problem and "Fix: " in problem


@pytest.mark.mpi
def test_one_rank_that_cannot_write_stops_every_rank_with_its_error(tmp_path):
    """Rank 1 alone sees the directory read-only (its own mount namespace); rank 0 could write. Both must refuse,
    with rank 1's error, instead of rank 0 training on and rank 1 dying at the first save."""
    exe = Path(sys.executable).parent / "mpirun"
    if not exe.exists():
        pytest.skip("no mpirun in this venv")
    save = tmp_path / "save"
    save.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    prefix = shlex.join(read_only_namespace_prefix(save))
    rank_cmd = f'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec {prefix} "$@"; else exec "$@"; fi'
    # mpirun starts both ranks through bash: rank 1 inside the namespace where the save directory is read-only
    ranks = [str(exe), "--oversubscribe", "-np", "2", "bash", "-c", rank_cmd, "rank"]
    p = run_captured(
        [*ranks, sys.executable, str(PROGRAMS / "savedir_check.py"), str(save), str(out)],
        timeout=helpers.MPI_TIMEOUT,
    )
    outcomes = {}
    for rank in (0, 1):
        f = out / f"{rank}.json"
        assert f.exists(), (
            f"rank {rank} wrote no outcome (mpirun exit {p.returncode}):\n{p.stderr[-3000:]}"
        )
        outcomes[rank] = json.loads(f.read_text())
    for rank, o in outcomes.items():
        assert (
            o["error"] and f"is not writable from rank 1 on {socket.gethostname()}" in o["error"]
        ), (rank, o)
    assert outcomes[0]["error"] == outcomes[1]["error"]
    assert not (
        save / LOCK_NAME
    ).exists()  # rank 0 took the lock, then gave it back on the shared refusal


# --- free space ----------------------------------------------------------------------------------------------


def test_free_space_for_two_checkpoints_is_required():
    state = 400 * MiB
    one = room.checkpoint_nbytes(state)
    assert one >= state
    assert room.space_problem("/groups/gxx00000/run", 2 * one, state) is None
    assert room.space_problem("/groups/gxx00000/run", 2 * one - 1, state) is not None
    problem = room.space_problem("/groups/gxx00000/run", 500 * MiB, state)
    assert problem.startswith(
        "save directory /groups/gxx00000/run has 500.0 MiB free; expected at least 842.0 MiB "
        "(2 checkpoints of 421.0 MiB each"
    ), problem
    assert "Fix: " in problem and "\n" not in problem
    assert "has 1.0 GiB free" in room.space_problem("/d", GiB, 10 * GiB)
    assert room.space_problem("/d", 0, 0) is not None  # even an empty state needs its metadata


def test_state_size_is_read_from_an_abstract_state():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    abstract = jax.eval_shape(
        lambda: {
            "w": jnp.zeros((1000, 256), jnp.float32),
            "b": jnp.zeros(7, jnp.bfloat16),
            "step": jnp.zeros((), jnp.int32),
        }
    )
    assert room.state_nbytes(abstract) == 1000 * 256 * 4 + 7 * 2 + 4


def test_free_bytes_of_a_path_not_yet_created_is_its_file_system(tmp_path):
    st = os.statvfs(tmp_path)
    # The same file system, read moments apart: within 64 MiB of each other however busy the disk is.
    assert abs(room.free_bytes(tmp_path / "a" / "b") - st.f_bavail * st.f_frsize) < 64 * MiB


# --- the run lock --------------------------------------------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from octo_dist.engine import savedir
lock = savedir.RunLock(sys.argv[1], "12345.pbs1").acquire()
Path(sys.argv[2]).write_text("held")
sys.stdin.read()          # hold until the test closes stdin or kills this process
lock.release()
"""


def hold_lock(directory: Path, tmp_path: Path) -> subprocess.Popen:
    flag = tmp_path / f"held.{time.monotonic_ns()}"
    p = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), str(flag)],
        stdin=subprocess.PIPE,
        env=clean_env(),
        cwd=REPO,
        text=True,
    )
    deadline = time.monotonic() + HANG_S  # only ends a hang
    while not flag.exists():
        assert p.poll() is None, f"the lock holder exited ({p.returncode}) before taking the lock"
        assert time.monotonic() < deadline, (
            f"waited {HANG_S} s for the holder process to take the lock"
        )
        time.sleep(0.05)
    return p


def test_a_second_run_is_refused_naming_the_holder_then_takes_over_when_it_dies(tmp_path, caplog):
    d = tmp_path / "run"
    holder = hold_lock(d, tmp_path)
    try:
        with pytest.raises(SaveDirError) as e:
            RunLock(d, "999.pbs1").acquire()
        msg = str(e.value)
        assert "\n" not in msg
        assert (
            f"is in use by another run (host {socket.gethostname()}, pid {holder.pid}, job 12345.pbs1, since "
            in msg
        )
        assert (
            "expected one run per save directory" in msg and "Fix: wait for that run to end" in msg
        )
    finally:
        holder.send_signal(signal.SIGKILL)  # a job killed at its wall time: its lock stays behind
        holder.wait(timeout=HANG_S)
    assert (d / LOCK_NAME).exists()
    with caplog.at_level(logging.WARNING, logger=savedir.__name__):
        lock = RunLock(d, "999.pbs1").acquire()
    try:
        assert lock.taken_over["pid"] == holder.pid
        assert f"pid {holder.pid} on this host) is gone" in caplog.text
        assert json.loads((d / LOCK_NAME).read_text())["job_id"] == "999.pbs1"
    finally:
        lock.release()
    assert not (d / LOCK_NAME).exists()


def test_a_lock_released_by_its_holder_is_free_again(tmp_path):
    d = tmp_path / "run"
    holder = hold_lock(d, tmp_path)
    holder.communicate("", timeout=HANG_S)  # closes stdin: the holder releases and exits
    assert holder.returncode == 0 and not (d / LOCK_NAME).exists()
    with RunLock(d) as lock:
        assert lock.taken_over is None


def fabricate_lock(d: Path, host: str, pid: int, age_s: float) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / LOCK_NAME).write_text(
        json.dumps({"host": host, "pid": pid, "job_id": "77.pbs1", "started": time.time() - age_s})
    )
    os.utime(d / LOCK_NAME, (time.time() - age_s, time.time() - age_s))


def test_a_lock_from_another_host_is_stale_only_once_it_stops_being_refreshed(tmp_path):
    d = tmp_path / "run"
    fabricate_lock(d, "g0099", 1, age_s=60)
    with pytest.raises(
        SaveDirError, match="in use by another run \\(host g0099, pid 1, job 77.pbs1"
    ):
        RunLock(d).acquire()
    fabricate_lock(d, "g0099", 1, age_s=savedir.STALE_AFTER_S + 60)
    lock = RunLock(d).acquire()
    assert lock.taken_over["host"] == "g0099"
    lock.release()


def test_an_unreadable_lock_is_respected_until_it_is_old(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / LOCK_NAME).write_text("{not json")
    with pytest.raises(SaveDirError, match="host \\?, pid \\?"):
        RunLock(d).acquire()
    os.utime(d / LOCK_NAME, (0, 0))
    RunLock(d).acquire().release()


def test_the_holder_refreshes_its_lock(tmp_path):
    d = tmp_path / "run"
    lock = RunLock(d, heartbeat_s=0.05).acquire()
    try:
        os.utime(d / LOCK_NAME, (1, 1))
        deadline = time.monotonic() + 60
        while os.stat(d / LOCK_NAME).st_mtime < 2:
            assert time.monotonic() < deadline, (
                "waited 60 s for the heartbeat thread to touch the lock"
            )
            time.sleep(0.05)
    finally:
        lock.release()


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    d = tmp_path / "run"
    lock = RunLock(d).acquire()
    fabricate_lock(d, "g0099", 1, age_s=0)  # taken over by another run while this one looked dead
    lock.release()
    assert json.loads((d / LOCK_NAME).read_text())["host"] == "g0099"


def test_stale_reasons():
    alive = {10}.__contains__
    assert (
        savedir.stale_reason({"host": "a", "pid": 11}, 5, "a", alive)
        == "its process (pid 11 on this host) is gone"
    )
    assert savedir.stale_reason({"host": "a", "pid": 10}, 5, "a", alive) is None
    assert (
        savedir.stale_reason({"host": "b", "pid": 11}, 5, "a", alive) is None
    )  # can't see b's pids
    assert "last refreshed 20 min ago" in savedir.stale_reason(
        {"host": "b", "pid": 11}, 1200, "a", alive
    )
    assert savedir.stale_reason({}, 5, "a", alive) is None


def test_job_id_from_the_scheduler():
    assert savedir.job_id({"PBS_JOBID": "12345.pbs1"}) == "12345.pbs1"
    assert savedir.job_id({"SLURM_JOB_ID": "77"}) == "77"
    # Grid Engine's JOB_ID names a job only beside Grid Engine's own variables (a build script's JOB_ID is not one)
    assert savedir.job_id({"JOB_ID": "9876543", "SGE_ROOT": "/opt/sge"}) == "9876543"
    assert savedir.job_id({"JOB_ID": "9876543"}) is None
    assert savedir.job_id({}) is None


def test_prepare_in_one_process_locks_and_a_second_prepare_is_refused(tmp_path):
    pytest.importorskip("jax")
    d = tmp_path / "run"
    layout = savelayout.RunLayout(str(d))
    claim = savedir.prepare(layout, state_bytes=MiB, environ={"PBS_JOBID": "1.pbs1"})
    try:
        assert isinstance(claim, RunLock)
        with pytest.raises(SaveDirError, match="job 1.pbs1"):
            savedir.prepare(layout, state_bytes=MiB)
    finally:
        claim.release()
    with pytest.raises(SaveDirError, match="expected at least"):
        savedir.prepare(layout, state_bytes=1 << 60)
    assert not (d / LOCK_NAME).exists()  # the space check failed before any lock was taken
    assert isinstance(savedir.prepare(None), savedir.NoClaim)


def test_first_problem_names_the_other_ranks():
    assert (
        savedir.first_problem([{"rank": 0, "problem": None}, {"rank": 1, "problem": None}]) is None
    )
    reports = [
        {"rank": 0, "problem": None},
        {"rank": 1, "problem": "x"},
        {"rank": 2, "problem": "y"},
    ]
    assert savedir.first_problem(reports) == "x (rank 2 too)"
    assert savedir.first_problem(reports + [{"rank": 3, "problem": "z"}]) == "x (ranks 2, 3 too)"


# --- what may be planted at the lock's name ----------------------------------------------------------------------


def plant(d: Path, kind: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / LOCK_NAME
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif (
        kind == "link-to-a-lock"
    ):  # even a link to a real lock file: the lock is a file of this directory
        fabricate_lock(d / "elsewhere", "g0099", 1, age_s=0)
        path.symlink_to(d / "elsewhere" / LOCK_NAME)
    elif kind == "directory":
        path.mkdir()
    return path


@pytest.mark.parametrize(
    "kind, says",
    [
        ("fifo", "is a FIFO"),
        ("dev-zero", "is a symbolic link to /dev/zero"),
        ("link-to-a-lock", "is a symbolic link to"),
        ("directory", "is a directory"),
    ],
)
def test_something_at_the_locks_name_that_is_not_a_lock_file_is_refused_in_one_line(
    tmp_path, kind, says
):
    """Before: a FIFO there blocked the start forever (the lock was opened to read who holds it), a link to
    /dev/zero was read without end."""
    d = tmp_path / "run"
    path = plant(d, kind)
    with pytest.raises(SaveDirError) as refused:
        RunLock(d).acquire()
    said = str(refused.value)
    assert f"the run lock {path} {says}" in said and f"rm {path}" in said, said
    assert "\n" not in said and refused.value.exit_status == 2
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(LOCK_NAME)) == [LOCK_NAME]


def test_a_binary_lock_is_unreadable_not_a_traceback_and_stale_once_old(tmp_path):
    """Before: ``UnicodeDecodeError`` from reading a lock of bytes that are not UTF-8 (a disk error, a file copied
    over it)."""
    d = tmp_path / "run"
    d.mkdir()
    (d / LOCK_NAME).write_bytes(b"\x89\xff\xfe\x00 not a lock" * 100)
    with pytest.raises(SaveDirError, match="in use by another run \\(host \\?, pid \\?"):
        RunLock(d).acquire()
    os.utime(d / LOCK_NAME, (0, 0))
    lock = RunLock(d).acquire()
    assert lock.taken_over == {}
    lock.release()
    assert not (d / LOCK_NAME).exists()


def test_the_lock_is_written_through_no_link_planted_at_a_name_it_once_used(tmp_path):
    """The lock's content was written first to ``.octo-dist.lock.<host>.<pid>.tmp``, a name anyone could plant a
    link at."""
    d = tmp_path / "run"
    d.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    (d / f"{LOCK_NAME}.vm.{os.getpid()}.tmp").symlink_to(victim)
    lock = RunLock(d, host="vm").acquire()
    try:
        assert victim.read_text() == "someone else's file\n"
        assert json.loads((d / LOCK_NAME).read_text())["pid"] == os.getpid()
        assert (d / LOCK_NAME).stat().st_mode & 0o777 == 0o644
    finally:
        lock.release()


def test_smoke_with_a_fifo_at_the_lock_ends_in_one_line_and_exit_2(tmp_path):
    """The whole start, as a user meets it: before, `octo-dist smoke --save-dir D` never started its first step."""
    save = tmp_path / "run"
    plant(save, "fifo")
    proc = helpers.run_smoke("--save-dir", str(save), "--steps", "2", cwd=tmp_path, timeout=HANG_S)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert errors == [
        f"octo-dist smoke: error: the run lock {save / LOCK_NAME} is a FIFO, not a lock file a run wrote; "
        f"expected no file there, or a regular file holding a run's JSON. Fix: remove it (rm {save / LOCK_NAME}) "
        f"if no run uses {save}, or pass another --save-dir"
    ], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
