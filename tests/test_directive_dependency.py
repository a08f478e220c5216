"""A `--directive` that makes the job wait for another job is refused (exit 2): the dependencies of a chain's jobs
are octo-dist's to write (`--chain N --submit`), and PBS's `#PBS -W depend=...` was rendered beside them, holding
the chain's first job on a job of the user's while the later ones followed the command line's."""

from __future__ import annotations

import pytest

from octo_dist import cli

BASE = {
    "pbs": ["launch", "pbs", "--nodes", "1", "--group", "g1", "--dry-run"],
    "slurm": ["launch", "slurm", "--nodes", "1", "--gpus-per-node", "4", "--dry-run"],
    "sge": ["launch", "sge", "--nodes", "1", "--gpus-per-node", "4", "--dry-run"],
}
# The scheduler's own dependency command, which the fix shows with JOB_ID in place of ID
WAIT = {
    "pbs": "qsub -W depend=afterany:JOB_ID SCRIPT",
    "slurm": "sbatch --dependency=afterany:JOB_ID SCRIPT",
    "sge": "qsub -hold_jid JOB_ID SCRIPT",
}


@pytest.mark.parametrize(
    "scheduler, directive",
    [
        ("pbs", "#PBS -W depend=afterok:123.pbs1"),
        ("pbs", "#PBS -Wdepend=afterany:123"),  # qsub's getopt: the value attached
        ("pbs", "#PBS -VW depend=afterok:5"),  # clustered after a flag
        ("pbs", "#PBS -W sandbox=PRIVATE,depend=afterok:7"),  # one of -W's list of attributes
        ("pbs", "#PBS -W DEPEND=afterok:7"),
        ("slurm", "#SBATCH --dependency=afterok:12"),
        (
            "slurm",
            "#SBATCH --depend=afterok:12",
        ),  # a unique prefix, as sbatch's getopt_long takes it
        ("slurm", "#SBATCH -d afterok:12"),
        ("sge", "#$ -hold_jid 12"),
    ],
)
def test_a_dependency_directive_is_refused(capsys, scheduler, directive):
    assert cli.main([*BASE[scheduler], "--directive", directive]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.strip().splitlines()
    assert captured.out == ""  # no script
    assert line.startswith(
        f"octo-dist launch: error: --directive {directive!r} makes the job wait for another job; expected no "
        "dependency among the directives: octo-dist writes the chain's own (--chain N --submit"
    )
    assert line.endswith(
        "Fix: drop the directive; to hold the job until another has ended, submit the written script yourself: "
        + WAIT[scheduler]
    )


@pytest.mark.parametrize(
    "scheduler, directive",
    [
        ("pbs", "#PBS -W group_list=g1"),  # -W sets other job attributes too
        ("pbs", "#PBS -W sandbox=PRIVATE"),
        ("pbs", "#PBS -m abe"),
        ("slurm", "#SBATCH --mail-type=END"),
        ("sge", "#$ -m e"),
    ],
)
def test_other_directives_are_still_rendered(capsys, scheduler, directive):
    assert cli.main([*BASE[scheduler], "--directive", directive]) == 0
    assert directive in capsys.readouterr().out.splitlines()
