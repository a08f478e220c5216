"""Shared fixtures: the venv's real Open MPI 5 ``mpirun``."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, clean_env


@pytest.fixture
def mpirun():
    """``mpirun(np, *argv, env=..., timeout=...)``: the venv's mpirun over this Python; a CompletedProcess."""
    exe = Path(sys.executable).parent / "mpirun"
    if not exe.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")

    def run(np: int, *argv: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
        cmd = [str(exe), "--oversubscribe", "-np", str(np), sys.executable, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or clean_env(), cwd=REPO)

    return run
