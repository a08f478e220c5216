"""check-env's output where a newcomer meets it: the wrong stack asked for says so in one line; a reader that stops
early (``check-env --json | head``) ends it quietly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import HANG_S, REPO
from octo_dist.envcheck import installed
from octo_dist.stack import builds


def check_env(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", *args],
        cwd=REPO,
        text=True,
        timeout=HANG_S,
        **kwargs,
    )


def installed_profile() -> str:
    build = builds.jax_build(installed.versions(installed.scan()))
    return builds.profile_for(build) if build else ""


def test_a_gpu_profile_asked_of_the_cpu_stack_is_one_line():
    if installed_profile() != "cpu":
        pytest.skip("needs the cpu stack (this environment's JAX is another profile's)")
    proc = check_env("--profile", "cuda12", capture_output=True)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: check-env --profile cuda12: this is the cpu stack (jaxlib ")
    assert line.endswith(
        "expected the cuda12 stack. Fix: use the cuda12 image (octo-dist-cuda12.sif) or `make env PROFILE=cuda12`; "
        "-v lists every check"
    )
    # -v still lists every check, for whoever wants them all.
    verbose = check_env("--profile", "cuda12", "-v", capture_output=True)
    assert verbose.returncode == 1 and "FAIL  pin.jax-cuda12-plugin" in verbose.stdout


def test_a_reader_that_has_gone_ends_check_env_quietly():
    read, write = os.pipe()
    os.close(
        read
    )  # the reader is gone before check-env writes a byte: every write fails with EPIPE
    try:
        proc = check_env("--json", stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode in (0, 1), proc.stderr  # the checks' own verdict, not a crash
