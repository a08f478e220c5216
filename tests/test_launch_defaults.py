"""Defaults for ``octo-dist launch`` from ~/.config/octo-dist/launch.ini and ./octo-dist.ini, the command line
winning; ``--show-defaults`` says where each value came from. HOME is a fake one in tmp_path."""

import pytest

from octo_dist import cli

USER = """[launch]
group = gxx00000
image = /groups/gxx00000/octo-dist.sif
skip-image-check = true
wandb-mode = online
save-dir = runs/user
[launch.pbs]
module = hpcx/2.20 extra/1.0
"""
PROJECT = """[launch]
save-dir = runs/project
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    user = tmp_path / "home" / ".config" / "octo-dist" / "launch.ini"
    user.parent.mkdir(parents=True)
    return user, work / "octo-dist.ini"


def shown(capsys) -> dict:
    return {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()}


def test_the_command_line_wins_over_the_project_file_over_the_user_file(home, capsys):
    user, project = home
    user.write_text(USER)
    project.write_text(PROJECT)
    assert cli.main(["launch", "pbs", "--show-defaults", "--wandb-mode", "offline"]) == 0
    rows = shown(capsys)
    assert rows["--group"] == ["gxx00000", str(user)]
    assert rows["--module"] == ["hpcx/2.20", "extra/1.0", str(user)]  # [launch.pbs] over [launch]
    assert rows["--save-dir"] == ["runs/project", str(project)]
    assert rows["--wandb-mode"] == [
        "offline",
        "command",
        "line",
    ]  # given, although it is the built-in value
    assert rows["--venv"] == [".venv", "built", "in"]
    # The script's header shows the whole line, so it can be rendered again without these files.
    assert cli.main(["launch", "pbs", "--nodes", "1", "--dry-run"]) == 0
    header = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("#   rendered:")][
        0
    ]
    for part in (
        "--group gxx00000",
        "--module hpcx/2.20 --module extra/1.0",
        "--save-dir runs/project",
        "--wandb-mode online",
        "--skip-image-check",
        "--image /groups/gxx00000/octo-dist.sif",
    ):
        assert part in header, header


def test_other_schedulers_skip_another_schedulers_section(home, capsys):
    user, _ = home
    user.write_text(USER)
    assert cli.main(["launch", "sge", "--show-defaults"]) == 0
    assert shown(capsys)["--module"][:3] == ["(none)", "built", "in"]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("[launch]\ngroupp = x\n", "unknown key 'groupp'"),
        ("[lunch]\ngroup = x\n", "unknown section [lunch]"),
        # A scheduler nobody registered: its section would be read by nothing.
        ("[launch.lsf]\ngroup = x\n", "unknown section [launch.lsf]"),
        ("group = x\n", "not an INI file"),
        ("[launch]\nskip-image-check = maybe\n", "expected true or false"),
    ],
)
def test_a_broken_defaults_file_is_refused_naming_the_file(home, capsys, text, needle):
    user, _ = home
    user.write_text(text)
    assert cli.main(["launch", "pbs", "--nodes", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"octo-dist launch: error: {user}")
        and needle in err
        and err.count("\n") == 1
    ), err


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"[launch]\ngroup = gxx\xff00000\n", "is not UTF-8 text (byte 0xff at offset 20)"),
        (b"[launch]\nname = " + b"x" * (50 << 20) + b"\n", "is longer than 65536 bytes"),
    ],
    ids=["not-utf8", "50MB-name"],
)
def test_a_defaults_file_not_utf8_or_huge_is_refused_in_one_line(home, capsys, content, needle):
    _, project = home
    project.write_bytes(content)
    assert cli.main(["launch", "pbs", "--nodes", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"octo-dist launch: error: {project} ") and err.count("\n") == 1, err
    assert needle in err and f"Fix: correct or remove {project}" in err, err


def test_terminal_sequences_in_a_defaults_file_are_shown_escaped(home, capsys):
    user, _ = home
    user.write_text("[launch]\ngroup = g\x1b]0;owned\x07x\nsave-dir = runs/\x1b[2J\x1b[31mred\n")
    assert cli.main(["launch", "pbs", "--show-defaults"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    rows = shown_raw(out)
    assert rows["--group"] == ["g\\x1b]0;owned\\x07x", str(user)]
    assert rows["--save-dir"] == ["runs/\\x1b[2J\\x1b[31mred", str(user)]


def shown_raw(out: str) -> dict:
    return {line.split()[0]: line.split()[1:] for line in out.splitlines()}


def test_show_defaults_shows_the_values_the_script_is_rendered_with(home, capsys):
    # What --help describes ("default: the resource type's, 8 on rt_HF") and what the script gets, not "(none)".
    assert cli.main(["launch", "pbs", "--show-defaults"]) == 0
    rows = shown(capsys)
    assert rows["--resource-type"][:1] == ["rt_HF"] and rows["--gpus-per-node"][:1] == ["8"]
    assert rows["--ranks-per-node"][:1] == ["8"] and rows["--cpus-per-rank"][:1] == ["12"]
    assert rows["--module"][:1] == ["hpcx/2.20"]
    assert cli.main(["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "--dry-run"]) == 0
    script = capsys.readouterr().out
    for rendered in ("-q rt_HF", "mpiprocs=8", '"cpus_per_rank": 12', "hpcx/2.20"):
        assert rendered in script, rendered
    # one GPU: one rank, nothing to bind
    assert cli.main(["launch", "pbs", "--resource-type", "rt_HG", "--show-defaults"]) == 0
    rows = shown(capsys)
    assert rows["--gpus-per-node"][:1] == ["1"] and rows["--cpus-per-rank"][:1] == ["0"]
