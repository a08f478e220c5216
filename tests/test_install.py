"""The post-lock install steps, against a real local git repository and a real venv."""

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from octo_dist.stack import install
from octo_dist.stack import manifest as mf


def _git(*args, cwd):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def local_repo(tmp_path_factory):
    """A git repo holding a tiny installable package, like octo at a pinned commit."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "tinypkg").mkdir()
    (repo / "tinypkg" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tinypkg', version='0.1', packages=['tinypkg'])\n"
    )
    _git("init", "-q", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=repo)
    first = _git("rev-parse", "HEAD", cwd=repo)
    (repo / "tinypkg" / "__init__.py").write_text("VALUE = 2\n")
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two", cwd=repo)
    return repo, first


def _manifest(url: str, commit: str) -> mf.Manifest:
    data = mf.loads(mf.DEFAULT_MANIFEST.read_text())
    data["git"] = {"tinypkg": {"url": url, "commit": commit, "distribution": "tinypkg"}}
    return mf.parse_manifest(data, Path("stack.toml"))


def test_git_dependency_is_installed_at_the_pinned_commit_not_the_tip(local_repo, tmp_path):
    repo, first = local_repo
    env = tmp_path / "venv"
    # No pip of its own where the base Python has one (ensurepip takes seconds): that pip, seen through the system
    # site packages, installs into this venv (the direct_url.json below is looked for there).
    venv.create(env, system_site_packages=True)
    python = str(env / "bin" / "python")
    if subprocess.run([python, "-c", "import pip"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "ensurepip"], capture_output=True, check=True)
    # pip 23 needs a host in file URLs: file://localhost/path
    skipped = install.install_git(_manifest(f"file://localhost{repo}", first), python, require=True)
    assert skipped == []
    out = subprocess.run(
        [python, "-c", "import tinypkg; print(tinypkg.VALUE)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == "1"  # the pinned commit, not the newer tip (VALUE = 2)
    direct_url = list(env.glob("lib/python*/site-packages/tinypkg-0.1.dist-info/direct_url.json"))
    assert direct_url and first in direct_url[0].read_text()


def test_unreachable_git_host_is_skipped_with_a_warning(tmp_path, capsys):
    m = _manifest(f"file://{tmp_path}/no-such-repo", "a" * 40)
    skipped = install.install_git(m, sys.executable, require=False)
    assert skipped == ["tinypkg"]
    err = capsys.readouterr().err
    assert "warning: tinypkg:" in err and "unreachable" in err and "make git-deps" in err


def test_unreachable_git_host_fails_when_required(tmp_path):
    m = _manifest(f"file://{tmp_path}/no-such-repo", "a" * 40)
    with pytest.raises(SystemExit, match="error: tinypkg: .* is unreachable"):
        install.install_git(m, sys.executable, require=True)


def test_install_script_refuses_a_python_without_a_lock(tmp_path):
    # Python 3.9 has no lock: the script must say which locks exist and how to fix it.
    py39 = Path.home() / ".pyenv/versions/3.9.18/bin/python3.9"
    if not py39.exists():
        pytest.skip("no Python 3.9 on this machine to fabricate the mismatch")
    script = mf.REPO_ROOT / "containers" / "install.sh"
    res = subprocess.run(
        ["bash", str(script), "cpu", str(tmp_path / "v")],
        env={"PYTHON": str(py39), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert res.returncode == 2  # bad input: refused before anything is written
    assert not (tmp_path / "v").exists()
    assert "no lock for profile 'cpu' on Python 3.9" in res.stderr
    assert "cpu-py3.11.txt" in res.stderr and "PYTHON=python3.10" in res.stderr
