"""``octo-dist detect``: every recorded environment through the CLI, under Python 3.9, and under a real
``mpirun -np 2`` of the venv's Open MPI 5 (each rank writes its own file; stdout is never parsed across ranks)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import HANG_S, REPO, clean_env, stdout_of
from test_coordcheck import HOLDER
from test_launchers import DETECTED, ENVS, REFUSED

from octo_dist import cli
from octo_dist.launchers import cli as detect_cli
from octo_dist.launchers import coordinator as coord

PYTHON39 = Path("/root/.pyenv/versions/3.9.18/bin/python")
MPIRUN = Path(sys.executable).parent / "mpirun"
FIELDS = {
    "schema",
    "octo_dist_version",
    "host",
    "python",
    "ok",
    "launcher",
    "detail",
    "rank",
    "world_size",
    "local_rank",
    "local_size",
    "job_id",
    "step_id",
    "nodes",
    "nodes_source",
    "coordinator",
    "coordinator_source",
    "coordinator_check",
    "nodes_problem",
    "note",
    "variables",
}

# name -> (coordinator address or None, a piece of its source)
COORDINATORS = {
    "openmpi5-np2-rank0": (
        f"127.0.0.1:{coord.port_for_job('prterun-vm-12940@1')}",
        "mpi4py broadcast from rank 0 at start-up; without mpi4py: 127.0.0.1",
    ),
    "openmpi4-hpcx-rank5of8": (
        f"10.1.0.5:{coord.port_for_job('12345.pbs1')}",
        "OMPI_MCA_orte_hnp_uri",
    ),
    "mpich-hydra-rank3of4": (None, "without mpi4py: pmi: 4 ranks over several nodes"),
    "slurm-srun-no-ntasks-per-node": (
        f"node001:{coord.port_for_job('123456', '1')}",
        "first host of SLURM_STEP_NODELIST",
    ),
    "slurm-srun-uneven-n3": (
        f"node001:{coord.port_for_job('1', '1')}",
        "first host of SLURM_STEP_NODELIST",
    ),
    "slurm-step-on-subset": (
        f"node003:{coord.port_for_job('123461', '0')}",
        "first host of SLURM_STEP_NODELIST",
    ),
    "slurm-concurrent-step1": (
        f"node003:{coord.port_for_job('123462', '1')}",
        "first host of SLURM_STEP_NODELIST",
    ),
    "slurm-sbatch-script": (None, "single process: none needed"),
}


def run_detect(capsys, *argv):
    code = cli.main(["detect", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def detected(record: dict) -> tuple:
    """What a detection record says of the launch, in DETECTED's order."""
    return tuple(record[k] for k in ("launcher", "world_size", "rank", "local_rank", "local_size"))


@pytest.mark.parametrize("name", sorted(DETECTED))
def test_detect_json_for_every_recorded_environment(capsys, name):
    code, out, err = run_detect(capsys, "--json", "--env-file", str(ENVS / f"{name}.env"))
    assert code == 0, err
    record = json.loads(out)
    assert set(record) == FIELDS and record["schema"] == 1 and record["ok"] is True
    assert detected(record) == DETECTED[name]
    if name in COORDINATORS:
        address, source = COORDINATORS[name]
        assert record["coordinator"] == address and source in record["coordinator_source"]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_detect_refusals_are_one_line_and_exit_2(capsys, name):
    code, out, err = run_detect(capsys, "--env-file", str(ENVS / f"{name}.env"))
    assert code == 2 and out == ""
    assert (
        err.startswith("octo-dist detect: error: ")
        and err.count("\n") == 1
        and REFUSED[name] in err
    )


def test_detect_json_on_refusal_and_a_coordinator_that_cannot_be_found(capsys, tmp_path):
    code, out, err = run_detect(capsys, "--json", "--env-file", str(ENVS / "torchrun-rank3of8.env"))
    record = json.loads(out)
    assert (
        code == 2
        and record["ok"] is False
        and "torchrun" in record["error"]
        and record["schema"] == 1
    )
    # an srun step over two nodes without any node list: Slurm itself never does this, a hand-made env does
    lines = [
        ln
        for ln in (ENVS / "slurm-srun-no-ntasks-per-node.env").read_text().splitlines()
        if "NODELIST" not in ln
    ]
    (tmp_path / "e.env").write_text("\n".join(lines))
    code, out, err = run_detect(capsys, "--env-file", str(tmp_path / "e.env"))
    assert (
        code == 2 and "no coordinator address" in err and "Fix: export COORDINATOR_ADDRESS" in err
    )
    code, out, err = run_detect(capsys, "--env-file", str(tmp_path / "absent.env"))
    assert code == 2 and "--env-file" in err and "cannot be read" in err
    code, out, err = run_detect(
        capsys,
        "--env-file",
        str(ENVS / "slurm-sbatch-script.env"),
        "--output",
        str(tmp_path / "no" / "dir" / "d-{rank}.json"),
    )
    assert code == 2 and "d-0.json cannot be written" in err and err.count("\n") == 1


def test_detect_text_output_names_the_source_of_each_answer(capsys):
    code, out, _ = run_detect(capsys, "--env-file", str(ENVS / "slurm-step-on-subset.env"))
    assert code == 0
    assert "rank         0 of 4" in out and "node003,node004  (from SLURM_STEP_NODELIST)" in out
    assert "coordinator  node003:" in out and "SLURM_STEP_TASKS_PER_NODE=2(x2)" in out
    code, out, _ = run_detect(capsys, "--env-file", str(ENVS / "slurm-sbatch-script.env"))
    assert "note         Slurm job 123456 asked for 8 tasks" in out


@pytest.mark.skipif(not PYTHON39.exists(), reason="no CPython 3.9 at " + str(PYTHON39))
@pytest.mark.parametrize(
    "name,code",
    # The entry point on 3.9, answering and refusing (every environment's answer on 3.9: the test below).
    [("openmpi4-hpcx-rank5of8", 0), ("lsf-jsrun", 2)],
)
def test_detect_runs_on_python_3_9(name, code):
    proc = subprocess.run(
        [
            str(PYTHON39),
            "-m",
            "octo_dist",
            "detect",
            "--json",
            "--env-file",
            str(ENVS / f"{name}.env"),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=HANG_S,
    )
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    record = json.loads(proc.stdout)
    assert record["python"].startswith("3.9.")
    if code == 0:
        assert detected(record) == DETECTED[name]


EVERY_ENV = """
import json, sys
from pathlib import Path
from octo_dist.launchers import cli
out = {}
for path in sorted(Path(sys.argv[1]).glob("*.env")):
    try:
        out[path.stem] = cli.describe(cli.read_env_file(path.read_text()))
    except ValueError as e:  # LauncherError
        out[path.stem] = "refused: " + str(e)
    except RuntimeError as e:  # CoordinatorError
        out[path.stem] = "no coordinator: " + str(e)
print(json.dumps(out, sort_keys=True))
"""


@pytest.mark.skipif(not PYTHON39.exists(), reason="no CPython 3.9 at " + str(PYTHON39))
def test_python_3_9_answers_every_environment_as_this_python_does():
    answers = [
        json.loads(stdout_of([python, "-c", EVERY_ENV, str(ENVS)]))
        for python in (str(PYTHON39), sys.executable)
    ]
    assert answers[0] == answers[1] and len(answers[0]) == len(DETECTED) + len(REFUSED)


@pytest.mark.mpi
@pytest.mark.parametrize("python", [sys.executable, str(PYTHON39)], ids=["venv", "py3.9"])
def test_detect_under_a_real_mpirun(tmp_path, python):
    if not MPIRUN.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    if not Path(python).exists():
        pytest.skip(f"no {python}")
    out = tmp_path / "detect-{rank}.json"
    proc = helpers.run(
        [
            str(MPIRUN),
            "--oversubscribe",
            "-np",
            "2",
            python,
            "-m",
            "octo_dist",
            "detect",
            "--json",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=HANG_S,
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads((tmp_path / f"detect-{r}.json").read_text()) for r in (0, 1)]
    assert [
        (d["launcher"], d["world_size"], d["rank"], d["local_rank"], d["local_size"])
        for d in records
    ] == [("openmpi5", 2, 0, 0, 2), ("openmpi5", 2, 1, 1, 2)]
    # both ranks agree on the fallback coordinator, derived from PRRTE's namespace
    assert records[0]["coordinator"] == records[1]["coordinator"] and records[0][
        "coordinator"
    ].startswith("127.0.0.1:")
    assert (
        records[0]["job_id"].startswith("prterun-") and records[0]["python"] == records[1]["python"]
    )
    assert records[0]["coordinator_check"].startswith("not checked: rank 0 picks its own host")


def test_detect_checks_the_coordinator_it_would_use(tmp_path):
    """Live (no --env-file): a COORDINATOR_ADDRESS whose port another process holds is refused on rank 0 only."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        port = int(holder.stdout.readline())
        base = dict(
            OMPI_COMM_WORLD_SIZE="2",
            OMPI_COMM_WORLD_LOCAL_SIZE="2",
            COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        )
        runs = [
            subprocess.run(
                [sys.executable, "-m", "octo_dist", "detect", "--json"],
                capture_output=True,
                text=True,
                env=clean_env(**base, OMPI_COMM_WORLD_RANK=r, OMPI_COMM_WORLD_LOCAL_RANK=r),
                cwd=REPO,
                timeout=HANG_S,
            )
            for r in ("0", "1")
        ]
    finally:
        holder.kill()
        holder.wait(timeout=HANG_S)
    assert runs[0].returncode == 2 and f"port {port} cannot be listened on" in runs[0].stderr
    assert runs[1].returncode == 0 and json.loads(runs[1].stdout)["coordinator_check"] == "ok"


@pytest.mark.mpi
def test_detect_refuses_under_mpirun_with_a_stale_torchrun_export(tmp_path):
    if not MPIRUN.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    out = tmp_path / "detect-{rank}.json"
    env = clean_env(RANK="0", WORLD_SIZE="2")  # every rank inherits RANK=0: rank 1 disagrees
    proc = helpers.run(
        [
            str(MPIRUN),
            "--oversubscribe",
            "-np",
            "2",
            sys.executable,
            "-m",
            "octo_dist",
            "detect",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=HANG_S,
    )
    assert proc.returncode != 0
    ok, refused = (json.loads((tmp_path / f"detect-{r}.json").read_text()) for r in (0, 1))
    assert ok["ok"] is True and refused["ok"] is False and "RANK=0" in refused["error"]


# --- outside input: bounded, binary, a directory, a real login shell's environment --------------------------------


@pytest.mark.parametrize(
    "path, needle",
    [
        ("/dev/zero", "is longer than 4194304 bytes (read stopped there)"),
        ("{tmp}", "is a directory"),
        ("{tmp}/core", "is not UTF-8 text (byte 0x80 at offset 4)"),
    ],
    ids=["endless", "directory", "binary"],
)
def test_an_env_file_that_is_endless_binary_or_a_directory_is_refused_in_one_line(
    capsys, tmp_path, path, needle
):
    (tmp_path / "core").write_bytes(b"\x7fELF\x80\x00\x01" * 100)
    code, out, err = run_detect(capsys, "--json", "--env-file", path.format(tmp=tmp_path))
    assert code == 2 and json.loads(out)["ok"] is False
    assert err.startswith("octo-dist detect: error: --env-file ") and err.count("\n") == 1, err
    assert needle in err and "Fix: env > recorded.env" in err, err


ENV_OF_A_LOGIN_SHELL = {
    "PATH": "/usr/bin:/bin",
    "OMPI_COMM_WORLD_RANK": "0",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "0",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "PMIX_NAMESPACE": "x",
    "OMPI_VERSION": "5.0.8",
}


@pytest.mark.parametrize("null", [False, True], ids=["env", "env-0"])
def test_env_output_with_exported_bash_functions_is_read(capsys, tmp_path, null):
    """What Environment Modules leaves in a login shell: ``module`` exported as a multi-line bash function, here
    placed between two rank variables, as the real `env` prints it (not a hand-written file)."""
    script = (
        'module() { eval "$(echo hi)"\n  X=1; }\nml() { module "$@"; }\nexport -f module ml\n'
        f"env{' -0' if null else ''}"
    )
    recorded = subprocess.run(
        ["env", "-i", *[f"{k}={v}" for k, v in ENV_OF_A_LOGIN_SHELL.items()], "bash", "-c", script],
        capture_output=True,
        check=True,
    ).stdout
    assert b"BASH_FUNC_module" in recorded
    (tmp_path / "f.env").write_bytes(recorded)
    code, out, err = run_detect(capsys, "--json", "--env-file", str(tmp_path / "f.env"))
    assert code == 0, err
    record = json.loads(out)
    assert (record["launcher"], record["rank"], record["world_size"]) == ("openmpi5", 0, 2)
    parsed = detect_cli.read_env_file(recorded.decode())
    assert {k: parsed[k] for k in ENV_OF_A_LOGIN_SHELL} == ENV_OF_A_LOGIN_SHELL
    assert not [k for k, v in parsed.items() if "\n" in v and not k.startswith("BASH_FUNC_")], (
        parsed
    )
    body = parsed.get("BASH_FUNC_module%%") or parsed["BASH_FUNC_module()"]
    assert body.startswith("() {") and body.endswith("}") and "X=1" in body
