"""A wandb key file (or ~/.netrc) that is a FIFO: launch says what it is (a FIFO, not a file) and never waits on
it, where a plain open would wait for a writer for ever. Run as a subprocess, so the old wait fails the test at its
timeout instead of hanging the suite."""

import os
import subprocess
import sys

import pytest

from helpers import clean_env

LAUNCH = ["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "--wandb-mode", "online"]
# Far beyond a render (about a second); only a launch that waits on the FIFO reaches it.
RENDER_TIMEOUT_S = 300


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "octo-dist").mkdir(parents=True)
    (home / ".venv-none").mkdir()
    return home


def launch(home, *argv):
    env = clean_env(HOME=str(home))
    for name in ("WANDB_API_KEY", "WANDB_KEY_FILE"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", *LAUNCH, *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=RENDER_TIMEOUT_S,
    )


def test_a_key_file_that_is_a_fifo_is_named_as_one(home):
    key = home / ".config" / "octo-dist" / "wandb_api_key"
    os.mkfifo(key)
    os.mkfifo(home / ".netrc")
    proc = launch(home, "--dry-run", "--", "smoke")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "wandb key" in ln]
    assert f"{key} is a FIFO, not a file" in line, line
    assert "~/.netrc is a FIFO, not a file" in line, line


def test_submit_refuses_naming_the_fifo(home):
    key = home / ".config" / "octo-dist" / "wandb_api_key"
    os.mkfifo(key)
    proc = launch(home, "-o", "job.sh", "--submit", "--", "smoke")
    assert proc.returncode == 2, proc.stderr
    assert "--wandb-mode online with no wandb key here" in proc.stderr
    assert f"{key} is a FIFO, not a file" in proc.stderr, proc.stderr
    assert not (home / "job.sh").exists()


def test_a_key_file_that_is_a_directory_is_named_as_one(home):
    key = home / ".config" / "octo-dist" / "wandb_api_key"
    key.mkdir()
    proc = launch(home, "--dry-run", "--", "smoke")
    assert f"{key} is a directory, not a file" in proc.stderr, proc.stderr
