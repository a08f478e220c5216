"""`octo-dist launch ... -- finetune` checked where ABCI users run it: a login node's bare Python 3.9 without absl or
ml_collections. The packaged configs' field names ship as text (configs/fields.txt), kept in sync with the configs
here; a missing --config.pretrained_path and --wandb-mode online without a key are warned about at render time."""

from __future__ import annotations

import pytest

from helpers import REPO, pbs_launch
from octo_dist import cli
from octo_dist.apps.finetune import configfile, flagerrors
from octo_dist.jobs import jobwarnings
from test_host_python import bare, host_python

LAUNCH = pbs_launch("--venv", str(REPO / ".venv"), "--dry-run")


def test_the_shipped_field_names_are_the_configs_own():
    pytest.importorskip("ml_collections")
    assert flagerrors.FIELDS_FILE.read_text() == flagerrors.generate_fields(), (
        "configs/fields.txt is out of date: python -m octo_dist.apps.finetune.flagerrors > "
        "octo_dist/apps/finetune/configs/fields.txt"
    )


def test_launch_knows_which_packaged_configs_leave_pretrained_path_unset():
    pytest.importorskip("ml_collections")
    assert tuple(configfile.packaged_configs()) == jobwarnings.PACKAGED_FINETUNE_CONFIGS
    for name in jobwarnings.PACKAGED_FINETUNE_CONFIGS:
        assert configfile.load_config(name).pretrained_path is None, name


@pytest.mark.parametrize(
    "argv, problem",
    [
        (["--config.tpyo=1"], "unknown config field tpyo"),
        (
            ["--config.num_stepz=5"],
            "unknown config field num_stepz, did you mean --config.num_steps?",
        ),
        (
            [
                "--config=finetune_config.py:head_only,multimodal",
                "--config.optimizer.learning_rate.peak_valu=1",
            ],
            "did you mean --config.optimizer.learning_rate.peak_value?",
        ),
        (["--config.num_steps=5", "--config.optimizer.learning_rate.peak_value=1"], None),
        (
            ["--config.dataset_kwargs.data_dir=d", "--config.optimizer=x"],
            None,
        ),  # a node is a field too
    ],
)
def test_unknown_fields_of_a_packaged_config_are_found_from_the_shipped_names(argv, problem):
    found = flagerrors.unknown_field(["octo-dist finetune", *argv])
    assert found == problem if problem is None else problem in found


def test_a_config_of_the_users_own_is_left_to_ml_collections(tmp_path, monkeypatch):
    mine = tmp_path / "mine.py"
    mine.write_text("def get_config(s=None):\n    return {}\n")
    assert flagerrors.unknown_field(["prog", f"--config={mine}", "--config.tpyo=1"]) is None
    monkeypatch.chdir(tmp_path)
    (tmp_path / "finetune_config.py").write_text("# the user's own, of the packaged name\n")
    assert (
        flagerrors.unknown_field(["prog", "--config=finetune_config.py", "--config.tpyo=1"]) is None
    )


@pytest.mark.parametrize("version", ["3.9"])
def test_a_finetune_typo_is_refused_on_a_bare_login_node_python(version):
    python = host_python(version)
    proc = bare(python, "-m", "octo_dist", *LAUNCH, "--", "finetune", "--config.num_stepz=5")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "octo-dist launch: error: -- finetune: unknown config field num_stepz, did you mean --config.num_steps?; "
        "expected flags that octo-dist finetune accepts. Fix: octo-dist finetune --help lists them\n"
    )
    proc = bare(python, "-m", "octo_dist", *LAUNCH, "--", "finetune")
    assert proc.returncode == 0 and proc.stdout.startswith("#!/bin/bash"), proc.stderr
    assert "warning: -- finetune without --config.pretrained_path" in proc.stderr


@pytest.fixture
def nokey(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_API_KEY", "WANDB_KEY_FILE", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def warnings_of(capsys, *argv) -> list:
    assert cli.main([*LAUNCH, *argv]) == 0
    return [ln for ln in capsys.readouterr().err.splitlines() if "warning:" in ln]


def test_a_finetune_without_pretrained_path_is_warned_about(nokey, capsys):
    (line,) = warnings_of(capsys, "--", "finetune")
    assert line.startswith(
        "octo-dist launch: warning: -- finetune without --config.pretrained_path"
    )
    assert "Fix: add --config.pretrained_path=weights/octo-small" in line
    assert (
        warnings_of(capsys, "--", "finetune", "--config.pretrained_path=weights/octo-small") == []
    )
    assert warnings_of(capsys, "--", "smoke") == []


def test_wandb_online_without_any_key_is_warned_about(nokey, capsys, monkeypatch):
    argv = ["--wandb-mode", "online", "--", "smoke"]
    (line,) = warnings_of(capsys, *argv)
    assert line.startswith("octo-dist launch: warning: --wandb-mode online, but no wandb key here")
    assert warnings_of(capsys, "--wandb-mode", "offline", "--", "smoke") == []
    (nokey / ".netrc").write_text("machine example.org\n")
    assert len(warnings_of(capsys, *argv)) == 1
    (nokey / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    assert warnings_of(capsys, *argv) == []
    (nokey / ".netrc").unlink()
    key = nokey / ".config" / "octo-dist" / "wandb_api_key"
    key.parent.mkdir(parents=True)
    key.write_text("k\n")
    assert warnings_of(capsys, *argv) == []
    key.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert warnings_of(capsys, *argv) == []
