"""On ABCI 3.0 the ranks run from the image: ``launch pbs`` takes the image ``make sif`` wrote when neither
``--image`` nor ``--venv`` is given, and a venv that cannot run is refused at render, not at the job's start.

ABCI 3.0 user guide (system-overview, software): the login and compute nodes have Python 3.9 (3.9.25 on the login
nodes, 3.9.23 on the compute nodes) and the modules python/3.12 and python/3.13; the stack's locks are for 3.10
and 3.11, so no ``.venv`` can be built there.
"""

import os
import sys

from octo_dist import cli
from octo_dist.jobs import runfrom

HEAD = ["launch", "pbs", "--nodes", "1", "--group", "gxx00000", "--dry-run"]


def make_venv(root, version="3.11.7", python=sys.executable):
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(python)}\nversion = {version}\n")
    os.symlink(python, venv / "bin" / "python")
    return venv


def test_pbs_without_image_or_venv_runs_from_the_image_make_sif_wrote(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    sif = tmp_path / "octo-dist-cuda12.sif"
    sif.write_bytes(b"#!/usr/bin/env run-singularity\n\0" + b"SIF_MAGIC\0" + b"\0" * 64)
    assert cli.main(HEAD) == 0
    captured = capsys.readouterr()
    assert f"--image {sif}: the image make sif wrote here, taken by default" in captured.err, (
        captured.err
    )
    assert f'"image": "{sif}"' in captured.out and f"singularity exec {sif}" in captured.out


def test_an_explicit_venv_is_not_replaced_by_the_image(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "octo-dist-cuda12.sif").write_bytes(b"x")
    venv = make_venv(tmp_path)
    assert cli.main([*HEAD, "--venv", str(venv)]) == 0
    assert '"image": ""' in capsys.readouterr().out


def test_a_venv_whose_interpreter_is_gone_is_refused_at_render(tmp_path, capsys):
    venv = make_venv(tmp_path, python=str(tmp_path / "pyenv" / "3.11.7" / "bin" / "python3.11"))
    assert cli.main([*HEAD, "--venv", str(venv)]) == 2
    err = capsys.readouterr().err
    assert (
        f"--venv {venv}: {venv}/bin/python does not run here: its interpreter is missing" in err
    ), err
    assert "Fix: --image FILE.sif (on ABCI 3.0: make sif PROFILE=cuda12 on a compute node" in err, (
        err
    )


def test_a_venv_of_a_python_the_stack_has_no_lock_for_is_refused(tmp_path, capsys):
    venv = make_venv(tmp_path, version="3.9.18")
    assert cli.main([*HEAD, "--venv", str(venv)]) == 2
    err = capsys.readouterr().err
    assert "Python 3.9 (its pyvenv.cfg); expected Python 3.10 or 3.11" in err, err


def test_venv_refusal_reads_uvs_version_info_and_passes_a_venv_not_here():
    cfg = {"v/pyvenv.cfg": "home = /usr/bin\nversion_info = 3.12.1\n"}
    exists = {"v", "v/bin/python"}.__contains__
    assert "Python 3.12" in runfrom.venv_refusal("v", cfg.get, exists, exists)[0]
    assert runfrom.venv_refusal("elsewhere", cfg.get, exists, exists) is None
