"""The job runtime's wandb key (prepare.wandb_key, when a job with --wandb-mode online starts): a key file or
~/.netrc that is a FIFO, a directory, /dev/zero or a file this user cannot read is named as what it is, with the
fix, in one line; nothing blocks and nothing is read unbounded. Before: a key file that was a FIFO or a directory
"did not exist", a ~/.netrc FIFO blocked the job's start for ever, another user's key file ended in a
PermissionError traceback. Each case runs the runtime's own code in a subprocess, so a hang fails the test at its
timeout instead of hanging the suite."""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from helpers import REPO, clean_env
from octo_dist.jobs.supervisor import wandbkey, zipapp

# Far beyond the check (well under a second); only a start that waits on a FIFO reaches it.
HANG_GUARD_S = 300
KEY = "0123456789abcdef0123456789abcdef01234567"
RUN = """
import json, sys
from octo_dist.jobs.supervisor import prepare
env = json.loads(sys.argv[1])
try:
    prepare.wandb_key(env)
    print("ok", env.get("WANDB_API_KEY", "none"))
except prepare.JobFailed as e:
    print("refused", e.exit_status, e)
"""


def wandb_key(home, python=sys.executable, preexec=None, runtime=None, **extra):
    """(outcome, text): what prepare.wandb_key made of ``home``'s files: ("ok", the key or "none") or ("refused",
    "2 <the line>"). ``runtime``: the job runtime's zipapp to import it from, alone, instead of the checkout."""
    env = {"WANDB_MODE": "online", "HOME": str(home), **extra}
    proc = subprocess.run(
        [python, "-c", RUN, json.dumps(env)],
        capture_output=True,
        text=True,
        env=clean_env(
            PYTHONDONTWRITEBYTECODE="1", **({"PYTHONPATH": str(runtime)} if runtime else {})
        ),
        cwd=home if runtime else REPO,
        timeout=HANG_GUARD_S,
        preexec_fn=preexec,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    outcome, _, text = proc.stdout.strip().partition(" ")
    return outcome, text


@pytest.fixture
def home(tmp_path):
    (tmp_path / ".config" / "octo-dist").mkdir(parents=True)
    return tmp_path


def key_path(home):
    return home / ".config" / "octo-dist" / "wandb_api_key"


def test_a_key_file_that_is_a_fifo_is_named_as_one(home):
    os.mkfifo(key_path(home))
    outcome, text = wandb_key(home)
    assert outcome == "refused" and text.startswith("2 WANDB_MODE=online but no wandb key"), text
    assert f"{key_path(home)} is a FIFO, not a file" in text, text
    assert (
        f"Fix: mv {key_path(home)} {key_path(home)}.old; (umask 077; cat >{key_path(home)})" in text
    )


def test_a_netrc_that_is_a_fifo_is_named_and_never_waited_on(home):
    os.mkfifo(home / ".netrc")
    outcome, text = wandb_key(home)
    assert outcome == "refused", text
    assert (
        "~/.netrc is a FIFO, not a file" in text and f"{key_path(home)} does not exist" in text
    ), text
    assert f"Fix: (umask 077; cat >{key_path(home)}) and paste the key" in text, text


def test_a_key_file_that_is_a_directory_is_named_as_one(home):
    key_path(home).mkdir()
    outcome, text = wandb_key(home)
    assert outcome == "refused" and f"{key_path(home)} is a directory, not a file" in text, text


def test_a_key_file_named_dev_zero_is_a_device_and_the_fix_leaves_it_alone(home):
    outcome, text = wandb_key(home, WANDB_KEY_FILE="/dev/zero")
    assert outcome == "refused" and "/dev/zero is a character device, not a file" in text, text
    assert f"(umask 077; cat >{key_path(home)}) and paste the key" in text, text
    assert (
        "then unset WANDB_KEY_FILE (it names /dev/zero)" in text and "mv /dev/zero" not in text
    ), text


def test_a_netrc_linked_to_dev_zero_is_not_read(home):
    (home / ".netrc").symlink_to("/dev/zero")
    outcome, text = wandb_key(home)
    assert outcome == "refused" and "~/.netrc is a character device, not a file" in text, text


def test_a_key_file_nobody_may_read_is_refused_by_its_mode(home):
    key_path(home).write_text(KEY + "\n")
    key_path(home).chmod(0)
    outcome, text = wandb_key(home)
    assert outcome == "refused" and f"{key_path(home)} has mode 0; expected 600 or 400" in text, (
        text
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's file is made by root only")
def test_another_users_key_file_is_one_line_not_a_traceback():
    # The job runs as nobody; the key file is root's, mode 600: the mode passes, the open is refused (EACCES).
    top = tempfile.mkdtemp(prefix="octo-dist-key-")
    try:
        os.chmod(top, 0o755)
        home = os.path.join(top, "home")
        os.makedirs(os.path.join(home, ".config", "octo-dist"))
        for d in (home, os.path.join(home, ".config"), os.path.join(home, ".config", "octo-dist")):
            os.chmod(d, 0o755)
        key = os.path.join(home, wandbkey.KEY_FILE)
        with open(key, "w") as f:
            f.write(KEY + "\n")
        os.chmod(key, 0o600)
        outcome, text = wandb_key(
            home, python=shutil.which("python3", path="/usr/bin:/bin"), preexec=_as_nobody
        )
    finally:
        shutil.rmtree(top)
    assert outcome == "refused", text
    assert f"{key} is a file this user cannot read (Permission denied)" in text, text
    assert f"Fix: rm -f {key}; (umask 077; cat >{key})" in text, text


def _as_nobody():
    os.setgid(65534)
    os.setuid(65534)


def test_a_netrc_entry_serves_when_the_key_file_is_a_fifo_as_launch_accepts(home):
    # launch (jobwarnings) finds the key in ~/.netrc here; the job must not refuse what launch accepted.
    os.mkfifo(key_path(home))
    (home / ".netrc").write_text(f"machine api.wandb.ai\n  login user\n  password {KEY}\n")
    assert wandbkey.key_found({"HOME": str(home)})
    assert wandb_key(home) == ("ok", "none")  # wandb reads ~/.netrc itself


def test_the_job_runtimes_zipapp_carries_the_check(home):
    # A job that has only the image runs the zipapp: what prepare imports for the key must be in it.
    runtime = zipapp.build(str(home / "runtime.pyz"))
    os.mkfifo(key_path(home))
    outcome, text = wandb_key(home, runtime=runtime)
    assert outcome == "refused" and f"{key_path(home)} is a FIFO, not a file" in text, text


def test_a_key_file_gives_the_key(home):
    key_path(home).write_text(KEY + "\n")
    key_path(home).chmod(0o600)
    assert wandb_key(home) == ("ok", KEY)
