"""A flag of `octo-dist launch` given twice with two values is refused (exit 2) naming both, where argparse kept the
last without a word (`--nodes 2 ... --nodes 4` rendered a 4-node job); the flags meant to repeat still add up."""

from __future__ import annotations

import pytest

from octo_dist import cli

PBS = ["launch", "pbs", "--group", "g1", "--dry-run"]
SLURM = ["launch", "slurm", "--gpus-per-node", "8", "--dry-run"]


def refusal(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()[-1:]
    assert captured.out == ""
    return line


def twice(flag: str, first: str, second: str, head=PBS) -> tuple:
    """``HEAD --nodes 1 FLAG FIRST FLAG SECOND``, and the two settings a refusal names: ``FLAG FIRST``, ``FLAG
    SECOND``."""
    return [*head, "--nodes", "1", flag, first, flag, second], f"{flag} {first}", f"{flag} {second}"


@pytest.mark.parametrize(
    "argv, first, second",
    [
        ([*PBS, "--nodes", "2", "--walltime", "1:00:00", "--nodes", "4"], "--nodes 2", "--nodes 4"),
        ([*PBS, "--nodes=2", "--nodes=4"], "--nodes 2", "--nodes 4"),
        twice("--walltime", "1:00:00", "2:00:00"),
        twice("--save-dir", "runs/a", "runs/b"),
        twice("--wandb-mode", "offline", "online"),
        # an old spelling and the current one are one setting
        (
            [*PBS, "--nodes", "1", "--devices-per-process", "8", "--devices-per-rank", "4"],
            "--devices-per-process 8",
            "--devices-per-rank 4",
        ),
        # the schedulers' own options
        twice("--reservation", "R1", "R2"),
        twice("--partition", "gpu", "cpu", head=SLURM),
    ],
)
def test_a_flag_given_twice_with_two_values_is_refused_naming_both(capsys, argv, first, second):
    line = refusal(capsys, argv)
    assert line == (
        f"octo-dist launch: error: {first} and {second} set the same setting twice; expected one value. "
        f"Fix: keep one of them ({first}, or {second})"
    )


def test_a_long_value_given_twice_is_not_echoed_whole(capsys):
    line = refusal(
        capsys, [*PBS, "--nodes", "1", "--save-dir", "a" * 5000, "--save-dir", "b" * 5000]
    )
    assert len(line) < 1000 and "more characters" in line


def test_the_same_value_twice_is_one_value(capsys):
    assert cli.main([*PBS, "--nodes", "2", "--nodes", "2"]) == 0
    assert "select=2:" in capsys.readouterr().out


def test_flags_meant_to_repeat_add_up(capsys):
    argv = [
        *PBS,
        "--nodes", "1",
        "--module", "hpcx/2.20", "--module", "extra/1.0",
        "--bind", "/data/a", "--bind", "/data/b",
        "--resource", "mem=400gb", "--resource", "ngpus=8",
        "--directive", "#PBS -m e", "--directive", "#PBS -M me@example.org",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    script = capsys.readouterr().out
    for text in ("hpcx/2.20", "extra/1.0", "/data/a", "/data/b"):
        assert text in script
    for line in ("#PBS -l mem=400gb", "#PBS -l ngpus=8", "#PBS -m e", "#PBS -M me@example.org"):
        assert line in script.splitlines()
