"""``octo-dist jobs`` against real Slurm 22.05 on the two-node namespace cluster: a chain of two submitted on the
login node (node001) as a user does it, its states (the first running, the second held for it), the running job's
log, and cancelling the rest of the chain; from the record launch --submit left in the save directory."""

from __future__ import annotations

import sys

import pytest

from cluster import sim
from helpers import HANG_S, chain_running, clean_env
from test_cluster_slurm import (  # noqa: F401  (pytest fixtures, used by name)
    LONG,
    LONG_STEP_TIME,
    SAVE_EVERY,
    compile_cache,
    launch,
    slurm,
    slurm_ready,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def jobs(slurm, tmp_path, *argv):  # noqa: F811
    """``octo-dist jobs --save-dir runs/smoke ...`` on the login node, in the submit directory."""
    home = tmp_path / "home"
    env = sim.base_env(slurm.cluster, home, {})
    env.update(slurm.env({"PATH": env["PATH"], "HOME": str(home)}))
    env["PYTHONPATH"] = clean_env()["PYTHONPATH"]
    argv = [sys.executable, "-m", "octo_dist", "jobs", "--save-dir", "runs/smoke", *argv]
    return slurm.client(
        "node001", argv, env=env, cwd=str(tmp_path / "submit"), check=False, timeout=HANG_S
    )


def test_a_chains_status_log_and_cancel_under_real_slurm(slurm, tmp_path, compile_cache):  # noqa: F811
    job = launch(
        slurm, tmp_path, compile_cache, "--chain", "2", steps=LONG, step_time=LONG_STEP_TIME
    )
    first, second = job.ids
    out, rows = chain_running(
        lambda: jobs(slurm, tmp_path),
        first,
        tmp_path / "submit" / "runs" / "smoke" / str(SAVE_EVERY),
        [job.work, *job.logs],
        job.tail,
    )
    assert out.startswith("chain of 2 (slurm, submitted "), out
    assert rows[second] == "held" and f"{second}  held     waits for the job before it" in out
    log = jobs(slurm, tmp_path, "log", "--lines", "200")
    assert log.returncode == 0 and log.stdout.startswith(
        f"job {first} (running), {job.logs[0]}:"
    ), log.stderr
    cancel = jobs(slurm, tmp_path, "cancel")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"cancelled {first}, {second} (scancel {first} {second})\n"
    for i in (0, 1):
        assert job.wait(i)["JobState"] == "CANCELLED", job.tail(i)
    after = jobs(slurm, tmp_path)
    assert [ln.split()[1] for ln in after.stdout.splitlines()[1:3]] != ["running", "held"], (
        after.stdout
    )
    assert (
        jobs(slurm, tmp_path, "cancel").stdout
        == "nothing to cancel: no job of the chain is queued or running\n"
    )
