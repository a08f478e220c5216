"""Launcher detection and the coordinator it leads to, over recorded and source-derived environments.

Each environment lives in ``tests/launch_envs/<name>.env`` with its shape and its source written at the top:
RECORDED ones were captured here from a real launcher (the venv's Open MPI 5; Debian's Open MPI 4.1.4, plain and
under a real Grid Engine 8.1.9; Debian's MPICH 4.0 Hydra), DERIVED ones were written from the
launcher's source or documentation (named in the file) where no such launcher can run here.
"""

from pathlib import Path

import pytest

from octo_dist.launchers import LauncherError, detect
from octo_dist.launchers import coordinator as coord
from octo_dist.launchers import hostlists, openmpi, slurm
from octo_dist.launchers.cli import read_env_file

ENVS = Path(__file__).parent / "launch_envs"


def env(name: str) -> dict:
    return read_env_file((ENVS / f"{name}.env").read_text())


def no_file(path):
    raise FileNotFoundError(2, "No such file or directory", path)


# name -> (launcher, world, rank, local rank, local size)
DETECTED = {
    "openmpi5-np2-rank0": ("openmpi5", 2, 0, 0, 2),
    "openmpi5-np2-rank1": ("openmpi5", 2, 1, 1, 2),
    "openmpi4-hpcx-rank5of8": ("openmpi4", 8, 5, 1, 4),
    "openmpi4-under-slurm": ("openmpi4", 8, 5, 1, 4),
    "openmpi4-gridengine-rank3of4": ("openmpi4", 4, 3, 1, 2),
    "openmpi4-np2-rank1": ("openmpi4", 2, 1, 1, 2),
    "wrapper-exports-agree": ("openmpi5", 2, 1, 1, 2),
    "mpich-hydra-rank3of4": ("pmi", 4, 3, 1, 2),
    "intelmpi-hydra-rank0of2": ("pmi", 2, 0, 0, 2),
    "hydra-under-slurm": ("pmi", 8, 6, 2, 4),
    "pals-rank5of8": ("pals", 8, 5, 1, 4),
    "slurm-srun-ntasks-per-node": ("slurm", 4, 3, 1, 2),
    "slurm-srun-uneven-n3": ("slurm", 3, 2, 0, 1),
    "slurm-srun-no-ntasks-per-node": ("slurm", 8, 5, 1, 4),
    "slurm-srun-heterogeneous": ("slurm", 8, 5, 2, 5),
    "slurm-srun-gpus-per-task": ("slurm", 7, 6, 2, 3),
    "slurm-step-on-subset": ("slurm", 4, 0, 0, 2),
    "slurm-concurrent-step0": ("slurm", 4, 1, 1, 2),
    "slurm-concurrent-step1": ("slurm", 4, 1, 1, 2),
    "slurm-srun-mpi-pmi2": ("slurm", 4, 3, 1, 2),
    "slurm-salloc-interactive-step": ("slurm", 1, 0, 0, 1),
    "slurm-sbatch-script": ("single", 1, 0, 0, 1),
    "slurm-salloc-shell": ("single", 1, 0, 0, 1),
    "pbs-job-script": ("single", 1, 0, 0, 1),
}

# name -> a piece of the one-line refusal
REFUSED = {
    "torchrun-rank3of8": "torchrun or DeepSpeed launcher variables found (RANK=3, WORLD_SIZE=8",
    "torchrun-under-srun": "slurm says rank 1 of 2 (local 0) but RANK=5, WORLD_SIZE=8",
    "lsf-jsrun": "IBM LSF jsrun variables found (JSM_NAMESPACE_RANK=5, JSM_NAMESPACE_SIZE=8",
    "horovodrun-gloo": "horovodrun variables found (HOROVOD_RANK=5, HOROVOD_SIZE=8",
    "mpich-pmix-only": "a PMIx launcher's variables found (PMIX_RANK=3",
    "pmi-half-pair": "pmi: PMI_RANK='3' is set but PMI_SIZE is not",
    "pals-no-local-rank": "but not a local rank (PALS_LOCAL_RANKID), a local size",
}


def test_every_recorded_environment_is_in_a_table():
    names = {p.stem for p in ENVS.glob("*.env")}
    assert names == set(DETECTED) | set(REFUSED)
    for p in ENVS.glob("*.env"):
        lines = p.read_text().splitlines()
        head = [
            line for line in lines[: lines.index(next(x for x in lines if not x.startswith("#")))]
        ]
        source = next(line for line in head if line.startswith("# source: "))
        assert head[0].startswith("# shape: "), p.name
        assert ("RECORDED" in source) != ("DERIVED" in source), p.name


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_and_broken_launches_are_refused_in_one_line(name):
    with pytest.raises(LauncherError) as e:
        detect(env(name))
    message = str(e.value)
    assert REFUSED[name] in message
    assert "\n" not in message and "; expected " in message and ". Fix: " in message


def test_batch_scripts_are_one_process_and_say_how_to_get_more():
    batch = detect(env("slurm-sbatch-script"))
    assert batch.job_id == "123456" and "srun" in batch.note and "8 tasks" in batch.note
    assert "8 tasks" in detect(env("slurm-salloc-shell")).note
    assert detect(env("pbs-job-script")).detail.startswith("PBS job 12345.pbs1 without a launcher")
    assert (
        detect({"JOB_ID": "42"}).detail == ""
        and detect({"JOB_ID": "42", "SGE_ROOT": "/sge"}).job_id == "42"
    )


def test_step_variables_win_over_the_allocation():
    step = detect(env("slurm-step-on-subset"))
    assert step.nodes == ("node003", "node004") and step.nodes_source == "SLURM_STEP_NODELIST"
    # SLURM_NTASKS / SLURM_NTASKS_PER_NODE of the allocation never override the step's own counts
    stale = {
        **env("slurm-srun-no-ntasks-per-node"),
        "SLURM_NTASKS": "16",
        "SLURM_NTASKS_PER_NODE": "8",
    }
    assert (detect(stale).world_size, detect(stale).local_size) == (8, 4)


def test_coordinator_is_the_steps_first_node_and_concurrent_steps_differ():
    a, b = (
        coord.resolve(env(f"slurm-concurrent-step{s}"), detect(env(f"slurm-concurrent-step{s}")))
        for s in (0, 1)
    )
    assert (a.host, b.host) == ("node001", "node003") and a.port != b.port
    assert a.port == coord.port_for_job("123462", "0") and b.port == coord.port_for_job(
        "123462", "1"
    )
    subset = coord.resolve(env("slurm-step-on-subset"), detect(env("slurm-step-on-subset")))
    assert (
        subset.host == "node003"
        and subset.source == "first host of SLURM_STEP_NODELIST, port from the job id"
    )
    assert (
        coord.resolve(
            env("slurm-salloc-interactive-step"), detect(env("slurm-salloc-interactive-step"))
        )
        is None
    )


def test_open_mpi_4_publishes_mpiruns_host_and_open_mpi_5_does_not():
    assert openmpi.hnp_host("2934833152.0;tcp://10.1.0.5,192.168.0.5:42123") == "10.1.0.5"
    assert (
        openmpi.hnp_host(
            "1314521088.0;tcp6://[fe80::b9b:ac5d:9cf0:b858,2620:10d:c083:150e::3000:2]:43370"
        )
        == "fe80::b9b:ac5d:9cf0:b858"
    )
    assert openmpi.hnp_host("1.0;usock") is None
    four = env("openmpi4-hpcx-rank5of8")  # its PBS_NODEFILE is on the host, not here
    c = coord.resolve(four, detect(four), read=no_file)
    assert (
        c.address == f"10.1.0.5:{coord.port_for_job('12345.pbs1')}"
        and "OMPI_MCA_orte_hnp_uri" in c.source
    )
    v6 = {**four, "OMPI_MCA_orte_hnp_uri": "1.0;tcp6://[fd00::5]:43370"}
    assert coord.resolve(v6, detect(v6), read=no_file).address.startswith("[fd00::5]:")
    # where the node file is readable it wins: it names hosts, mpirun's URI only an address
    assert coord.resolve(four, detect(four), read=lambda p: "g0003\ng0003\ng0004\n").host == "g0003"
    five = {
        **env("openmpi5-np2-rank1"),
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_UNIVERSE_SIZE": "4",
    }  # 2 of 4 ranks here
    with pytest.raises(
        coord.CoordinatorError, match="Open MPI 5 and MPICH do not.*Fix: export COORDINATOR_ADDRESS"
    ):
        coord.resolve(five, detect(five))


def test_one_node_needs_no_node_file_and_an_unreadable_one_is_one_line():
    one_node = {
        **env("openmpi5-np2-rank0"),
        "PBS_NODEFILE": "/var/spool/pbs/aux/1.pbs1",
        "PBS_JOBID": "1.pbs1",
    }
    assert coord.resolve(one_node, detect(one_node), read=no_file).host == "127.0.0.1"
    pals = env("pals-rank5of8")
    with pytest.raises(coord.CoordinatorError) as e:
        coord.resolve(pals, detect(pals), read=no_file)
    message = str(e.value)
    assert (
        "PBS_NODEFILE=/var/spool/pbs/aux/4242.polaris-pbs-01 cannot be read in this process"
        in message
    )
    assert "singularity exec --bind" in message and "\n" not in message
    assert coord.resolve(pals, detect(pals), read=lambda p: "x3001\nx3002\n").host == "x3001"


def test_grid_engine_pe_hostfile_and_open_mpi_4s_address():
    """Recorded under a real Grid Engine: rank 3 on node002 reads the PE_HOSTFILE for the node list; its coordinator
    is node001 from that list, or from mpirun's address (OMPI_MCA_orte_hnp_uri) when the spool file is not readable."""
    sge = env("openmpi4-gridengine-rank3of4")
    files = {
        sge["PE_HOSTFILE"]: "node001 2 all.q@node001 UNDEFINED\nnode002 2 all.q@node002 UNDEFINED\n"
    }
    assert hostlists.node_list(sge, files.__getitem__) == ("PE_HOSTFILE", ["node001", "node002"])
    from_file = coord.resolve(sge, detect(sge), read=files.__getitem__).address
    from_mpirun = coord.resolve(sge, detect(sge), read=no_file).address
    port = from_file.rsplit(":", 1)[1]
    assert (from_file, from_mpirun) == (f"node001:{port}", f"10.231.0.1:{port}")  # both node001


def test_selection_by_name_and_its_errors():
    both = {**env("slurm-srun-ntasks-per-node"), **env("openmpi4-hpcx-rank5of8")}
    assert detect(both).launcher == "openmpi4" and detect(both, "slurm").rank == 3
    with pytest.raises(LauncherError, match="--launcher pmi was asked for"):
        detect(env("slurm-srun-ntasks-per-node"), "pmi")
    with pytest.raises(LauncherError, match="unknown launcher 'lsf'"):
        detect({}, "lsf")
    assert detect({}, "single").launcher == "single"
    assert detect(env("slurm-sbatch-script"), "single").job_id == "123456"


def test_forcing_a_single_process_under_a_launcher_of_several_is_refused():
    with pytest.raises(
        LauncherError,
        match=r"--launcher single, but Open MPI 5.0.8 \(PRRTE\) mpirun started 2 processes",
    ):
        detect(env("openmpi5-np2-rank1"), "single")
    with pytest.raises(LauncherError, match="Slurm srun step 2 of job 123456 started 8 processes"):
        detect(env("slurm-srun-heterogeneous"), "single")
    assert detect(env("slurm-salloc-interactive-step"), "single").world_size == 1


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"OMPI_COMM_WORLD_RANK": "8", "OMPI_COMM_WORLD_SIZE": "8"},
            "rank 8/8, local rank 1/2 are inconsistent",
        ),
        ({"OMPI_COMM_WORLD_RANK": "x"}, "OMPI_COMM_WORLD_RANK='x' is not an integer"),
    ],
)
def test_inconsistent_and_malformed_open_mpi_values(change, message):
    with pytest.raises(LauncherError, match=message):
        detect({**env("openmpi5-np2-rank1"), **change})


@pytest.mark.parametrize(
    "change,message",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x3)"}, "adds up to 12 tasks but SLURM_STEP_NUM_TASKS=8"),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x)"}, "is not a per-node task count"),
        ({"SLURM_STEP_NODELIST": "node[001-003]", "SLURM_STEP_TASKS_PER_NODE": "4,2,2"}, None),
        ({"SLURM_STEP_NODELIST": "node[001-003]"}, "names 3 node(s) but SLURM_STEP_TASKS_PER_NODE"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 but the step has 2 node(s)"),
        ({"SLURM_STEP_NODELIST": "node[002-001]"}, "runs backwards"),
    ],
    ids=["sum", "form", "three-nodes-ok", "nodes-vs-counts", "nodeid", "bad-nodelist"],
)
def test_slurm_step_cross_checks(change, message):
    e = {**env("slurm-srun-no-ntasks-per-node"), **change}
    if message is None:
        assert detect(e).local_size == 2
        return
    with pytest.raises(LauncherError) as err:
        detect(e)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "environ",
    [
        {"SLURM_PROCID": "3"},
        {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "123456"},
        {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_JOB_ID": "123456"},
    ],
    ids=["alone", "with-job-ntasks", "task-ids-no-step"],
)
def test_a_slurm_rank_without_the_steps_size_is_refused_not_read_as_one_process(environ):
    with pytest.raises(LauncherError) as err:
        detect(environ)
    msg = str(err.value)
    assert "\n" not in msg and "SLURM_PROCID=3 but no SLURM_STEP_NUM_TASKS" in msg, msg
    assert "srun" in msg, msg
    # The batch step itself (SLURM_PROCID=0) stays one process; a real step with the same rank is read as one.
    assert detect({**environ, "SLURM_PROCID": "0"}).world_size == 1
    step = {**env("slurm-srun-no-ntasks-per-node"), "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    assert detect(step).rank == 3


def test_older_slurm_without_step_tasks_per_node():
    e = {k: v for k, v in env("slurm-srun-no-ntasks-per-node").items() if "TASKS_PER_NODE" not in k}
    assert detect({**e, "SLURM_GTIDS": "4,5,6,7"}).local_size == 4
    with pytest.raises(
        LauncherError,
        match="without SLURM_STEP_TASKS_PER_NODE, SLURM_GTIDS or SLURM_NTASKS_PER_NODE",
    ):
        detect(e)


@pytest.mark.parametrize(
    "value,counts",
    [
        ("4", [4]),
        ("4(x2)", [4, 4]),
        ("3,5", [3, 5]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1,2,1(x3),3,2", [1, 2, 1, 1, 1, 3, 2]),
    ],
)
def test_tasks_per_node_forms(value, counts):
    assert slurm.parse_tasks_per_node(value) == counts


def test_explicit_coordinator_always_wins_and_ipv6_is_accepted():
    e = env("slurm-step-on-subset")
    assert (
        coord.resolve({**e, "COORDINATOR_ADDRESS": "g0001:12345"}, detect(e)).address
        == "g0001:12345"
    )
    c = coord.resolve({**e, "JAX_COORDINATOR_ADDRESS": "[::1]:23456"}, detect(e))
    assert (c.address, c.host, c.port, c.explicit) == ("[::1]:23456", "::1", 23456, True)
    assert (
        hostlists.explicit_coordinator(
            {"COORDINATOR_ADDRESS": "a:1", "JAX_COORDINATOR_ADDRESS": "b:2"}
        )
        == "a:1"
    )


@pytest.mark.parametrize(
    "bad,why",
    [
        ("host:99999", "port '99999' is not a number from 1 to 65535"),
        ("host:0", "port '0'"),
        ("::1:23456", "an IPv6 address needs brackets"),
        ("[::1]", "no ':PORT' after the bracketed address"),
        ("[nonsense]:1", "is not a bracketed IPv6 address"),
        ("http://g0001:1", "is not a host name or address"),
        ("g0001", "no ':PORT'"),
    ],
)
def test_malformed_coordinator_addresses_are_refused(bad, why):
    with pytest.raises(coord.CoordinatorError) as e:
        coord.parse_address(bad, "COORDINATOR_ADDRESS")
    assert why in str(e.value) and "is not HOST:PORT" in str(e.value) and "Fix: " in str(e.value)
