"""`octo-dist launch` checks the training command after `--` with that command's own parser, when it renders."""

import subprocess
import sys

import pytest

from helpers import HANG_S, REPO, clean_env, stdout_of
from octo_dist import cli

HEAD = ["launch", "pbs", "--nodes", "2", "--group", "gxx00000"]


@pytest.mark.parametrize(
    "command, needle",
    [
        (["smoke", "--stepz", "3"], "-- smoke: unknown flag --stepz, did you mean --steps?"),
        (
            ["smoke", "--learning-rate", "fast"],
            "-- smoke: argument --learning-rate: invalid float value: 'fast'",
        ),
        (["smoke", "--steps", "-5"], "-- smoke: --steps -5 (expected at least 1 step)"),
        (
            ["finetune", "--config.num_stepz=3"],
            "-- finetune: unknown config field num_stepz, did you mean --config.num_steps?",
        ),
        (["finetune", "--bogus"], "-- finetune: unknown flag --bogus;"),
        (
            ["finetune", "--config=no_such_config.py"],
            "-- finetune: --config=no_such_config.py: no config file",
        ),
    ],
)
def test_a_typo_in_the_training_command_is_refused_before_the_job_queues(
    tmp_path, capsys, command, needle
):
    out = tmp_path / "job.sh"
    assert cli.main([*HEAD, "-o", str(out), "--", *command]) == 2
    err = capsys.readouterr().err
    assert err.startswith("octo-dist launch: error: ") and err.count("\n") == 1, err
    assert needle in err and ". Fix: octo-dist " in err and "--help lists them" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["smoke", "--steps", "3", "--step-fn", "shard_map"],
        ["finetune", "--config=finetune_smoke_config.py", "--config.num_steps=3", "--debug"],
    ],
)
def test_a_sound_training_command_renders(tmp_path, command):
    out = tmp_path / "job.sh"
    assert cli.main([*HEAD, "-o", str(out), "--", *command]) == 0
    assert " ".join(command[1:]).split()[0] in out.read_text()


def test_checking_imports_no_jax():
    code = (
        "import sys\nfrom octo_dist import cli\n"
        "slurm = ['launch', 'slurm', '--nodes', '2', '--gpus-per-node', '4', '--dry-run', '--']\n"
        "rc = cli.main([*slurm, 'smoke', '--stepz', '1'])\n"
        "rc2 = cli.main([*slurm, 'finetune', '--config.num_steps=2'])\n"
        "print(rc, rc2, 'jax' in sys.modules, 'tensorflow' in sys.modules)"
    )
    out = stdout_of([sys.executable, "-c", code])
    assert out.split()[-4:] == ["2", "0", "False", "False"], out


BARE_39 = "/root/.pyenv/versions/3.9.18/bin/python"


@pytest.mark.skipif(
    not __import__("os").path.exists(BARE_39), reason=f"no CPython 3.9 at {BARE_39} (pyenv)"
)
def test_on_a_login_nodes_bare_python_smoke_is_checked_and_finetune_is_skipped_with_a_note():
    env = dict(clean_env(), PYTHONPATH=str(REPO))

    def run(*cmd):
        return subprocess.run(
            [BARE_39, "-S", "-E", "-B", "-m", "octo_dist", *HEAD, "--dry-run", "--", *cmd],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=HANG_S,
        )

    typo = run("smoke", "--stepz", "3")
    assert typo.returncode == 2 and "unknown flag --stepz, did you mean --steps?" in typo.stderr, (
        typo.stderr
    )
    finetune = run("finetune", "--config.num_steps=3")
    assert finetune.returncode == 0, finetune.stderr
    assert (
        "note: the finetune flags after -- are not checked here (No module named 'absl')"
        in finetune.stderr
    )
