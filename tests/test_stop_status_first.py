"""A job stopped by a signal (a qdel, the wall time) has seconds before the scheduler's kill (PBS's kill_delay: 10 s
after a qdel): the rank notes the saved step for the job runtime first, writes summary.json, and does not draw the
loss plot, whose matplotlib import and drawing can outlast that delay. A real smoke run, a real SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import helpers
from helpers import HANG_S, clean_env, tail
from helpers import COMPILE_FAST

from octo_dist import savelayout
from octo_dist.engine import checksums


def test_a_stopped_run_notes_its_step_and_summary_and_leaves_the_plot_to_the_next_job(tmp_path):
    """The plot made as slow as a cold network file system can make it: matplotlib's config file is a FIFO, whose
    read never ends. Before: the stopped rank blocked there (after its summary lines), so a job runtime waiting for
    it to exit would never write its last line before the kill."""
    save, job_dir, rc = tmp_path / "run", tmp_path / "job", tmp_path / "matplotlibrc"
    job_dir.mkdir()
    os.mkfifo(rc)
    env = clean_env(
        **{savelayout.JOB_DIR_ENV: str(job_dir), "MATPLOTLIBRC": str(rc)}, XLA_FLAGS=COMPILE_FAST
    )
    args = ["smoke", "--model", "tiny", "--steps", "100000", "--save-every", "2"]
    proc = helpers.popen(
        [sys.executable, "-m", "octo_dist", *args, "--save-dir", str(save)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (save / "2" / checksums.MANIFEST).exists():
            assert proc.poll() is None, tail(proc.communicate()[1], 3000)
            assert time.monotonic() < deadline, "waited 300 s for the first checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, tail(err, 3000)
    written = json.loads((save / savelayout.SUMMARY).read_text())
    step = written["end_step"]
    assert written["stopped_by"] == "SIGTERM" and step >= 2
    assert savelayout.stopped_step(str(job_dir)) == step
    assert checksums.verify(save / str(step), step) is None
    assert not (save / savelayout.LOSS_PLOT).exists()
    assert "stopped by SIGTERM (checkpoint saved)" in out
    assert "loss.png not redrawn (stopped by SIGTERM" in err, tail(err, 3000)


def test_the_stop_note_replaces_a_link_or_fifo_planted_at_its_name(tmp_path):
    """Before: the note was opened for writing at its name: through a link into the file it named, and into a
    FIFO (no reader: the rank blocked there, after its checkpoint, until the kill)."""
    from octo_dist.apps import harness

    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    for planted in ("link", "fifo"):
        job_dir = tmp_path / planted
        job_dir.mkdir()
        note = job_dir / os.path.basename(savelayout.stop_note(str(job_dir)))
        if planted == "link":
            note.symlink_to(victim)
        else:
            os.mkfifo(note)
        harness.note_stop(12, {savelayout.JOB_DIR_ENV: str(job_dir)})
        assert savelayout.stopped_step(str(job_dir)) == 12 and not note.is_symlink()
        assert sorted(p.name for p in job_dir.iterdir()) == [note.name]
    assert victim.read_text() == "someone else's file\n"
