"""The TOML subset reader (ABCI's system Python 3.9 has no tomllib) against tomllib, and the host-side steps on
real Python 3.9 and 3.12 with only the standard library."""

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from helpers import REPO
from octo_dist.stack import manifest as mf
from octo_dist.stack import toml_subset

PYENV = Path("/root/.pyenv/versions")
# The host-side interpreters on ABCI 3.0's login nodes: the system Python and the python/3.12 module.
HOST_PYTHONS = {"3.9": PYENV / "3.9.18" / "bin" / "python", "3.12": PYENV / "3.12.1" / "bin" / "python"}
# What runs on a login node before anything is installed: the manifest, the image checks, launch's layers.
HOST_SIDE = ["octo_dist/__init__.py", "octo_dist/stack", "octo_dist/launchers", "octo_dist/jobs"]

FABRICATED = [
    'a = "x"\nb = 1\nc = true\nd = false\ne = -3\nf = 1_000\ng = 2.5\nh = 1e3\n',
    '# comment\n\n  key = "v"   # trailing\n[t]\nx = 1\n[t.u]\ny = "z"\n',
    '[common.by_python."3.10".requirements]\nprotobuf = "==3.20.3"\n[common.by_python."3.11".requirements]\np = "1"\n',
    '[[p.o]]\npackage = "a"\n[[p.o]]\npackage = "b"\n[p.o.sub]\nk = 1\n[p]\nname = "n"\n',
    'arr = [\n  "3.10",  # the images\n  "3.11",\n]\nnested = [[1, 2], ["a"]]\nempty = []\n',
    "lit = 'C:\\path\\no escapes'\nbasic = \"tab\\t quote\\\" back\\\\ u\\u00e9 U\\U0001F600\"\n",
    'dotted.key = "v"\n"quoted key" = 1\n\'lit key\' = 2\n[x]\ny.z = 3\n',
    "crlf = 1\r\n[t]\r\nk = \"v\"\r\n",
    'inherit = ["numpy", "ml-dtypes"]\ngpu = "false"\nlock_pythons = "3.11"\n',
    '[a.b]\nx = 1\n[a]\ny = 2\n',                              # a super-table after its sub-table
    '[[a]]\nx = 1\n[a.b]\ny = 2\n[[a]]\nx = 3\n',                # a sub-table of the last array element
    'x = "a#b" # c\n[ spaced . "q" ]\nz = 1\na = [\n]\nb = ["x",\n "y" # c\n , "z"]\n',
    '',
]


def test_the_committed_manifest_reads_the_same_as_with_tomllib():
    text = mf.DEFAULT_MANIFEST.read_text()
    assert toml_subset.loads(text) == tomllib.loads(text)
    assert toml_subset.loads(text)["profiles"]["cuda11"]["lock_pythons"] == ["3.10"]  # non-vacuous


@pytest.mark.parametrize("text", FABRICATED)
def test_fabricated_documents_read_the_same_as_with_tomllib(text):
    assert toml_subset.loads(text) == tomllib.loads(text)


@pytest.mark.parametrize("text,message", [
    ('a = {x = 1}\n', "inline tables are outside the TOML subset"),
    ('a = """x"""\n', "multi-line strings are outside"),
    ('a = 1979-05-27\n', "dates, inf, nan and 0x/0o/0b integers are outside"),
    ('a = 0x1F\n', "0x/0o/0b integers are outside"),
    ('a = "open\n', "unterminated string"),
    ('a = 1\na = 2\n', "key 'a' is defined twice"),
    ('[t]\n[t]\n', r"\[t\] is defined twice"),
    ('a = [1, 2\nb = 3\n', "expected ',' or ']'"),
    ('a = 1 2\n', "expected the end of the line"),
    ('a = "\\q"\n', r"unknown escape \\q"),
    ('x = [1]\n[[x]]\n', "not an array of tables"),
    ('= 1\n', "expected a key"),
])
def test_what_tomllib_refuses_or_the_subset_lacks_is_refused_with_the_line(text, message):
    with pytest.raises(toml_subset.TomlSubsetError, match=message) as err:
        toml_subset.loads("# first line\n" + text)
    assert err.value.line >= 2
    if "outside" not in message:  # a real TOML error: tomllib refuses it too
        with pytest.raises(tomllib.TOMLDecodeError):
            tomllib.loads(text)


def test_the_manifest_reader_falls_back_to_the_subset_reader():
    text = mf.DEFAULT_MANIFEST.read_text()
    assert mf.loads(text, reader=toml_subset.loads) == mf.loads(text)
    m = mf.parse_manifest(mf.loads(text, reader=toml_subset.loads), mf.DEFAULT_MANIFEST)
    assert m.profile("cuda11").exact_pins()["nvidia-cudnn-cu11"] == "8.6.0.163"


def bare(python: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -S -E``: no site-packages at all, no PYTHONPATH: the standard library and the checkout (cwd)."""
    return subprocess.run([str(python), "-S", "-E", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def host_python(version: str) -> Path:
    python = HOST_PYTHONS[version]
    if not python.exists():
        pytest.skip(f"no real Python {version} at {python}; test_host_side_modules_pass_vermin covers it statically")
    return python


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_image_checks_run_on_a_bare_host_python(version):
    python = host_python(version)
    probe = bare(python, "-c", "import sys; print(sys.version_info[:2]); import tomli")
    assert "ModuleNotFoundError" in probe.stderr, "expected a Python without tomli"  # the login node's situation
    proc = bare(python, "-m", "octo_dist.stack.imagedefs", "check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "agree with env/stack.toml" in proc.stdout


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_the_manifest_reads_the_same_on_a_bare_host_python(version, tmp_path):
    python = host_python(version)
    code = ("import json, sys; from octo_dist.stack import manifest as mf; m = mf.load_manifest();"
            "print(json.dumps({n: [p.python, list(p.lock_pythons), p.gpu, p.exact_pins()] for n, p in m.profiles.items()},"
            " sort_keys=True))")
    proc = bare(python, "-c", code)
    assert proc.returncode == 0, proc.stderr
    m = mf.load_manifest()
    want = {n: [p.python, list(p.lock_pythons), p.gpu, p.exact_pins()] for n, p in m.profiles.items()}
    import json

    assert json.loads(proc.stdout) == want


@pytest.mark.parametrize("version", sorted(HOST_PYTHONS))
def test_a_broken_manifest_is_one_line_on_a_bare_host_python(version, tmp_path):
    python = host_python(version)
    bad = tmp_path / "stack.toml"
    bad.write_text(mf.DEFAULT_MANIFEST.read_text().replace('gpu = true', 'gpu = "true"'))
    code = f"from octo_dist.stack import manifest as mf; mf.load_manifest({str(bad)!r})"
    proc = bare(python, "-c", code)
    assert proc.returncode == 1 and "profiles.cuda11.gpu must be true or false" in proc.stderr


def test_host_side_modules_pass_vermin():
    vermin = Path(sys.executable).parent / "vermin"
    if not vermin.exists():
        pytest.fail(f"vermin not found beside {sys.executable}; expected the dev lock installed: make dev-env")
    proc = subprocess.run([str(vermin), "-t=3.9-", "--no-tips", "--violations", "--eval-annotations", *HOST_SIDE],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_vermin_is_live(tmp_path):
    vermin = Path(sys.executable).parent / "vermin"
    (tmp_path / "new.py").write_text("import tomllib\n")
    proc = subprocess.run([str(vermin), "-t=3.9-", "--no-tips", "--violations", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "tomllib" in proc.stdout


def test_make_images_check_needs_only_the_standard_library():
    python = HOST_PYTHONS["3.9"]
    if not python.exists() or not shutil.which("make"):
        pytest.skip("no real Python 3.9 or no make here")
    proc = subprocess.run(["make", "-s", "images-check", f"PYTHON={python} -S -E"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
