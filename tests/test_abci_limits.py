"""ABCI 3.0's per-job limits, as its user guide writes them, refused when the script is rendered (exit 2, found /
expected / fix) rather than by qsub after the render.

ABCI 3.0 user guide, job-execution ("Job Execution Resource"): a job asks for nodes of one resource type; rt_HF
is a whole node (1 to 128 nodes a job), rt_HG one GPU of a node (1 node a job: "multi-node needs rt_HF"), and
the Spot service's elapsed time limit is 168:00:00 ("since you can reserve more days than the elapsed time limit
of the Spot Service, it is possible to execute jobs for a longer time": a reservation, not a Spot job).
"""

import pytest

from octo_dist import cli
from octo_dist.jobs import schedulers
from octo_dist.jobs.walltime import walltime_fix

HEAD = ["launch", "pbs", "--group", "gxx00000", "--dry-run"]


def refusal(capsys, *flags):
    assert cli.main([*HEAD, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("octo-dist launch: error: ") and err.count("\n") == 1, err
    return err


def test_each_resource_type_carries_abcis_limits():
    types = schedulers.get("pbs").resource_types
    assert (types["rt_HF"].max_nodes, types["rt_HG"].max_nodes) == (128, 1)
    assert types["rt_HF"].max_walltime_s == types["rt_HG"].max_walltime_s == 168 * 3600


def test_more_than_128_rt_hf_nodes_is_refused(capsys):
    err = refusal(capsys, "--nodes", "200")
    assert "--nodes 200 on rt_HF; expected 1 to 128 nodes for rt_HF" in err, err
    assert "Fix: --nodes 128" in err, err


def test_128_rt_hf_nodes_render(capsys):
    assert cli.main([*HEAD, "--nodes", "128"]) == 0
    assert "#PBS -l select=128:mpiprocs=8" in capsys.readouterr().out


def test_rt_hg_on_two_nodes_is_refused_with_rt_hf_as_the_fix(capsys):
    err = refusal(capsys, "--nodes", "2", "--resource-type", "rt_HG")
    assert "--nodes 2 on rt_HG; expected 1 node" in err, err
    assert "Fix: --nodes 1, or --resource-type rt_HF" in err, err


@pytest.mark.parametrize("resource_type", ["rt_HF", "rt_HG"])
def test_a_wall_time_past_168_hours_is_refused(capsys, resource_type):
    err = refusal(
        capsys, "--nodes", "1", "--resource-type", resource_type, "--walltime", "169:00:00"
    )
    assert (
        f"--walltime 169:00:00 (608400 s) on {resource_type}; expected at most 168:00:00" in err
    ), err
    assert "Fix: --walltime 168:00:00 and --submit --chain N" in err, err


def test_168_hours_render(capsys):
    assert cli.main([*HEAD, "--nodes", "1", "--walltime", "168:00:00"]) == 0
    assert "#PBS -l walltime=168:00:00" in capsys.readouterr().out


def test_a_bare_number_of_a_wall_time_names_each_reading(capsys):
    err = refusal(capsys, "--nodes", "1", "--walltime", "90")
    assert (
        "Fix: --walltime 90:00:00 (90 hours), 1:30:00 (90 minutes, as SLURM reads a bare number) or 0:01:30 "
        "(90 seconds, as PBS and Grid Engine read it)"
    ) in err, err


def test_a_bare_number_too_big_for_hours_names_the_other_readings():
    # 9000 hours is past a year: only minutes (150 h) and seconds remain readings
    assert walltime_fix("9000") == (
        "150:00:00 (9000 minutes, as SLURM reads a bare number) or 2:30:00 (9000 seconds, as PBS and Grid "
        "Engine read it)"
    )
