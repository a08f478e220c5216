"""What a newcomer's first launch on ABCI got wrong: a wall time read as hours, a chain submitted without --submit,
a file that is not an image taken as one, an error that echoes 4,000 digits or tells to shorten "the command line's
argument", two spellings of the group silently taking the last, a fix that is refused again."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import REPO
from octo_dist import cli
from octo_dist.jobs import submit, walltime
from octo_dist.jobs.cli import parse

PBS = ["launch", "pbs", "--nodes", "2", "--group", "g1"]
SIF_HEADER = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0"


def refused(capsys, *argv) -> str:
    """The one line ``octo-dist launch`` refuses ``argv`` with (exit 2)."""
    assert cli.main(list(argv)) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert captured.out == ""
    return line


@pytest.mark.parametrize(
    "scheduler",
    [["pbs", "--group", "g1"], ["slurm", "--gpus-per-node", "8"], ["sge", "--gpus-per-node", "4"]],
)
def test_two_field_walltime_is_never_thirty_hours(capsys, scheduler):
    line = refused(capsys, "launch", *scheduler, "--nodes", "1", "--walltime", "30:00", "--dry-run")
    assert (
        "--walltime 30:00, two fields, which PBS, SLURM and Grid Engine all read as minutes:seconds"
        in line
    )
    assert (
        "Fix: --walltime 00:30:00 (30 min 0 s, as the schedulers read it) or 30:00:00 (30 h 0 min)"
        in line
    )


@pytest.mark.parametrize(
    "text, fix",
    [
        ("12h", "12:00:00"),
        ("1h30m", "01:30:00"),
        ("90min", "01:30:00"),
        ("2d", "2-00:00:00"),
        ("45 m", "00:45:00"),
    ],
)
def test_a_walltime_in_units_gets_a_fix_made_of_it(capsys, text, fix):
    line = refused(capsys, *PBS, "--walltime", text, "--dry-run")
    assert line.endswith(f"Fix: --walltime {fix}")
    assert walltime.parse_walltime(fix) > 0  # the fix is accepted


def test_the_wrote_line_parts_say_the_wall_time_and_node_hours():
    job = parse(["pbs", "--nodes", "2", "--group", "g1", "--walltime", "12:00:00"])
    assert walltime.time_summary(job) == "wall time 12:00:00, at most 24 node-hours"
    assert (
        submit.chain_summary(job, 3)
        == "submitting 3 jobs x 2 nodes x 12:00:00 = at most 72 node-hours"
    )
    one = parse(["pbs", "--nodes", "1", "--group", "g1", "--walltime", "0:10:00"])
    assert walltime.time_summary(one) == "wall time 00:10:00, at most 0.17 node-hours"
    assert (
        submit.chain_summary(one, 1)
        == "submitting 1 job x 1 node x 00:10:00 = at most 0.17 node-hours"
    )


def test_chain_without_submit_is_refused_and_nothing_is_written(capsys, tmp_path):
    out = tmp_path / "job.sh"
    line = refused(capsys, *PBS, "--chain", "3", "-o", str(out))
    assert line == (
        "octo-dist launch: error: --chain 3 without --submit; expected --submit with it: --chain submits jobs to "
        "the queue, and without --submit launch only writes the script. Fix: --submit --chain 3 (or drop --chain "
        "to only write the script)"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "content, found",
    [
        (b"", "is empty"),
        (b"hello, not an image\n", "is not a SIF file (it starts with 'hello, not an im'"),
        (b"#!/usr/bin/env run-singularity\n" + b"\0" * 40, "is not a SIF file"),
    ],
)
def test_a_file_that_is_not_an_image_is_refused(capsys, tmp_path, content, found):
    image = tmp_path / "octo-dist-cuda12.sif"
    image.write_bytes(content)
    line = refused(capsys, *PBS, "--image", str(image), "--dry-run")
    assert f"--image {image} {found}" in line and "SIF_MAGIC at byte 32" in line


@pytest.mark.parametrize("content", [SIF_HEADER + b"rest of the image", b"hsqs" + b"\0" * 100])
def test_a_sif_or_squashfs_image_is_taken(capsys, tmp_path, content):
    image = tmp_path / "octo-dist-cuda12.sif"
    image.write_bytes(content)
    assert cli.main([*PBS, "--image", str(image), "--dry-run"]) == 0, capsys.readouterr().err
    assert f"{image}" in capsys.readouterr().out


def test_an_image_name_singularity_reads_as_a_uri_is_refused(capsys):
    line = refused(capsys, *PBS, "--image", "x:y.sif", "--skip-image-check", "--dry-run")
    assert "singularity reads 'x:' as a URI scheme" in line
    assert line.endswith("Fix: --image ./x:y.sif, or rename the file without ':'")
    # A ':' after a '/' is part of a file name.
    assert cli.main([*PBS, "--image", "/g/x:y.sif", "--skip-image-check", "--dry-run"]) == 0


def test_a_missing_image_names_the_profile_the_nodes_need(capsys):
    line = refused(capsys, *PBS, "--image", "/nonexistent/octo.sif", "--dry-run")
    assert "the cuda12 profile for rt_HF" in line and "make sif PROFILE=cuda12" in line


def test_a_job_without_its_venv_names_the_profile_the_nodes_need(capsys):
    """A script rendered with --venv says, on a node without that venv, which environment to build: ABCI 3.0's
    H200 (sm_90) need cuda12, not the cuda11 stack."""
    assert cli.main([*PBS, "--venv", "/nonexistent/venv", "--dry-run"]) == 0, (
        capsys.readouterr().err
    )
    script = capsys.readouterr().out
    assert "(make env PROFILE=cuda12)" in script and "PROFILE=cuda11" not in script, script


def test_make_sif_builds_the_profile_h200_needs():
    def planned(*args):
        proc = subprocess.run(
            ["make", "-n", "sif", *args], cwd=REPO, capture_output=True, text=True
        )
        return proc.stdout

    assert "build --fakeroot octo-dist-cuda12.sif singularity-cuda12.def" in planned()
    assert "build --fakeroot octo-dist-cuda11.sif singularity.def" in planned("PROFILE=cuda11")


def test_account_and_group_together_are_refused(capsys):
    base = ["launch", "slurm", "--nodes", "1", "--gpus-per-node", "8", "--dry-run"]
    with pytest.raises(SystemExit) as e:
        cli.main([*base, "--account", "a", "--group", "b"])
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "octo-dist launch: error: --account a and --group b set the same setting twice; expected one value. "
        "Fix: keep one of them (--account a, or --group b)"
    )
    assert (
        cli.main([*base, "--account", "a", "--group", "a"]) == 0
    )  # the same value twice is one value


def test_a_long_value_is_named_by_its_flag(capsys):
    line = refused(capsys, *PBS, "--save-dir", "a" * 5000, "--dry-run")
    assert "--save-dir of 5000 characters" in line and line.endswith("Fix: a shorter --save-dir")
    line = refused(capsys, *PBS, "--dry-run", "--", "smoke", "--model", "b" * 5000)
    assert line.endswith("Fix: a shorter argument 3 after --")


@pytest.mark.parametrize(
    "flag",
    [
        "--nodes",
        "--gpus-per-node",
        "--cpus-per-rank",
        "--stop-margin",
        "--ranks-per-node",
        "--chain",
    ],
)
def test_a_number_of_4000_digits_is_not_echoed_whole(capsys, flag):
    argv = ["launch", "pbs", "--group", "g1", "--submit"] + (
        [] if flag == "--nodes" else ["--nodes", "1"]
    )
    line = refused(capsys, *argv, flag, "9" * 4000)
    assert "99999999999999999999... (4,000 digits)" in line and len(line) < 400


def test_a_too_short_walltime_suggests_what_is_accepted(capsys):
    line = refused(capsys, *PBS, "--walltime", "0:00:10", "--dry-run")
    assert "--stop-margin 0" not in line
    fix = line.split("Fix: ")[1]
    assert fix == "--walltime 00:15:00"
    assert cli.main([*PBS, *fix.split(), "--dry-run"]) == 0


@pytest.fixture
def project_ini(tmp_path, monkeypatch):
    """./octo-dist.ini in an empty working directory, with no user file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "octo-dist.ini"


@pytest.mark.parametrize(
    "text, line",
    [
        (
            "[launch]\ngroup = g1\n\nwalltime = 12h\n",
            "line 4 [launch]: walltime = '12h' is not a wall time; expected H:MM:SS or D-H:MM:SS, more than zero "
            "(e.g. 1:30:00). Fix: walltime = 12:00:00",
        ),
        (
            "[launch]\ngroup = g1\n[launch.pbs]\n# ABCI\nwall-time = 1:00:00\n",
            "line 5 [launch.pbs]: unknown key 'wall-time', did you mean 'walltime'?",
        ),
        (
            "[launch]\ngroup = g1\nwalltime = 30:00\n",
            "line 3 [launch]: walltime = 30:00, two fields",
        ),
        (
            "[launch]\ngroup = g1\nwandb-mode = onlin\n",
            "line 3 [launch]: wandb-mode = 'onlin'; expected one of online, offline, disabled. Fix: wandb-mode = "
            "online",
        ),
        (
            "[launch]\n\nskip-image-check = maybe\n",
            "line 3 [launch]: skip-image-check = 'maybe'; expected true",
        ),
    ],
)
def test_a_defaults_file_error_names_the_file_and_line_and_fixes_the_value(
    capsys, project_ini, text, line
):
    project_ini.write_text(text)
    found = refused(capsys, "launch", "pbs", "--nodes", "1", "--dry-run")
    assert found.startswith(f"octo-dist launch: error: {project_ini} {line}"), found


def test_grid_engines_qsub_on_path_for_a_pbs_submit_is_named(capsys, tmp_path, monkeypatch):
    """Debian's gridengine-client qsub, unconfigured (no qmaster), as a login node with the wrong qsub first."""
    real = shutil.which("qsub", path="/usr/bin")
    probe = subprocess.run([real, "--version"], capture_output=True, text=True) if real else None
    if probe is None or submit.qsub_kind(probe.stdout + probe.stderr) != "sge":
        pytest.skip("needs Grid Engine's qsub in /usr/bin (Debian's gridengine-client)")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    line = refused_with(capsys, 1, *PBS, "--submit", "-o", "job.sh")
    assert line.startswith("octo-dist launch: error: qsub ")
    assert line.endswith(
        "; the qsub on PATH (/usr/bin/qsub) is Grid Engine's, not PBS Professional's that octo-dist launch pbs "
        "writes for. Fix: put PBS Professional's qsub first on PATH (on the cluster's login node), or render for "
        "the scheduler you have: octo-dist launch sge ..."
    )


def test_a_failing_pbs_qsub_is_not_called_the_wrong_one(capsys, tmp_path, monkeypatch):
    tools = tmp_path / "tools"
    tools.mkdir()
    qsub = tools / "qsub"
    qsub.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo "pbs_version = 22.05.11"; exit 0; }\n'
        'echo "qsub: Unknown queue" >&2; exit 1\n'
    )
    qsub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    line = refused_with(capsys, 1, *PBS, "--submit", "-o", "job.sh")
    assert line.endswith("failed (exit 1): qsub: Unknown queue"), line


@pytest.mark.parametrize(
    "text, kind",
    [
        ("pbs_version = 22.05.11\n", "pbs"),
        ("GE 8.1.9\nusage: qsub [options]\n", "sge"),
        (
            'unable to read qmaster name: qmaster hostname in "/var/lib/gridengine/default/common/act_qmaster"',
            "sge",
        ),
        ("qsub: command not understood", None),
    ],
)
def test_which_qsub_answered(text, kind):
    assert submit.qsub_kind(text) == kind


def refused_with(capsys, code, *argv) -> str:
    assert cli.main(list(argv)) == code
    err = [ln for ln in capsys.readouterr().err.splitlines() if "warning:" not in ln]
    (line,) = err
    return line
