"""Launcher detection from recorded environments, and from a real `mpirun -np 2` of the venv's Open MPI 5."""

import pytest

from helpers import json_lines

from octo_dist.launchers import LauncherError, detect
from octo_dist.launchers import hostlists

# Recorded (trimmed) from HPC-X 2.12 mpirun on ABCI 2.0, rank 5 of 8 on the second node.
OPENMPI4 = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_MCA_orte_hnp_uri": "2934833152.0;tcp://10.1.0.5:42123"}
OPENMPI5 = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-host-4242@1", "PMIX_RANK": "1"}
MPICH = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
INTEL = {"PMI_RANK": "0", "PMI_SIZE": "2", "PMI_LOCAL_RANK": "0", "PMI_LOCAL_SIZE": "1"}
SRUN = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "node[001-002]"}


@pytest.mark.parametrize("env,launcher,world,rank,local,local_size,job", [
    (OPENMPI4, "openmpi4", 8, 5, 1, 4, "2934833152"),
    (OPENMPI5, "openmpi5", 2, 1, 1, 2, "prterun-host-4242@1"),
    (MPICH, "pmi", 4, 3, 1, 2, None),
    (INTEL, "pmi", 2, 0, 0, 1, None),
    (SRUN, "slurm", 8, 6, 2, 4, "123456"),
    ({}, "single", 1, 0, 0, 1, None),
])
def test_detect(env, launcher, world, rank, local, local_size, job):
    got = detect(env)
    assert (got.launcher, got.world_size, got.rank, got.local_rank, got.local_size, got.job_id) == \
        (launcher, world, rank, local, local_size, job)


def test_mpi_wins_over_the_slurm_allocation_it_runs_in():
    assert detect({**SRUN, **OPENMPI4}).launcher == "openmpi4"


def test_sbatch_without_srun_is_a_single_process():
    assert detect({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "8"}).launcher == "single"


def test_selection_by_name_and_its_errors():
    assert detect({**SRUN, **OPENMPI4}, "slurm").rank == 6
    with pytest.raises(LauncherError, match="--launcher pmi was asked for"):
        detect(SRUN, "pmi")
    with pytest.raises(LauncherError, match="unknown launcher 'lsf'"):
        detect({}, "lsf")


def test_inconsistent_and_malformed_values_are_refused():
    with pytest.raises(LauncherError, match="rank 8/8"):
        detect({**OPENMPI5, "OMPI_COMM_WORLD_RANK": "8", "OMPI_COMM_WORLD_SIZE": "8"})
    with pytest.raises(LauncherError, match="SLURM_PROCID='x' is not an integer"):
        detect({**SRUN, "SLURM_PROCID": "x"})


@pytest.mark.parametrize("spec,hosts", [
    ("node[001-004,007]", ["node001", "node002", "node003", "node004", "node007"]),
    ("a1,b[1-2]x,c[09-11]", ["a1", "b1x", "b2x", "c09", "c10", "c11"]),
    ("g0001", ["g0001"]),
])
def test_expand_slurm_nodelist(spec, hosts):
    assert hostlists.expand_nodelist(spec) == hosts


def test_pbs_and_sge_host_files(tmp_path):
    pbs = tmp_path / "pbs"
    pbs.write_text("hnode001\nhnode001\nhnode002\nhnode002\n")  # PBS: one line per mpiprocs slot
    sge = tmp_path / "sge"
    sge.write_text("g0001\ng0002\n")
    assert hostlists.node_list({"PBS_NODEFILE": str(pbs)}) == ("PBS_NODEFILE", ["hnode001", "hnode002"])
    assert hostlists.node_list({"SGE_JOB_HOSTLIST": str(sge)}) == ("SGE_JOB_HOSTLIST", ["g0001", "g0002"])
    assert hostlists.node_list({"SLURM_JOB_NODELIST": "n[1-2]"}) == ("SLURM_JOB_NODELIST", ["n1", "n2"])
    assert hostlists.node_list({}) is None


def test_explicit_coordinator_always_wins():
    assert hostlists.explicit_coordinator({"COORDINATOR_ADDRESS": "g0001:12345", "JAX_COORDINATOR_ADDRESS": "x:1"}) == "g0001:12345"
    assert hostlists.explicit_coordinator({"JAX_COORDINATOR_ADDRESS": "x:1"}) == "x:1"
    assert hostlists.explicit_coordinator({}) is None


@pytest.mark.mpi
def test_real_open_mpi5_mpirun_is_detected_on_every_rank(mpirun):
    code = "import json, os; from octo_dist.launchers import detect; l = detect(os.environ); print(json.dumps(l.__dict__))"
    proc = mpirun(2, "-c", code)
    assert proc.returncode == 0, proc.stderr
    ranks = sorted(json_lines(proc.stdout), key=lambda d: d["rank"])
    assert [(d["launcher"], d["world_size"], d["rank"], d["local_rank"], d["local_size"]) for d in ranks] == \
        [("openmpi5", 2, 0, 0, 2), ("openmpi5", 2, 1, 1, 2)]
