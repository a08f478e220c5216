"""Which ``mpirun`` a job has, read from where it leads: MPICH's Hydra gets its own launcher line, since it refuses
Open MPI's options ("unrecognized argument x")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from octo_dist.jobs.schedulers import mpirun
from helpers import HANG_S


@pytest.mark.parametrize(
    "path, head, hydra",
    [
        ("/usr/bin/mpiexec.hydra", b"\x7fELF", True),  # Debian's mpirun.mpich links here
        ("/opt/intel/mpi/2021.9/bin/mpirun", b'#!/bin/sh\nexec mpiexec.hydra "$@"\n', True),
        ("/usr/bin/orterun", b"\x7fELF", False),  # Debian's Open MPI 4.1
        ("/venv/bin/prterun", b"\x7fELF", False),  # Open MPI 5
        (
            "/opt/hpcx/ompi/bin/mpirun",
            b"\x7fELF mpiexec.hydra",
            False,
        ),  # a binary naming it is not a script
    ],
)
def test_hydra_is_told_from_where_mpirun_leads(path, head, hydra):
    assert mpirun.is_hydra(path, head) is hydra


def test_the_jobs_mpirun_is_looked_up_on_its_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec.hydra").write_bytes(b"\x7fELF")
    (bin_dir / "mpiexec.hydra").chmod(0o755)
    (bin_dir / "mpirun").symlink_to("mpiexec.hydra")
    assert mpirun.launcher_is_hydra({"PATH": f"{bin_dir}:/usr/bin"})
    os.remove(bin_dir / "mpirun")
    (bin_dir / "mpirun").symlink_to(Path("/nonexistent/prterun"))
    assert not mpirun.launcher_is_hydra({"PATH": str(bin_dir)})
    assert not mpirun.launcher_is_hydra({"PATH": str(tmp_path / "empty")})


def test_hydra_binds_each_rank_to_its_cores_when_the_node_has_them():
    assert mpirun.hydra_binding(8, 12, 96) == (["-bind-to", "core:12"], "")
    assert mpirun.hydra_binding(2, 0, 96) == (["-bind-to", "none"], "")
    bind, note = mpirun.hydra_binding(2, 12, 2)
    assert bind == ["-bind-to", "none"] and "fewer than 2 rank(s) x 12" in note


def test_an_executable_fifo_named_mpirun_is_not_waited_on(tmp_path):
    """Before: the runtime opened the mpirun on PATH to read its first bytes, and an executable FIFO there waited
    for a writer for ever (the job hung until its wall time)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.mkfifo(bin_dir / "mpirun")
    os.chmod(bin_dir / "mpirun", 0o755)
    code = (
        "import sys; from octo_dist.jobs.schedulers import mpirun; "
        f"print(mpirun.launcher_is_hydra({{'PATH': {str(bin_dir)!r}}}))"
    )
    # In a process of its own: a hang fails the test instead of hanging the suite.
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S
    )
    assert proc.returncode == 0 and proc.stdout == "False\n", proc.stderr
