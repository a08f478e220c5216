"""One class per scheduler: the pure parts of each (binding, node lists, the Grid Engine PE's shape, Slurm's lost
node) and proof that a new scheduler is one class: an LSF-like one defined here, registered, rendered and
submitted, and run by the job runtime, with no other file changed."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from octo_dist.jobs import render, schedulers, submit
from octo_dist.jobs.cli import parse
from octo_dist.jobs.schedulers import base, mpirun
from octo_dist.jobs.supervisor import zipapp


class Lsf(mpirun.MpirunScheduler):
    """IBM Spectrum LSF, as a site would add it: its header, its node list (LSB_DJOB_HOSTFILE: one line per slot),
    ``bsub < job.sh``, ``-w 'ended(ID)'`` for a chain, and "Job <123> is submitted to queue <gpu>."."""

    name = "lsf"
    title = "IBM Spectrum LSF"
    header = """\
#!/bin/bash
#BSUB -J @{name}
#BSUB -n @{slots}
#BSUB -R "span[ptile=@{ranks_per_node}]"
#BSUB -W @{lsf_walltime}
#BSUB -o @{name}.o%J
"""
    job_id_var = "LSB_JOBID"
    hostfile_var = "LSB_DJOB_HOSTFILE"
    workdir = '"${LS_SUBCWD:-$PWD}"'
    submit_program = "bsub"
    job_id_re = re.compile(r"Job <(\d+)> is submitted.*")
    job_id_example = "Job <123> is submitted to queue <gpu>."

    def header_values(self, spec):
        return {"lsf_walltime": f"{spec.walltime_s // 3600}:{spec.walltime_s % 3600 // 60:02d}"}

    def submit_command(self, script, after):
        return [
            "bsub",
            *(["-w", f"ended({after})", "-env", f"all,{base.AFTER_ENV}={after}"] if after else []),
            script,
        ]

    def log_path(self, name, job, submit_dir, home):
        return os.path.join(submit_dir, f"{name}.o{job}")


@pytest.fixture
def lsf():
    yield schedulers.register(Lsf())
    del schedulers.SCHEDULERS["lsf"]


def lsf_spec(tmp_path):
    pbs = parse(
        [
            "pbs",
            "--nodes",
            "2",
            "--group",
            "g1",
            "--venv",
            str(tmp_path / "venv"),
            "--ranks-per-node",
            "2",
        ]
    )
    return dataclasses.replace(
        pbs, scheduler="lsf", group=None, resource_type=None, modules=(), environment=()
    )


def test_a_new_scheduler_is_one_class_rendered_submitted_and_run(lsf, tmp_path, monkeypatch):
    text = render.render(lsf_spec(tmp_path), "job.sh")
    assert (
        text.startswith("#!/bin/bash\n#BSUB -J octo-dist\n#BSUB -n 4\n") and "#BSUB -W 1:00" in text
    ), text
    assert "octo-dist job for IBM Spectrum LSF" in text and "submit:    bsub job.sh" in text
    assert 'cd -- "${LS_SUBCWD:-$PWD}"' in text and len(text.splitlines()) <= 40

    answers = iter(
        ["Job <7> is submitted to queue <gpu>.\n", "Job <8> is submitted to queue <gpu>.\n"]
    )
    seen = []

    def run(argv, timeout_s):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, next(answers), "")

    jobs = submit.submit(
        "lsf", "job.sh", name="octo-dist", group=None, chain=2, run=run, submit_dir="/w", home="/h"
    )
    assert [j.job_id for j in jobs] == ["7", "8"] and jobs[0].log == "/w/octo-dist.o7"
    assert seen[1] == ["bsub", "-w", "ended(7)", "-env", "all,OCTO_DIST_AFTER=7", "job.sh"]

    # The job runtime reads the new scheduler's node list and builds its launcher line.
    hostfile = tmp_path / "hosts"
    hostfile.write_text("h1\nh1\nh2\nh2\n")
    error, warnings = lsf.node_checks({"LSB_DJOB_HOSTFILE": str(hostfile)}, 2, 2, "job.sh")
    assert error is None and warnings == []
    error, _ = lsf.node_checks({}, 2, 2, "job.sh")
    assert (
        error
        == "LSB_DJOB_HOSTFILE is ''; expected the node list the scheduler gives every job. Fix: submit it (bsub job.sh) rather than running it"
    )


@pytest.mark.parametrize(
    "args, expected, note",
    [
        ((8, 12, 2, 96, 2), "--map-by ppr:4:socket:PE=12 --bind-to core", ""),
        (
            (8, 12, 2, 96, 1),
            "--map-by ppr:8:node:PE=12 --bind-to core",
            "",
        ),  # another shape: one block per node
        ((2, 0, 0, 4, 0), "--map-by ppr:2:node --bind-to none", ""),
        (
            (8, 12, 2, 16, 2),
            "--map-by ppr:8:node --bind-to none",
            "this node has 16 CPU(s), fewer than 8 rank(s) x 12",
        ),
    ],
)
def test_mpirun_binding(args, expected, note):
    argv, said = mpirun.binding(*args)
    assert " ".join(argv) == expected and said.startswith(note)


def test_forwarded_variables_by_prefix_and_name_sorted():
    env = {"NCCL_X": "1", "PATH": "/bin", "COORDINATOR_ADDRESS": "h:1", "JAX_Y": "2"}
    assert mpirun.forwarded(env, ("NCCL_", "JAX_"), ("COORDINATOR_ADDRESS",)) == [
        "-x",
        "COORDINATOR_ADDRESS",
        "-x",
        "JAX_Y",
        "-x",
        "NCCL_X",
    ]


def test_grid_engine_refuses_a_pe_of_another_shape(tmp_path):
    ge = schedulers.get("sge")
    hosts = tmp_path / "pe_hostfile"
    hosts.write_text("node001 2 all.q@node001 UNDEFINED\n")
    error, warnings = ge.node_checks({"PE_HOSTFILE": str(hosts), "NSLOTS": "2"}, 2, 1, "job.sh")
    assert "NSLOTS=2 as node001:2" in error and "allocation_rule is 1" in error
    assert warnings == [f"warning: {hosts} lists 1 node(s); this script was rendered for 2"]
    hosts.write_text("node001 1 q UNDEFINED\nnode002 1 q UNDEFINED\n")
    assert ge.node_checks({"PE_HOSTFILE": str(hosts), "NSLOTS": "2"}, 2, 1, "job.sh") == (None, [])


def test_slurm_names_the_node_a_probe_could_not_reach():
    s = schedulers.get("slurm")
    said = "srun: error: Task launch for StepId=7.3 failed on node node002: Communication connection failure"
    assert (
        s.lost_node(said) == "node002"
        and s.lost_node("srun: error: Unable to contact slurm controller") is None
    )
    assert s.node_probe(1) is None and "--overlap" in s.node_probe(2)
    assert (
        s.node_checks({}, 1, 1, "job.sh")[0]
        == "SLURM_JOB_ID is unset; expected to run inside a job. Fix: sbatch job.sh"
    )


def test_the_zipapp_runs_on_a_bare_python(tmp_path):
    """Standard library only: the zipapp's own modules, under -I -S (no site packages, no PYTHONPATH)."""
    pyz = zipapp.build(str(tmp_path / "runtime.pyz"))
    done = subprocess.run(
        [sys.executable, "-I", "-S", pyz, "octo-dist-rank", str(tmp_path), "true"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "done" / "rank-unknown").exists()
    imports = f"import sys; sys.path.insert(0, {pyz!r}); import octo_dist.jobs.supervisor.supervise"
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", imports], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    bad = subprocess.run(
        [sys.executable, "-I", "-S", pyz, "nonsense"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "expected 'supervise SETTINGS_JSON'" in bad.stderr
