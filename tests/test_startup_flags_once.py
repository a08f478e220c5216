"""The runtime's start-up flags (--init-timeout, --launcher, --coordinator, --devices-per-process) given twice with
two values are refused in one line (exit 2) by every command that takes them, where argparse kept the last without
a word (`smoke --init-timeout 10 --init-timeout 20` waited 20 s); launch refuses them at render under `-- smoke` and
`-- finetune`. The same value twice is one value."""

import argparse
import subprocess
import sys

import pytest

from helpers import HANG_S, REPO, clean_env
from octo_dist import cli
from octo_dist.apps.finetune import arguments
from octo_dist.apps.smoke import app as smoke
from octo_dist.launchers import onevalue
from octo_dist.runtime import runtime

TWICE = [
    (
        ["--init-timeout", "10", "--init-timeout", "20"],
        "--init-timeout 10.0 and --init-timeout 20.0",
    ),
    (["--launcher=openmpi", "--launcher", "slurm"], "--launcher openmpi and --launcher slurm"),
    (
        ["--coordinator", "h:1234", "--coordinator=h:99"],
        "--coordinator h:1234 and --coordinator h:99",
    ),
    (["--devices-per-process=all", "--devices-per-process", "2"], "--devices-per-process all and"),
]
REFUSED = "set the same flag twice; expected one value. Fix: keep one of them"


class _Refusing(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


@pytest.mark.parametrize("argv, named", TWICE, ids=[a[0].split("=")[0] for a, _ in TWICE])
def test_a_start_up_flag_given_twice_is_refused_by_its_parser(argv, named):
    parser = _Refusing(prog="octo-dist x")
    runtime.argv_options(parser)
    with pytest.raises(ValueError, match=REFUSED) as refused:
        parser.parse_args(argv)
    assert named in str(refused.value), refused.value


def test_the_same_value_twice_is_one_value():
    parser = _Refusing(prog="octo-dist x")
    runtime.argv_options(parser)
    args = parser.parse_args(
        ["--init-timeout", "10", "--init-timeout=10.0", "--devices-per-process=1"]
    )
    assert runtime.from_args(args) == {
        "launcher": "auto",
        "coordinator": None,
        "timeout_s": 10.0,
        "devices": "one",
    }


def test_the_refusal_names_both_values_and_shows_a_long_one_cut():
    line = onevalue.refusal(("--coordinator", "a" * 500), ("--coordinator", "b\x1b[31m"))
    assert line.startswith(
        "--coordinator " + "a" * 80 + "... (420 more characters) and --coordinator b\\x1b[31m"
    )
    assert line.endswith(
        "Fix: keep one of them (--coordinator " + "a" * 80 + "... (420 more characters), or "
        "--coordinator b\\x1b[31m)"
    )


def test_smoke_and_finetune_checks_refuse_it():
    with pytest.raises(ValueError, match=f"--init-timeout 10.0 and --init-timeout 20.0 {REFUSED}"):
        smoke.check_command(["--steps", "3", "--init-timeout", "10", "--init-timeout", "20"])
    # finetune's fork spelling (--init_timeout) is the same flag as --init-timeout.
    with pytest.raises(ValueError, match=REFUSED):
        arguments.check_command(["--init_timeout=10", "--init-timeout=20"])


@pytest.mark.parametrize("command", ["smoke", "finetune"])
def test_launch_refuses_it_at_render(tmp_path, capsys, command):
    out = tmp_path / "job.sh"
    head = ["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "-o", str(out), "--", command]
    assert cli.main([*head, "--init-timeout", "10", "--init-timeout", "20"]) == 2
    err = capsys.readouterr().err
    assert f"-- {command}: --init-timeout 10.0 and --init-timeout 20.0 {REFUSED}" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "command", [["smoke"], ["finetune"], ["check-env", "--launch"], ["validate"]]
)
def test_the_command_itself_refuses_before_starting(command):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "octo_dist",
            *command,
            "--init-timeout",
            "10",
            "--init-timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=HANG_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"error: --init-timeout 10.0 and --init-timeout 20.0 {REFUSED}" in proc.stderr, (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv, named",
    [
        (
            ["--config.num_steps=3", "--config.num_steps", "5"],
            "--config.num_steps 3 and --config.num_steps 5",
        ),
        (["--name", "a", "--config.seed=1", "-name=b"], "--name a and -name b"),
        (["--step-fn=jit", "--step_fn=shard_map"], "--step_fn jit and --step_fn shard_map"),
        (["--debug", "--debug=false"], "--debug and --debug false"),
    ],
)
def test_a_fine_tune_flag_given_twice_is_refused_where_absl_kept_the_last(argv, named):
    # Before: absl trained --config.num_steps=5 and ran as --name b without a word.
    with pytest.raises(ValueError, match=REFUSED) as refused:
        arguments.check_command(argv)
    assert str(refused.value).startswith(f"{named} set the same flag twice"), refused.value


def test_a_fine_tune_flag_given_twice_with_one_value_is_one_value():
    flags, _ = arguments.parse_command_line(
        ["octo-dist finetune", "--config=finetune_smoke_config.py", "--config.seed", "3"]
        + ["--config.seed=3", "--name=x", "--name", "x", "--debug", "--debug"]
    )
    assert flags.config.seed == 3 and flags.name == "x"


def test_launch_refuses_a_fine_tune_flag_given_twice_at_render(tmp_path, capsys):
    out = tmp_path / "job.sh"
    head = [
        "launch",
        "pbs",
        "--nodes",
        "1",
        "--group",
        "gxx00000",
        "-o",
        str(out),
        "--",
        "finetune",
    ]
    assert cli.main([*head, "--config.num_steps=3", "--config.num_steps=5"]) == 2
    err = capsys.readouterr().err
    assert f"--config.num_steps 3 and --config.num_steps 5 {REFUSED}" in err, err
    assert not out.exists()
