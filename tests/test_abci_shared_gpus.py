"""check-env's advice when ``CUDA_VISIBLE_DEVICES`` hides GPUs that ``nvidia-smi -L`` lists: never "unset
CUDA_VISIBLE_DEVICES" in a job on a shared node, where the hidden GPUs are other jobs'.

ABCI 3.0 user guide (job-execution, "Job Execution Resource"): rt_HG is one H200 (and a share of the CPU cores and
memory) of a node that other jobs use at the same time; a job on it that unset CUDA_VISIBLE_DEVICES would run on
another job's GPU.
"""

import pytest

from octo_dist.envcheck import gpus, rules
from octo_dist.stack import manifest as mf

PROFILE = mf.load_manifest().profile("cuda12")
# nvidia-smi -L on an H node lists all 8 H200 where the job's isolation is CUDA_VISIBLE_DEVICES alone
SMI = "".join(f"GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d}-0000)\n" for i in range(8))


def visible_check(environ):
    (check,) = [
        c for c in rules.check_gpus(environ, SMI, PROFILE) if c.id == "gpu.cuda-visible-devices"
    ]
    return check


@pytest.mark.parametrize(
    "job",
    [
        {"PBS_JOBID": "12345.pbs1", "PBS_QUEUE": "rt_HG"},
        {"PBS_JOBID": "12345.pbs1", "PBS_QUEUE": "R1234567", "RTYPE": "rt_HG"},  # in a reservation
        {"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "3"},
        {
            "PBS_JOBID": "12345.pbs1",
            "PBS_QUEUE": "rt_HF",
        },  # a job, nothing says the node is its own
    ],
)
def test_a_job_with_a_gpu_subset_is_never_told_to_unset_it(job):
    check = visible_check({**job, "CUDA_VISIBLE_DEVICES": "3"})
    assert "unset CUDA_VISIBLE_DEVICES" not in check.remedy, check
    assert (
        check.remedy == "" or "leave CUDA_VISIBLE_DEVICES as the scheduler set it" in check.remedy
    )


def test_an_rt_hg_jobs_one_gpu_is_what_it_asked_for():
    check = visible_check(
        {"PBS_JOBID": "1.pbs1", "PBS_QUEUE": "rt_HG", "CUDA_VISIBLE_DEVICES": "5"}
    )
    assert check.status == "ok" and "PBS job 1.pbs1 on rt_HG, a share of a node" in check.found, (
        check
    )


def test_outside_a_job_hidden_gpus_are_still_a_warning_with_the_unset_advice():
    check = visible_check({"CUDA_VISIBLE_DEVICES": "0"})
    assert (check.status, check.remedy) == ("warn", "unset CUDA_VISIBLE_DEVICES")


def test_shared_node_reads_the_schedulers_variables():
    assert gpus.shared_node({}) is None
    assert "Grid Engine job 9" in gpus.shared_node({"JOB_ID": "9", "NSLOTS": "8"})
    assert "LSF job 4242" in gpus.shared_node({"LSB_JOBID": "4242"})
    # Grid Engine's JOB_ID alone (a build script's) is no job, as everywhere else (savelayout.scheduler_job_var)
    assert gpus.shared_node({"JOB_ID": "build 7"}) is None
