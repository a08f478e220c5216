"""The batch and the ranks are counted in GPUs: ranks per node x devices per rank = GPUs per node, or the render is
refused; the preflight checks the same product against the GPUs each host shows. Pure functions, no processes."""

from __future__ import annotations

import pytest

from octo_dist.envcheck import launch as preflight
from octo_dist.jobs import options as options_mod
from octo_dist.jobs import spec as spec_mod
from octo_dist.jobs.cli import parse


def build(*argv):
    return parse(
        list(argv)
    )  # no checkers: the training command's own parser is not what is tested here


def test_four_ranks_on_an_8_gpu_node_use_every_gpu_and_count_the_batch_over_gpus():
    # Before: select=2:mpiprocs=4 and a batch of 32 x 8 ranks = 256, one GPU per rank, 4 of 8 GPUs idle.
    job = build(
        "pbs", "--nodes", "2", "--group", "g1", "--ranks-per-node", "4", "--per-gpu-batch", "32",
        "--", "finetune",
    )  # fmt: skip
    allocation, job_args = job.settings.allocation, job.header.training.job_args
    assert "--config.batch_size=512" in job_args  # 32 x 16 GPUs
    assert (allocation.ranks_per_node, job.header.devices_per_rank, job.gpus) == (4, 2, 16)
    assert "--devices-per-process=2" in job_args
    assert job.preflight_args == ("--devices-per-process=2",)  # check-env --launch checks the same
    assert (
        allocation.cpus_per_rank == 24
    )  # rt_HF's 96 cores over 4 ranks, not 12 each with half of them unbound


def test_one_gpu_per_rank_passes_no_devices_flag():
    job = build("pbs", "--nodes", "2", "--group", "g1", "--per-gpu-batch", "4")
    training = job.header.training
    assert (job.settings.allocation.ranks_per_node, job.header.devices_per_rank) == (8, 1)
    assert training.global_batch == 64
    assert not any(a.startswith("--devices-per-process") for a in training.job_args)


def test_devices_per_rank_alone_sets_the_ranks():
    job = build("slurm", "--nodes", "1", "--gpus-per-node", "8", "--devices-per-process", "8")
    assert (job.settings.allocation.ranks_per_node, job.header.devices_per_rank) == (1, 8)
    assert "--devices-per-process=8" in job.header.training.job_args


@pytest.mark.parametrize(
    "argv, fix",
    [
        (["--ranks-per-node", "3"], "--ranks-per-node 2 --devices-per-process 4"),
        (
            ["--ranks-per-node", "4", "--devices-per-process", "1"],
            "--ranks-per-node 4 --devices-per-process 2",
        ),
        (["--devices-per-process", "3"], "--ranks-per-node 2 --devices-per-process 4"),
        (["--devices-per-process", "16"], "--ranks-per-node 8 --devices-per-process 1"),
    ],
)
def test_gpus_left_idle_or_over_asked_are_refused_in_one_line_with_the_fix(argv, fix):
    with pytest.raises(spec_mod.JobSpecError) as e:
        build("pbs", "--nodes", "1", "--group", "g1", *argv)
    assert "\n" not in str(e.value)
    assert "ranks per node x devices per rank = 8" in e.value.expected
    assert fix in e.value.fix


def test_the_devices_flag_after_the_command_is_refused():
    with pytest.raises(spec_mod.JobSpecError, match="--devices-per-process"):
        build("pbs", "--nodes", "1", "--group", "g1", "--", "smoke", "--devices-per-process=all")


def test_a_global_batch_must_divide_over_gpus_not_ranks():
    with pytest.raises(spec_mod.JobSpecError, match="multiple of 16"):
        build(
            "pbs", "--nodes", "2", "--group", "g1", "--ranks-per-node", "4", "--global-batch", "40"
        )


def test_show_defaults_derives_the_devices_per_rank():
    options = options_mod.LaunchOptions(scheduler="pbs", group="g1", ranks_per_node=2)
    derived = spec_mod.derived_defaults(options)
    assert derived["devices_per_rank"][0] == 4 and derived["cpus_per_rank"][0] == 48


def records(n, gpus):
    return [
        {
            "host": "g0001",
            "gpus_on_host": gpus,
            "rank": r,
            "world_size": n,
            "coordinator": "g0001:1",
            "env_failures": [],
        }
        for r in range(n)
    ]


def test_preflight_checks_ranks_times_devices_against_the_hosts_gpus():
    assert preflight.problems(records(4, 8), True, devices=2) == []
    (problem,) = preflight.problems(records(4, 8), True, devices=4)
    assert "4 ranks but 8 GPU(s) for 4 GPU(s) each" in problem
    assert "--ranks-per-node 2 --devices-per-process 4" in problem
    assert preflight.problems(records(1, 8), True, devices=None) == []
    assert preflight.problems(records(2, 8), True, devices=None)  # "all" on two ranks of one host
    assert [preflight.devices_per_rank(m) for m in ("one", "all", "2", 4)] == [1, None, 2, 4]
