"""Rendered job scripts cannot run what a value smuggles in, end a launcher left running after a rank failed, bind
each rank to its own cores, and render the same on the login nodes' Pythons (3.9, 3.12) as here.

The scripts run for real under bash, with stand-ins on PATH for the tools a cluster has (mpirun, singularity,
module) and a fake venv whose ``octo-dist`` records the argv each rank got.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import HANG_S, REPO, clean_env
from test_launch import kill_session
from octo_dist.jobs import cli as jobs_cli
from octo_dist import cli
from octo_dist.jobs import examples, render
from octo_dist.jobs.cli import parse

VENV_BIN = Path(sys.executable).parent
SHELLCHECK = shutil.which("shellcheck", path=str(VENV_BIN)) or shutil.which("shellcheck")
MARKER = "PWNED"  # a hostile value tries to create a file of this name

# Each tries a different way out of a shell word: substitution, quotes, separators, globbing, history, escapes.
HOSTILE = [
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f'"; touch {MARKER}; echo "',
    f"'; touch {MARKER}; echo '",
    f"x;touch {MARKER}",
    f"x && touch {MARKER}",
    f"x | touch {MARKER}",
    f"${{IFS}}touch${{IFS}}{MARKER}",
    f"$(touch${{IFS}}{MARKER})",
    "x*",
    "!x",
    "x\\",
    "$HOME",
    "x y",
    "ünïcødé",
]
# Refused outright: they can end a comment or a quoted word, or hide text from the reader.
UNPRINTABLE = [
    f"x\ntouch {MARKER} #",
    f"x\rtouch {MARKER}",
    "x\x1b[2Ky",
    "x\u202ey",
    "x\x00y",
    "1:00:00\n",
]

# option -> how a hostile value goes in (paths are relative: the marker would land in the job's directory).
FIELDS = {
    "--save-dir": lambda v: ["--save-dir", v],
    "--data-dir": lambda v: ["--data-dir", v, "--", "finetune"],
    "--venv": lambda v: ["--venv", v],
    "--image": lambda v: ["--image", v, "--skip-image-check"],
    "--module": lambda v: ["--module", v],
    "--bind": lambda v: ["--image", "img.sif", "--skip-image-check", "--bind", v],
    "--compile-cache": lambda v: ["--compile-cache", v],
    "-- smoke": lambda v: ["--", "smoke", "--wandb-project", v],
    "-- finetune": lambda v: ["--", "finetune", f"--config.pretrained_path={v}"],
    "--name": lambda v: ["--name", v],
    "--group": lambda v: ["--group", v],
    "--coordinator": lambda v: ["--coordinator", v],
    "--walltime": lambda v: ["--walltime", v],
    "--wandb-mode": lambda v: ["--wandb-mode", v],
    "--pe": lambda v: [
        "--pe",
        v,
    ],  # Grid Engine's directives (PBS's resource type is a table lookup)
    "--queue": lambda v: ["--queue", v],
    "-o": lambda v: ["-o", v],  # after launch()'s own -o: argparse keeps the last
}

FAKE_MPIRUN = r"""#!/bin/bash
# Stands in for mpirun: skips its options, then runs the command as FAKE_RANKS ranks on this host.
echo "mpirun $*" >>"$FAKE_LOG"
while [ $# -gt 0 ]; do
  case "$1" in -hostfile|--map-by|--bind-to|-x) shift 2 ;; *) break ;; esac
done
trap '' TERM  # FAKE_HANG: like an mpirun that lost a node, it ignores SIGTERM and, once a rank failed, hangs
pids=()
for rank in $(seq 0 $((${FAKE_RANKS:-1} - 1))); do
  OMPI_COMM_WORLD_RANK=$rank "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
if [ "$status" -ne 0 ] && [ -n "${FAKE_HANG:-}" ]; then while :; do sleep 1; done; fi
exit "$status"
"""

FAKE_SINGULARITY = r"""#!/bin/bash
# Stands in for `singularity exec [--nv] [--bind DIR]... IMAGE CMD...`: records the image, runs CMD on the host.
[ "$1" = exec ] || exit 64
shift
while [ $# -gt 0 ]; do
  case "$1" in --nv) shift ;; --bind) echo "bind $2" >>"$FAKE_LOG"; shift 2 ;; *) break ;; esac
done
echo "image $1" >>"$FAKE_LOG"
shift
PATH=$FAKE_IMAGE_BIN:$PATH exec "$@"  # the image's octo-dist
"""

FAKE_MODULE = """#!/bin/bash
echo "module $*" >>"$FAKE_LOG"
"""

FAKE_OCTO_DIST = f"""#!{sys.executable}
# Stands in for octo-dist on every rank: records its argv, one JSON line; FAKE_FAIL_RANK exits 3, others may sleep.
# `octo-dist job-runtime -o FILE` (the script asking the image for its job runtime) is the real one: not a rank.
import json, os, sys, time
if sys.argv[1:2] == ["job-runtime"]:
    os.execv(sys.executable, [sys.executable, "-m", "octo_dist", *sys.argv[1:]])
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "?")
with open(os.environ["FAKE_ARGV_LOG"], "a") as f:
    f.write(json.dumps({{"rank": rank, "argv": sys.argv[1:]}}) + "\\n")
if rank == os.environ.get("FAKE_FAIL_RANK"):
    sys.exit(3)
if os.environ.get("FAKE_SLEEP") and "check-env" not in sys.argv:
    time.sleep(float(os.environ["FAKE_SLEEP"]))
"""


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def cluster(tmp_path):
    """(job_dir, env, argv_log): a Grid Engine job's environment with stand-ins on PATH; the job runs in job_dir."""
    tools = tmp_path / "tools"
    tools.mkdir()
    _executable(tools / "mpirun", FAKE_MPIRUN)
    _executable(tools / "singularity", FAKE_SINGULARITY)
    _executable(tools / "module", FAKE_MODULE)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    hostlist = tmp_path / "pe_hostfile"
    hostlist.write_text("localhost 4 all.q@localhost UNDEFINED\n")
    env = {k: v for k, v in clean_env().items() if not k.startswith("BASH_FUNC_module")}
    env.update(
        PATH=f"{tools}:/usr/bin:/bin",
        PE_HOSTFILE=str(hostlist),
        NSLOTS="4",
        JOB_ID="4242",
        HOME=str(tmp_path),
        FAKE_LOG=str(tmp_path / "tools.log"),
        FAKE_ARGV_LOG=str(tmp_path / "argv.log"),
    )
    return job_dir, env, tmp_path / "argv.log"


def with_slots(env: dict, slots: int) -> dict:
    """The job's Grid Engine variables for one node with ``slots`` slots (the rendered script checks the shape)."""
    Path(env["PE_HOSTFILE"]).write_text(f"localhost {slots} all.q@localhost UNDEFINED\n")
    return dict(env, NSLOTS=str(slots))


def fake_venv(where: Path) -> None:
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "python").symlink_to(sys.executable)
    _executable(where / "bin" / "octo-dist", FAKE_OCTO_DIST)


def markers(root: Path) -> list:
    return [str(p) for p in root.rglob(MARKER) if p.is_file()]


def shellcheck(path: Path) -> None:
    if SHELLCHECK:
        proc = subprocess.run(
            [SHELLCHECK, "--shell=bash", str(path)], capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout


def launch(tmp_path: Path, argv: list, capsys) -> tuple:
    """``octo-dist launch`` -> (exit code, stderr, script path or None)."""
    out = tmp_path / "job" / "job.sh"
    try:
        code = cli.main(["launch", argv[0], "-o", str(out), *argv[1:]])
    except (
        SystemExit
    ) as e:  # argparse's own refusals (a value outside --wandb-mode's choices): usage + error
        code = e.code
    return code, capsys.readouterr().err, (out if out.exists() else None)


def one_line_refusal(err: str) -> bool:
    """octo-dist's refusals are one line with found/expected/fix; argparse's (usage, then error) end in 'error:'."""
    if err.startswith("usage:"):
        return "error: argument" in err
    return (
        err.startswith("octo-dist launch: error: ")
        and err.count("\n") == 1
        and "; expected " in err
        and ". Fix: " in err
    )


# Two jobs carry a hostile value in every field that takes free text: the venv and the smoke job, then the image
# and the finetune job with its data and an extra bind.
def venv_job(v: str) -> list:
    return [
        "--save-dir",
        f"{v}s",
        "--venv",
        f"{v}v",
        "--module",
        v,
        "--compile-cache",
        f"{v}c",
        "--",
        "smoke",
        "--wandb-project",
        v,
    ]


def image_job(v: str) -> list:
    return [
        "--image",
        f"{v}.sif",
        "--skip-image-check",
        "--bind",
        f"{v}b",
        "--save-dir",
        f"{v}s",
        "--data-dir",
        f"{v}d",
        "--",
        "finetune",
        f"--config.pretrained_path={v}",
    ]


HEADS = {
    "sge": ["sge", "--nodes", "1", "--gpus-per-node", "1"],
    "pbs": ["pbs", "--nodes", "1", "--group", "g1"],
    "slurm": ["slurm", "--nodes", "1", "--gpus-per-node", "1"],
}


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_reach_the_ranks_as_data(cluster, tmp_path, capsys, value):
    """Every free-text field holds the value as it is: the scripts of every scheduler pass shellcheck, and running
    the Grid Engine one under the stand-ins gives the ranks the very same strings and creates no marker file."""
    job_dir, env, argv_log = cluster
    for n, (job, container) in enumerate(((venv_job, "venv"), (image_job, "image"))):
        scripts = []
        for scheduler, head in HEADS.items():
            out = tmp_path / f"{scheduler}-{container}.sh"
            assert cli.main(["launch", *head, "-o", str(out), *job(value)]) == 0, (
                capsys.readouterr().err
            )
            scripts.append(out)
        capsys.readouterr()
        if SHELLCHECK:
            proc = subprocess.run(
                [SHELLCHECK, "--shell=bash", *map(str, scripts)], capture_output=True, text=True
            )
            assert proc.returncode == 0, proc.stdout
        run_dir = tmp_path / f"run{n}"
        shutil.copytree(job_dir, run_dir)
        shutil.copy(scripts[0], run_dir / "job.sh")
        if container == "venv":
            fake_venv(run_dir / f"{value}v")
        else:
            fake_venv(run_dir / "image")
            (run_dir / f"{value}.sif").write_bytes(b"SIF")
            (run_dir / f"{value}d").mkdir()
            (run_dir / f"{value}b").mkdir()
        argv_log.unlink(missing_ok=True)
        proc = helpers.run_script(
            run_dir, dict(with_slots(env, 1), FAKE_IMAGE_BIN=str(run_dir / "image" / "bin"))
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert not markers(tmp_path), markers(tmp_path)
        ranks = [json.loads(ln) for ln in argv_log.read_text().splitlines()]
        assert len(ranks) == 2 and ranks[0]["argv"][:2] == ["check-env", "--launch"], ranks
        train = ranks[1]["argv"]
        tools = (tmp_path / "tools.log").read_text()
        if container == "venv":
            assert train[:3] == ["smoke", "--wandb-project", value] or value in train, train
            assert f"--save-dir={run_dir / (value + 's')}" in train, train
            assert f"--compile-cache={run_dir / (value + 'c')}" in train, train
            assert f"module load {value}\n" in tools, tools
        else:
            assert f"--config.pretrained_path={value}" in train, train
            assert f"--config.dataset_kwargs.data_dir={run_dir / (value + 'd')}" in train, train
            assert (
                f"image {run_dir / (value + '.sif')}\n" in tools
                and f"bind {run_dir / (value + 'b')}\n" in tools
            )
        (tmp_path / "tools.log").unlink()
        shutil.rmtree(run_dir)


@pytest.mark.parametrize(
    "field", ["--name", "--group", "--coordinator", "--walltime", "--wandb-mode", "--pe", "--queue"]
)
def test_scheduler_directives_take_no_free_text(tmp_path, capsys, field):
    """What lands in #PBS/#$/#SBATCH lines or in a number is refused unless it has the expected form."""
    (tmp_path / "job").mkdir()
    for value in HOSTILE:
        code, err, script = launch(
            tmp_path, ["sge", "--nodes", "1", "--gpus-per-node", "4", *FIELDS[field](value)], capsys
        )
        assert code == 2 and script is None and one_line_refusal(err), (value, err)


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_unprintable_values_are_refused_in_every_field(tmp_path, capsys, field):
    (tmp_path / "job").mkdir()
    for value in UNPRINTABLE:
        if "\x00" in value and field != "-- smoke":
            continue  # argv cannot hold NUL; tested once through the training command's path below
        argv = ["sge", "--nodes", "1", "--gpus-per-node", "4", *FIELDS[field](value)]
        if "\x00" in value:
            with pytest.raises(Exception):
                parse(argv)
            continue
        code, err, script = launch(tmp_path, argv, capsys)
        assert code == 2 and script is None and one_line_refusal(err), (field, value, err)


@pytest.mark.parametrize(
    "name", [f"$(touch {MARKER}).sh", f'a"; touch {MARKER}; echo ".sh', "a'b.sh", "a b.sh"]
)
def test_a_hostile_script_name_stays_data(cluster, tmp_path, capsys, name):
    """-o lands in the header's submit hint and in the 'submit it' error: quoted in both."""
    job_dir, env, _ = cluster
    out = job_dir / name
    assert (
        cli.main(
            [
                "launch",
                "sge",
                "--nodes",
                "1",
                "--gpus-per-node",
                "4",
                "--venv",
                "venv",
                "-o",
                str(out),
            ]
        )
        == 0
    ), capsys.readouterr().err
    shellcheck(out)
    fake_venv(
        job_dir / "venv"
    )  # the script hands over to the venv's job runtime, which sees no job
    env = {
        k: v for k, v in env.items() if k != "PE_HOSTFILE"
    }  # outside a job: the script says to submit it
    proc = helpers.run_script(job_dir, env, str(out))
    assert proc.returncode == 2 and f"qsub {name})" in proc.stderr, proc.stderr
    assert not markers(tmp_path)


def test_output_that_is_a_directory_or_in_a_missing_one_is_refused(tmp_path, capsys):
    assert (
        cli.main(["launch", "sge", "--nodes", "1", "--gpus-per-node", "4", "-o", str(tmp_path)])
        == 2
    )
    err = capsys.readouterr().err
    assert (
        "is a directory" in err
        and err.count("\n") == 1
        and f"-o {tmp_path}/octo-dist-sge.sh" in err
    )
    assert (
        cli.main(
            [
                "launch",
                "sge",
                "--nodes",
                "1",
                "--gpus-per-node",
                "4",
                "-o",
                str(tmp_path / "no" / "job.sh"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "does not exist" in err and f"mkdir -p {tmp_path / 'no'}" in err


def test_bash_n_catches_a_script_bash_cannot_parse():
    """The last check before a script is written (a broken template is octo-dist's bug, not the user's)."""
    with pytest.raises(jobs_cli.ScriptError, match="fails bash -n"):
        jobs_cli.syntax_check("#!/bin/bash\nif then fi\n")
    jobs_cli.syntax_check(render.render(parse(["sge", "--nodes", "1", "--gpus-per-node", "4"])))


# ---- a failed rank ends the job --------------------------------------------------------------------------------------


def test_a_failed_rank_ends_a_launcher_that_hangs(cluster, tmp_path):
    job_dir, env, argv_log = cluster
    fake_venv(job_dir / "venv")
    (job_dir / "job.sh").write_text(
        render.render(
            parse(
                [
                    "sge",
                    "--nodes",
                    "1",
                    "--gpus-per-node",
                    "2",
                    "--venv",
                    "venv",
                    "--cpus-per-rank",
                    "0",
                ]
            )
        )
    )
    # The preflight passes on both ranks; in training rank 1 fails at once and rank 0 would run for 10 minutes.
    (job_dir / "venv" / "bin" / "octo-dist").write_text(
        FAKE_OCTO_DIST.replace(
            'if rank == os.environ.get("FAKE_FAIL_RANK"):',
            'if rank == os.environ.get("FAKE_FAIL_RANK") and "check-env" not in sys.argv:',
        )
    )
    env = dict(
        with_slots(env, 2), FAKE_RANKS="2", FAKE_HANG="1", FAKE_SLEEP="600", FAKE_FAIL_RANK="1"
    )
    proc = helpers.start_script(job_dir, env)
    try:
        out, _ = proc.communicate(
            timeout=HANG_S
        )  # the script's own grace is 20 s + 10 s; its words below say it ended the launcher
    finally:
        kill_session(proc.pid)
    assert proc.returncode not in (0, None), out
    assert "rank 1 on " in out and "exited with status 3" in out, out
    assert "still running 20s after a rank failed: ending it" in out, out
    assert not (job_dir / "runs" / "octo-dist" / ".octo-dist-job-4242").exists()


# ---- CPU binding, for real under the venv's mpirun -------------------------------------------------------------------


def real_mpirun_venv(job_dir: Path, octo_dist: str) -> None:
    """A venv in job_dir whose octo-dist is the bash lines given, for a script run under the venv's real mpirun."""
    if not (VENV_BIN / "mpirun").exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    venv = job_dir / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    _executable(venv / "octo-dist", "#!/bin/bash\n" + octo_dist)


@pytest.mark.mpi
def test_each_rank_gets_its_own_cores_under_the_real_mpirun(cluster, tmp_path):
    """Two ranks, one core each (this machine: 1 socket, 2 cores): each rank's allowed CPUs are its own."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs")
    job_dir, env, _ = cluster
    # Each rank writes its own file (never parse several ranks' stdout).
    real_mpirun_venv(
        job_dir,
        'grep Cpus_allowed_list /proc/self/status >"$RANK_OUT/rank-$OMPI_COMM_WORLD_RANK"\n',
    )
    (job_dir / "job.sh").write_text(
        render.render(
            parse(
                [
                    "sge",
                    "--nodes",
                    "1",
                    "--gpus-per-node",
                    "2",
                    "--venv",
                    "venv",
                    "--cpus-per-rank",
                    "1",
                ]
            )
        )
    )
    env = dict(with_slots(env, 2), PATH=f"{VENV_BIN}:/usr/bin:/bin", RANK_OUT=str(tmp_path))
    proc = helpers.run_script(job_dir, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cpus = [(tmp_path / f"rank-{r}").read_text().split(":")[1].strip() for r in (0, 1)]
    assert len(set(cpus)) == 2 and all("-" not in c and "," not in c for c in cpus), (
        cpus
    )  # one core each, not shared


# ---- the login nodes' Pythons ----------------------------------------------------------------------------------------

PYTHONS = {
    "3.9": "/root/.pyenv/versions/3.9.18/bin/python",
    "3.12": "/root/.pyenv/versions/3.12.1/bin/python",
}


@pytest.mark.parametrize("version", sorted(PYTHONS))
def test_every_scheduler_renders_the_same_on_a_bare_python(version, tmp_path):
    """ABCI's login nodes have Python 3.9.18 (system) and 3.12: launch needs nothing but the standard library."""
    python = PYTHONS[version]
    if not os.access(python, os.X_OK):
        pytest.skip(f"no Python {version} at {python} (pyenv install {version})")
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),
        "PYTHONNOUSERSITE": "1",
    }
    check = subprocess.run(
        [python, "-S", "-m", "octo_dist.jobs.examples", "--check", str(REPO / "scripts" / "jobs")],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert check.returncode == 0, check.stderr
    schedulers = {name: argv[0] for name, argv in examples.EXAMPLES.items()}
    assert set(schedulers.values()) == {"pbs", "sge", "slurm"}
    # The command itself, with -S (no site-packages at all): writes a script for every scheduler.
    for scheduler, extra in (
        ("pbs", ["--group", "gxx00000"]),
        ("sge", ["--gpus-per-node", "4"]),
        ("slurm", ["--gpus-per-node", "4"]),
    ):
        code = (
            "import sys; from octo_dist.jobs import cli; import argparse; p = argparse.ArgumentParser(); "
            "s = p.add_subparsers(); cli.add_parser(s); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
        )
        out = tmp_path / f"{scheduler}.sh"
        proc = subprocess.run(
            [python, "-S", "-c", code, "launch", scheduler, "--nodes", "2", *extra, "-o", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert proc.returncode == 0 and out.exists(), proc.stderr
        assert out.read_text() == render.render(
            parse([scheduler, "--nodes", "2", *extra, "-o", str(out)]), out.name
        )


# ---- a chain of jobs (launch --chain) --------------------------------------------------------------------------------


def test_a_chained_job_trains_only_after_a_job_that_did_not_fail(cluster):
    """Each job leaves its exit status in the save directory; the next one (OCTO_DIST_AFTER) refuses to train after
    a failure, and says why, but continues after a clean end or a stop."""
    job_dir, env, argv_log = cluster
    fake_venv(job_dir / "venv")
    (job_dir / "job.sh").write_text(
        render.render(
            parse(
                [
                    "sge",
                    "--nodes",
                    "1",
                    "--gpus-per-node",
                    "1",
                    "--venv",
                    "venv",
                    "--save-dir",
                    "save",
                ]
            )
        )
    )

    def job(job_id, after=None, **extra):
        env_job = dict(with_slots(env, 1), JOB_ID=job_id, **extra)
        if after:
            env_job["OCTO_DIST_AFTER"] = after
        argv_log.unlink(missing_ok=True)
        return helpers.run_script(job_dir, env_job)

    first = job("10")
    assert (
        first.returncode == 0 and (job_dir / "save" / ".octo-dist-exit-10").read_text() == "0\n"
    ), first.stderr
    second = job(
        "11", after="10", FAKE_FAIL_RANK="0"
    )  # trains after a clean job, then its rank fails
    assert (
        second.returncode == 3 and (job_dir / "save" / ".octo-dist-exit-11").read_text() == "3\n"
    ), second.stderr
    third = job("12", after="11")
    assert third.returncode == 2 and not argv_log.exists(), third.stderr  # no rank started
    assert "previous job of this chain (11) failed with exit 3: not training" in third.stderr
    fourth = job("13", after="9")  # the previous one left nothing (ended by the scheduler): resume
    assert fourth.returncode == 0 and "left no exit status" in fourth.stderr and argv_log.exists()


@pytest.mark.mpi
def test_a_failed_rank_is_named_under_the_real_mpirun(cluster, tmp_path):
    """The venv's mpirun ends the other ranks itself when one exits non-zero: the script names the rank."""
    job_dir, env, _ = cluster
    real_mpirun_venv(
        job_dir,
        'case " $* " in *" check-env "*) exit 0 ;; esac\n'
        'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 3; fi\n'
        "exec sleep 600\n",
    )
    (job_dir / "job.sh").write_text(
        render.render(
            parse(
                [
                    "sge",
                    "--nodes",
                    "1",
                    "--gpus-per-node",
                    "2",
                    "--venv",
                    "venv",
                    "--cpus-per-rank",
                    "0",
                ]
            )
        )
    )
    env = dict(with_slots(env, 2), PATH=f"{VENV_BIN}:/usr/bin:/bin")
    proc = helpers.run_script(job_dir, env)  # mpirun ends rank 0 at once
    assert proc.returncode != 0, proc.stderr
    assert "rank 1 on " in proc.stderr and "exited with status 3" in proc.stderr, proc.stderr


# ---- what reaches the ranks on other nodes ---------------------------------------------------------------------------


def test_the_environment_reaches_other_nodes_by_prefix(cluster):
    """Open MPI 4 gives the ranks on other nodes only the -x names: every exported NCCL_*, XLA_*, JAX_*, TF_CPP_*,
    OCTO_DIST_*, HF_*, WANDB_*, UCX_* variable is named, by name only (no value on the command line)."""
    job_dir, env, _ = cluster
    fake_venv(job_dir / "venv")
    (job_dir / "job.sh").write_text(
        render.render(
            parse(
                [
                    "sge",
                    "--nodes",
                    "1",
                    "--gpus-per-node",
                    "1",
                    "--venv",
                    "venv",
                    "--wandb-mode",
                    "online",
                ]
            )
        )
    )
    exported = {
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "ib0",
        "XLA_FLAGS": "--xla_dump_to=/tmp/x",
        "JAX_DEBUG_NANS": "1",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OCTO_DIST_INIT_TIMEOUT": "60",
        "HF_HOME": "/groups/gxx00000/hf",
        "UCX_TLS": "rc",
        "WANDB_API_KEY": "sk-secret-0123456789",
        "WANDB_ENTITY": "lab",
        "PYTHONUNBUFFERED": "1",
    }
    env = dict(with_slots(env, 1), **exported, UNRELATED_VAR="x", MY_NCCL_NOTE="x")
    proc = helpers.run_script(job_dir, env)
    assert proc.returncode == 0, proc.stderr
    launches = [
        ln
        for ln in (job_dir.parent / "tools.log").read_text().splitlines()
        if ln.startswith("mpirun ")
    ]
    assert len(launches) == 2
    names = launches[1].split(" -x ")[1:]
    names = {n.split()[0] for n in names}
    for name in [*exported, "WANDB_MODE", "OCTO_DIST_NODEFILE", "JOB_ID"]:
        assert name in names, (name, launches[1])
    assert (
        "UNRELATED_VAR" not in names
        and "MY_NCCL_NOTE" not in names
        and "sk-secret" not in launches[1]
    )


def test_abci3_jobs_carry_its_settings():
    spec = parse(
        ["pbs", "--nodes", "2", "--group", "gxx00000", "--image", "x.sif", "--skip-image-check"]
    )
    pbs = render.render(spec)
    assert "#PBS -k oe" in pbs and "#PBS -j oe" in pbs
    # What the job runtime reads (the JSON the script hands over), not bash variables.
    settings = render.settings(spec, "job.sh")
    hcas = ",".join(f"mlx5_ibn{i}" for i in range(1, 9))  # the 8 compute HCAs, not the storage one
    environment = settings.forwarding.environment
    assert ("NCCL_IB_HCA", hcas) in environment, environment
    assert settings.software.binds == ("/groups/gxx00000", "/dev/infiniband")
    assert settings.allocation.cpus_per_rank == 12 and settings.allocation.sockets == 2
    assert settings.storage.compile_cache == ".octo-dist/compile-cache"
    for forbidden in (
        "NCCL_IB_DISABLE",
        "NCCL_NET=",
        "PBS_NODEFILE=",
        "--bind-to none -x PBS_NODEFILE",
    ):
        assert forbidden not in pbs, forbidden
    assert not any(name in ("NCCL_IB_DISABLE", "NCCL_NET") for name, _ in environment)
    one_spec = parse(["pbs", "--nodes", "1", "--group", "gxx00000", "--resource-type", "rt_HG"])
    one = render.render(one_spec)
    assert "#PBS -q rt_HG" in one and "#PBS -l select=1:mpiprocs=1" in one
    assert render.settings(one_spec, "job.sh").allocation.cpus_per_rank == 0
    slurm = render.render(
        parse(["slurm", "--nodes", "1", "--gpus-per-node", "4", "--cpus-per-rank", "8"])
    )
    assert "#SBATCH --cpus-per-task=8" in slurm and "NCCL_IB_HCA" not in slurm
