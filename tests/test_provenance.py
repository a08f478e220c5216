"""`octo-dist env` says which commit of octo and dlimp runs, however they were installed (fabricated inputs)."""

import json
import subprocess
import sys

from helpers import HANG_S, REPO, clean_env
from octo_dist.envcheck import installed, provenance
from octo_dist.stack import manifest as mf

PINNED = "b14ec77d15ac30137c95b847f7fbaaf56f7eee8b"
OTHER = "0123456789abcdef0123456789abcdef01234567"
OCTO = mf.GitDep("octo", "https://github.com/TMats/octo", PINNED, "octo")


def dist_info(site, name, version, direct_url=None):
    d = site / f"{name}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (d / "direct_url.json").write_text(json.dumps(direct_url))


def checkout(path, commit, *, packed=False, detached=False):
    git = path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    if detached:
        (git / "HEAD").write_text(commit + "\n")
    else:
        (git / "HEAD").write_text("ref: refs/heads/main\n")
        if packed:
            (git / "packed-refs").write_text(f"# pack-refs\n{commit} refs/heads/main\n")
        else:
            (git / "refs" / "heads" / "main").write_text(commit + "\n")
    return path


def test_a_pip_git_install_reports_its_recorded_commit(tmp_path):
    dist_info(
        tmp_path,
        "octo",
        "0.1.0",
        {"url": OCTO.url, "vcs_info": {"vcs": "git", "commit_id": PINNED}},
    )
    row = provenance.describe(OCTO, installed.scan([str(tmp_path)])["octo"])
    assert row == {
        "name": "octo",
        "pinned": PINNED,
        "installed": f"0.1.0 at {PINNED}",
        "matches": True,
    }


def test_an_editable_install_reports_its_checkouts_commit(tmp_path):
    src = checkout(tmp_path / "src" / "octo", OTHER, packed=True)
    site = tmp_path / "site"
    dist_info(site, "octo", "0.1.0", {"url": f"file://{src}", "dir_info": {"editable": True}})
    row = provenance.describe(OCTO, installed.scan([str(site)])["octo"])
    assert row["installed"] == f"0.1.0 from {src} (editable) at {OTHER}" and not row["matches"]


def test_a_source_tree_and_a_worktree_report_their_commits(tmp_path):
    tree = checkout(tmp_path / "octo", PINNED, detached=True)
    assert (
        provenance.describe(OCTO, None, str(tree))["installed"] == f"source tree {tree} at {PINNED}"
    )
    # a worktree: .git is a file naming its gitdir, whose HEAD's ref lives in the main repository
    main = checkout(tmp_path / "main", OTHER)
    gitdir = main / ".git" / "worktrees" / "wt"
    gitdir.mkdir(parents=True)
    (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
    (gitdir / "commondir").write_text("../..\n")
    wt = tmp_path / "wt"
    wt.mkdir()
    (wt / ".git").write_text(f"gitdir: {gitdir}\n")
    assert provenance.checkout_commit(wt / "octo") == OTHER
    assert provenance.checkout_commit(tmp_path / "nowhere") is None


def test_env_names_the_commit_of_an_octo_on_pythonpath(tmp_path):
    # A source tree of octo made importable by hand, as researchers do: no metadata, its checkout has the commit.
    tree = checkout(tmp_path / "octo-src", PINNED, detached=True)
    (tree / "octo").mkdir()
    (tree / "octo" / "__init__.py").write_text("raise RuntimeError('env must not import octo')\n")
    env = clean_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{tree}"
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "env", "--json", "--no-jax", "--profile", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["name"]: r for r in json.loads(proc.stdout)["git"]}
    assert (
        rows["octo"]["installed"] == f"source tree {tree} at {PINNED}" and rows["octo"]["matches"]
    )
    assert rows["dlimp"]["installed"] is None and not rows["dlimp"]["matches"]
