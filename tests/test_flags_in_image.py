"""Where launch's Python cannot check the fine-tune's flags (a login node's: no absl), they are checked inside the
image when ``singularity`` (or ``apptainer``) and the image are here, and what the image refuses launch refuses
(exit 2); otherwise launch says how to check them by hand.

No Singularity here: a fake ``singularity`` on PATH drops ``exec IMAGE`` and runs the rest with this venv's Python
(which has absl). The Python without absl is a real one (CPython 3.9 with ``-S``: no site-packages) where pyenv
has it, and otherwise launch's own seam: the checker it is given raises the ImportError such a Python raises.
"""

import argparse
import os
import subprocess
import sys

import pytest

from helpers import HANG_S, REPO, clean_env
from octo_dist.jobs import cli as jobs_cli

SIF_HEADER = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC\0"
BARE_39 = "/root/.pyenv/versions/3.9.18/bin/python"
WEIGHTS = "--config.pretrained_path=weights/octo-small"


def fake_runner(bin_dir, name="singularity", body=None):
    """``singularity exec IMAGE python3 ARGS...`` -> this venv's ``python ARGS...``; ``body``: another script."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(
        body
        or (
            '#!/bin/sh\n[ "$1" = exec ] || exit 64\nshift 2\n[ "$1" = python3 ] && shift\n'
            f'exec "{sys.executable}" "$@"\n'
        )
    )
    path.chmod(0o755)
    return path


@pytest.fixture
def site(tmp_path):
    (tmp_path / "octo-dist-cuda12.sif").write_bytes(SIF_HEADER)
    return tmp_path


def head(site):
    image = str(site / "octo-dist-cuda12.sif")
    return ["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "--image", image, "--dry-run"]


# --- in this process: the checker launch is given cannot be imported ------------------------------------------


def no_absl(argv):
    raise ModuleNotFoundError("No module named 'absl'")


def launch(argv, checker=no_absl) -> int:
    parser = argparse.ArgumentParser(prog="octo-dist")
    jobs_cli.add_parser(parser.add_subparsers(), checkers={"finetune": checker})
    args = parser.parse_args(argv)
    return args.func(args)


def test_a_refusal_in_the_image_is_launchs(site, monkeypatch, capsys):
    fake_runner(site / "bin")
    monkeypatch.setenv("PATH", f"{site / 'bin'}:{os.environ['PATH']}")
    monkeypatch.chdir(site)
    assert launch([*head(site), "--", "finetune", WEIGHTS, "--config.num_stepz=3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "octo-dist launch: error: -- finetune: unknown config field num_stepz, did you mean "
        "--config.num_steps?; expected flags that octo-dist finetune accepts"
    ), err
    assert launch([*head(site), "--", "finetune", WEIGHTS, "--config.num_steps=3"]) == 0
    err = capsys.readouterr().err
    assert (
        f"note: the finetune flags after -- were checked in {site / 'octo-dist-cuda12.sif'} "
        "(No module named 'absl' here)" in err
    ), err


def test_apptainer_serves_as_well(site, monkeypatch, capsys):
    fake_runner(site / "bin", "apptainer")
    monkeypatch.setenv("PATH", f"{site / 'bin'}:/usr/bin:/bin")
    monkeypatch.chdir(site)
    assert launch([*head(site), "--", "finetune", WEIGHTS, "--config.augment_on", "--debug"]) == 2
    assert "-- finetune: --config.augment_on without a value" in capsys.readouterr().err


@pytest.mark.parametrize(
    "body, said",
    [
        ('#!/bin/sh\necho "FATAL: could not open image" >&2\nexit 255\n', "exit 255 (FATAL: could"),
        ("#!/bin/sh\nexit 0\n", "exit 0 (no output)"),  # an image whose octo-dist has no such check
    ],
)
def test_an_image_that_cannot_check_says_so_and_how(site, monkeypatch, capsys, body, said):
    fake_runner(site / "bin", body=body)
    monkeypatch.setenv("PATH", f"{site / 'bin'}:/usr/bin:/bin")
    monkeypatch.chdir(site)
    assert launch([*head(site), "--", "finetune", WEIGHTS]) == 0
    err = capsys.readouterr().err
    assert (
        "the finetune flags after -- are not checked here (No module named 'absl'), nor in the image"
        in err
    )
    assert said in err and "Check them by hand: singularity exec " in err, err


def test_without_singularity_the_note_says_how_to_check_by_hand(site, monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(site)
    assert launch([*head(site), "-o", "job.sh", "--", "finetune", WEIGHTS]) == 0
    err = capsys.readouterr().err
    image = site / "octo-dist-cuda12.sif"
    assert (
        "note: the finetune flags after -- are not checked here (No module named 'absl'): singularity (or "
        f"apptainer) is not on PATH. Check them by hand: singularity exec {image} octo-dist launch pbs "
        f"--nodes 1 --group gxx00000 --image {image} --dry-run -- finetune {WEIGHTS}"
    ) in err, err


# --- a real Python without absl, as on ABCI's login node -------------------------------------------------------


@pytest.mark.skipif(not os.path.exists(BARE_39), reason=f"no CPython 3.9 at {BARE_39} (pyenv)")
def test_on_a_bare_login_python_the_image_checks_the_flags(site):
    fake_runner(site / "bin")
    env = dict(clean_env(), PATH=f"{site / 'bin'}:/usr/bin:/bin")

    def run(*flags):
        return subprocess.run(
            [BARE_39, "-S", "-E", "-B", "-m", "octo_dist", *head(site), "--", "finetune", *flags],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=HANG_S,
        )

    typo = run(WEIGHTS, "--config.num_stepz=3")
    assert typo.returncode == 2, typo.stderr
    assert (
        "-- finetune: unknown config field num_stepz, did you mean --config.num_steps?"
        in typo.stderr
    )
    sound = run(WEIGHTS, "--config.num_steps=3")
    assert sound.returncode == 0 and sound.stdout.startswith("#!/bin/bash"), sound.stderr
    assert "were checked in" in sound.stderr


def test_the_check_in_the_image_speaks_its_protocol(tmp_path):
    def check(*flags):
        return subprocess.run(
            [sys.executable, "-m", "octo_dist.apps.finetune.arguments", *flags],
            capture_output=True,
            text=True,
            env=clean_env(),
            cwd=tmp_path,
            timeout=HANG_S,
        )

    bad = check("--config.num_stepz=3")
    assert bad.returncode == 2 and bad.stderr.startswith(
        "octo-dist finetune: error: unknown config field num_stepz"
    ), bad.stderr
    good = check("--config.num_steps=3")
    assert good.returncode == 0 and good.stdout == "octo-dist: flags checked\n", good.stderr


def test_a_check_that_does_not_end_is_cut_off_and_said(site):
    """The image's check ran past its time (a hung mount): it is ended, and the render goes on with a note."""
    from octo_dist.jobs import flagsinimage
    from octo_dist.launchers import outside

    def hung(argv, timeout_s):
        raise outside.CommandTimeout(argv, timeout_s, "")

    notes = []
    image = str(site / "octo-dist-cuda12.sif")
    flagsinimage.in_image(
        "finetune", [WEIGHTS], "No module named 'absl'", image, "BY HAND",
        lambda name: f"/usr/bin/{name}", hung, notes.append,
    )  # fmt: skip
    (note,) = notes
    assert f"nor in the image: singularity exec {image} python3 -m " in note
    assert f"did not end within {flagsinimage.TIMEOUT_S} s" in note and note.endswith("BY HAND")
