"""What a hostile or careless input must not do: delete outside the job's own directory, write over a device, bypass
a check through another spelling, end in a traceback. Each input is fabricated; the code under test is the real one
(the job runtime as a process, `octo-dist launch` as a process, the parsers called directly)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import HANG_S, REPO, clean_env, settings_mapping
from octo_dist import cli, savelayout
from octo_dist.jobs import schedulers
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs import settingsread
from octo_dist.jobs.schedulers import pbs
from octo_dist.jobs.schedulers.pbs import qsub_options
from octo_dist.launchers import cli as launchers_cli
from octo_dist.launchers import coordinator
from octo_dist.stack import manifest, toml_subset


def program(path: Path, text: str) -> None:
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(0o755)


def settings_json(scheduler: str, tmp_path: Path, save_dir: Path) -> str:
    return json.dumps(
        settings_mapping(scheduler, venv=str(tmp_path / "venv"), save_dir=str(save_dir))
    )


@pytest.fixture
def runtime_job(tmp_path):
    """(run(scheduler, **env) -> CompletedProcess, outer directory): the real job runtime as a process, its save
    directory ``outer/save`` beside a file of the user's (``outer/keep.txt``) and a checkpoint (``outer/save/7``);
    mpirun and srun stand-ins that run the rank's command, a venv whose octo-dist exits 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The launcher stand-in: skips its options (each with a value), runs the rest once as rank 0.
    launcher = (
        "import os, subprocess, sys\nargs = sys.argv[1:]\n"
        "while args and args[0].startswith('-'):\n    args = args[1:] if '=' in args[0] else args[2:]\n"
        "sys.exit(subprocess.call(args, env={**os.environ, 'OMPI_COMM_WORLD_RANK': '0', 'SLURM_PROCID': '0'}))\n"
    )
    program(bin_dir / "mpirun", launcher)
    program(bin_dir / "srun", launcher)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    program(venv / "python", "")
    program(venv / "octo-dist", "import sys\nsys.exit(0)\n")
    outer = tmp_path / "outer"
    (outer / "save" / "7").mkdir(parents=True)
    (outer / "save" / "7" / "checkpoint").write_text("weights")
    (outer / "keep.txt").write_text("the user's")
    (tmp_path / "nodefile").write_text("localhost\n")

    def run(scheduler: str, **env: str) -> subprocess.CompletedProcess:
        full = clean_env(PATH=f"{bin_dir}:/usr/bin:/bin", HOME=str(tmp_path))
        full.update({"PBS_NODEFILE": str(tmp_path / "nodefile"), **env})
        return subprocess.run(
            [sys.executable, "-m", "octo_dist.jobs.supervisor", "supervise"]
            + [settings_json(scheduler, tmp_path, outer / "save")],
            cwd=tmp_path,
            env=full,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )

    return run, outer


def test_the_runtime_stand_ins_run_a_job_and_remove_only_its_own_directory(runtime_job):
    run, outer = runtime_job
    proc = run("pbs", PBS_JOBID="12345.pbs1")
    assert proc.returncode == 0, proc.stderr
    assert (outer / "save" / ".octo-dist-exit-12345.pbs1").read_text() == "0\n"
    assert not (outer / "save" / ".octo-dist-job-12345.pbs1").exists()
    assert (outer / "keep.txt").exists() and (outer / "save" / "7" / "checkpoint").exists()


@pytest.mark.parametrize(
    "scheduler, var, value",
    [("pbs", "PBS_JOBID", "1/../.."), ("slurm", "SLURM_JOB_ID", "7/../..")],
)
def test_a_job_id_that_names_a_path_deletes_nothing_and_is_one_line(
    runtime_job, scheduler, var, value
):
    run, outer = runtime_job
    proc = run(scheduler, **{var: value})
    assert (outer / "keep.txt").read_text() == "the user's", (
        "the save directory's parent was deleted"
    )
    assert (outer / "save" / "7" / "checkpoint").read_text() == "weights"
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{var}={value!r}" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(outer / "save")) == ["7"]  # nothing made, nothing written


@pytest.mark.parametrize(
    "value", ["12345.pbs1", "9876543", "123456", "4242", "123[4].pbs1", "123_4", "4242[3]"]
)
def test_job_ids_of_every_scheduler_pass_the_check(value):
    assert savelayout.checked_job_id("PBS_JOBID", value) == value


@pytest.mark.parametrize(
    "value",
    ["1/../..", "..", "1..2", "a\0b", ".hidden", "-rf", "x" * 129, "12 34", "1\n2", "é1", "1/2"],
)
def test_job_ids_that_are_not_safe_file_names_are_refused_naming_the_variable(value):
    with pytest.raises(savelayout.JobIdError) as e:
        savelayout.checked_job_id("SLURM_JOB_ID", value)
    assert e.value.exit_status == 2 and str(e.value).startswith("SLURM_JOB_ID=")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["pbs", "slurm", "sge"])
def test_every_scheduler_checks_its_job_id(name):
    s = schedulers.get(name)
    assert s.job_id({s.job_id_var: "42"}) == "42" and s.job_id({}) == "0"
    with pytest.raises(savelayout.JobIdError):
        s.job_id({s.job_id_var: "1/../.."})


def test_only_the_directory_the_job_made_is_removed(tmp_path):
    save = tmp_path / "save"
    save.mkdir()
    made = savelayout.make_job_dir(str(save), "42")
    assert (Path(made) / savelayout.JOB_MARK).read_text() == "42\n"
    assert (
        savelayout.make_job_dir(str(save), "42") == made
    )  # started again by the scheduler: its own
    assert savelayout.remove_job_dir(str(save), made, "42") is None and not os.path.exists(made)
    # A directory of that name the job did not make (no mark, or another job's) is neither taken nor removed.
    other = save / ".octo-dist-job-43"
    other.mkdir()
    (other / "data").write_text("x")
    with pytest.raises(FileExistsError):
        savelayout.make_job_dir(str(save), "43")
    assert "left" in savelayout.remove_job_dir(str(save), str(other), "43")
    assert (other / "data").exists()
    # A link in the job directory's place, to a directory holding a mark: left alone, its target kept.
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / savelayout.JOB_MARK).write_text("44\n")
    (save / ".octo-dist-job-44").symlink_to(target)
    assert savelayout.remove_job_dir(str(save), str(save / ".octo-dist-job-44"), "44")
    assert (target / savelayout.JOB_MARK).exists()


# --- octo-dist launch -o --------------------------------------------------------------------------------------


def launch(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``octo-dist launch ARGS`` as a process (a FIFO that blocks it fails the test at ``timeout``, not forever)."""
    return subprocess.run(
        [sys.executable, "-m", "octo_dist", "launch", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


PBS_JOB = ("pbs", "--group", "gxx00000", "--nodes", "1")


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("octo-dist launch: error: "), proc.stderr
    return lines[0]


def test_launch_o_refuses_a_fifo_without_opening_it(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    line = one_error_line(launch(*PBS_JOB, "-o", str(fifo), cwd=tmp_path))
    assert "is a FIFO, not a file" in line
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_launch_o_refuses_a_device_and_leaves_its_mode(tmp_path):
    # A copy of /dev/null's device node (char 1:3) in a tmp directory: the real /dev/null is never touched.
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    null.chmod(0o666)  # mknod's mode passes through the umask
    line = one_error_line(launch(*PBS_JOB, "-o", str(null), cwd=tmp_path))
    assert "is a character device, not a file" in line
    st = os.lstat(null)
    assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666


def test_launch_o_refuses_a_symlink_and_leaves_its_target(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("my notes\n")
    target.chmod(0o600)
    (tmp_path / "job.sh").symlink_to(target)
    line = one_error_line(launch(*PBS_JOB, "-o", "job.sh", cwd=tmp_path))
    assert "is a symbolic link, not a file" in line
    assert target.read_text() == "my notes\n" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_launch_o_refuses_a_directory(tmp_path):
    line = one_error_line(launch(*PBS_JOB, "-o", str(tmp_path), cwd=tmp_path))
    assert "is a directory" in line


def test_launch_o_says_when_it_replaces_a_file_that_is_not_a_job_script(tmp_path):
    (tmp_path / "job.sh").write_text("my notes\n")
    proc = launch(*PBS_JOB, "-o", "job.sh", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "replaced 'job.sh', which was not a job script octo-dist wrote" in proc.stdout
    assert (tmp_path / "job.sh").read_text().startswith("#!/bin/bash")
    assert os.access(tmp_path / "job.sh", os.X_OK)
    again = launch(
        *PBS_JOB, "-o", "job.sh", cwd=tmp_path
    )  # its own script: replaced without a word
    assert again.returncode == 0 and "replaced" not in again.stdout, again.stdout
    assert sorted(os.listdir(tmp_path)) == ["job.sh"]  # no temporary file left


# --- PBS directives as qsub's getopt reads them ---------------------------------------------------------------


def test_qsub_options_are_read_as_getopt_reads_them():
    assert qsub_options(["-VJ", "1-4"]) == [("V", None), ("J", "1-4")]
    assert qsub_options(["-Vlselect=4:mpiprocs=1"]) == [("V", None), ("l", "select=4:mpiprocs=1")]
    assert qsub_options(["-Vl", "walltime=99:00:00"]) == [("V", None), ("l", "walltime=99:00:00")]
    assert qsub_options(["-Nname", "-zV"]) == [("N", "name"), ("z", None), ("V", None)]
    assert qsub_options(["-m", "-V"]) == [
        ("m", "-V")
    ]  # a value that looks like an option is the value
    assert qsub_options(["-N"]) == [("N", None)]
    assert qsub_options(["x", "-q", "a", "--", "-J", "1"]) == [("q", "a")]


CLUSTERED = {
    "#PBS -VJ 1-4": "#PBS -J 1-4",
    "#PBS -Vl walltime=99:00:00": "#PBS -l walltime=99:00:00",
    "#PBS -Vlselect=4:mpiprocs=1": "#PBS -l select=4:mpiprocs=1",
    "#PBS -Vq rt_HG": "#PBS -q rt_HG",
    "#PBS -VN x": "#PBS -N x",
    "#PBS -hJ1-4": "#PBS -J 1-4",
}


@pytest.mark.parametrize("clustered, plain", sorted(CLUSTERED.items()))
def test_a_clustered_pbs_directive_is_refused_as_its_plain_form(clustered, plain, capsys):
    s = schedulers.get("pbs")
    assert [k for k in s.directive_keys(clustered) if k != "-V" and k != "-h"] == s.directive_keys(
        plain
    )
    codes = []
    for directive in (plain, clustered):
        codes.append(cli.main(["launch", *PBS_JOB, "--dry-run", "--directive", directive]))
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and directive in err[0] and " sets -" in err[0], err
    assert codes == [2, 2]


def test_pbs_directives_that_add_to_the_header_still_render(capsys):
    for directive in ("#PBS -m abe -M me@example.org", "#PBS -Vlmem=400gb"):
        assert cli.main(["launch", *PBS_JOB, "--dry-run", "--directive", directive]) == 0
        assert directive in capsys.readouterr().out


# --- one line, exit 2, where a traceback was ------------------------------------------------------------------


def node_list_error(tmp_path: Path, path: str, nodes: int = 1) -> str:
    error, _ = schedulers.get("pbs").node_checks({"PBS_NODEFILE": path}, nodes, 8, "job.sh")
    assert error and "\n" not in error, error
    return error


def test_a_node_file_that_is_not_a_node_list_is_one_line(tmp_path):
    assert "(not a regular file)" in node_list_error(tmp_path, str(tmp_path))
    assert "(not a regular file)" in node_list_error(
        tmp_path, "/dev/zero"
    )  # never read: it has no end
    binary = tmp_path / "nodes.bin"
    binary.write_bytes(b"\xff\xfe\x00node\n")
    assert "(not text: not UTF-8)" in node_list_error(tmp_path, str(binary))
    assert "PBS_NODEFILE is '' (unset)" in node_list_error(tmp_path, "")


def test_a_node_file_with_fewer_nodes_than_rendered_is_refused_naming_both_counts(tmp_path):
    nodes = tmp_path / "nodes"
    nodes.write_text("g0001\ng0001\ng0002\n")
    error = node_list_error(tmp_path, str(nodes), nodes=3)
    assert "lists 2 node(s); expected the 3 this script was rendered for" in error
    assert "--nodes 2" in error
    assert schedulers.get("pbs").node_checks({"PBS_NODEFILE": str(nodes)}, 2, 8, "job.sh") == (
        None,
        [],
    )
    more = schedulers.get("pbs").node_checks({"PBS_NODEFILE": str(nodes)}, 1, 8, "job.sh")
    assert (
        more[0] is None and "lists 2 node(s)" in more[1][0]
    )  # more than rendered: mpirun uses the first


@pytest.mark.parametrize("nodefile", ["directory", "binary", "short"])
def test_a_bad_node_file_ends_the_real_runtime_in_one_line_before_mpirun(
    runtime_job, tmp_path, nodefile
):
    run, outer = runtime_job
    path = tmp_path / "nodes"
    if nodefile == "directory":
        path.mkdir()
    elif nodefile == "binary":
        path.write_bytes(bytes(range(256)))
    else:
        path.write_text("")  # no node at all: fewer than the 1 rendered
    proc = run("pbs", PBS_JOBID="12345.pbs1", PBS_NODEFILE=str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "PBS_NODEFILE" in lines[0], proc.stderr
    assert not (tmp_path / "ranks.log").exists()


def test_a_kill_delay_that_is_not_ascii_digits_is_pbss_default():
    for value in ("\u00b2", "\u0663", "9" * 5000, "-1", ""):
        qstat = json.dumps({"Queue": {"rt_HF": {"kill_delay": value}}})
        assert pbs.kill_delay(qstat, "rt_HF") == (
            pbs.DEFAULT_KILL_DELAY_S,
            "PBS's default: queue rt_HF sets no kill_delay",
        )
    assert pbs.kill_delay(json.dumps({"Queue": {"rt_HF": {"kill_delay": 60}}}), "rt_HF")[0] == 60


def test_other_numbers_from_outside_that_isdigit_passes_are_refused(tmp_path):
    (tmp_path / savelayout.STOPPED).write_text("\u00b2\n")
    assert savelayout.stopped_step(str(tmp_path)) is None
    with pytest.raises(coordinator.CoordinatorError, match="port"):
        coordinator.parse_address("g0001:\u00b2", "COORDINATOR_ADDRESS")
    assert launchers_cli._rank_guess({"OMPI_COMM_WORLD_RANK": "\u00b2"}) == "unknown"


def deep_toml(tmp_path: Path) -> Path:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    return path


def test_a_toml_of_100000_nested_brackets_is_one_line(tmp_path):
    with pytest.raises(toml_subset.TomlSubsetError, match="nested deeper than"):
        toml_subset.loads(deep_toml(tmp_path).read_text())
    with pytest.raises(manifest.ManifestError, match="not valid TOML"):
        manifest.load_manifest(deep_toml(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--manifest", str(deep_toml(tmp_path))],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "not valid TOML" in proc.stderr


@pytest.mark.parametrize(
    "argv",
    [["check-env", "--manifest", "{fifo}"], ["detect", "--env-file", "{fifo}"]],
    ids=["check-env --manifest", "detect --env-file"],
)
def test_a_fifo_as_an_input_file_is_refused_without_blocking(tmp_path, argv):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", *[a.format(fifo=fifo) for a in argv]],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,  # a blocked open fails the test here rather than hanging it
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a" in proc.stderr, proc.stderr


# --- containers/install.sh ------------------------------------------------------------------------------------


def install_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(REPO / "containers" / "install.sh"), *args],
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def refused(proc: subprocess.CompletedProcess, says: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], proc.stderr
    assert "Fix: " in lines[0]


def users_directory(tmp_path: Path) -> Path:
    """A directory of the user's, not a venv: ``work/notes.txt``."""
    prefix = tmp_path / "work"
    prefix.mkdir()
    (prefix / "notes.txt").write_text("mine")
    return prefix


def test_install_sh_checks_the_profile_before_writing_anything(tmp_path):
    prefix = users_directory(tmp_path)
    refused(install_sh("bogus", str(prefix)), "no profile 'bogus'")
    refused(install_sh("bogus", str(tmp_path / "new")), "expected one of: cpu ")
    assert os.listdir(prefix) == ["notes.txt"] and not (tmp_path / "new").exists()


def test_install_sh_never_writes_into_a_directory_that_is_not_empty_and_not_a_venv(tmp_path):
    prefix = users_directory(tmp_path)
    refused(install_sh("cpu", str(prefix)), "not empty and not a venv")
    refused(install_sh("cpu", str(prefix / "notes.txt")), "is not a directory")
    assert os.listdir(prefix) == ["notes.txt"]


def test_install_sh_checks_python_and_the_lock_before_making_the_venv(tmp_path):
    refused(
        install_sh("cpu", str(tmp_path / "a"), PYTHON=str(tmp_path / "nopython")), "does not run"
    )
    # A Python the profile has no lock for (cuda11 is locked for 3.10 only; a fake 3.99 for any profile).
    fake = tmp_path / "python3.99"
    fake.write_text("#!/bin/sh\necho 3.99\n")
    fake.chmod(0o755)
    refused(
        install_sh("cpu", str(tmp_path / "b"), PYTHON=str(fake)),
        "no lock for profile 'cpu' on Python 3.99",
    )
    refused(install_sh("cpu", str(tmp_path / "c"), "--bogus"), "option '--bogus'")
    assert sorted(os.listdir(tmp_path)) == ["python3.99"]


# --- the images' help texts -----------------------------------------------------------------------------------

# GPUs per node of each image's nodes: cuda12 is for ABCI 3.0's rt_HF (8 H200), cuda11 for 4-GPU nodes (V100).
IMAGE_GPUS = {
    "singularity-cuda12.def": schedulers.get("pbs").resource_types["rt_HF"].gpus,
    "singularity.def": 4,
}


@pytest.mark.parametrize("definition", sorted(IMAGE_GPUS))
def test_the_images_help_starts_one_rank_per_gpu_of_a_node(definition):
    text = (REPO / definition).read_text()
    help_text = text.split("%help", 1)[1].split("\n%", 1)[0]
    lines = re.findall(r"mpirun -np (\d+) --map-by ppr:(\d+):node", help_text)
    gpus = IMAGE_GPUS[definition]
    assert lines, help_text
    for ranks, per_node in lines:
        assert int(per_node) == gpus and int(ranks) % gpus == 0, (definition, ranks, per_node)
    assert f"{lines[0][0]} ranks, {gpus} per node" in help_text


# --- smaller refusals -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("schema", [2.0, True, "2"])
def test_a_settings_schema_that_is_not_the_int_is_refused(tmp_path, schema):
    raw = json.loads(settings_json("pbs", tmp_path, tmp_path / "save"))
    settingsread.from_mapping(raw)  # the int: read
    raw["schema"] = schema
    with pytest.raises(job_settings.SettingsError, match="schema"):
        settingsread.from_mapping(raw)


def test_a_config_file_that_exits_when_loaded_is_one_line_not_a_silent_exit_0(tmp_path):
    pytest.importorskip("absl")
    config = tmp_path / "exits.py"
    config.write_text("raise SystemExit(0)\n")
    line = one_error_line(
        launch(*PBS_JOB, "--dry-run", "--", "finetune", f"--config={config}", cwd=tmp_path)
    )
    assert "SystemExit('0')" in line and "-- finetune" in line


@pytest.mark.parametrize(
    "after",
    [
        ["--launcher", "single"],
        ["--launcher=single"],
        ["--coordinator", "g0001:99999"],
        ["--coordinator=g0001:23456"],
    ],
)
def test_start_up_flags_the_job_decides_are_refused_after_the_double_dash(after, capsys):
    assert cli.main(["launch", *PBS_JOB, "--dry-run", "--", "smoke", "--steps", "5", *after]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{after[0].split('=')[0]} " in err[0] and "after --" in err[0], err
    assert cli.main(["launch", *PBS_JOB, "--dry-run", "--", "smoke", "--steps", "5"]) == 0


@pytest.mark.parametrize("digits", ["²", "٣", "1²"])
def test_digits_that_isdigit_passes_but_int_refuses_are_no_number(digits, tmp_path):
    """``"²".isdigit()`` is True and ``int("²")`` a ValueError: each reader takes ASCII digits only."""
    from octo_dist.jobs.supervisor import exitfile, rankguard
    from octo_dist.runtime import runtime

    # PBS's NCPUS: a value that is no number is left as the site set it, never int()ed.
    assert rankguard.cpus_for_rank({"NCPUS": digits, "OMP_NUM_THREADS": digits}, 12) == {}
    with pytest.raises(runtime.SettingError):
        runtime.devices_per_process(digits)
    # An exit file's status: not one octo-dist writes, so the chain neither trains on it nor reads it as failed.
    said = tmp_path / ".octo-dist-exit-1"
    said.write_text(f"{digits} resumable: stopped\n")
    assert exitfile.read(str(said))[0] is None
    said.write_text(f"{digits}\n")
    assert exitfile.read(str(said))[0] is None
