"""The ABCI 3.0 (PBS) job script with Open MPI 4.1 as the nodes' launcher: Debian's ``/usr/bin/mpirun`` 4.1.4, the
family of ABCI's hpcx 2.20 (Open MPI 4.1.7), instead of the venv's Open MPI 5 that ``tests/test_cluster.py`` uses.

The same PBS imitation (``sim.pbs_env``: a node file in a spool outside the job's directory), the same image
stand-in, and the script exactly as ``octo-dist launch pbs`` renders it, with cores bound (``--cpus-per-rank 1``:
``--map-by ppr:2:node:PE=1 --bind-to core``) and variables forwarded with ``-x``. Only ``module load hpcx/...`` differs:
here it puts Open MPI 4.1's ``mpirun`` on PATH and names the namespace-entering ssh agent the way Open MPI 4 reads it
(``OMPI_MCA_plm_rsh_agent``; Open MPI 5 reads ``PRTE_MCA_plm_ssh_agent``), as an hpcx module sets its own
variables. Results come from rank 0's record and the per-rank environments the image stand-in writes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cluster import image as sim_image
from cluster import sim
from helpers import COMPILE_FAST, PBS_JOB, launch_job, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

OMPI41 = Path("/usr/bin/mpirun")
STEPS = 6
GLOBAL_BATCH = 16
# Forwarded by prefix to node002's ranks; XLA_FLAGS also compiles every rank fast (helpers.COMPILE_FAST): this job
# tests Open MPI 4.1's launch, binding and forwarding, not what XLA makes of the model.
SUBMIT_VARS = {
    "NCCL_DEBUG": "WARN",
    "OCTO_DIST_CLUSTER_MARK": "from-the-submit-shell",
    "XLA_FLAGS": COMPILE_FAST,
}
LOCAL_ONLY = {
    "SUBMIT_SHELL_ONLY": "1"
}  # under no forwarded prefix: node002's ranks must not see it


def ompi41() -> bool:
    if not OMPI41.exists():
        return False
    out = subprocess.run([str(OMPI41), "--version"], capture_output=True, text=True).stdout
    return "Open MPI) 4.1" in out


@pytest.fixture
def cluster(tmp_path):
    reason = sim.unavailable()
    if reason:
        pytest.skip(reason)
    if not ompi41():
        pytest.skip("no Open MPI 4.1 at /usr/bin/mpirun (apt-get install openmpi-bin)")
    c = sim.Cluster(tmp_path / "cluster").up()
    try:
        yield c
    finally:
        c.down()


SPOOL_PREFIX = "octosim-ompi41-"


def spool_dir() -> Path:
    """PBS's spool for this run, outside the job's directories; one a crashed earlier run left (its pid gone) goes."""
    for old in Path("/var/spool").glob(SPOOL_PREFIX + "*"):
        pid = old.name[len(SPOOL_PREFIX) :]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["rm", "-rf", str(old)])
    path = Path("/var/spool") / f"{SPOOL_PREFIX}{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def hpcx41(cluster: sim.Cluster) -> Path:
    """What this ``module load hpcx/...`` puts on PATH: Open MPI 4.1's mpirun (its orted is on the nodes' PATH)."""
    d = cluster.state / "hpcx41" / "bin"
    d.mkdir(parents=True, exist_ok=True)
    link = d / "mpirun"
    if not link.exists():
        link.symlink_to(OMPI41)
    return d


def module_function(bin_dir: Path) -> str:
    """sim.module_function's Lmod stand-in, with Open MPI 4.1 behind hpcx/*."""
    return (
        '() { if [ "$1" != load ]; then echo "module: only \'module load\' is simulated" >&2; return 1; fi; '
        'shift; local m; for m in "$@"; do case $m in '
        f"hpcx/*) PATH={bin_dir}:$PATH ;; singularity*) ;; "
        '*) echo "Lmod has detected the following error: unknown module $m" >&2; return 1 ;; esac; done; '
        "export PATH; }"
    )


def test_pbs_job_in_the_image_under_open_mpi_4_1_binds_forwards_and_trains(cluster, tmp_path):
    work, home = tmp_path / "submit", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    groups = tmp_path / "groups"
    groups.mkdir()
    sif = sim_image.write_sif(groups / "octo-dist.sif", sim_image.build())
    script = launch_job(
        work,
        "pbs",
        "--nodes",
        "2",
        *PBS_JOB,
        "--cpus-per-rank",
        "1",
        "--walltime",
        "0:30:00",
        "--image",
        str(sif),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--steps",
        str(STEPS),
        "--save-dir",
        "runs/smoke",
        "--wandb-mode",
        "disabled",
        smoke=(f"--record={work / 'record.json'}",),
    )
    text = script.read_text()
    assert (
        '"cpus_per_rank": 1' in text
    )  # the job runtime binds: --map-by ppr:2:node:PE=1 --bind-to core

    spool = spool_dir()
    try:
        env = sim.base_env(cluster, home, {**SUBMIT_VARS, **LOCAL_ONLY})
        env["BASH_FUNC_module%%"] = module_function(hpcx41(cluster))
        env["OMPI_MCA_plm_rsh_agent"] = str(cluster.bin / "rsh-agent")
        env.update(sim.pbs_env(cluster, spool, "201.pbs1", work, ranks_per_node=2))
        job = sim.Job(cluster, script, env, work, "pbs-ompi41").start()

        def out() -> str:
            return f"--- stdout ---\n{job.output()[-4000:]}\n--- stderr ---\n{job.errors()[-4000:]}"

        # However long a loaded machine makes it take: only a job that changes nothing in work for HANG_S is hung.
        wait_until(
            lambda: job.proc.poll() is not None,
            watch=[work],
            what="the job",
            tail=out,
            on_hang=job.kill,
        )
        assert job.proc.returncode == 0, out()
    finally:
        subprocess.run(["rm", "-rf", str(spool)])

    record = json.loads((work / "record.json").read_text())
    assert sorted(record["hosts"]) == ["node001", "node001", "node002", "node002"], record
    assert len(set(record["digests"])) == 1 and record["end_step"] == STEPS, record
    assert "not binding ranks to cores" not in job.errors(), out()

    ranks = sim.rank_envs(cluster)  # the preflight's 4 and the training's 4
    # Open MPI 4 (ORTE) started every rank, node002's through orted over the agent.
    assert all(e.get("OMPI_COMM_WORLD_SIZE") == "4" for e in ranks), [e.get("_host") for e in ranks]
    assert all("OMPI_MCA_orte_hnp_uri" in e for e in ranks)
    remote = [e for e in ranks if e["_host"] == "node002"]
    assert len(remote) >= 2, [e["_host"] for e in ranks]
    for e in remote:
        assert {k: e.get(k) for k in SUBMIT_VARS} == SUBMIT_VARS  # -x by prefix
        assert "SUBMIT_SHELL_ONLY" not in e
        assert e.get("OMPI_MCA_orte_bound_at_launch") == "1"  # mpirun bound them (--bind-to core)
