"""A job's identity is read once: the scheduler's module reads its own variable and checks it, the job runtime
exports it to the ranks as ``OCTO_DIST_JOB_ID``, and every other module reads that one (the schedulers' own
variables only outside the job runtime, where no one exported it)."""

from __future__ import annotations

import pytest

from octo_dist import savelayout
from octo_dist.engine import savedir
from octo_dist.jobs import schedulers
from octo_dist.launchers import scheduler as launch_scheduler

READERS = {"engine/savedir.py": savedir.job_id, "launchers/scheduler.py": launch_scheduler.job_id}


@pytest.mark.parametrize("where", list(READERS))
def test_the_job_runtimes_id_wins_over_the_schedulers_variables(where):
    read = READERS[where]
    assert (
        read({"OCTO_DIST_JOB_ID": "12345.pbs1", "JOB_ID": "7", "SLURM_JOB_ID": "8"}) == "12345.pbs1"
    )


@pytest.mark.parametrize("where", list(READERS))
def test_lsfs_job_id_is_honoured_outside_the_job_runtime(where):
    assert READERS[where]({"LSB_JOBID": "4242"}) == "4242"


@pytest.mark.parametrize("where", list(READERS))
@pytest.mark.parametrize("var", ["OCTO_DIST_JOB_ID", "LSB_JOBID", "PBS_JOBID"])
def test_a_job_id_that_names_a_path_is_refused_naming_its_variable(where, var):
    with pytest.raises(savelayout.JobIdError) as e:
        READERS[where]({var: "1/../.."})
    assert str(e.value).startswith(f"{var}='1/../..'") and e.value.exit_status == 2


def test_outside_a_job_there_is_no_id():
    assert savelayout.job_id({}) is None and savedir.job_id({"JOB_ID": ""}) is None


def test_every_scheduler_shipped_names_its_variable_for_the_layers_that_cannot_ask_it():
    # The launchers and the engine may not import jobs/ (tests/test_layers.py): outside the job runtime they read
    # savelayout's list of the schedulers' variables, which must name every scheduler shipped.
    assert {s.job_id_var for s in schedulers.SCHEDULERS.values()} <= set(
        savelayout.SCHEDULER_JOB_ID_VARS
    )


@pytest.mark.parametrize("where", list(READERS))
def test_an_unrelated_job_id_variable_is_no_grid_engine_job(where):
    """Before: ``JOB_ID='build 7'`` left by a build script refused every bare ``smoke`` (its run lock reads the
    job id). Grid Engine's JOB_ID names a job only beside Grid Engine's own variables; there, it is checked."""
    read = READERS[where]
    assert read({"JOB_ID": "build 7"}) is None
    assert (
        read({"JOB_ID": "77", "PE_HOSTFILE": "/var/spool/sge/g0001/active_jobs/77.1/pe_hostfile"})
        == "77"
    )
    with pytest.raises(savelayout.JobIdError):
        read({"JOB_ID": "build 7", "SGE_ROOT": "/opt/sge", "NSLOTS": "2"})


def test_a_job_script_without_a_launcher_is_one_process_of_the_same_job_everywhere():
    """The launchers' view of a job script (``detect``) reads the same one list as the job id (savelayout's): a
    Grid Engine job only beside Grid Engine's own variables, Slurm's allocation left to the slurm launcher."""
    assert launch_scheduler.allocation({"JOB_ID": "build 7"}) is None
    assert launch_scheduler.allocation({"SLURM_JOB_ID": "123456"}) is None
    grid = launch_scheduler.allocation({"JOB_ID": "77", "NSLOTS": "2"})
    assert grid.job_id == "77" and grid.detail.startswith("Grid Engine job 77 without a launcher")
    lsf = launch_scheduler.allocation({"LSB_JOBID": "4242"})
    assert lsf.job_id == "4242" and lsf.detail.startswith("LSF job 4242")
