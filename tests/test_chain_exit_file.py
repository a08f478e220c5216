"""The exit file a job leaves for the next job of its chain, as the job runtime reads and writes it: a file that is
not one line of octo-dist's (binary, 5 MB), and a save directory whose file system is full when the job starts.

Each job is the script ``octo-dist launch pbs`` renders, run with ``bash`` and PBS's variables; the previous job's
check and the job's files come before any rank starts, so no mpirun runs here (it only has to be on PATH)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import helpers

VENV = Path(sys.executable).parent


def render(work: Path, save_dir: Path) -> None:
    helpers.launch_job(
        work,
        "pbs",
        "--nodes",
        "1",
        *helpers.PBS_JOB,
        "--venv",
        str(VENV.parent),
        "--save-dir",
        str(save_dir),
        "--compile-cache",
        "",
        "--wandb-mode",
        "disabled",
    )


def run_job(work: Path, job_id: str, after: str = "") -> subprocess.CompletedProcess:
    env = helpers.pbs_batch_env(work, job_id, f"{VENV}:/usr/bin:/bin")
    if after:
        env["OCTO_DIST_AFTER"] = after
    return helpers.run_script(work, env)


def errors(proc: subprocess.CompletedProcess) -> list:
    return [ln for ln in proc.stderr.splitlines() if "error:" in ln or "Traceback" in ln]


@pytest.mark.parametrize(
    "content",
    [bytes(range(256)) * 16, b"7" * (5 << 20), b"0\n" * 3, b"\x00"],
    ids=["binary", "5MB-of-digits", "three-lines", "nul"],
)
def test_a_previous_exit_file_not_octo_dists_is_one_line_and_exit_2(tmp_path, content):
    """Before: a binary file ended the job in a UnicodeDecodeError traceback (exit 1); 5 MB of digits were read
    whole and echoed into one 5 MB line."""
    save = tmp_path / "save"
    save.mkdir()
    (save / ".octo-dist-exit-40.pbs5").write_bytes(content)
    render(tmp_path, save)
    proc = run_job(tmp_path, "41.pbs5", after="40.pbs5")
    said = helpers.tail(proc.stderr, 3000)
    assert proc.returncode == 2, said
    lines = errors(proc)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, said
    assert "the previous job of this chain (40.pbs5) left " in lines[0], said
    assert len(lines[0]) < 700, len(lines[0])
    assert "preflight" not in proc.stderr, said  # refused before any rank started
    # Its own exit file says 2 for the chain after it, and the previous one is left as it was.
    assert (save / ".octo-dist-exit-41.pbs5").read_text() == "2\n"
    assert (save / ".octo-dist-exit-40.pbs5").read_bytes() == content


@pytest.mark.parametrize(
    "content, trains",
    [
        ("0\n", True),
        ("stopping SIGTERM: asked to stop after 21s ...\n", True),
        ("143 resumable: stopped by SIGTERM, but ...\n", True),
        ("3\n", False),
    ],
)
def test_the_chain_reads_what_a_job_writes(tmp_path, content, trains):
    from octo_dist.jobs.supervisor import prepare

    (tmp_path / ".octo-dist-exit-1").write_text(content)
    said = []
    if trains:
        prepare.previous_job(str(tmp_path), "1", said.append)
        assert said == (
            []
            if content == "0\n"
            else [f"the previous job of this chain (1) left: {content.strip()}"]
        )
    else:
        with pytest.raises(prepare.JobFailed, match=r"failed with exit 3: not training"):
            prepare.previous_job(str(tmp_path), "1", said.append)


@pytest.fixture
def full_fs(tmp_path):
    """A 1 MiB tmpfs under tmp_path, filled to the last byte (root only; skipped otherwise), unmounted after."""
    where = tmp_path / "fs"
    where.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        save = where / "save"
        save.mkdir()
        with pytest.raises(OSError):
            with open(where / "filler", "wb") as f:
                for _ in range(64):
                    f.write(b"\0" * (64 << 10))
                    f.flush()
        yield save
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_full_file_system_at_job_start_is_one_line_and_the_chain_says_so(tmp_path, full_fs):
    """Before: copying the node list into the job's directory ended the job in an OSError traceback (exit 1), and
    the next job of the chain read the exit file that could not be written as 'failed with exit : not training'."""
    work = tmp_path / "work"
    work.mkdir()
    render(work, full_fs)
    proc = run_job(work, "50.pbs5")
    said = helpers.tail(proc.stderr, 3000)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, said
    lines = errors(proc)
    assert len(lines) == 2, said  # the job's files, then its exit file
    assert "No space left on device" in lines[0] and f"df -h {full_fs}" in lines[0], said
    assert "cannot write" in lines[1] and ".octo-dist-exit-50.pbs5" in lines[1], said
    assert (full_fs / ".octo-dist-exit-50.pbs5").read_text() == ""
    chained = run_job(work, "51.pbs5", after="50.pbs5")
    said = helpers.tail(chained.stderr, 3000)
    assert chained.returncode == 2 and "Traceback" not in chained.stderr, said
    assert "the previous job of this chain (50.pbs5) left an empty exit status" in said, said
    assert "file system was full?" in said, said


@pytest.mark.parametrize("after", ["../../outside", "1/../..", "40.pbs5\nx"])
def test_a_previous_job_id_that_is_no_job_id_is_one_line_and_reads_nothing(tmp_path, after):
    """OCTO_DIST_AFTER names the file the chain reads: "../../outside" must not reach a file outside the save
    directory (before: it read ``save/.octo-dist-exit-../../outside``, whatever that was)."""
    save = tmp_path / "save"
    save.mkdir()
    render(tmp_path, save)
    proc = run_job(tmp_path, "41.pbs5", after=after)
    said = helpers.tail(proc.stderr, 3000)
    lines = errors(proc)
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, said
    assert "OCTO_DIST_AFTER=" in lines[0] and "is not a job id" in lines[0], said
    assert "preflight" not in proc.stderr, said
