"""`octo-dist env` (a report to paste into a bug report) and `octo-dist completion` (generated from the parsers)."""

import functools
import json
import os
import subprocess
import sys

import pytest

from helpers import HANG_S, REPO, clean_env, stdout_of
from octo_dist.envcheck import envreport


def test_job_variables_are_kept_and_secrets_masked():
    env = {
        "SLURM_PROCID": "3",
        "OMPI_COMM_WORLD_RANK": "1",
        "WANDB_API_KEY": "sk-123",
        "HF_TOKEN": "hf_abc",
        "HTTPS_PROXY": "http://user:pw@proxy:8080",
        "NCCL_IB_HCA": "mlx5_ibn1",
        "HOME": "/home/u",
        "PATH": "/bin",
    }
    got = envreport.job_variables(env)
    assert got == {
        "HF_TOKEN": "****",
        "HTTPS_PROXY": "http://****@proxy:8080",
        "NCCL_IB_HCA": "mlx5_ibn1",
        "OMPI_COMM_WORLD_RANK": "1",
        "SLURM_PROCID": "3",
        "WANDB_API_KEY": "****",
    }


def test_a_missing_command_is_reported_not_raised():
    got = envreport.run_command(["no-such-tool-octo-dist", "--version"])
    assert got == {
        "command": "no-such-tool-octo-dist --version",
        "ok": False,
        "output": "no-such-tool-octo-dist not found on PATH",
    }


def fake_nvidia_smi(bin_dir):
    exe = bin_dir / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\necho 'index, name, driver_version, memory.total [MiB]'\n"
        "echo '0, NVIDIA H200, 550.54.15, 143771 MiB'\n"
    )
    exe.chmod(0o755)


@pytest.mark.slow
def test_the_report_as_json_and_text(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_nvidia_smi(bin_dir)
    env = clean_env(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        WANDB_API_KEY="sk-must-not-leak-0123456789",
        SLURM_JOB_ID="4242",
        NCCL_DEBUG="INFO",
    )

    def octo_dist_env(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "octo_dist", "env", *flags, "--profile", "cpu"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=HANG_S,
        )

    proc = octo_dist_env("--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sk-must-not-leak" not in proc.stdout + proc.stderr
    r = json.loads(proc.stdout)
    assert {
        "octo_dist_version",
        "schema",
        "host",
        "python",
        "platform",
        "profile",
        "stack",
        "jax",
        "gpus",
        "mpirun",
        "variables",
        "container",
    } <= set(r)
    assert r["container"]["runtime"] in ("none", "docker", "podman", "singularity", "apptainer")
    jax_row = next(row for row in r["stack"] if row["name"] == "jax")
    assert jax_row == {"name": "jax", "pinned": "==0.4.22", "installed": "0.4.22"}
    assert (
        r["jax"]["ok"] and "jax:    0.4.22" in r["jax"]["output"]
    )  # JAX's own report, from a subprocess
    assert r["gpus"]["ok"] and "NVIDIA H200, 550.54.15" in r["gpus"]["output"]
    assert "Open MPI" in r["mpirun"]["output"]
    assert r["variables"]["WANDB_API_KEY"] == "****" and r["variables"]["SLURM_JOB_ID"] == "4242"
    text = octo_dist_env("--no-jax").stdout
    assert text.startswith("octo-dist 0.1.0 on ") and "stack (pinned -> installed):" in text
    assert "\ncontainer: " in text
    assert (
        "GPUs (nvidia-smi" in text and "NCCL_DEBUG=INFO" in text and "sk-must-not-leak" not in text
    )


def test_a_broken_manifest_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "stack.toml"
    bad.write_text("[profiles.cpu\n")
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "env", "--no-jax", "--manifest", str(bad)],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=REPO,
        timeout=HANG_S,
    )
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("octo-dist env: error: ")
        and proc.stderr.count("\n") == 1
    )


@functools.lru_cache(maxsize=None)
def bash_script() -> str:
    """``octo-dist completion bash``, printed once for the file: it is made from the parsers, the same every time
    (one Python start instead of one per completion asked below)."""
    return stdout_of([sys.executable, "-m", "octo_dist", "completion", "bash"])


def complete(*words):
    probe = (
        bash_script()
        + '\nCOMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _octo_dist; echo "${COMPREPLY[*]}"\n'
    )
    return subprocess.run(
        ["bash", "-c", probe, "octo-dist", "octo-dist", *words],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=True,
    ).stdout.split()


def test_bash_completion_knows_every_command_and_their_flags():
    assert complete("sm") == ["smoke"]
    assert complete("smoke", "--ste") == ["--step-fn", "--step-time", "--steps"]
    assert complete("launch", "s") == ["sge", "slurm"]
    assert complete("launch", "pbs", "--wall") == ["--walltime"]
    assert complete("smoke", "--steps", "3", "--save-") == ["--save-dir", "--save-every"]
    assert complete("finetune", "--con") == ["--config="]


def test_bash_completion_offers_values_paths_and_the_training_commands_flags(tmp_path):
    # choices argparse knows, and the ones defined elsewhere (the manifest's profiles, a scheduler's resource types)
    assert complete("smoke", "--step-fn", "") == ["auto", "jit", "shard_map"]
    assert complete("smoke", "--steps", "3", "--step-fn", "s") == ["shard_map"]
    assert "cuda12" in complete("check-env", "--profile", "") and "cpu" in complete(
        "check-env", "--profile", ""
    )
    assert complete("launch", "pbs", "--resource-type", "") == ["rt_HF", "rt_HG"]
    assert complete("completion", "") == ["bash", "zsh", "--help"]
    # a free value (a number) gets no flags offered in its place
    assert complete("smoke", "--steps", "") == []
    # a path flag completes file names
    (tmp_path / "runs-a").mkdir()
    assert complete("smoke", "--save-dir", f"{tmp_path}/run") == [f"{tmp_path}/runs-a"]
    # after `launch ... --`: the training command, then its own flags (not launch's)
    assert complete("launch", "pbs", "--nodes", "2", "--", "") == ["finetune", "smoke"]
    assert complete("launch", "pbs", "--nodes", "2", "--", "smoke", "--ste") == [
        "--step-fn",
        "--step-time",
        "--steps",
    ]
    assert complete("launch", "pbs", "--", "smoke", "--step-fn", "j") == ["jit"]
    assert complete("launch", "slurm", "--", "finetune", "--con") == ["--config="]


def test_zsh_completion_wraps_the_bash_one():
    out = stdout_of([sys.executable, "-m", "octo_dist", "completion", "zsh"])
    assert (
        "autoload -U +X bashcompinit && bashcompinit" in out
        and "complete -o default -F _octo_dist octo-dist" in out
    )
