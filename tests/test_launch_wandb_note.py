"""launch's closing line says when wandb is disabled, its default (the fork's fine-tune logs to wandb, so a job that
logs nothing must say so): "wandb: disabled (--wandb-mode offline|online to log)"."""

from __future__ import annotations

import pytest

from octo_dist.jobs import options
from octo_dist.jobs.cli import parse

PBS = ["pbs", "--nodes", "1", "--group", "g1"]


def mode_of(*argv: str) -> str:
    """The wandb mode a launch command line renders (the job's own setting, as the closing line reads it)."""
    return parse([*PBS, *argv]).settings.storage.wandb_mode


def test_the_default_says_disabled_and_how_to_log():
    assert options.wandb_note(mode_of("--", "finetune")) == (
        "wandb: disabled (--wandb-mode offline|online to log)"
    )


@pytest.mark.parametrize("mode", ["offline", "online"])
def test_a_logging_mode_is_named(mode):
    assert options.wandb_note(mode_of("--wandb-mode", mode)) == f"wandb: {mode}"


def test_the_wrote_line_names_wandbs_mode(tmp_path, monkeypatch, capsys):
    """The line a user reads after launch: a default job says it logs nothing to wandb."""
    from octo_dist import cli

    monkeypatch.chdir(tmp_path)
    assert (
        cli.main(["launch", *PBS, "--skip-image-check", "--image", "/x.sif", "-o", "job.sh"]) == 0
    )
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert (
        wrote and ", wandb: disabled (--wandb-mode offline|online to log), wall time " in wrote[0]
    ), wrote
