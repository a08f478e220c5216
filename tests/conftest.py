"""Shared fixtures: the venv's real Open MPI 5 ``mpirun``; the opt-in for the long real-scheduler scenarios."""

import os
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


CLUSTER_LONG_ENV = "OCTO_DIST_CLUSTER_LONG"


def pytest_collection_modifyitems(config, items):
    # The image tests wait for the image .ci/run builds in the background: run them last, so the build overlaps
    # the rest of the suite (a stable sort keeps each group's own order).
    items.sort(key=lambda item: "buildah" in item.keywords)
    # The real-scheduler fault and cancel scenarios (scancel, qdel, a lost node two ways) take minutes each, mostly
    # waiting: `make test` as root (CI) runs them in streams of their own, `make cluster-smoke` too; a plain pytest
    # of a real-scheduler file skips them unless asked. The time-limit stops and chains are not marked.
    if os.environ.get(CLUSTER_LONG_ENV, "") not in ("", "0"):
        return
    skip = pytest.mark.skip(
        reason=f"a long real-scheduler scenario: {CLUSTER_LONG_ENV}=1 "
        "(make test as root and make cluster-smoke set it) runs it"
    )
    for item in items:
        if "cluster_long" in item.keywords:
            item.add_marker(skip)
