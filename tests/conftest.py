"""Shared fixtures: the venv's real Open MPI 5 ``mpirun``."""

import sys
from pathlib import Path

import pytest

from helpers import MPI_TIMEOUT, run_mpirun


@pytest.fixture
def mpirun(tmp_path_factory):
    """``mpirun(np, *argv, env=..., timeout=...)``: the venv's mpirun over this Python (see helpers.run_mpirun)."""
    exe = Path(sys.executable).parent / "mpirun"
    if not exe.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")

    def run(np: int, *argv: str, env: dict | None = None, timeout: float = MPI_TIMEOUT):
        return run_mpirun(
            exe, np, argv, out_dir=tmp_path_factory.mktemp("ranks"), env=env, timeout=timeout
        )

    return run
