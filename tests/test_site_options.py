"""A site's own header lines: SLURM partition/account/QOS/constraint, Grid Engine queue/project, PBS extra -l, and a
validated --directive for any scheduler; and --show-defaults agreeing with --help on every option. Pure renders
(``parse`` + ``render``), no scheduler."""

from __future__ import annotations

import argparse
import re

import pytest

from octo_dist import cli
from octo_dist.jobs import schedulers
from octo_dist.jobs.cli import parse
from octo_dist.jobs.render import render

BASE = {
    "pbs": ["pbs", "--nodes", "2", "--group", "g1"],
    "sge": ["sge", "--nodes", "2", "--gpus-per-node", "4"],
    "slurm": ["slurm", "--nodes", "2", "--gpus-per-node", "8"],
}


def header(*argv) -> list:
    """The directive lines of the rendered script."""
    text = render(parse(list(argv)))
    return [line for line in text.splitlines() if re.match(r"#(PBS|\$|SBATCH) ", line)]


def test_slurm_site_options_become_sbatch_lines():
    lines = header(
        *BASE["slurm"], "--account", "acct", "--partition", "gpu", "--qos", "high",
        "--constraint", "a100&ib", "--directive", "#SBATCH --mail-type=END",
    )  # fmt: skip
    for line in (
        "#SBATCH --account=acct",
        "#SBATCH --partition=gpu",
        "#SBATCH --qos=high",
        "#SBATCH --constraint=a100&ib",
        "#SBATCH --mail-type=END",
    ):
        assert line in lines
    # Directives come before the first command: sbatch stops reading them there.
    assert lines[-1] == "#SBATCH --mail-type=END"


def test_grid_engine_queue_project_pe_and_pbs_resources():
    lines = header(*BASE["sge"], "--queue", "gpu.q", "--project", "p1", "--pe", "orte")
    assert {"#$ -q gpu.q", "#$ -P p1", "#$ -pe orte 8"} <= set(lines)
    lines = header(*BASE["pbs"], "--resource", "mem=400gb", "--resource", "ngpus_min=8")
    assert {"#PBS -l mem=400gb", "#PBS -l ngpus_min=8", "#PBS -l select=2:mpiprocs=8"} <= set(lines)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            ["slurm", "--directive", "#SBATCH --nodes=3"],
            "sets --nodes, which the header already sets",
        ),
        (["slurm", "--directive", "#SBATCH -N 3"], "sets --nodes"),
        (["slurm", "--directive", "#SBATCH -N3"], "sets --nodes"),
        (["pbs", "--directive", "#PBS -lselect=3"], "sets -l select"),
        (["slurm", "--directive", "#SBATCH --mail-type=END\nrm -rf ~"], "newline"),
        (["slurm", "--directive", "#PBS -l mem=400gb"], "is a pbs directive"),
        (["slurm", "--directive=--mail-type=END"], "does not start with #SBATCH"),
        (["slurm", "--account", "a", "--directive", "#SBATCH -A b"], "sets --account"),
        (["pbs", "--directive", "#PBS -l walltime=9:00:00"], "sets -l walltime"),
        (["pbs", "--directive", "#PBS -l mem=400gb,select=3"], "sets -l select"),
        (["pbs", "--resource", "select=3"], "--nodes/--ranks-per-node"),
        (["pbs", "--resource", "place"], "KEY=VALUE"),
        (["pbs", "--partition", "gpu"], "unrecognized argument"),
        (["sge", "--directive", "#$ -l h_rt=9:00:00"], "sets -l h_rt"),
        (["sge", "--queue", "a.q", "--directive", "#$ -q b.q"], "sets -q"),
        (["slurm", "--constraint", "a100 ib"], "one word"),
        (["slurm", "--qos", "x;y"], "one word"),
        # sbatch takes any unique prefix of a long option and clusters one-letter ones, as getopt does:
        (["slurm", "--directive", "#SBATCH --sig=B:KILL@1"], "sets --signal, which the header"),
        (["slurm", "--directive", "#SBATCH --ntasks-per-no=64"], "sets --ntasks-per-node"),
        (["slurm", "--directive", "#SBATCH --gpus-per-no=0"], "sets --gpus-per-node"),
        (["slurm", "--directive", "#SBATCH --gpus-per=1"], "sets --gpus-per-node"),  # ambiguous
        (["slurm", "--directive", "#SBATCH -vN3"], "sets --nodes"),
        (["slurm", "--directive", "#SBATCH -Qt 5"], "sets --time"),
        # what no octo-dist job may have, whoever renders the header:
        (["slurm", "--directive", "#SBATCH --export=NONE"], "sets --export; expected none"),
        (["slurm", "--directive", "#SBATCH --exp=NONE"], "sets --export"),
        (["slurm", "--directive", "#SBATCH --array=1-3"], "sets --array"),
        (["slurm", "--directive", "#SBATCH -a 1-3"], "sets --array"),
        (["pbs", "--directive", "#PBS -J 1-3"], "sets -J; expected none: an array job"),
        (["pbs", "--directive", "#PBS -S /bin/sh"], "sets -S"),
        (["pbs", "--directive", "#PBS -l Walltime=9:00:00"], "sets -l walltime"),
        (["pbs", "--directive", "#PBS -l SELECT=3:ncpus=8"], "sets -l select"),
        (
            ["pbs", "--resource", "Walltime=9:00:00"],
            "--resource Walltime=9:00:00; expected a resource",
        ),
        (["sge", "--directive", "#$ -t 1-3"], "sets -t"),
    ],
)
def test_a_site_line_that_contradicts_the_header_or_is_malformed_is_refused_in_one_line(
    argv, needle, capsys
):
    argv = [*BASE[argv[0]], *argv[1:]]
    try:
        status = cli.main(["launch", *argv, "--dry-run"])
    except SystemExit as e:  # an option of another scheduler: argparse's own refusal
        status = e.code
    assert status == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) in (1, 2), (
        err
    )  # argparse adds its usage line


def test_directives_that_the_header_does_not_set_are_allowed():
    # --account not given: the directive is its only spelling; -q on Grid Engine likewise.
    assert "#SBATCH -A other" in header(*BASE["slurm"], "--directive", "#SBATCH -A other")
    assert "#$ -q b.q" in header(*BASE["sge"], "--directive", "#$ -q b.q")
    # Prefixes and clusters of options the header does not set: --mail is --mail-type or --mail-user.
    for line in ("#SBATCH --mail=END", "#SBATCH -vv", "#SBATCH --mem=0", "#SBATCH -Q"):
        assert line in header(*BASE["slurm"], "--directive", line)
    assert "#PBS -l mem=400gb" in header(*BASE["pbs"], "--directive", "#PBS -l mem=400gb")


@pytest.mark.parametrize("scheduler", sorted(BASE))
def test_every_directive_the_header_renders_is_known_to_the_contradiction_check(scheduler):
    # If a template gains a directive, rendered_keys must learn its key, or a --directive could contradict it unseen.
    extra = {
        "pbs": [],
        "sge": ["--queue", "q", "--group", "p"],
        "slurm": [
            "--cpus-per-rank",
            "4",
            "--group",
            "a",
            "--partition",
            "p",
            "--qos",
            "q",
            "--constraint",
            "c",
        ],
    }[scheduler]
    s = schedulers.get(scheduler)
    for line in header(*BASE[scheduler], *extra):
        for key in s.directive_keys(line):
            assert key in s.rendered_keys, (line, key)


def _help_defaults(scheduler: str) -> dict:
    """flag -> the text in "(default: ...)" of its help line, from the real parser."""
    parser = argparse.ArgumentParser(prog="octo-dist")
    sub = parser.add_subparsers()
    from octo_dist.jobs import cli as jobs_cli

    launch = jobs_cli.add_parser(sub)
    sp = next(a for a in launch._actions if isinstance(a, argparse._SubParsersAction)).choices[
        scheduler
    ]
    out = {}
    for action in sp._actions:
        m = re.search(r"\((?:default: (.*)|(required))\)\s*$", action.help or "")
        if m and action.option_strings:
            out[action.option_strings[0]] = m.group(1) or m.group(2)
    return out


def _shown(scheduler: str, capsys) -> dict:
    assert cli.main(["launch", scheduler, "--show-defaults"]) == 0
    rows = {}
    for line in capsys.readouterr().out.splitlines():
        flag, rest = line.split(None, 1)
        value, source = (part.strip() for part in rest.split("  ", 1))
        rows[flag] = (value, source.partition("(")[2].rstrip(")"))  # "built in (one per GPU)"
    return rows


# How --help says that nothing is set (--show-defaults: "(none)" or "off").
EMPTY = ("none", "no ", "off", "the site's", "the command's own", "one job", "octo-dist agrees one")


@pytest.mark.parametrize("scheduler", sorted(BASE))
def test_show_defaults_and_help_agree_on_every_default(scheduler, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    helped, shown = _help_defaults(scheduler), _shown(scheduler, capsys)
    assert set(helped) - {"--show-defaults", "--dry-run"} == set(shown), set(helped) ^ set(shown)
    for flag, (value, why) in shown.items():
        said = helped[flag]
        if said == "required":
            assert value == "(none)", (flag, value)
            continue
        agree = (
            value in re.split(r"[\s,;']+", said)  # "rt_HF", "hpcx/2.20", "1:00:00", "0, none bound"
            or (value in ("(none)", "off") and said.startswith(EMPTY))
            or (why and why in said)  # a value that follows another option: the same rule in both
            or (
                flag == "--no-resume" and value == "off" and said.startswith("resume")
            )  # off: it resumes
        )
        assert agree, (
            f"{scheduler} {flag}: --show-defaults {value!r} ({why}) but --help 'default: {said}'"
        )


def test_an_empty_module_renders_a_script_that_loads_none():
    job = parse([*BASE["pbs"], "--module", ""])
    assert job.settings.software.modules == ()
    script = render(job)
    assert "then module load" not in script and "# no modules to load (--module '')" in script
    assert '"modules": []' in script


def test_a_data_dir_or_venv_missing_here_is_a_one_line_warning_and_the_script_is_still_written(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    argv = [
        *BASE["pbs"],
        "--data-dir",
        "data/bridge",
        "--venv",
        "no-venv",
        "-o",
        "job.sh",
        "--",
        "finetune",
        "--config.pretrained_path=weights/octo-small",  # no warning of a missing pretrained model either
    ]
    assert cli.main(["launch", *argv]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("octo-dist launch: warning:")]
    assert any("--data-dir data/bridge: no such directory" in w for w in warnings), err
    assert any("--venv no-venv: no such environment" in w for w in warnings), err
    assert (tmp_path / "job.sh").exists()
    (tmp_path / "data" / "bridge").mkdir(parents=True)
    (tmp_path / "no-venv" / "bin").mkdir(parents=True)
    assert cli.main(["launch", *argv]) == 0
    assert "warning: --" not in capsys.readouterr().err


def test_site_options_from_a_defaults_file_reach_only_their_scheduler(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    (tmp_path / "octo-dist.ini").write_text(
        "[launch]\npartition = gpu\nqos = high\n[launch.pbs]\nresource = mem=400gb ngpus_min=8\n"
    )
    assert cli.main(["launch", *BASE["slurm"], "--dry-run"]) == 0
    assert "#SBATCH --partition=gpu\n#SBATCH --qos=high\n" in capsys.readouterr().out
    assert cli.main(["launch", *BASE["pbs"], "--dry-run"]) == 0  # [launch]'s partition is not pbs's
    out = capsys.readouterr().out
    assert "#PBS -l mem=400gb\n#PBS -l ngpus_min=8\n" in out and "partition" not in out
