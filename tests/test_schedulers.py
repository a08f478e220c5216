"""One class per scheduler: the pure parts of each (binding, node lists, the Grid Engine PE's shape, Slurm's lost
node) and proof that a new scheduler is one module and nothing else: LSF added so to a copy of the package (the
class registers itself where it is defined), offered by the real ``octo-dist launch``, rendered, submitted and
chained, and run by the job runtime."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from octo_dist.jobs import schedulers
from octo_dist.jobs.schedulers import mpirun
from octo_dist.jobs.supervisor import zipapp
from helpers import HANG_S

REPO = Path(__file__).resolve().parents[1]


# IBM Spectrum LSF, as a site would add it: one module (its header, its own --queue option, its directive grammar,
# its node list LSB_DJOB_HOSTFILE with one line per slot, `bsub job.sh`, -w 'ended(ID)' for a chain, and
# "Job <123> is submitted to queue <gpu>."), and nothing else: no register line, no edit of the package.
LSF_MODULE = r'''"""IBM Spectrum LSF: ``#BSUB -n SLOTS``, ``span[ptile=R]``, the node list in ``LSB_DJOB_HOSTFILE``."""

from __future__ import annotations

import os
import re

from octo_dist.jobs.schedulers.base import AFTER_ENV, Option
from octo_dist.jobs.schedulers.mpirun import MpirunScheduler


class Lsf(MpirunScheduler):
    name = "lsf"
    title = "IBM Spectrum LSF"
    help = "IBM Spectrum LSF: bsub"
    header = """\
#!/bin/bash
#BSUB -J @{name}
#BSUB -n @{slots}
#BSUB -R "span[ptile=@{ranks_per_node}]"
#BSUB -W @{lsf_walltime}
#BSUB -o @{name}.o%J
"""
    options = (Option("queue", "LSF queue, #BSUB -q QUEUE (default: the site's)"),)
    directive_prefix = "#BSUB"
    rendered_keys = {"-J": "--name", "-n": "--nodes/--ranks-per-node", "-W": "--walltime", "-q": "--queue"}
    conditional_keys = {"-q": "queue"}
    job_id_var = "LSB_JOBID"
    hostfile_var = "LSB_DJOB_HOSTFILE"
    workdir = '"${LS_SUBCWD:-$PWD}"'
    submit_program = "bsub"
    job_id_re = re.compile(r"Job <(\d+)> is submitted.*")
    job_id_example = "Job <123> is submitted to queue <gpu>."

    def header_values(self, header, settings):
        walltime_s = settings.timing.walltime_s
        return {"lsf_walltime": f"{walltime_s // 3600}:{walltime_s % 3600 // 60:02d}"}

    def site_lines(self, header, settings):
        queue = [f"#BSUB -q {header.site['queue']}"] if header.site.get("queue") else []
        return queue + list(header.directives)

    def submit_command(self, script, after):
        extra = ["-w", f"ended({after})", "-env", f"all,{AFTER_ENV}={after}"] if after else []
        return ["bsub", *extra, script]

    def log_path(self, name, job, submit_dir, home):
        return os.path.join(submit_dir, f"{name}.o{job}")
'''

# Stands in for mpirun on one host: skips its options (each with a value), starts the rest once per rank with
# OMPI_COMM_WORLD_RANK set, and exits with the first failure.
FAKE_MPIRUN = """import os, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[2:]
procs = [subprocess.Popen(args, env={**os.environ, "OMPI_COMM_WORLD_RANK": str(r)}) for r in range(4)]
sys.exit(max(p.wait() for p in procs))
"""
# Stands in for octo-dist on every rank: notes its rank, the job id it was given and its argv.
FAKE_OCTO_DIST = """import os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"{os.environ['OMPI_COMM_WORLD_RANK']} {os.environ.get('OCTO_DIST_JOB_ID')} {' '.join(sys.argv[1:])}\\n")
"""


def program(path: Path, text: str) -> None:
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(0o755)


@pytest.fixture
def with_lsf(tmp_path) -> Path:
    """A copy of octo_dist/ with LSF added as a site would: one new module, no other edit."""
    copy = tmp_path / "src"
    shutil.copytree(
        REPO / "octo_dist", copy / "octo_dist", ignore=shutil.ignore_patterns("__pycache__")
    )
    package = copy / "octo_dist" / "jobs" / "schedulers"
    (package / "lsf.py").write_text(LSF_MODULE)
    return copy


def test_a_new_scheduler_is_one_module_and_one_line_through_launch_render_and_the_runtime(
    with_lsf, tmp_path
):
    changed = subprocess.run(
        ["diff", "-r", "-x", "__pycache__", str(REPO / "octo_dist"), str(with_lsf / "octo_dist")],
        capture_output=True,
        text=True,
    ).stdout
    # the module, and no line of any other file
    assert changed.count("Only in") == 1 and "lsf.py" in changed, changed
    assert "\n> " not in changed and "\n< " not in changed, changed
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    venv = work / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    program(venv / "octo-dist", FAKE_OCTO_DIST)
    program(work / "bin" / "mpirun", FAKE_MPIRUN)
    env = {
        "PATH": f"{work / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(with_lsf),
        "FAKE_LOG": str(work / "ranks.log"),
    }

    def launch(*args: str) -> subprocess.CompletedProcess:
        argv = ["launch", "lsf", "--nodes", "2", "--gpus-per-node", "2", "--venv", "venv"]
        return subprocess.run(
            [sys.executable, "-m", "octo_dist", *argv, "--module", "", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )

    # The real CLI offers the new scheduler and its own option, and checks directives in its grammar.
    helped = launch("--help")
    assert "--queue QUEUE" in helped.stdout and "LSF queue, #BSUB -q QUEUE" in helped.stdout, helped
    refused = launch("--directive", "#BSUB -n 9", "-o", "refused.sh")
    assert refused.returncode == 2 and "sets -n, which the header already sets" in refused.stderr
    assert not (work / "refused.sh").exists()
    done = launch("--queue", "gpu", "--wandb-mode", "disabled", "-o", "job.sh")
    assert done.returncode == 0, done.stderr
    text = (work / "job.sh").read_text()
    assert text.startswith("#!/bin/bash\n#BSUB -J octo-dist\n#BSUB -n 4\n"), text
    assert "#BSUB -W 1:00\n#BSUB -o octo-dist.o%J\n#BSUB -q gpu\n" in text, text
    assert "octo-dist job for IBM Spectrum LSF" in text and "submit:    bsub job.sh" in text
    assert '"scheduler": "lsf"' in text and len(text.splitlines()) <= 40

    # The job runtime reads the new scheduler's node list and starts every rank under its launcher.
    (work / "hosts").write_text("h1\nh1\nh2\nh2\n")
    ran = subprocess.run(
        ["bash", "job.sh"],
        cwd=work,
        env={**env, "LSB_JOBID": "7", "LSB_DJOB_HOSTFILE": str(work / "hosts")},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert ran.returncode == 0, ran.stderr
    ranks = sorted((work / "ranks.log").read_text().splitlines())
    assert [r.split()[0] for r in ranks] == ["0", "0", "1", "1", "2", "2", "3", "3"], ranks
    # LSB_JOBID, read by the new module alone, reaches every rank as OCTO_DIST_JOB_ID
    assert all(r.split()[1] == "7" for r in ranks), ranks
    assert sum("check-env --launch" in r for r in ranks) == 4
    assert sum(r.split()[2] == "smoke" for r in ranks) == 4, ranks
    assert (work / "runs" / "octo-dist" / ".octo-dist-exit-7").read_text() == "0\n"


def test_a_new_scheduler_submits_and_chains(with_lsf):
    code = """if True:
        import subprocess
        from octo_dist.jobs import submit
        answers = iter(["Job <7> is submitted to queue <gpu>.\\n", "Job <8> is submitted to queue <gpu>.\\n"])
        seen = []
        def run(argv, timeout_s):
            seen.append(argv)
            return subprocess.CompletedProcess(argv, 0, next(answers), "")
        jobs = submit.submit(
            "lsf", "job.sh", name="octo-dist", group=None, chain=2, run=run, submit_dir="/w", home="/h"
        )
        print([j.job_id for j in jobs], jobs[0].log, seen[1])
    """
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(with_lsf), "PATH": "/usr/bin:/bin"},
        cwd=with_lsf,  # not the checkout: its octo_dist/ would come first on sys.path
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "['7', '8'] /w/octo-dist.o7 "
        "['bsub', '-w', 'ended(7)', '-env', 'all,OCTO_DIST_AFTER=7', 'job.sh']"
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
    assert warnings == []  # fewer nodes than rendered: refused, here for the PE's shape
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


def job_runtime(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", "job-runtime", *args],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        cwd=REPO,
    )


def test_the_job_runtime_replaces_only_regular_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "real"
    target.write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    for path, kind in (
        ("/dev/null", "character device"),
        (str(fifo), "FIFO"),
        (str(tmp_path), "directory"),
        (str(link), "symbolic link"),
    ):
        done = job_runtime("-o", path)
        assert done.returncode == 2, done
        assert done.stderr == (
            f"octo-dist job-runtime: error: {path!r} is a {kind}, not a file; expected a new file name or a "
            "regular file to replace. Fix: -o a file name, e.g. -o octo-dist-runtime.pyz\n"
        )
    assert os.path.realpath("/dev/null") == "/dev/null" and not os.path.isfile("/dev/null")
    assert fifo.is_fifo() and link.is_symlink() and target.read_text() == "x"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".octo-dist-runtime")] == []
    new = tmp_path / "runtime.pyz"
    assert job_runtime("-o", str(new)).stdout.startswith(f"wrote {new}: ")
    assert job_runtime("-o", str(new)).stdout.startswith(f"replaced the existing file {new}: ")


# What OpenPBS 23.06's `qstat -Qf -F json rt_HF` prints once `qmgr -c "set queue rt_HF kill_delay=60"` set it
# (trimmed); without that line the queue has no kill_delay key.
QSTAT_QUEUE = """{
    "timestamp":1764950000,
    "pbs_version":"23.06.06",
    "pbs_server":"node001",
    "Queue":{
        "rt_HF":{
            "queue_type":"Execution",
            "total_jobs":1,
            "kill_delay":60,
            "enabled":"True",
            "started":"True"
        }
    }
}"""


def test_the_kill_delay_is_the_queues_or_pbss_default():
    from octo_dist.jobs.schedulers import pbs

    assert pbs.kill_delay(QSTAT_QUEUE, "rt_HF") == (60, "queue rt_HF's kill_delay")
    unset = QSTAT_QUEUE.replace('"kill_delay":60,', "")
    assert pbs.kill_delay(unset, "rt_HF") == (10, "PBS's default: queue rt_HF sets no kill_delay")
    for said in ("", "qstat: Unknown queue", "[]", '{"Queue": {}}', '{"Queue": {"rt_HF": 3}}'):
        assert pbs.kill_delay(said, "rt_HF") == (
            10,
            "PBS's default: qstat did not describe queue rt_HF",
        )


def test_the_job_asks_its_queues_kill_delay_of_qstat(tmp_path):
    from octo_dist.jobs.schedulers import pbs

    asked = tmp_path / "asked"
    qstat = tmp_path / "qstat"
    qstat.write_text(
        f"#!/bin/sh\necho \"$@\" > {asked}\ncat <<'JSON'\n{QSTAT_QUEUE.replace('rt_HF', 'rt_HG')}\nJSON\n"
    )
    qstat.chmod(0o755)
    nowhere = str(tmp_path / "no-pbs.conf")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PBS_QUEUE": "rt_HG", "PBS_CONF_FILE": nowhere}
    assert pbs.queue_kill_delay(env) == (60, "queue rt_HG's kill_delay")
    assert asked.read_text().split() == ["-Qf", "-F", "json", "rt_HG"]
    assert pbs.queue_kill_delay({**env, "PBS_QUEUE": ""}) == (
        10,
        "PBS's default: PBS_QUEUE is not set",
    )
    assert pbs.queue_kill_delay(
        {**env, "PATH": str(tmp_path / "none")}
    ) == (  # a qstat not on PATH is not run
        10,
        "PBS's default: no qstat found (pbs.conf's PBS_EXEC, PATH)",
    )
    # PBS's own qstat (pbs.conf's PBS_EXEC) before another scheduler's on PATH (Grid Engine's /usr/bin/qstat)
    (tmp_path / "opt" / "bin").mkdir(parents=True)
    own = tmp_path / "opt" / "bin" / "qstat"
    own.write_text("#!/bin/sh\necho 'qstat: Unknown queue' >&2\nexit 1\n")
    own.chmod(0o755)
    conf = tmp_path / "pbs.conf"
    conf.write_text(f"PBS_SERVER=node001\nPBS_EXEC={tmp_path / 'opt'}\nPBS_HOME=/var/spool/pbs\n")
    assert pbs.queue_kill_delay({**env, "PBS_CONF_FILE": str(conf)}) == (
        10,
        f"PBS's default: {own} -Qf rt_HG failed (qstat: Unknown queue)",
    )
