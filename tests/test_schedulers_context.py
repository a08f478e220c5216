"""The scheduler's run-time hook is typed: ``launcher(settings, ctx)`` gets the job's ``JobSettings`` and a frozen
``JobContext`` of what the runtime learned (its environment, job id, job directory, cores, a note), and the
supervisor keeps its settings as they were read, with no copy of their fields."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import settings_mapping
from octo_dist.jobs import schedulers
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs import settingsread
from octo_dist.jobs.schedulers.base import JobContext
from octo_dist.jobs.supervisor import supervise


def settings(scheduler: str, cpus_per_rank: int = 12) -> job_settings.JobSettings:
    return settingsread.from_mapping(
        settings_mapping(
            scheduler,
            nodes=2,
            ranks_per_node=4,
            cpus_per_rank=cpus_per_rank,
            venv="/v",
            save_dir="s",
            forward_prefixes=["NCCL_"],
            forward_names=["PYTHONUNBUFFERED"],
            preflight=["octo-dist", "check-env"],
            train=["octo-dist", "smoke"],
        )
    )


def context(tmp_path, env, cores=96):
    said = []
    return JobContext(
        env=env, job_id="42", job_dir=str(tmp_path), cores=cores, note=said.append
    ), said


def test_slurms_launcher_is_built_from_the_settings_alone(tmp_path):
    ctx, said = context(tmp_path, {"SLURM_JOB_ID": "42"})
    argv, env = schedulers.get("slurm").launcher(settings("slurm"), ctx)
    assert argv[:3] == ["srun", "--nodes=2", "--ntasks-per-node=4"], argv
    assert "--cpus-per-task=12" in argv and env == {} and said == []


def test_grid_engines_launcher_reads_the_context_and_names_the_job_id(tmp_path):
    (tmp_path / "pe").write_text("n1 4 all.q@n1 UNDEFINED\nn2 4 all.q@n2 UNDEFINED\n")
    env = {
        "PE_HOSTFILE": str(tmp_path / "pe"),
        "JOB_ID": "42",
        "OCTO_DIST_JOB_ID": "42",
        "NCCL_DEBUG": "INFO",
    }
    ctx, said = context(
        tmp_path, env, cores=8
    )  # fewer cores than 4 ranks x 12: no binding, and a note
    argv, exports = schedulers.get("sge").launcher(settings("sge"), ctx)
    pairs = set(zip(argv, argv[1:]))
    assert {("-x", "OCTO_DIST_JOB_ID"), ("-x", "JOB_ID"), ("-x", "NCCL_DEBUG")} <= pairs, argv
    assert ("--bind-to", "none") in pairs and "fewer than 4 rank(s) x 12" in said[0], (argv, said)
    assert (tmp_path / "nodes").read_text() == (tmp_path / "pe").read_text()
    assert exports["OCTO_DIST_NODEFILE"] == str(tmp_path / "nodes")


def test_the_context_is_frozen(tmp_path):
    ctx, _ = context(tmp_path, {})
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.job_id = "1/../.."


def test_the_supervisor_keeps_its_settings_and_no_copy_of_their_fields():
    s = settings("pbs")
    sup = supervise.Supervisor(s, {})
    assert sup.s is s
    groups = [getattr(s, g.name) for g in dataclasses.fields(s)]
    copies = {f.name for g in groups if dataclasses.is_dataclass(g) for f in dataclasses.fields(g)}
    copies |= {"ranks"}
    # Two names alike, neither a copy: the scheduler's object (not its name), the save directory the runtime made
    # absolute (empty until it has).
    assert sup.scheduler is schedulers.get("pbs") and sup.save_dir == ""
    copies -= {"scheduler", "save_dir"}
    assert not copies & set(vars(sup)), sorted(copies & set(vars(sup)))
