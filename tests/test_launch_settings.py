"""A launch setting that reaches training is one ``LaunchOptions`` field and one ``Command.flags`` entry per program:
this test adds one (``--save-interval``, for finetune's ``config.save_interval``) with exactly those two things and
sees it reach the fine-tune's ConfigDict through the real ``octo-dist launch`` command line, the rendered script's
settings and finetune's own flag parser."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Optional

import pytest

from octo_dist import cli
from octo_dist.jobs import commands
from octo_dist.jobs import options as options_mod
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs import settingsread


def _settings_in(script: str) -> job_settings.JobSettings:
    """The settings a rendered script hands to the job runtime: the single-quoted JSON word after ``supervise``,
    read back by the runtime's own reader."""
    words = shlex.shlex(script[script.index(" supervise '") + len(" supervise ") :], posix=True)
    words.whitespace_split = True
    return settingsread.from_json(next(words))


def test_a_new_launch_setting_reaches_the_training_config_by_one_option_and_one_map_entry(
    monkeypatch, capsys, tmp_path
):
    pytest.importorskip("absl")
    pytest.importorskip("ml_collections")
    from octo_dist.apps.finetune import arguments

    # 1. One option ...
    @dataclasses.dataclass(frozen=True)
    class WithSaveInterval(options_mod.LaunchOptions):
        save_interval: Optional[int] = options_mod._opt(
            None, "steps between checkpoints (default: the command's own)", "training", type=int
        )

    monkeypatch.setattr(options_mod, "LaunchOptions", WithSaveInterval)
    # 2. ... and one map entry for the program that takes it.
    finetune = commands.COMMANDS["finetune"]
    flags = {**finetune.flags, "save_interval": "--config.save_interval"}
    monkeypatch.setitem(commands.COMMANDS, "finetune", dataclasses.replace(finetune, flags=flags))

    argv = ["launch", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--save-interval", "250"]
    argv += ["--save-dir", "runs/ft", "--dry-run", "--", "finetune"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    settings = _settings_in(capsys.readouterr().out)
    train = list(settings.commands.train)
    assert "--config.save_interval=250" in train, train

    # What every rank parses: the script's argv with the job's directories filled in, as the runtime does.
    paths = {"save_dir": str(tmp_path / "runs"), "compile_cache": str(tmp_path / "cache")}
    for name, value in paths.items():
        train = [arg.replace("@{" + name + "}", value) for arg in train]
    assert train[:2] == ["octo-dist", "finetune"]
    config = arguments.parse_flags(["octo-dist finetune", *train[2:]]).config
    assert config.save_interval == 250
    assert config.save_dir == paths["save_dir"]
    assert json.loads(settings.to_json())["commands"]["train"] == list(settings.commands.train)


def test_a_launch_setting_given_again_after_the_double_dash_is_refused_in_one_line(
    monkeypatch, capsys
):
    """The map entry also makes ``-- finetune --config.save_interval=9`` a setting given twice."""

    @dataclasses.dataclass(frozen=True)
    class WithSaveInterval(options_mod.LaunchOptions):
        save_interval: Optional[int] = options_mod._opt(None, "steps", "training", type=int)

    monkeypatch.setattr(options_mod, "LaunchOptions", WithSaveInterval)
    finetune = commands.COMMANDS["finetune"]
    flags = {**finetune.flags, "save_interval": "--config.save_interval"}
    monkeypatch.setitem(commands.COMMANDS, "finetune", dataclasses.replace(finetune, flags=flags))
    argv = ["launch", "slurm", "--nodes", "1", "--gpus-per-node", "4", "--save-interval", "250"]
    argv += ["--dry-run", "--", "finetune", "--config.save_interval=9"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "--config.save_interval after -- while octo-dist launch sets it" in err
    assert "Fix: drop --config.save_interval after --" in err


@pytest.mark.parametrize(
    "flag, value, path, in_flag_words, in_json_words",
    [
        (
            "--nodes",
            20000,
            ("allocation", "nodes"),
            "--nodes 20000; expected --nodes from 1 to 10000. Fix: --nodes 1 (or more)",
            "job setting allocation.nodes: 20000; expected a whole number from 1 to 10000",
        ),
        (
            "--cpus-per-rank",
            2000,
            ("allocation", "cpus_per_rank"),
            "--cpus-per-rank 2000; expected 0 (no binding) to 1024. Fix: --cpus-per-rank 0",
            "job setting allocation.cpus_per_rank: 2000; expected a whole number from 0 to 1024",
        ),
        (
            "--wandb-mode",
            "loud",
            ("storage", "wandb_mode"),
            None,  # argparse's choices refuse it first on the command line
            "job setting storage.wandb_mode: 'loud'; expected one of online, offline, disabled",
        ),
    ],
)
def test_one_validator_names_a_setting_by_its_flag_at_render_and_by_its_path_on_the_node(
    capsys, flag, value, path, in_flag_words, in_json_words
):
    """The same field metadata and the same check refuse the value in both places, in each place's words."""
    base = ["launch", "slurm", "--nodes", "1", "--gpus-per-node", "4", "--dry-run"]
    if in_flag_words is not None:
        # the flag in place of base's own value (a flag given twice with two values is refused as such)
        i = base.index(flag) if flag in base else len(base)
        given = base[:i] + base[i + 2 :]
        assert cli.main([*given, flag, str(value)]) == 2
        assert capsys.readouterr().err.strip() == f"octo-dist launch: error: {in_flag_words}"
    assert cli.main(base) == 0
    raw = json.loads(_settings_in(capsys.readouterr().out).to_json())
    raw[path[0]][path[1]] = value
    with pytest.raises(job_settings.SettingsError) as refused:
        settingsread.from_json(json.dumps({"schema": job_settings.SCHEMA, **raw}))
    assert str(refused.value).startswith(in_json_words)
    assert "Fix: re-render the job script with octo-dist launch" in str(refused.value)


def test_every_setting_with_a_flag_is_the_launch_option_of_that_flag_with_its_help():
    """A setting's flag and help are declared once, in its metadata (``settings.py``): launch's option of that
    flag takes both from there, so a refusal of the value names the flag that set it."""
    options = {options_mod.flag_of(f): f for f in options_mod.option_fields()}
    seen = []
    sections = (
        job_settings.Allocation,
        job_settings.Timing,
        job_settings.Software,
        job_settings.Storage,
    )
    for section in (*sections, job_settings.Forwarding):
        for f in dataclasses.fields(section):
            if f.metadata["flag"]:
                option = options[f.metadata["flag"]]  # KeyError: a setting no launch option sets
                assert option.metadata["help"] == f.metadata["help"] != "", f.name
                seen.append(f.metadata["flag"])
    assert {
        "--nodes",
        "--walltime",
        "--stop-margin",
        "--save-dir",
        "--module",
        "--coordinator",
    } <= set(seen)


def test_a_setting_the_job_runtime_reads_is_one_field_from_the_command_line_to_the_runtime(
    monkeypatch, capsys, tmp_path
):
    """A setting the job runtime reads is one field of a section in ``settings.py`` (its flag, help, bound, launch
    group and default) and the runtime's code that reads it: ``launch`` takes its flag, ``spec`` passes it by name,
    the rendered script carries it and the runtime's reader (``settingsread``) gives it back, checked; a value past
    its bound is refused by launch and by the runtime alike. Declared ``in_file``, a defaults file sets it too, under
    its flag's name, checked as the flag is."""
    # The bound a new count names, in the one table (beside the field, in settings.py).
    bound = job_settings.Bound(1, 3600, "--heartbeat 60")
    monkeypatch.setitem(job_settings.BOUNDS, "heartbeat_s", bound)

    # 1. The one field ...
    @dataclasses.dataclass(frozen=True)
    class Timing(job_settings.Timing):
        heartbeat_s: int = job_settings._field(
            "heartbeat_s",
            flag="--heartbeat",
            help="seconds between the ranks' heartbeats (default: {default})",
            group="training",
            default=60,
            in_file=True,
        )

    monkeypatch.setattr(job_settings, "Timing", Timing)
    # ... which LaunchOptions takes as import does (options.LaunchOptions = with_settings(...) at its end).
    monkeypatch.setattr(
        options_mod, "LaunchOptions", options_mod.with_settings(options_mod.LaunchOptions)
    )

    # 2. The runtime's code that uses it, given the settings the job's first node reads back.
    def heartbeats(settings: job_settings.JobSettings) -> int:
        return settings.timing.walltime_s // settings.timing.heartbeat_s

    argv = ["launch", "slurm", "--nodes", "2", "--gpus-per-node", "4", "--walltime", "1:00:00"]
    assert cli.main([*argv, "--heartbeat", "45", "--dry-run"]) == 0, capsys.readouterr().err
    script = capsys.readouterr().out
    assert '"heartbeat_s": 45' in script, script  # the JSON the script hands to the runtime
    settings = _settings_in(script)
    assert settings.timing.heartbeat_s == 45 and heartbeats(settings) == 80
    assert cli.main([*argv, "--dry-run"]) == 0  # left out: its launch default
    assert _settings_in(capsys.readouterr().out).timing.heartbeat_s == 60

    # Past its bound: launch refuses it in its flag's words, the runtime by its JSON path, both from the table.
    assert cli.main([*argv, "--heartbeat", "0", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--heartbeat 0; expected --heartbeat from 1 to 3600. Fix: --heartbeat 60" in err, err
    with pytest.raises(
        job_settings.SettingsError, match="job setting timing.heartbeat_s: 7200; .* 1 to 3600"
    ):
        settingsread.from_json(
            script.split(" supervise '")[1].split("'")[0].replace(": 45", ": 7200")
        )

    # A defaults file sets it under its flag's name (the project's octo-dist.ini here); the command line wins.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-user-file"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "octo-dist.ini").write_text("[launch]\nheartbeat = 30\n")
    assert cli.main([*argv, "--dry-run"]) == 0, capsys.readouterr().err
    assert _settings_in(capsys.readouterr().out).timing.heartbeat_s == 30
    assert cli.main([*argv, "--heartbeat", "45", "--dry-run"]) == 0
    assert _settings_in(capsys.readouterr().out).timing.heartbeat_s == 45
    (tmp_path / "octo-dist.ini").write_text("[launch]\nheartbeat = soon\n")
    assert cli.main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert (
        "line 2 [launch]: heartbeat = 'soon'; expected a whole number. Fix: heartbeat = 60" in err
    ), err
