"""``octo-dist detect`` and ``check-env --launch`` under Debian's real launchers: MPICH 4.0's Hydra
(``mpiexec.hydra``, package ``mpich``) and Open MPI 4.1.4 (``/usr/bin/mpirun``, package ``openmpi-bin``, the family of
ABCI's hpcx), two plain processes on this machine.

Each rank writes its own file (``detect --output``, Hydra's ``-outfile-pattern``); only rank 0's output is read.
The venv's mpi4py is built for the venv's Open MPI 5, not for these launchers' libraries, so the ranks run with
``OCTO_DIST_NO_MPI4PY=1`` (a site's venv would have an mpi4py built for its MPI): rank, size and local rank come
from the launcher's own variables, and ``check-env --launch`` gets the coordinator address.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, REPO, clean_env

from octo_dist.launchers import coordinator

pytestmark = pytest.mark.mpi

HYDRA = shutil.which("mpiexec.hydra")
OMPI41 = Path("/usr/bin/mpirun")
PYTHON = sys.executable


def ompi41_version() -> str:
    if not OMPI41.exists():
        return ""
    out = subprocess.run([str(OMPI41), "--version"], capture_output=True, text=True).stdout
    return out.split("\n", 1)[0]


needs_hydra = pytest.mark.skipif(HYDRA is None, reason="no mpiexec.hydra (apt-get install mpich)")
needs_ompi41 = pytest.mark.skipif(
    "Open MPI) 4.1" not in ompi41_version(),
    reason="no Open MPI 4.1 at /usr/bin/mpirun (apt-get install openmpi-bin)",
)


def env(**extra: str) -> dict:
    return clean_env(OCTO_DIST_NO_MPI4PY="1", **extra)


def detect_records(launcher: list, tmp_path: Path) -> list:
    out = tmp_path / "detect-{rank}.json"
    proc = subprocess.run(
        [*launcher, PYTHON, "-m", "octo_dist", "detect", "--json", "--output", str(out)],
        capture_output=True,
        text=True,
        env=env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"detect-{r}.json").read_text()) for r in (0, 1)]


@needs_hydra
def test_detect_under_a_real_hydra(tmp_path):
    records = detect_records([HYDRA, "-n", "2"], tmp_path)
    assert [
        (d["launcher"], d["world_size"], d["rank"], d["local_rank"], d["local_size"])
        for d in records
    ] == [("pmi", 2, 0, 0, 2), ("pmi", 2, 1, 1, 2)]


@needs_ompi41
def test_detect_under_open_mpi_4_1(tmp_path):
    records = detect_records([str(OMPI41), "--oversubscribe", "-np", "2"], tmp_path)
    assert [
        (d["launcher"], d["world_size"], d["rank"], d["local_rank"], d["local_size"])
        for d in records
    ] == [("openmpi4", 2, 0, 0, 2), ("openmpi4", 2, 1, 1, 2)]
    # Both ranks agree on the coordinator Open MPI 4's own variables lead to (the job family in orte_hnp_uri).
    assert records[0]["coordinator"] == records[1]["coordinator"] and records[0]["coordinator"]


def check_env_launch(launcher: list, tmp_path: Path, **extra: str) -> dict:
    """``check-env --launch --json`` on 2 ranks; rank 0's stdout alone (its own file) holds every rank's record."""
    port = coordinator.free_port()
    proc = subprocess.run(
        [
            *launcher,
            PYTHON,
            "-m",
            "octo_dist",
            "check-env",
            "--launch",
            "--json",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--init-timeout",
            "240",
        ],
        capture_output=True,
        text=True,
        env=env(
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            **extra,
        ),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        timeout=HANG_S,
    )
    rank0 = tmp_path / "out.0"
    text = rank0.read_text() if rank0.exists() else proc.stdout
    return {"rc": proc.returncode, "stdout": text, "stderr": proc.stderr}


def launch_records(result: dict) -> list:
    """Rank 0's report: every rank started JAX's distributed runtime (2 devices, one per process) and nothing failed."""
    assert result["rc"] == 0, result
    data = json.loads(result["stdout"])
    assert data["ok"] is True and data["problems"] == [], data
    records = data["ranks"]
    assert sorted(r["jax"]["process_index"] for r in records) == [0, 1], records
    assert {r["jax"]["devices"] for r in records} == {2}, records
    return records


@needs_hydra
def test_check_env_launch_under_a_real_hydra(tmp_path):
    result = check_env_launch(
        [HYDRA, "-n", "2", "-outfile-pattern", str(tmp_path / "out.%r")], tmp_path
    )
    assert result["stdout"].strip(), result
    records = launch_records(result)
    assert len(records) == 2, records
    assert sorted(r["rank"] for r in records) == [0, 1], records
    assert {r["launcher"] for r in records} == {"pmi"}, records


@needs_ompi41
def test_check_env_launch_under_open_mpi_4_1(tmp_path):
    # Open MPI 4.1 has no output pattern: --output-filename DIR gives one file per rank under DIR/1/rank.N/stdout.
    result = check_env_launch(
        [str(OMPI41), "--oversubscribe", "-np", "2", "--output-filename", str(tmp_path / "o")],
        tmp_path,
    )
    rank0 = tmp_path / "o" / "1" / "rank.0" / "stdout"
    result["stdout"] = rank0.read_text() if rank0.exists() else result["stdout"]
    assert result["stdout"].strip(), result
    records = launch_records(result)
    assert len(records) == 2 and sorted(r["rank"] for r in records) == [0, 1], records
    assert {r["launcher"] for r in records} == {"openmpi4"}, records
