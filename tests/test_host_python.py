"""The host-side steps on real Python 3.9.18 and 3.12 with only the standard library (ABCI 3.0's login nodes:
system Python 3.9.18, modules python/3.12 and 3.13), and a static check with vermin where no interpreter exists."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, REPO
from octo_dist.stack import manifest as mf

PYENV = Path("/root/.pyenv/versions")
# The host-side interpreters on ABCI 3.0's login nodes: the system Python and the python/3.12 module.
HOST_PYTHONS = {
    "3.9": PYENV / "3.9.18" / "bin" / "python",
    "3.12": PYENV / "3.12.1" / "bin" / "python",
}
# What runs on a login node before anything is installed: the manifest, the image checks, launch's layers.
HOST_SIDE = ["octo_dist/__init__.py", "octo_dist/stack", "octo_dist/launchers", "octo_dist/jobs"]


def bare(python: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -S -E -B``: no site-packages at all, no PYTHONPATH, no bytecode written: the standard library and
    the checkout (cwd)."""
    return subprocess.run(
        [str(python), "-S", "-E", "-B", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def host_python(version: str) -> Path:
    python = HOST_PYTHONS[version]
    if not python.exists():
        pytest.skip(
            f"no real Python {version} at {python}; test_host_side_modules_pass_vermin covers it statically"
        )
    return python


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_image_checks_run_on_a_bare_host_python(version):
    python = host_python(version)
    probe = bare(python, "-c", "import sys; print(sys.version_info[:2]); import tomli")
    assert "ModuleNotFoundError" in probe.stderr, (
        "expected a Python without tomli"
    )  # the login node's situation
    proc = bare(python, "-m", "octo_dist.stack.imagedefs", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agree with env/stack.toml" in proc.stdout


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_the_manifest_reads_the_same_on_a_bare_host_python(version, tmp_path):
    python = host_python(version)
    code = (
        "import json, sys; from octo_dist.stack import manifest as mf; m = mf.load_manifest();"
        "print(json.dumps({n: [p.python, list(p.lock_pythons), p.gpu, p.exact_pins()] for n, p in m.profiles.items()},"
        " sort_keys=True))"
    )
    proc = bare(python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    m = mf.load_manifest()
    want = {
        n: [p.python, list(p.lock_pythons), p.gpu, p.exact_pins()] for n, p in m.profiles.items()
    }
    assert json.loads(proc.stdout) == want


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_a_broken_manifest_is_one_line_on_a_bare_host_python(version, tmp_path):
    python = host_python(version)
    bad = tmp_path / "stack.toml"
    bad.write_text(mf.DEFAULT_MANIFEST.read_text().replace("gpu = true", 'gpu = "true"'))
    code = f"from octo_dist.stack import manifest as mf; mf.load_manifest({str(bad)!r})"
    proc = bare(python, "-c", code)
    assert proc.returncode == 1 and "profiles.cuda11.gpu must be true or false" in proc.stderr


def test_host_side_modules_pass_vermin():
    vermin = Path(sys.executable).parent / "vermin"
    if not vermin.exists():
        pytest.fail(
            f"vermin not found beside {sys.executable}; expected the dev lock installed: make dev-env"
        )
    proc = subprocess.run(
        [str(vermin), "-t=3.9-", "--no-tips", "--violations", "--eval-annotations", *HOST_SIDE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vermin_is_live(tmp_path):
    vermin = Path(sys.executable).parent / "vermin"
    (tmp_path / "new.py").write_text("import tomllib\n")
    proc = subprocess.run(
        [str(vermin), "-t=3.9-", "--no-tips", "--violations", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode != 0 and "tomllib" in proc.stdout


def test_make_images_check_needs_only_the_standard_library():
    python = HOST_PYTHONS["3.9"]
    if not python.exists() or not shutil.which("make"):
        pytest.skip("no real Python 3.9 or no make here")
    proc = subprocess.run(
        ["make", "-s", "images-check", f"PYTHON={python} -S -E"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_octo_dist_launch_renders_a_job_on_a_bare_host_python(version):
    python = host_python(version)
    proc = bare(
        python,
        "-m",
        "octo_dist",
        "launch",
        "pbs",
        "--nodes",
        "2",
        "--group",
        "gxx00000",
        "--image",
        "/groups/gxx00000/octo-dist.sif",
        "--skip-image-check",
        "--dry-run",
        "--",
        "smoke",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/bin/bash") and "#PBS -P gxx00000" in proc.stdout
