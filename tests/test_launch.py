"""`octo-dist launch`: rendered job scripts pass shellcheck, refuse bad input, stop the ranks before the wall time,
and run the real smoke job under a fake SGE / PBS job on this machine (2 ranks, the venv's mpirun)."""

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import helpers
from helpers import COMPILE_FAST, HANG_S, REPO, clean_env
from octo_dist import cli
from octo_dist.engine import checksums
from octo_dist.jobs import examples, render, spec, training, walltime
from octo_dist.jobs.cli import parse

VENV_BIN = Path(sys.executable).parent
SHELLCHECK = shutil.which("shellcheck", path=str(VENV_BIN)) or shutil.which("shellcheck")


def rendered(*argv, name="job.sh") -> str:
    return render.render(parse(list(argv)), name)


def write_script(tmp_path: Path, *argv) -> Path:
    path = tmp_path / "job.sh"
    path.write_text(rendered(*argv))
    return path


# ---- rendering ---------------------------------------------------------------------------------------------------

BASE = {
    "pbs": ["pbs", "--nodes", "2", "--group", "gxx00000"],
    "sge": ["sge", "--nodes", "2", "--gpus-per-node", "4"],
    "slurm": ["slurm", "--nodes", "2", "--gpus-per-node", "8", "--group", "acct"],
}


@pytest.mark.skipif(
    not SHELLCHECK, reason="no shellcheck (make dev-env installs it from the dev lock)"
)
@pytest.mark.parametrize("container", ["image", "venv"])
@pytest.mark.parametrize("scheduler", sorted(BASE))
@pytest.mark.parametrize("command", ["smoke", "finetune"])
def test_rendered_script_passes_shellcheck(tmp_path, scheduler, container, command):
    image = tmp_path / "octo-dist.sif"
    image.write_bytes(b"#!/usr/bin/env run-singularity\n\0SIF_MAGIC\0")
    argv = [
        *BASE[scheduler],
        "--per-gpu-batch",
        "4",
        "--steps",
        "100",
        "--wandb-mode",
        "online",
        "--coordinator",
        "g0001:23456",
    ]
    if container == "image":
        argv += ["--image", str(image)]
    if command == "finetune":
        argv += [
            "--data-dir",
            "data",
            "--",
            "finetune",
            "--config.pretrained_path=hf://rail-berkeley/octo-small",
            "--name",
            "it's quoted",
        ]
    script = write_script(tmp_path, *argv)
    proc = subprocess.run([SHELLCHECK, "--shell=bash", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + script.read_text()
    text = script.read_text()
    if container == "image":  # the image's own job runtime, written beside the job
        assert (
            f"singularity exec {image} octo-dist job-runtime" in text
            and f'"image": "{image}"' in text
        )
    else:
        assert (
            "/bin/python -m octo_dist.jobs.supervisor supervise" in text and '"image": ""' in text
        )


def test_examples_are_what_launch_renders():
    on_disk = {p.name for p in (REPO / "scripts" / "jobs").glob("*.sh")}
    assert on_disk == set(examples.EXAMPLES), (
        "scripts/jobs/ and octo_dist/jobs/examples.py list different scripts"
    )
    for name, text in examples.rendered().items():
        assert (REPO / "scripts" / "jobs" / name).read_text() == text, (
            f"scripts/jobs/{name} is stale: make job-examples"
        )


@pytest.mark.parametrize("scheduler", sorted(BASE))
@pytest.mark.parametrize("container", ["image", "venv"])
def test_a_rendered_script_is_read_in_a_minute(scheduler, container):
    """Header, module load and one hand-over to the job runtime: every job's logic is in tested Python."""
    extra = ["--image", "x.sif", "--skip-image-check"] if container == "image" else []
    text = rendered(
        *BASE[scheduler], *extra, "--", "finetune", "--config.pretrained_path=weights/octo-small"
    )
    assert len(text.splitlines()) <= 40, text
    assert (
        [ln.split()[0] for ln in text.splitlines()].count("exec") == 1
        and "trap " not in text
        and "while " not in text
    ), text


@pytest.mark.skipif(
    not SHELLCHECK, reason="no shellcheck (make dev-env installs it from the dev lock)"
)
@pytest.mark.parametrize(
    "text, seconds, shown",
    [
        ("1:30:00", 5400, "01:30:00"),
        ("0:10:00", 600, "00:10:00"),
        ("2-00:00", 172800, "48:00:00"),  # SLURM's days-hours:minutes
        ("2-00:00:00", 172800, "48:00:00"),
        ("72:00:00", 259200, "72:00:00"),
    ],
)
def test_walltime_forms(text, seconds, shown):
    assert walltime.parse_walltime(text) == seconds and walltime.format_walltime(seconds) == shown


def test_headers_follow_each_scheduler():
    pbs = rendered(*BASE["pbs"], "--walltime", "12:00:00")
    for line in (
        "#PBS -P gxx00000",
        "#PBS -q rt_HF",
        "#PBS -l select=2:mpiprocs=8",
        "#PBS -l walltime=12:00:00",
        "module load hpcx/2.20;",
        '"scheduler": "pbs"',
        'cd -- "${PBS_O_WORKDIR:-$PWD}"',
    ):
        assert line in pbs
    sge = rendered(*BASE["sge"], "--walltime", "0:10:00", "--image", "x.sif", "--skip-image-check")
    for line in (
        "#$ -pe mpi 8",
        "#$ -l h_rt=00:10:00",
        "#$ -notify",
        '"scheduler": "sge"',
        '"ranks_per_node": 4',
        '"modules": []',
        'cd -- "$PWD"',
    ):
        assert line in sge
    assert "then module load" not in sge
    slurm = rendered(*BASE["slurm"], "--walltime", "1-00:00:00", "--stop-margin", "120")
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --time=24:00:00",
        "#SBATCH --account=acct",
        "#SBATCH --signal=B:USR1@120",
        '"scheduler": "slurm"',
        'cd -- "${SLURM_SUBMIT_DIR:-$PWD}"',
    ):
        assert line in slurm
    assert "#SBATCH --account" not in rendered("slurm", "--nodes", "1", "--gpus-per-node", "4")


def test_batch_and_steps_map_to_each_commands_flags():
    smoke = parse(
        [*BASE["pbs"], "--per-gpu-batch", "4", "--steps", "1000", "--keep-samples-from", "32"]
    )
    smoke = smoke.header.training
    assert smoke.global_batch == 64 and smoke.steps == 500  # 1000 steps x 32 = 500 x 64 examples
    assert (
        smoke.job_args == ("--global-batch=64", "--steps=500", "--wandb-mode=disabled")
        and smoke.resume
    )
    ft = parse(
        [
            *BASE["pbs"],
            "--per-gpu-batch",
            "32",
            "--steps",
            "50000",
            "--keep-samples-from",
            "256",
            "--data-dir",
            "data",
            "--",
            "finetune",
            "--config.pretrained_path=hf://rail-berkeley/octo-small",
        ]
    )
    assert ft.header.training.job_args == ("--config.batch_size=512", "--config.num_steps=25000")
    argv = render.train_argv(ft)
    assert argv[:2] == ["octo-dist", "finetune"]  # from the venv's bin/, or the image's own PATH
    assert ", ".join(argv[2:]).startswith(
        "--config.batch_size=512, --config.num_steps=25000, --config.save_dir=@{save_dir}, "
        "--config.dataset_kwargs.data_dir=@{data_dir}, --compile_cache=@{compile_cache}"
    )  # the paths, made absolute on the node by the job runtime
    assert (
        argv[-1] == "--resume"
    )  # a job requeued after its wall time continues from its checkpoints
    assert "--resume" not in render.train_argv(
        parse([*BASE["pbs"], "--no-resume", "--", "finetune"])
    )
    assert (
        training.scaled_steps(50000, 256, 384) == 33334
    )  # rounded up: never fewer examples than planned
    plain = parse([*BASE["sge"]]).header.training
    assert (
        plain.command == "smoke"
        and plain.global_batch is None
        and plain.job_args == ("--wandb-mode=disabled",)
    )


def test_coordinator_only_when_asked():
    assert '"coordinator": ""' in rendered(*BASE["pbs"])
    assert '"coordinator": "g0001:23456"' in rendered(*BASE["pbs"], "--coordinator", "g0001:23456")


def test_launch_writes_the_script_and_prints_how_to_submit(tmp_path, capsys):
    out = tmp_path / "job.sh"
    assert cli.main(["launch", *BASE["sge"], "--group", "gxx00000", "-o", str(out)]) == 0
    assert f"Submit: qsub {out}" in capsys.readouterr().out
    assert out.stat().st_mode & stat.S_IXUSR and out.read_text().startswith(
        "#!/bin/bash\n#$ -pe mpi 8\n"
    )
    assert "#$ -P gxx00000\n" in out.read_text()
    assert cli.main(["launch", *BASE["sge"], "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("#!/bin/bash")


def test_dry_run_with_output_shows_the_script_as_output_names_it_and_writes_nothing(
    tmp_path, capsys
):
    out = tmp_path / "job.sh"
    assert (
        cli.main(["launch", *BASE["sge"], "--group", "gxx00000", "-o", str(out), "--dry-run"]) == 0
    )
    text = capsys.readouterr().out
    assert "qsub job.sh" in text and '"script_name": "job.sh"' in text, text[:800]
    assert "octo-dist-sge.sh" not in text and not out.exists()


# ---- refusals: exit 2, what/expected/fix, nothing written ---------------------------------------------------------

REFUSALS = {
    "more ranks than GPUs": (
        ["pbs", "--nodes", "1", "--group", "g1", "--ranks-per-node", "9"],
        "--ranks-per-node 9",
    ),
    "more GPUs than the node": (
        ["pbs", "--nodes", "1", "--group", "g1", "--gpus-per-node", "9"],
        "at most 8",
    ),
    "sge without gpus per node": (["sge", "--nodes", "1"], "--gpus-per-node 8"),
    "a PE name with a space": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--pe", "mpi x"],
        "--pe mpi-x",
    ),
    "zero nodes": (["pbs", "--nodes", "0", "--group", "g1"], "--nodes 0"),
    "batch not divisible": (
        ["pbs", "--nodes", "2", "--group", "g1", "--global-batch", "100"],
        "--global-batch 112",
    ),
    "missing image": (
        ["pbs", "--nodes", "1", "--group", "g1", "--image", "/nonexistent/octo.sif"],
        "no such file",
    ),
    "walltime malformed": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--walltime", "2h"],
        "H:MM:SS",
    ),
    "walltime minutes > 59": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--walltime", "1:75:00"],
        "H:MM:SS",
    ),
    "walltime zero": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--walltime", "0:00:00"],
        "more than zero",
    ),
    "walltime shorter than the stop margin": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--walltime", "0:05:00"],
        "--stop-margin 30",
    ),
    "one second left before the stop": (
        [
            "sge",
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "--walltime",
            "0:05:01",
            "--stop-margin",
            "300",
        ],
        "at least 30 s before it",
    ),
    "a negative stop margin": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--stop-margin", "-100"],
        "--stop-margin -100; expected --stop-margin from 0 to 31622400",
    ),
    "nodes past any machine": (
        ["pbs", "--nodes", "99999999999999999999", "--group", "g1"],
        "--nodes from 1 to 10000",
    ),
    "a wall time of centuries": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--walltime", "99999999-00:00:00"],
        "at most 366 days",
    ),
    "a save directory of 5000 characters": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--save-dir", "x" * 5000],
        "at most 4096",
    ),
    "a launch flag after -- finetune": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--", "finetune", "-o", "x.sh"],
        "-o after -- finetune: it is octo-dist launch's",
    ),
    "a scheduler's flag after -- smoke": (
        ["slurm", "--nodes", "1", "--gpus-per-node", "4", "--", "smoke", "--partition=gpu"],
        "Fix: octo-dist launch slurm ... --partition=gpu -- smoke ...",
    ),
    "pbs without a group": (["pbs", "--nodes", "1"], "qsub -P"),
    "slurm without gpus per node": (["slurm", "--nodes", "1"], "--gpus-per-node 8"),
    "resource type of another scheduler": (
        ["pbs", "--nodes", "1", "--group", "g1", "--resource-type", "rt_F"],
        "rt_HF",
    ),
    "unknown training command": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--", "train.py"],
        "smoke",
    ),
    "a setting given twice": (
        [
            "sge",
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "--steps",
            "10",
            "--",
            "smoke",
            "--steps=20",
        ],
        "drop --steps",
    ),
    "save dir after --": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--", "smoke", "--save-dir", "x"],
        "--save-dir",
    ),
    "group with a space": (["pbs", "--nodes", "1", "--group", "g 1"], "--group g-1"),
    "coordinator port out of range": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--coordinator", "host:99999"],
        "1 to 65535",
    ),
    "coordinator port zero": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--coordinator", "host:0"],
        "1 to 65535",
    ),
    "a newline after --": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--", "smoke", "--model\ntouch X #"],
        "U+000A",
    ),
    "a path read as an option": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--save-dir=-rf"],
        "--save-dir ./-rf",
    ),
    "a bound path with a colon": (
        [
            "sge",
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "--image",
            "x.sif",
            "--skip-image-check",
            "--save-dir",
            "a:b",
        ],
        "source:destination",
    ),
    "more cores than the node": (
        ["pbs", "--nodes", "1", "--group", "g1", "--cpus-per-rank", "13"],
        "--cpus-per-rank 12",
    ),
    "a bidi override in a module": (
        ["sge", "--nodes", "1", "--gpus-per-node", "4", "--module", "hpcx\u202e"],
        "U+202E",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_input_is_refused_before_anything_is_written(tmp_path, capsys, case):
    argv, needle = REFUSALS[case]
    out = tmp_path / "job.sh"
    assert cli.main(["launch", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("octo-dist launch: error: ") and err.count("\n") == 1, err  # one line
    assert "; expected " in err and ". Fix: " in err, err
    assert needle in err, err
    assert not out.exists()


# ---- the script's own logic, under a fake launcher (fast: no MPI, no JAX) ------------------------------------------

FAKE_LAUNCHER = r"""#!/bin/bash
# Stands in for mpirun/srun: records what it was given; the preflight returns at once, "training" waits for a signal.
log=$FAKE_LAUNCHER_LOG
echo "argv $(echo "$*" | tr '\n' ' ')" >>"$log"  # the rank guard's script spans lines
echo "env WANDB_API_KEY=${WANDB_API_KEY:-}" >>"$log"
# The rank guard's notes: every rank that exits 0 says so in <job dir>/done (the argument after octo-dist-rank).
job_dir=; prev=
for arg in "$@"; do if [ "$prev" = octo-dist-rank ]; then job_dir=$arg; fi; prev=$arg; done
ranks_done() {
    mkdir -p "$job_dir/done"
    for ((r = 0; r < ${FAKE_RANKS:-2}; r++)); do echo "rank $r" >"$job_dir/done/rank-$r"; done
}
case " $* " in
*" check-env "*) if [ "${FAKE_PREFLIGHT_EXIT:-0}" = 0 ]; then ranks_done; fi; exit "${FAKE_PREFLIGHT_EXIT:-0}" ;;
esac
trap 'echo "signal USR1" >>"$log"; ranks_done; exit 0' USR1
trap 'echo "signal TERM" >>"$log"; exit 143' TERM
echo "training started" >>"$log"
for _ in $(seq 600); do sleep 0.1; done
echo "no signal" >>"$log"
exit 1
"""


@pytest.fixture
def fake_job(tmp_path):
    """(script, env, log): an SGE job script in tmp_path with a fake mpirun first on PATH and a fake venv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("mpirun", "srun"):
        launcher = bin_dir / name
        launcher.write_text(FAKE_LAUNCHER)
        launcher.chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    hostlist = tmp_path / "hostlist"  # PBS's form, for the PBS case
    hostlist.write_text("localhost\nlocalhost\n")
    pe_hostfile = tmp_path / "pe_hostfile"  # Grid Engine's: host, slots, queue, processors
    pe_hostfile.write_text("localhost 2 all.q@localhost UNDEFINED\n")
    log = tmp_path / "launcher.log"
    env = {k: v for k, v in clean_env().items() if not k.startswith("BASH_FUNC_module")}
    env.update(
        PATH=f"{bin_dir}:/usr/bin:/bin",
        PE_HOSTFILE=str(pe_hostfile),
        NSLOTS="2",
        JOB_ID="4242",
        FAKE_LAUNCHER_LOG=str(log),
        HOME=str(tmp_path),
    )

    def make(*extra, scheduler="sge"):
        head = {"sge": ["sge"], "pbs": ["pbs", "--group", "g1"], "slurm": ["slurm"]}[scheduler]
        script = tmp_path / "job.sh"
        defaults = {
            "--nodes": "1",
            "--gpus-per-node": "2",
            "--venv": str(tmp_path / "venv"),
            "--save-dir": "save",
            "--wandb-mode": "disabled",
            "--cpus-per-rank": "0",
        }
        # a flag in extra replaces its default (launch refuses one flag given twice with two values)
        given = [(flag, value) for flag, value in defaults.items() if flag not in extra]
        script.write_text(rendered(*head, *[w for pair in given for w in pair], *extra))
        return script

    return make, env, log


def start(script, env, cwd):
    return helpers.start_script(cwd, env, str(script))


def wait_for(path: Path, needle: str, timeout: float = HANG_S) -> None:
    """Until ``needle`` is in ``path``; ``timeout`` only ends a hang (a fake job's start-up takes seconds, minutes
    on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(
        f"{needle!r} not in {path} after {timeout} s: {path.read_text() if path.exists() else ''}"
    )


def kill_session(sid: int) -> None:
    """SIGKILL every process of a session: the script runs its launcher and its stop timer in process groups of
    their own (set -m), which killing the script's group alone would leave running."""
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after "pid (comm)": state, ppid, pgrp, session
            try:
                os.kill(int(stat_file.parent.name), signal.SIGKILL)
            except OSError:
                pass


def finish(proc, timeout=HANG_S):
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        kill_session(proc.pid)
    return out


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT], ids=lambda s: s.name
)
def test_a_stop_signal_reaches_the_launcher_as_sigusr1(fake_job, tmp_path, sig):
    """PBS/SLURM's SIGTERM, SGE -notify's SIGUSR1/SIGUSR2, Ctrl-C: mpirun gets SIGUSR1 (it would kill the ranks on
    SIGTERM), the script waits for it and exits with its status."""
    make, env, log = fake_job
    proc = start(make(), env, tmp_path)
    wait_for(log, "training started")
    os.kill(proc.pid, sig)
    out = finish(proc)
    assert proc.returncode == 0, out
    assert "signal USR1" in log.read_text() and "signal TERM" not in log.read_text()
    assert f"{sig.name} after" in out and f"stop requested by {sig.name}" in out


@pytest.mark.parametrize(
    "ignored", [(signal.SIGINT,), (signal.SIGINT, signal.SIGTERM)], ids=["INT", "INT+TERM"]
)
def test_a_stop_signal_ignored_on_entry_still_stops_the_job(fake_job, tmp_path, ignored):
    """Started as `job.sh &` from a script (SIGINT ignored) or under `trap '' TERM`: bash could not trap those; the
    job runtime (Python) arms them again, so the first of them stops the job cleanly through the launcher."""
    make, env, log = fake_job
    proc = helpers.start_script(tmp_path, env, str(make()), preexec=helpers.ignoring(*ignored))
    wait_for(log, "training started")
    os.kill(proc.pid, ignored[-1])
    out = finish(proc)
    assert proc.returncode == 0, out
    assert f"{ignored[-1].name} after" in out and f"stop requested by {ignored[-1].name}" in out, (
        out
    )
    assert "signal USR1" in log.read_text() and "signal TERM" not in log.read_text()


@pytest.mark.parametrize("scheduler", ["pbs", "slurm"])
def test_pbs_and_slurm_scripts_start_their_launcher_from_the_submit_directory(
    fake_job, tmp_path, scheduler
):
    make, env, log = fake_job
    env = {k: v for k, v in env.items() if k not in ("PE_HOSTFILE", "NSLOTS", "JOB_ID")}
    if scheduler == "pbs":  # PBS starts the job in $HOME; the script goes back to where qsub ran
        env.update(
            PBS_NODEFILE=str(tmp_path / "hostlist"),
            PBS_JOBID="77.pbs1",
            PBS_O_WORKDIR=str(tmp_path),
        )
        expected = f"argv -hostfile {tmp_path / 'hostlist'} --map-by ppr:2:node --bind-to none -x "
    else:  # srun passes the environment on by itself
        env.update(SLURM_JOB_ID="99", SLURM_SUBMIT_DIR=str(tmp_path))
        expected = (
            "argv --nodes=1 --ntasks-per-node=2 --export=ALL --kill-on-bad-exit=1 --cpu-bind=none "
        )
    proc = helpers.start_script(Path("/"), env, str(make(scheduler=scheduler)))
    wait_for(log, "training started")
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == 0, out
    argv = [ln for ln in log.read_text().splitlines() if ln.startswith("argv ")]
    assert argv[1].startswith(expected), argv[1]
    if (
        scheduler == "pbs"
    ):  # the job's id, as PBS set it and as the job runtime checked it, reaches every node
        assert "-x PBS_JOBID " in argv[1] and "-x OCTO_DIST_JOB_ID " in argv[1], argv[1]
    assert f"--save-dir={tmp_path / 'save'} " in argv[1] and "signal USR1" in log.read_text()


def test_the_script_asks_for_the_stop_before_the_wall_time(fake_job, tmp_path):
    make, env, log = fake_job
    started = time.monotonic()
    # The shortest training a job may have: 30 s before the stop (60 - 30).
    proc = start(make("--walltime", "0:01:00", "--stop-margin", "30"), env, tmp_path)
    out = finish(proc)
    took = time.monotonic() - started
    assert proc.returncode == 0, out
    # Never before the 30 s (what holds under any load); how much later depends on the machine's load.
    after = re.search(r"SIGUSR1 after (\d+)s", out)
    assert "signal USR1" in log.read_text() and after and int(after.group(1)) >= 30, out
    assert took > 29.5


def test_launcher_line_one_rank_per_gpu_and_key_stays_out_of_argv(fake_job, tmp_path):
    make, env, log = fake_job
    key_file = tmp_path / ".config" / "octo-dist" / "wandb_api_key"
    key_file.parent.mkdir(parents=True)
    key_file.write_text("sk-secret-0123456789\n")
    key_file.chmod(0o600)
    script = make("--wandb-mode", "online")
    assert "sk-secret" not in script.read_text()
    proc = start(script, env, tmp_path)
    wait_for(log, "training started")
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == 0, out
    argv = [ln for ln in log.read_text().splitlines() if ln.startswith("argv ")]
    assert len(argv) == 2 and "check-env --launch" in argv[0] and " smoke " in argv[1]
    assert argv[1].startswith("argv --map-by ppr:2:node --bind-to none -x ")
    for var in ("JOB_ID", "OCTO_DIST_JOB_ID", "WANDB_MODE", "WANDB_API_KEY", "OCTO_DIST_NODEFILE"):
        assert f"-x {var} " in argv[1]
    assert "PE_HOSTFILE" not in argv[1]  # the scheduler's variable is left as it set it
    assert "sk-secret" not in "".join(argv) and "sk-secret" not in out
    assert (
        "env WANDB_API_KEY=sk-secret-0123456789" in log.read_text()
    )  # the ranks do get it, through the environment
    assert f"--save-dir={tmp_path / 'save'} " in argv[1] and argv[1].endswith(" --resume ")
    assert not (
        tmp_path / "save" / ".octo-dist-job-4242"
    ).exists()  # the ranks' copy of the node list is removed


def test_a_key_file_others_can_read_is_refused(fake_job, tmp_path):
    make, env, log = fake_job
    key_file = tmp_path / "key"
    key_file.write_text("sk-secret-0123456789\n")
    key_file.chmod(0o644)
    proc = start(make("--wandb-mode", "online"), {**env, "WANDB_KEY_FILE": str(key_file)}, tmp_path)
    out = finish(proc)
    assert (
        proc.returncode == 2
        and "has mode 644; expected 600 or 400" in out
        and f"chmod 600 {key_file}" in out
    )
    assert not log.exists()  # refused before any rank started


@pytest.mark.parametrize(
    "content, found",
    [
        (bytes(range(256)), "not printable ASCII text"),
        (b"", "empty"),
        (b"k" * 5000, "over 4096 bytes"),
    ],
    ids=["binary", "empty", "huge"],
)
def test_a_key_file_that_holds_no_key_is_one_line(fake_job, tmp_path, content, found):
    """Before: a binary key file ended the job in a UnicodeDecodeError traceback (exit 1)."""
    make, env, log = fake_job
    key_file = tmp_path / "key"
    key_file.write_bytes(content)
    key_file.chmod(0o600)
    proc = start(make("--wandb-mode", "online"), {**env, "WANDB_KEY_FILE": str(key_file)}, tmp_path)
    out = finish(proc)
    assert proc.returncode == 2 and f"{key_file} is {found}; expected one wandb API key" in out, out
    assert "Traceback" not in out and not log.exists()  # refused before any rank started


def test_online_without_any_key_is_refused(fake_job, tmp_path):
    make, env, log = fake_job
    proc = start(make("--wandb-mode", "online"), env, tmp_path)
    out = finish(proc)
    assert proc.returncode == 2 and "no wandb key" in out and "--wandb-mode offline" in out


def test_a_failed_preflight_stops_before_training(fake_job, tmp_path):
    make, env, log = fake_job
    proc = start(make(), {**env, "FAKE_PREFLIGHT_EXIT": "3"}, tmp_path)
    out = finish(proc)
    assert proc.returncode == 3 and "preflight failed (exit 3): not training" in out
    assert "training started" not in log.read_text()


def test_outside_a_job_the_script_says_to_submit_it(fake_job, tmp_path):
    make, env, log = fake_job
    env = {k: v for k, v in env.items() if k != "PE_HOSTFILE"}
    proc = start(make(), env, tmp_path)
    out = finish(proc)
    assert proc.returncode == 2 and "PE_HOSTFILE is ''" in out and "qsub job.sh" in out


def test_a_grid_engine_pe_of_another_shape_is_refused_naming_it(fake_job, tmp_path):
    """PE_HOSTFILE with both slots on one host (a PE whose allocation_rule fills up a node): refused before mpirun."""
    make, env, log = fake_job
    (tmp_path / "pe_hostfile").write_text("node001 2 all.q@node001 UNDEFINED\n")
    proc = start(make("--nodes", "2", "--gpus-per-node", "1"), env, tmp_path)
    out = finish(proc)
    assert proc.returncode == 2 and "NSLOTS=2 as node001:2" in out and "allocation_rule is 1" in out
    assert not log.exists() or "argv" not in log.read_text()


# ---- for real: the smoke job's 2 ranks under the venv's mpirun, in a fake SGE / PBS job -----------------------------

MANIFEST = REPO / "env" / "stack.toml"


def _without_git_tables(text: str) -> str:
    out, skip = [], False
    for line in text.splitlines():
        if line.startswith("["):
            skip = line.startswith("[git.")
        if not skip:
            out.append(line)
    return "\n".join(out) + "\n"


def real_job_env(tmp_path: Path, **scheduler_vars: str) -> dict:
    """The job's environment: the venv's mpirun first on PATH, no `module`, root allowed through OMPI_* (not flags)."""
    if not (VENV_BIN / "mpirun").exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    env = {
        k: v
        for k, v in clean_env().items()
        if not k.startswith("BASH_FUNC_module") and k != "MODULESHOME"
    }
    env.update(PATH=f"{VENV_BIN}:/usr/bin:/bin", **scheduler_vars)
    env.pop("PYTHONPATH", None)  # the ranks run the venv's octo-dist, as on a cluster
    # The ranks compile fast (helpers.COMPILE_FAST; the job forwards XLA_ variables to every rank): these jobs test
    # the script, its launcher and how the job stops, not what XLA's optimiser does.
    env["XLA_FLAGS"] = COMPILE_FAST
    # The preflight refuses to train in an environment that fails check-env: that is its job. A venv holding a local,
    # unpinned octo/dlimp (a developer's checkout) fails only the git.* checks; they are not what is tested here.
    check = subprocess.run(
        [str(VENV_BIN / "octo-dist"), "check-env", "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        import json

        failing = [c["id"] for c in json.loads(check.stdout)["checks"] if c["status"] == "fail"]
        if not all(f.startswith("git.") for f in failing):
            pytest.skip(
                f"this venv fails check-env ({', '.join(failing)}): the job's preflight would refuse to train"
            )
        manifest = tmp_path / "stack-without-git.toml"
        manifest.write_text(_without_git_tables(MANIFEST.read_text()))
        env["OCTO_DIST_MANIFEST"] = str(manifest)
    return env


def smoke_script(tmp_path: Path, scheduler: str, *extra: str) -> Path:
    argv = [
        scheduler,
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--walltime",
        "0:30:00",
        "--venv",
        str(VENV_BIN.parent),
        "--save-dir",
        "save",
        "--wandb-mode",
        "disabled",
        "--per-gpu-batch",
        "4",
        *extra,
    ]
    if scheduler == "pbs":
        argv[1:1] = ["--group", "gxx00000"]
    script = tmp_path / f"{scheduler}.sh"
    script.write_text(rendered(*argv))
    return script


@pytest.mark.mpi
@pytest.mark.slow
def test_sge_script_runs_the_smoke_job_on_two_ranks(tmp_path):
    hosts = tmp_path / "pe_hostfile"
    hosts.write_text("localhost 2 all.q@localhost UNDEFINED\n")
    env = real_job_env(tmp_path, PE_HOSTFILE=str(hosts), NSLOTS="2", JOB_ID="4242")
    script = smoke_script(tmp_path, "sge", "--", "smoke", "--model", "tiny", "--steps", "4")
    started = time.monotonic()
    proc = helpers.run_script(tmp_path, env, str(script))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "every rank agrees; start-up works" in out  # the preflight, under the same mpirun
    assert "2 rank(s) x 1 cpu device(s) = 2 device(s), global batch 8" in out
    assert "steps 0 -> 4 of 4" in out and "parameters identical on every rank" in out
    assert (tmp_path / "save" / "4").is_dir() and not list(
        (tmp_path / "save").glob(".octo-dist-job-*")
    )
    print(f"SGE job: {time.monotonic() - started:.0f} s")


# Open MPI 5.0.8's prterun often aborts (a glibc assertion, exit 134; 137 seen under the job script) while it ends a
# job one of whose ranks refused to start (exit 2); this wrapper makes a crash certain, around the real mpirun and
# ranks.
CRASHING_MPIRUN = """#!/bin/bash
"$REAL_MPIRUN" "$@"
status=$?
if [ "$status" -ne 0 ]; then kill -ABRT $$; fi
exit "$status"
"""


@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpirun", "mpirun-then-abort"])
def test_a_ranks_refusal_is_the_jobs_final_word_when_the_launcher_crashes_after_it(
    tmp_path, launcher
):
    """RANK=0 exported to both ranks (a stale export): rank 1's preflight refuses with exit 2, whatever the launcher
    exits with after it; the job exits 2 and its last line names that rank, not the launcher's crash."""
    hosts = tmp_path / "nodefile"
    hosts.write_text("localhost\nlocalhost\n")
    env = real_job_env(
        tmp_path, PBS_NODEFILE=str(hosts), PBS_JOBID="78.pbs1", PBS_O_WORKDIR=str(tmp_path)
    )
    env.update(RANK="0", WORLD_SIZE="2")
    if launcher == "mpirun-then-abort":
        wrapper = tmp_path / "bin" / "mpirun"
        wrapper.parent.mkdir()
        wrapper.write_text(CRASHING_MPIRUN)
        wrapper.chmod(0o755)
        env.update(PATH=f"{wrapper.parent}:{env['PATH']}", REAL_MPIRUN=str(VENV_BIN / "mpirun"))
    script = smoke_script(tmp_path, "pbs", "--", "smoke", "--model", "tiny", "--steps", "4")
    proc = helpers.run_script(tmp_path, env, str(script))
    out = proc.stdout + proc.stderr
    assert "openmpi5 says rank 1 of 2 (local 1) but RANK=0 is also set" in out, out
    last = proc.stderr.rstrip("\n").splitlines()[-1]
    assert proc.returncode == 2, out
    assert last.startswith("octo-dist job: preflight failed: rank 1 on "), last
    assert "exited with status 2" in last and "not training" in last, last
    if launcher == "mpirun-then-abort":
        # 134 when the wrapper's abort comes first; 143 when the job ends the failed launcher first
        # (FAILED_GRACE_S after the refusal), 137 when the launcher outlived that SIGTERM too (END_WAIT_S: a CI run's
        # prterun, slow to end on a busy machine). Whichever, the rank's refusal is the final word.
        assert re.search(r"the launcher then exited with status (134|137|143)\)", last), last


@pytest.mark.mpi
@pytest.mark.slow
def test_pbs_script_stops_the_smoke_job_with_a_checkpoint_on_sigterm(tmp_path):
    """PBS's wall-time SIGTERM to the job script: every rank stops at a step boundary, saves, and the job exits 0."""
    hosts = tmp_path / "nodefile"
    hosts.write_text("localhost\nlocalhost\n")
    env = real_job_env(
        tmp_path, PBS_NODEFILE=str(hosts), PBS_JOBID="77.pbs1", PBS_O_WORKDIR=str(tmp_path)
    )
    # Paced (a step at most every 0.5 s, the same parameters): the ranks wait for the SIGTERM instead of training flat
    # out on the 2 cores the test shares, and a stop still comes within a step.
    script = smoke_script(
        tmp_path, "pbs", "--steps", "100000", "--", "smoke", "--model", "tiny", "--step-time", "0.5"
    )
    started = time.monotonic()
    proc = helpers.start_script(Path("/"), env, str(script))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    # Both ranks hold the stop handler once the first checkpoint (step 10: the smoke job's default --save-every)
    # is complete: orbax writes it with every process, ending in its barrier, and octo-dist writes its checksum
    # record last.
    first = tmp_path / "save" / "10" / "checksums.json"

    def saved_or_ended() -> bool:
        return first.exists() or proc.poll() is not None

    try:
        helpers.wait_until(
            saved_or_ended, watch=[tmp_path], what=str(first), tail=lambda: "".join(lines)[-3000:]
        )
        assert proc.poll() is None, f"the job ended before {first} appeared:\n" + "".join(lines)
        signalled = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(HANG_S) == 0, "".join(lines)
    finally:
        kill_session(proc.pid)
    reader.join(10)
    out = "".join(lines)
    assert "SIGTERM after" in out and "stopped by SIGUSR1 (checkpoint saved)" in out, out
    assert "parameters identical on every rank" in out
    # The stop's own checkpoint, at the step it stopped ("steps 0 -> 11 of 100000"), complete and verified.
    stop = int(re.search(r"steps 0 -> (\d+) of 100000", out)[1])
    assert stop >= 10 and checksums.verify(tmp_path / "save" / str(stop), stop) is None, out
    print(
        f"PBS job: {signalled - started:.0f} s to its first checkpoint, stopped "
        f"{time.monotonic() - signalled:.0f} s after SIGTERM at step {stop}"
    )


def test_the_training_command_is_checked_by_the_checker_given_for_it(tmp_path, capsys):
    """jobs/ never imports the applications: the caller hands it a checker per command (argv -> None, or ValueError
    naming the bad flag), which sees the arguments every rank will get."""

    def smoke_checker(argv):
        for arg in argv:
            if arg.startswith("--stepz"):
                raise ValueError("unknown flag --stepz, did you mean --steps?")

    with pytest.raises(spec.JobSpecError, match="did you mean --steps"):
        parse(
            ["sge", "--nodes", "1", "--gpus-per-node", "4", "--", "smoke", "--stepz", "3"],
            checkers={"smoke": smoke_checker},
        )
    seen = []
    parse(
        [
            "sge",
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "--steps",
            "5",
            "--",
            "smoke",
            "--model",
            "tiny",
        ],
        checkers={"smoke": seen.append, "finetune": smoke_checker},
    )
    assert seen == [
        [
            "--steps=5",
            "--wandb-mode=disabled",
            "--save-dir=runs/octo-dist",
            "--compile-cache=.octo-dist/compile-cache",
            "--model",
            "tiny",
            "--resume",
        ]
    ]
    # Through the command: exit 2, one line, nothing written.
    import argparse

    from octo_dist.jobs import cli as jobs_cli

    parser = argparse.ArgumentParser(prog="octo-dist")
    jobs_cli.add_parser(parser.add_subparsers(), checkers={"smoke": smoke_checker})
    out = tmp_path / "job.sh"
    args = parser.parse_args(
        [
            "launch",
            "sge",
            "--nodes",
            "1",
            "--gpus-per-node",
            "4",
            "-o",
            str(out),
            "--",
            "smoke",
            "--stepz",
            "3",
        ]
    )
    assert args.func(args) == 2 and not out.exists()
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "-- smoke: unknown flag --stepz, did you mean --steps?" in err
    ), err


@pytest.mark.parametrize("scheduler", sorted(BASE))
def test_each_schedulers_help_stands_alone(scheduler):
    """Every option has a help line with its default, and speaks of this scheduler only."""
    import argparse

    from octo_dist.jobs import cli as jobs_cli

    parser = argparse.ArgumentParser(prog="octo-dist")
    jobs_cli.add_parser(parser.add_subparsers())
    sub = (
        parser._subparsers._group_actions[0]
        .choices["launch"]
        ._subparsers._group_actions[0]
        .choices[scheduler]
    )
    for action in sub._actions:
        if action.dest in ("help",):
            continue
        assert action.help and ("default" in action.help or "(required)" in action.help), (
            action.dest,
            action.help,
        )
        assert "``" not in action.help and ":ref:" not in action.help and "seed" not in action.help
    text = sub.format_help()
    others = {
        "pbs": ("PE_HOSTFILE", "sbatch", "--pe PE", "--queue"),
        "sge": ("rt_HF", "hpcx/2.20", "sbatch", "SGE_JOB_HOSTLIST", "rt_F"),
        "slurm": ("rt_HF", "hpcx", "qsub", "PBS_NODEFILE"),
    }[scheduler]
    for word in others:
        assert word not in text, (word, text)


def test_a_syntax_check_that_hangs_is_refused_not_waited_for(tmp_path, monkeypatch):
    # A `bash` that never answers (a wedged login node): the check gives up after its timeout.
    from octo_dist.jobs import cli as jobs_cli

    helpers.fake_program(tmp_path, "bash", "exec sleep 600")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(jobs_cli, "SYNTAX_CHECK_TIMEOUT_S", 1)
    with pytest.raises(
        jobs_cli.ScriptError, match="did not finish within 1 s; nothing was written"
    ):
        jobs_cli.syntax_check("echo hi\n")
