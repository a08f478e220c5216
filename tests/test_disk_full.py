"""A save directory that fills up: the room check counts what a run keeps plus the checkpoint being written, and a
disk that fills mid-run (another job writing beside it) ends in one line that keeps the newest verified checkpoint.

Real file systems: a small tmpfs mounted for the test (root only; skipped otherwise) and unmounted after it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import COMPILE_FAST, PROGRAMS, REPO, clean_env, tail

from octo_dist.engine import room
from octo_dist.engine.train import TrainConfig, planned_saves

MiB = 1 << 20


def test_copies_needed_counts_the_kept_checkpoints_plus_the_one_being_written():
    assert room.copies_needed(3, saves=10) == 4  # 3 kept + 1 being written
    assert room.copies_needed(3, saves=2) == 2  # the run writes only two
    assert room.copies_needed(3, saves=1) == 1
    assert (
        room.copies_needed(3, saves=10, kept_now=3) == 1
    )  # a resumed run's three are on disk already
    assert room.copies_needed(3, saves=10, kept_now=1) == 3
    assert room.copies_needed(None, saves=5) == 5  # keep all
    assert room.copies_needed(3, saves=0) == 0
    assert planned_saves(0, TrainConfig(steps=10, save_every=3)) == 4  # 3, 6, 9 and the end
    assert planned_saves(6, TrainConfig(steps=10, save_every=3)) == 2
    assert planned_saves(0, TrainConfig(steps=10)) == 1
    assert planned_saves(10, TrainConfig(steps=10, save_every=3)) == 0
    state = 400 * MiB
    one = room.checkpoint_nbytes(state)
    problem = room.space_problem("/groups/gxx00000/run", 3 * one, state, copies=4)
    assert problem.startswith(
        "save directory /groups/gxx00000/run has 1.2 GiB free; expected at least 1.6 GiB "
        "(4 checkpoints of 421.0 MiB each: 3 kept plus 1 being written, for this run's state)"
    ), problem
    assert room.space_problem("/d", 4 * one, state, copies=4) is None


@pytest.fixture
def small_fs(tmp_path):
    """``mount(size_mib)`` -> a fresh tmpfs of that size under tmp_path; every one is unmounted afterwards."""
    mounted = []

    def mount(size_mib: int) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


# The runs here compile fast (helpers.COMPILE_FAST): what is tested is the room check and the full disk, not XLA's
# optimiser.
FAST = clean_env(XLA_FLAGS=COMPILE_FAST)


def smoke(save_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return helpers.run_smoke("--save-dir", str(save_dir), *extra, cwd=REPO, env=FAST)


@pytest.mark.slow
def test_a_save_dir_with_room_for_two_but_not_four_checkpoints_is_refused_before_training(small_fs):
    """Before: the check asked for 2 checkpoints, the run kept 3 and wrote a 4th, and ENOSPC ended it mid-run with
    a 70-line traceback. Now it is refused before the first step, in one line that counts what is kept."""
    small = small_fs(5)
    run = smoke(small / "run", "--steps", "12", "--save-every", "2")
    assert run.returncode == 2, tail(run.stderr)
    err = [ln for ln in run.stderr.splitlines() if "error:" in ln]
    assert len(err) == 1 and "Traceback" not in run.stderr, tail(run.stderr)
    assert f"save directory {small / 'run'} has 5.0 MiB free; expected at least " in err[0], err[0]
    assert "(4 checkpoints of " in err[0] and "3 kept plus 1 being written" in err[0], err[0]
    assert not list((small / "run").glob("[0-9]*")), "refused before the first checkpoint"


FILL = r"""
import json, os, sys
from pathlib import Path

import jax
import numpy as np

from octo_dist.engine import checkpoint as ck

directory, filler = Path(sys.argv[1]), Path(sys.argv[2])
rng = np.random.default_rng(0)
state = {"w": jax.numpy.asarray(rng.standard_normal((256, 1024), dtype=np.float32))}  # 1 MiB
c = ck.Checkpoints(str(directory), max_to_keep=3)
c.save(1, state, {"data_position": 1})
c.save(2, jax.tree_util.tree_map(lambda x: x + 1, state), {"data_position": 2})
# Another job fills the file system, leaving less than one checkpoint free.
with open(filler, "wb", buffering=0) as f:
    try:
        while True:
            f.write(b"\0" * (1 << 16))
    except OSError:
        pass
os.truncate(filler, filler.stat().st_size - (256 << 10))  # 256 KiB free again: less than a checkpoint
try:
    c.save(3, jax.tree_util.tree_map(lambda x: x + 2, state), {"data_position": 3})
    print(json.dumps({"saved": True}))
except ck.CheckpointWriteError as e:
    print(json.dumps({"error": str(e)}))
"""


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_keeps_the_newest_verified_checkpoint_and_says_how_much_room(
    small_fs,
):
    pytest.importorskip("jax")
    from octo_dist.engine import checkpoint as ck
    from octo_dist.engine import checksums

    fs = small_fs(8)
    directory, filler = fs / "run", fs / "another-job.bin"
    outcome = helpers.last_json_line(
        [sys.executable, "-c", FILL, str(directory), str(filler)], FAST
    )
    message = outcome.get("error")
    assert message, outcome
    assert "\n" not in message and message.startswith(
        f"checkpoint step 3 could not be written to {directory}: the file system is full (No space left on "
        "device); kept the newest verified checkpoint, step 2, and removed the partial step"
    ), message
    # The size is the newest verified step's, as its checksum record counts it (zarr compresses: under 1 MiB).
    assert re.search(
        r"expected room for 4 checkpoints of \d+\.\d KiB each: 3 kept plus 1 being written \(\d+\.\d MiB in all, "
        r"\d+\.\d KiB free now\)",
        message,
    ), message
    assert "Fix: free space there" in message and "rerun with --resume" in message
    # Nothing half-written is left to take room; step 2 verifies and restores.
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == ["1", "2"]
    assert checksums.verify(directory / "2", 2) is None
    os.unlink(filler)
    c = ck.Checkpoints(str(directory), max_to_keep=3)
    assert c.latest_step() == 2
    c.close()


@pytest.mark.mpi
@pytest.mark.slow
def test_a_disk_that_fills_under_mpirun_ends_the_job_in_one_line_keeping_the_verified_step(
    small_fs, mpirun
):
    """Two ranks through the harness (as smoke and finetune run): rank 0's save fails alone while rank 1 waits in
    orbax's barrier, so rank 0 ends the job, with one line and exit 2, not a traceback or a hang."""
    pytest.importorskip("jax")
    from octo_dist.engine import checkpoint as ck
    from octo_dist.engine import checksums

    fs = small_fs(12)  # passes the room check (4 x ~2 MiB) until the filler takes it
    directory = fs / "run"
    proc = mpirun(
        2, str(PROGRAMS / "disk_fills.py"), str(directory), str(fs / "another-job.bin"), env=FAST
    )
    out0, err0 = proc.ranks[0]
    assert proc.returncode == 2, (proc.returncode, tail(err0), tail(proc.ranks[1][1]))
    errors = [ln for ln in err0.splitlines() if "error:" in ln]
    assert len(errors) == 1 and "Traceback" not in err0, tail(err0)
    assert errors[0].startswith(
        f"octo-dist disk-fills: error: checkpoint step 4 could not be written to {directory}: the file system is "
        "full (No space left on device); kept the newest verified checkpoint, step 2, and removed the partial step 4"
    ), errors[0]
    assert "3 kept plus 1 being written" in errors[0]
    # Rank 0 removed step 4's partial directory, but rank 1 may still have been writing its shards into it until
    # mpirun ended it (tensorstore recreates missing parents), so a fresh orbax temporary directory of step 4 can
    # be left. Nothing else is: no finalised step 4, no other step.
    left = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
    assert left[0] == "2" and all(n.startswith("4.orbax-checkpoint-tmp-") for n in left[1:]), left
    assert checksums.verify(directory / "2", 2) is None
    # What the user's `--resume` sees once space is freed: the leftover is removed on opening, step 2 is the start.
    os.unlink(fs / "another-job.bin")
    c = ck.Checkpoints(str(directory), max_to_keep=3)
    assert c.latest_step() == 2
    c.close()
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == ["2"]
