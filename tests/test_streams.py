"""tests/streams.py, which `make test` runs as root: every test file in exactly one stream, a new one in the rest."""

import re
import subprocess
import sys

import streams
from helpers import REPO


def selected(stream) -> set:
    """The files a stream's commands run (paths under the checkout), read from its argv as pytest would."""
    files = set()
    for _, argv in streams.commands(stream):
        named = {a for a in argv if a.startswith("tests/")}
        ignored = {a.split("=", 1)[1] for a in argv if a.startswith("--ignore=")}
        args = argv[argv.index("pytest") + 1 :]  # after `python -m pytest`
        marker = args[args.index("-m") + 1]
        every = {str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")}
        files |= {(f, marker) for f in (named or every) - ignored}
    return files


def test_every_test_file_runs_once_per_marker_and_a_new_file_lands_in_the_rest(tmp_path):
    runs = [pair for s in (None, *streams.STREAMS) for pair in selected(s)]
    every = {str(p.relative_to(REPO)) for p in (REPO / "tests").glob("test_*.py")}
    # each file once under -m cluster and once under -m "not cluster": nothing run twice, nothing left out
    assert sorted(runs) == sorted({(f, m) for f in every for m in ("cluster", "not cluster")})
    # the files the streams name exist (a renamed file would otherwise leave its stream silently)
    for s in streams.STREAMS:
        assert all((REPO / "tests" / f).is_file() for f in s.beside), s.beside
        assert all(streams.claimed(g) for g in s.cluster), s.cluster
    # the real schedulers' streams: a cluster of their own each, the long scenarios on
    envs = [env for s in streams.STREAMS for env, argv in streams.commands(s) if "cluster" in argv]
    instances = [e.get("OCTOSIM_INSTANCE") for e in envs]
    assert len(set(instances)) == len(instances)
    assert [e.get("OCTO_DIST_CLUSTER_LONG") for e in envs if e] == ["1"] * 3


def test_a_file_no_stream_names_is_the_rests(monkeypatch, tmp_path):
    (tmp_path / "tests").mkdir()
    for name in ("test_cluster_slurm_new.py", "test_brand_new.py", "test_engine.py"):
        (tmp_path / "tests" / name).write_text("")
    monkeypatch.setattr(streams, "REPO", tmp_path)
    monkeypatch.setattr(streams, "TESTS", tmp_path / "tests")
    (rest,) = streams.commands(None)
    assert "--ignore=tests/test_brand_new.py" not in rest[1]
    assert "--ignore=tests/test_engine.py" in rest[1]  # taken beside the Grid Engine tests
    slurm = next(s for s in streams.STREAMS if s.name == "slurm")
    assert "tests/test_cluster_slurm_new.py" in streams.commands(slurm)[0][1]


def test_each_command_is_noted_with_its_exit_status_wall_and_cpu_seconds(monkeypatch):
    monkeypatch.setattr(streams, "TIMES", [])
    # a child that spends CPU in a grandchild it waits for, then fails: both count, the status is kept
    spin = "import time; t = time.process_time(); exec('while time.process_time() - t < 1.2: pass')"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}]); sys.exit(3)"
    argv = [sys.executable, "-c", code, "-m", "not cluster"]
    proc = subprocess.Popen(argv)
    assert streams.waited(proc, "slurm", argv) == 3 and proc.returncode == 3
    (line,) = streams.TIMES
    name, wall, cpu = re.fullmatch(
        r"(\S+ -m 'not cluster'): (\d+) s wall, (\d+) s cpu", line
    ).groups()
    assert name == "slurm -m 'not cluster'" and int(cpu) >= 1 and int(wall) >= int(cpu) - 1
