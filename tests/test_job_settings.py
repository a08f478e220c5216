"""The job's settings (``octo_dist/jobs/settings.py``): written by ``launch``, read back by the job runtime.

Every bad settings text a careless edit, a cut-off copy or a hostile hand can put in a job script is given to the
real runtime (the zipapp ``octo-dist job-runtime`` writes, under this Python): one line, exit 2, nothing started
and nothing written.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from octo_dist.jobs import render
from octo_dist.jobs import settingsread
from octo_dist.jobs.cli import parse
from octo_dist.jobs.supervisor import zipapp
from helpers import HANG_S


def rendered() -> dict:
    """The settings ``launch sge`` writes, as parsed JSON: the base every case below spoils one way."""
    spec = parse(["sge", "--nodes", "2", "--gpus-per-node", "2", "--save-dir", "save"])
    return json.loads(render.settings(spec, "job.sh").to_json())


def spoiled(path: str, value) -> str:
    """The rendered settings with ``path`` ("allocation.nodes") set to ``value`` (or removed: ``DELETE``)."""
    values = copy.deepcopy(rendered())
    *parents, last = path.split(".")
    node = values
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return json.dumps(values)


DELETE = object()

# case -> (settings text, what the one line must name)
CASES = {
    "not JSON": ("nodes=2", "not JSON"),
    "a list": ("[]", "a list"),
    "an older script's flat settings": (json.dumps({"scheduler": "sge", "nodes": 2}), "no schema"),
    "a newer schema": (spoiled("schema", 3), "schema 3"),
    "an unknown scheduler": (spoiled("allocation.scheduler", "lsf"), "one of pbs, sge, slurm"),
    "nodes as a word": (spoiled("allocation.nodes", "two"), "allocation.nodes: 'two' (a string)"),
    "nodes null": (spoiled("allocation.nodes", None), "allocation.nodes: null"),
    "nodes true": (spoiled("allocation.nodes", True), "true (true/false)"),
    "nodes past any machine": (
        spoiled("allocation.nodes", 10**20),
        "allocation.nodes: 100000000000000000000",
    ),
    "ranks zero": (spoiled("allocation.ranks_per_node", 0), "a whole number from 1 to 256"),
    "the training command as one string": (
        spoiled("commands.train", "octo-dist smoke"),
        "commands.train: 'octo-dist smoke' (a string); expected a JSON list",
    ),
    "an empty training command": (spoiled("commands.train", []), "an empty command"),
    "a missing key": (spoiled("storage.save_dir", DELETE), "storage.save_dir: missing"),
    "a missing section": (spoiled("timing", DELETE), "job setting timing: missing"),
    "an unknown key": (spoiled("allocation.gpus", 8), "allocation.gpus: a key this octo-dist"),
    "an infinite wall time": (
        spoiled("timing.walltime_s", 1e999).replace("Infinity", "1e999"),
        "an infinite number",
    ),
    "a NaN wall time": (spoiled("timing.walltime_s", float("nan")), "NaN is not a number"),
    "the wall time as text": (spoiled("timing.walltime_s", "1:00:00"), "'1:00:00' (a string)"),
    "a negative wall time": (spoiled("timing.walltime_s", -100), "timing.walltime_s: -100"),
    "a margin as long as the wall time": (
        spoiled("timing.stop_margin_s", 7200),
        "at least 30 s between the start and the stop",
    ),
    "environment as an object": (
        spoiled("forwarding.environment", {"A": "1"}),
        'forwarding.environment: {"A": "1"} (an object); expected a JSON list',
    ),
    "environment pair of three": (
        spoiled("forwarding.environment", [["A", "1", "x"]]),
        "a [NAME, VALUE] pair",
    ),
    "environment name with a space": (
        spoiled("forwarding.environment", [["A B", "1"]]),
        "variable name 'A B'",
    ),
    "a NUL byte in the text": (spoiled("storage.save_dir", "a") + "\0", "a NUL byte"),
    "a NUL escape in a value": (spoiled("storage.save_dir", "sa\u0000ve"), "U+0000"),
    "a lone surrogate": (spoiled("storage.save_dir", "\ud800"), "U+D800"),
    "a save directory like an option": (spoiled("storage.save_dir", "-rf"), "does not start"),
    "a 5000-character path": (spoiled("storage.save_dir", "x" * 5000), "5000 characters"),
    "a wandb mode nobody knows": (spoiled("storage.wandb_mode", "loud"), "one of online"),
    "ten thousand binds": (spoiled("software.binds", ["/b"] * 10_000), "10000 entries"),
    "deeply nested JSON": ("[" * 20_000 + "]" * 20_000, "not JSON"),
}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory) -> Path:
    return Path(zipapp.build(str(tmp_path_factory.mktemp("runtime") / "runtime.pyz")))


def test_the_rendered_settings_read_back_as_they_were_written():
    spec = parse(["pbs", "--nodes", "2", "--group", "g1", "--", "smoke", "--model", "tiny"])
    written = render.settings(spec, "job.sh")
    read = settingsread.from_json(written.to_json())
    assert read == written and read.ranks == 16
    assert read.commands.train[-3:] == ("--model", "tiny", "--resume")


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_settings_are_one_line_exit_2_and_start_nothing(runtime, tmp_path, case):
    text, needle = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    if "\0" in text:
        proc = _with_nul(runtime, work, tmp_path, text)
    else:  # json.dumps escapes NUL and surrogates ("\\ud800"): the text is what a script's argv holds
        proc = subprocess.run(
            [sys.executable, str(runtime), "supervise", text],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("octo-dist job: error: ") and proc.stderr.count("\n") == 1, (
        proc.stderr
    )
    assert "Traceback" not in proc.stderr and needle in proc.stderr, proc.stderr
    assert ". Fix: re-render the job script with octo-dist launch" in proc.stderr
    assert list(work.iterdir()) == []  # no save directory, no exit file, no job directory


def _with_nul(runtime: Path, work: Path, home: Path, text: str) -> subprocess.CompletedProcess:
    """An argv cannot hold a NUL: the text comes through Python, as a script reading the settings from a file
    would pass them (``supervise.main``)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from octo_dist.jobs.supervisor import supervise; "
        "sys.exit(supervise.main(sys.stdin.read()))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(runtime)],
        input=text,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
    )


def test_every_case_fails_for_its_own_reason():
    """Each case spoils the settings one way: the same text twice would hide a case that no longer fails."""
    texts = [text for text, _ in CASES.values()]
    assert len(set(texts)) == len(texts)


def test_an_older_python_gets_one_line_from_the_runtime_not_a_syntax_error(runtime):
    # The zipapp's first lines, run as Python 3.8 would see its version (no 3.8 is installed here).
    code = (
        "import sys, runpy; sys.version_info = (3, 8, 10, 'final', 0); "
        "runpy.run_path(sys.argv[1], run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(runtime), "supervise", "{}"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("octo-dist job runtime: error: Python 3.8 (")
    assert "expected Python 3.9 or newer. Fix: put a newer python3 on PATH" in proc.stderr


@pytest.mark.parametrize("cut", ["empty", "half"])
def test_an_empty_or_cut_short_runtime_fails_the_job_in_one_line(tmp_path, cut):
    """The rendered image job checks the runtime file before it runs it: python3 runs an empty file as nothing."""
    image = tmp_path / "octo.sif"
    image.write_bytes(b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC\0")
    script = tmp_path / "job.sh"
    spec = parse(["pbs", "--nodes", "1", "--group", "g1", "--image", str(image), "--module", ""])
    script.write_text(render.render(spec, "job.sh"))
    # The real zipapp, cut where a full disk or a killed copy would have cut it.
    whole = Path(zipapp.build(str(tmp_path / "whole.pyz"))).read_bytes()
    bad = tmp_path / "runtime.pyz"
    bad.write_bytes(b"" if cut == "empty" else whole[: len(whole) // 2])
    proc = subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OCTO_DIST_RUNTIME": str(bad)},
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        f"octo-dist job: error: the job runtime {bad} is not a complete zipapp (empty, or cut short)"
        in (proc.stderr)
    )
    assert not (tmp_path / "runs").exists()
