"""The rendered SLURM job under real Slurm 22.05 on the two-node namespace cluster (root; Debian's slurmctld,
slurmd, slurm-client and munge).

Every job is rendered and submitted as a user does it, on the login node (node001): ``octo-dist launch slurm
--nodes 2 ... --submit`` (the real ``sbatch``); the job's ``srun`` is the real one, its ``--signal`` and time limit
are Slurm's own, and so is ``--chain``'s dependency. Results come from rank 0's record (``--record``: every rank's
parameter digest and host) and from ``scontrol show job`` (no ``sacct`` without ``slurmdbd``); never from
interleaved output. ``tests/cluster/slurm.py`` says how the daemons run.

The trained jobs here run one rank per node: what they check (both nodes, identical parameters, the job script's
stop signal, the chained job's bit-identical resume, ``octo-dist jobs`` and its scancel, a lost node) does not need two
ranks on a node, and each rank costs two JAX start-ups (preflight, training) per job. Two ranks per node under the
real srun are checked by ``test_detect_under_the_real_srun_matches_slurms_own_variables`` below (the task layout, no
JAX) and by ``tests/test_cluster.py::test_slurm_job_runs_2_nodes_x_2_ranks_in_the_image`` (a 2 x 2 job trained to
the end). Five jobs train here: the uninterrupted one, the stop chain's two, the chain ``octo-dist jobs``
reads and cancels (its second job never starts), and the lost node's. Slurm's time limit and its --signal are
checked by a job without JAX, the rendered job's #SBATCH lines around a stand-in for its runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import image as sim_image
from cluster import sim
from cluster import slurm as sim_slurm
from helpers import COMPILE_FAST, HANG_S, REPO, SubmittedJobs, chain_running, clean_env, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS = 30
GLOBAL_BATCH = 8  # 4 per rank on 2 nodes x 1 rank
SAVE_EVERY = 10  # a checkpoint every 10 steps (one costs a rank about 0.37 s of CPU)
LONG = 10**6  # steps of a run that only a fault or scancel ends
# The stop chain. Its first job is sent SIGUSR1 as Slurm's time limit sends it (--signal=B:USR1: the job script's
# process alone, scancel --batch) once it has saved step SAVE_EVERY, and the ranks stop within two steps of it; the
# steps after that checkpoint outlast a poll (1 s), the scancel (its time measured on the same cluster just before,
# at three times that: load may grow) and 2 s of slurmctld, slurmd and the job's forwarding, with two steps to spare
# (STEPS - SAVE_EVERY - 2 = 18 steps): quiet, 3.4 s or 0.19 s a step, never below CHAIN_STEP_TIME_S (a quiet run
# stopped 1.75 s after its checkpoint, at step 17; 0.3 s leaves 6 s). That Slurm sends the signal before the time
# limit, when the script asks it to, is the next test's (a job without JAX: the wait for Slurm's time-limit check, up
# to SLURM_CHECK_S, is then no JAX job's).
CHAIN_STEP_TIME_S = 0.3
SLURM_CHECK_S = 30  # slurmctld's PERIODIC_TIMEOUT: its time-limit (and --signal) checks, apart
# The uninterrupted run's pace: it waits instead of computing flat out, so the tests beside it keep the cores.
REFERENCE_STEP_TIME = 0.1
# A run that only a fault or scancel ends sleeps between steps instead of training flat out: the scenario lasts as
# long, and the tests beside it keep the machine's cores. Its first checkpoint (step 10) comes after 5 s, and one
# every 5 s after it; each rank computes two steps a second.
LONG_STEP_TIME = 0.5
# The rendered job's --stop-margin, hence its `#SBATCH --signal=B:USR1@180`. The test moves the time limit to the
# whole minute that puts the signal's time (limit - 180 s) in the past and the limit itself 120-180 s ahead, so
# Slurm sends the signal at its next time-limit check (every SLURM_CHECK_S), 90 s or more before the limit. (A 60 s
# margin with the limit 60-120 s ahead would leave the signal up to 90 s away.)
STOP_MARGIN_S = 180
# A lost node: from the fault to the job's end (under CI load: 1-34 s; 89 s once a probe in flight at the cut hung,
# before such a probe was ended after PROBE_TIMEOUT_S). What it takes: the supervisor's node probe (NODE_PROBE_S, 15
# s; a probe in flight at the cut, 30 s more) or a rank's failure, its FAILED_GRACE_S (20 s), END_WAIT_S (10 s) after
# a SIGTERM, on a loaded 2-core machine. The bound is the property, not a budget for the machine: without the
# supervisor, srun waits for Slurm's SlurmdTimeout (300 s) before it gives the lost node up; a job still running at
# the bound is one that holds its nodes until Slurm's timeouts. A constant, not read from the runtime: a runtime
# whose grace grew must fail here.
LOST_NODE_BOUND_S = 150
VENV = Path(sys.executable).parent.parent
# Exported in the submit shell: sbatch passes the whole environment to the job, and srun to every task (and the
# job forwards XLA_ to the ranks by prefix). XLA_FLAGS compiles every rank's programs fast (helpers.COMPILE_FAST,
# about half a rank's CPU): these jobs test Slurm and the job runtime, not XLA's optimiser, and every job here,
# the uninterrupted run the chain is compared with included, is submitted with it, so both sides compile alike.
SUBMIT_VARS = {
    "NCCL_DEBUG": "WARN",
    "OCTO_DIST_CLUSTER_MARK": "from-the-submit-shell",
    "XLA_FLAGS": COMPILE_FAST,
}
REPORT = (
    sim_image.CACHE / "cluster-slurm.txt"
)  # what each run measured, for a reader (`make cluster-smoke` style)
ENDED = sim_slurm.ENDED


@pytest.fixture(scope="session")
def slurm_ready():
    reason = sim_slurm.unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def slurm(slurm_ready, tmp_path):
    """Two nodes with munged, slurmctld (node001) and a slurmd on each; all of it gone after the test."""
    with sim.Cluster(tmp_path / "cluster") as c, sim_slurm.Slurm(c) as s:
        yield s


@pytest.fixture(scope="session")
def sif(slurm_ready, tmp_path_factory) -> Path:
    groups = tmp_path_factory.mktemp("groups")
    return sim_image.write_sif(groups / "octo-dist.sif", sim_image.build())


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory) -> Path:
    """One JAX compilation cache directory for every job of the session, passed as a site passes one
    (--compile-cache). On the CPU JAX writes nothing there: it caches only under XLA's other runtime
    (--xla_cpu_use_xla_runtime=true), which cannot compile these two-process steps ("op was not bufferized"), so
    every job compiles its step."""
    return tmp_path_factory.mktemp("compile-cache")


class Submitted(SubmittedJobs):
    """What ``octo-dist launch slurm ... --submit`` said (helpers.SubmittedJobs), waited for under Slurm."""

    def __init__(self, slurm: sim_slurm.Slurm, work: Path, stdout: str):
        super().__init__(work, stdout)
        self.slurm = slurm

    def tail(self, i: int = 0, n: int = 4000) -> str:
        return f"--- job {self.ids[i]} log ---\n{self.log(i)[-n:]}\n--- daemons ---\n{self.slurm.logs(1500)}"

    def record_of(self, job_id: str) -> dict:
        return self.slurm.job(job_id)  # scontrol show job

    def has_ended(self, record: dict) -> bool:
        return record.get("JobState") in ENDED

    def cancel(self, job_id: str) -> None:
        self.slurm.client("node001", ["scancel", job_id], check=False)


def login_env(slurm: sim_slurm.Slurm, home: Path, submitted: dict) -> dict:
    """The login shell: the site's PATH (singularity), Slurm's config, the checkout importable for `python -m`, and
    ``submitted`` exported."""
    env = sim.base_env(slurm.cluster, home, submitted)
    env.update(slurm.env({"PATH": env["PATH"], "HOME": str(home)}))
    env["PYTHONPATH"] = clean_env()["PYTHONPATH"]
    return env


def launch(slurm: sim_slurm.Slurm, tmp_path: Path, cache: Path, *extra: str, **job) -> Submitted:
    """``octo-dist launch slurm --nodes 2 --ranks-per-node 1 ... --submit`` in a submit directory on node001 (the
    login node); ``job``: :func:`render`'s."""
    res = render(slurm, tmp_path, cache, "--submit", *extra, **job)
    return Submitted(slurm, tmp_path / "submit", res.stdout)


def render(
    slurm: sim_slurm.Slurm,
    tmp_path: Path,
    cache: Path,
    *extra: str,
    steps: int = STEPS,
    walltime: str = "0:30:00",
    image: Path | None = None,
    train: list | None = None,
    step_time: float = 0,
) -> subprocess.CompletedProcess:
    """``octo-dist launch slurm --nodes 2 --ranks-per-node 1 ... -o job.sh [extra]`` in a submit directory on
    node001 (the login node), the shell's SUBMIT_VARS exported."""
    work, home = tmp_path / "submit", tmp_path / "home"
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    assert REPO not in work.parents
    train = train or [
        "smoke",
        "--model",
        "tiny",
        f"--save-every={SAVE_EVERY}",
        f"--record={work / 'record.json'}",
        *([f"--step-time={step_time}"] if step_time else []),
    ]
    where = ["--image", str(image)] if image else ["--venv", str(VENV)]
    argv = [
        sys.executable,
        "-m",
        "octo_dist",
        "launch",
        "slurm",
        "--nodes",
        "2",
        "--ranks-per-node",
        "1",
        "--gpus-per-node",
        "1",
        "--walltime",
        walltime,
        *where,
        "--global-batch",
        str(GLOBAL_BATCH),
        "--steps",
        str(steps),
        "--save-dir",
        "runs/smoke",
        "--wandb-mode",
        "disabled",
        "--compile-cache",
        str(cache),
        "-o",
        "job.sh",
        *extra,
        "--",
        *train,
    ]
    env = login_env(slurm, home, SUBMIT_VARS)
    res = slurm.client("node001", argv, env=env, cwd=str(work), check=False, timeout=HANG_S)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


def hosts(rec: dict) -> None:
    assert sorted(rec["hosts"]) == ["node001", "node002"], rec["hosts"]


# ---- the runs -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def uninterrupted(slurm_ready, tmp_path_factory, compile_cache) -> dict:
    """The venv job run once to the end under real Slurm: the run the others must equal."""
    tmp = tmp_path_factory.mktemp("slurm-complete")
    with sim.Cluster(tmp / "cluster") as c, sim_slurm.Slurm(c) as s:
        job = launch(s, tmp, compile_cache, step_time=REFERENCE_STEP_TIME)
        final = job.wait()
        return {
            "final": final,
            "record": job.record() if final["JobState"] == "COMPLETED" else None,
            "tail": job.tail(),
            "log": job.log(),
        }


def test_submitted_job_completes_on_both_nodes_with_identical_parameters(uninterrupted):
    assert uninterrupted["final"]["JobState"] == "COMPLETED", uninterrupted["tail"]
    assert uninterrupted["final"]["ExitCode"] == "0:0", uninterrupted["final"]
    assert uninterrupted["final"]["NodeList"] == "node[001-002]", uninterrupted["final"]
    rec = uninterrupted["record"]
    hosts(rec)
    assert len(rec["digests"]) == 2 and len(set(rec["digests"])) == 1, rec["digests"]
    assert rec["end_step"] == STEPS and not rec["stopped_by"], rec


def chain_step_time(latency: float) -> float:
    """The stop chain's pace (smoke --step-time) for Slurm commands that take ``latency`` s: the steps after the
    checkpoint that triggers the stop outlast a poll (1 s), the scancel at three times its measured time and 2 s of
    Slurm's and the job's forwarding, with two steps to spare; never below CHAIN_STEP_TIME_S."""
    needed = 1 + 3 * latency + 2
    return max(CHAIN_STEP_TIME_S, round(needed / (STEPS - SAVE_EVERY - 2), 2))


# What stands in for the job's runtime in the time-limit test: it notes its start, then the time SIGUSR1 came, and
# exits 0 (no JAX: what is tested is Slurm's delivery, as the rendered directives ask for it).
SIGNAL_NOTE = """exec {python} -c '
import pathlib, signal, sys, time
def stop(*_):
    pathlib.Path("{work}/usr1").write_text(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGUSR1, stop)
pathlib.Path("{work}/started").write_text(repr(time.time()))
while True:
    time.sleep(1)
'
"""


def test_the_time_limit_sends_the_job_script_usr1_before_the_limit(slurm, tmp_path, compile_cache):
    """The rendered job's own #SBATCH lines (--time, --signal=B:USR1@STOP_MARGIN_S) under the real sbatch: once the
    time limit is brought forward (as an admin's `scontrol update` does; Slurm counts it in minutes) so that the
    signal's time is past and the limit 121-180 s ahead, Slurm sends SIGUSR1 to the job script's process at its next
    time-limit check, before the limit: the job ends by it (0:0), not by the limit. The rendered script `exec`s the
    job's runtime, which the stop chain below shows stopping every rank on that signal."""
    render(slurm, tmp_path, compile_cache, "--stop-margin", str(STOP_MARGIN_S))
    work = tmp_path / "submit"
    env = login_env(slurm, tmp_path / "home", {})
    rendered = (work / "job.sh").read_text().splitlines()
    assert any(line.startswith("exec ") for line in rendered), (
        rendered
    )  # the runtime is the script's process
    header = [line for line in rendered if line.startswith(("#!", "#SBATCH"))]
    assert "#SBATCH --time=00:30:00" in header, header
    assert f"#SBATCH --signal=B:USR1@{STOP_MARGIN_S}" in header, header
    script = work / "note-usr1.sh"
    body = SIGNAL_NOTE.format(python=sys.executable, work=work)
    script.write_text("\n".join(header) + "\n" + body)
    submitted = slurm.client(
        "node001", ["sbatch", "--parsable", str(script)], env=env, cwd=str(work)
    )
    job_id = submitted.stdout.strip()
    wait_until(lambda: (work / "started").exists(), watch=[work], what=f"job {job_id} to start")
    minutes = int(slurm.job(job_id)["RunTime"].split(":")[-2]) + 3
    slurm.client("node001", ["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"])
    final = wait_until(
        lambda: (r := slurm.job(job_id)).get("JobState") in ENDED and r,
        watch=[work],
        what=f"job {job_id} to end",
        tail=lambda: slurm.logs(),
        on_hang=lambda: slurm.client("node001", ["scancel", job_id], check=False),
    )
    assert final["JobState"] == "COMPLETED" and final["ExitCode"] == "0:0", (final, slurm.logs())
    limit = float((work / "started").read_text()) + minutes * 60
    came = float((work / "usr1").read_text())
    assert came < limit - 60, (came, limit)  # 90 s or more before the limit: at Slurm's next check


def launch_until_stopped(slurm: sim_slurm.Slurm, tmp_path: Path, cache: Path) -> Submitted:
    """A paced job that only a cancel or a fault ends, once it has written its first checkpoint."""
    job = launch(slurm, tmp_path, cache, steps=LONG, step_time=LONG_STEP_TIME)
    job.wait_for(job.work / "runs" / "smoke" / str(SAVE_EVERY))
    return job


def jobs(slurm: sim_slurm.Slurm, tmp_path: Path, *argv: str):
    """``octo-dist jobs --save-dir runs/smoke ...`` on the login node, in the submit directory."""
    env = login_env(slurm, tmp_path / "home", {})
    argv = [sys.executable, "-m", "octo_dist", "jobs", "--save-dir", "runs/smoke", *argv]
    return slurm.client(
        "node001", argv, env=env, cwd=str(tmp_path / "submit"), check=False, timeout=HANG_S
    )


def test_jobs_shows_a_chain_and_its_scancel_ends_the_running_job_on_both_nodes(
    slurm, tmp_path, compile_cache
):
    """``octo-dist jobs`` on a chain of two submitted on the login node: its states (the first running, the second
    held for it), the running job's log, and cancelling the rest of the chain (the real scancel), after which
    nothing of the job is left on either node; from the record launch --submit left in the save directory."""
    job = launch(
        slurm, tmp_path, compile_cache, "--chain", "2", steps=LONG, step_time=LONG_STEP_TIME
    )
    first, second = job.ids
    checkpoint = job.work / "runs" / "smoke" / str(SAVE_EVERY)
    # Waited for with scontrol first: `octo-dist jobs` (a Python start on every poll) is asked once it can answer.
    job.wait_for(checkpoint)
    out, rows = chain_running(
        lambda: jobs(slurm, tmp_path),
        first,
        checkpoint,
        [job.work, *job.logs],
        job.tail,
    )
    assert out.startswith("chain of 2 (slurm, submitted "), out
    assert rows[second] == "held" and f"{second}  held     waits for the job before it" in out
    running = sim_slurm.job_processes(slurm.cluster)
    assert any(p.startswith("node002:") and "octo-dist" in p for p in running), running
    log = jobs(slurm, tmp_path, "log", "--lines", "200")
    assert log.returncode == 0 and log.stdout.startswith(
        f"job {first} (running), {job.logs[0]}:"
    ), log.stderr
    cancel = jobs(slurm, tmp_path, "cancel")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"cancelled {first}, {second} (scancel {first} {second})\n"
    for i in (0, 1):
        assert job.wait(i)["JobState"] == "CANCELLED", job.tail(i)
    # Slurm's KillWait (30 s) after the SIGTERM: then nothing of the job may be left (HANG_S only ends a hang).
    wait_until(
        lambda: sim_slurm.job_processes(slurm.cluster) == [],
        what="the job's processes to end after scancel",
        tail=lambda: "\n".join(sim_slurm.job_processes(slurm.cluster)),
    )
    after = jobs(slurm, tmp_path)
    assert [ln.split()[1] for ln in after.stdout.splitlines()[1:3]] != ["running", "held"], (
        after.stdout
    )
    assert (
        jobs(slurm, tmp_path, "cancel").stdout
        == "nothing to cancel: no job of the chain is queued or running\n"
    )


@pytest.mark.cluster_long
def test_a_lost_node_ends_the_job_naming_it_and_slurm_says_failed(slurm, tmp_path, compile_cache):
    """node002's link cut mid-run: the supervisor's node probe (srun has no keepalive) ends the job within
    LOST_NODE_BOUND_S, naming node002, and Slurm records it failed. The other way to lose a node, its daemon and
    ranks SIGKILLed (a rank's failure noted by its guard ends the launcher, whichever the scheduler), is
    tests/test_cluster_pbs.py's test_a_lost_node_ends_the_job_fast_and_keeps_its_checkpoints[sigkill]; a launcher
    that hangs after a rank failed is ended in tests/test_launch_injection.py."""
    job = launch_until_stopped(slurm, tmp_path, compile_cache)
    seen = len(job.log())  # the preflight already names node002: read what follows the fault
    slurm.cluster.cut_link("node002")
    t0 = time.monotonic()
    state = slurm.job(job.id)
    while state.get("JobState") == "RUNNING" and time.monotonic() - t0 < LOST_NODE_BOUND_S:
        time.sleep(1)
        state = slurm.job(job.id)
    took = time.monotonic() - t0
    assert state.get("JobState") != "RUNNING", (
        f"job {job.id} still RUNNING {took:.0f} s after the link cut (a job that holds its nodes until Slurm's "
        f"own timeouts)\n" + job.tail()
    )
    # The batch script has ended: Slurm records it as failed (COMPLETING while it cannot reach node002 to clean
    # up, with the script's exit status; FAILED or NODE_FAIL once done).
    assert state["JobState"] in ("FAILED", "NODE_FAIL", "COMPLETING"), state
    assert state["ExitCode"] != "0:0", state
    said = job.log()[seen:]
    assert "node002" in said, "nothing after the link cut names node002\n" + job.tail()
    report(
        f"lost node (link-cut): job {job.id} ended {took:.0f} s after the fault, Slurm: JobState="
        f"{state['JobState']} ExitCode={state['ExitCode']}; the job said: "
        + " | ".join(ln for ln in said.splitlines() if "node002" in ln)[:600]
    )


def report(line: str) -> None:
    REPORT.parent.mkdir(exist_ok=True)
    with open(REPORT, "a") as f:
        f.write(line + "\n")


# ---- what the real srun gives a task, and what octo-dist reads from it (no JAX: seconds) --------------------------

DETECT_JOB = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=2 --output=detect-%j.out
# Every task: its environment (NUL-separated) and octo-dist's reading of it, one file each.
each='env -0 >"$1-env-$SLURM_PROCID" && exec "$2" detect --json --output "$1-detect-{{rank}}.json" >/dev/null'
srun --nodes=2 --ntasks-per-node=2 bash -c "$each" task 2x2 {octo}
srun --nodes=2 --ntasks=3 bash -c "$each" task n3 {octo}
"""


def read_task_files(work: Path, shape: str) -> list[tuple[dict, dict]]:
    out = []
    for f in sorted(work.glob(f"{shape}-env-*")):
        env = dict(kv.split("=", 1) for kv in f.read_text().split("\0") if "=" in kv)
        detected = json.loads((work / f"{shape}-detect-{env['SLURM_PROCID']}.json").read_text())
        out.append((env, detected))
    return out


def test_detect_under_the_real_srun_matches_slurms_own_variables(slurm, tmp_path):
    work = tmp_path / "submit"
    work.mkdir()
    (work / "detect.sh").write_text(DETECT_JOB.format(octo=VENV / "bin" / "octo-dist"))
    job_id = slurm.client("node001", ["sbatch", "--parsable", "detect.sh"], cwd=str(work)).stdout
    final = slurm.wait_job(job_id.strip(), HANG_S)  # seconds of work: HANG_S only ends a hang
    log = (work / f"detect-{job_id.strip()}.out").read_text(errors="replace")
    assert final["JobState"] == "COMPLETED", (final, log, slurm.logs(1500))
    for shape, per_node in (
        ("2x2", {"node001": 2, "node002": 2}),
        ("n3", {"node001": 2, "node002": 1}),
    ):
        tasks = read_task_files(work, shape)
        world = sum(per_node.values())
        assert len(tasks) == world, (shape, log)
        for env, d in tasks:
            host = env["SLURMD_NODENAME"]
            assert d["ok"] and d["launcher"] == "slurm", d
            assert (d["rank"], d["world_size"], d["local_rank"], d["local_size"]) == (
                int(env["SLURM_PROCID"]),
                int(env["SLURM_STEP_NUM_TASKS"]),
                int(env["SLURM_LOCALID"]),
                per_node[host],
            ), (shape, env, d)
            assert d["nodes"] == ["node001", "node002"] and d["job_id"] == env["SLURM_JOB_ID"], d
            assert d["host"] == host, d
        ranks_by_host = sorted((e["SLURMD_NODENAME"], int(e["SLURM_PROCID"])) for e, _ in tasks)
        # Block distribution: the first node's tasks come first.
        expect = [("node001", r) for r in range(per_node["node001"])] + [
            ("node002", r) for r in range(per_node["node001"], world)
        ]
        assert ranks_by_host == expect, (shape, ranks_by_host)


def test_a_new_set_up_removes_what_a_crashed_run_left(slurm_ready, tmp_path):
    crashed_cluster = sim.Cluster(tmp_path / "crashed").up()
    crashed = sim_slurm.Slurm(crashed_cluster).up()
    daemons = {name: p.pid for name, p in crashed.daemons.items()}
    (crashed.run / "left-behind").write_text("")
    # "Crashed": neither down() ran; the lock goes with the process that held it.
    crashed_cluster._lock.close()
    crashed_cluster._lock = None
    sim._HELD = False
    try:
        with sim.Cluster(tmp_path / "again") as c, sim_slurm.Slurm(c) as s:
            for p in crashed.daemons.values():
                p.wait(
                    timeout=HANG_S
                )  # killed by the new set-up (they lived in the old namespaces)
            assert not (s.run / "left-behind").exists()
            assert sorted(s.daemons) == sorted(daemons)
            assert s.client("node001", ["sinfo", "-h", "-o", "%D %t"]).stdout.split() == [
                "2",
                "idle",
            ]
    finally:
        for p in list(crashed.daemons.values()) + list(crashed_cluster.holders.values()):
            if p.poll() is None:
                p.kill()
            p.wait()
    # (Not the namespaces: another test process may set up its cluster as soon as the lock is free.)
    assert not sim_slurm.RUN.exists()


# ---- the stop chain: the last tests of this file, both on one cluster of their own --------------------------------


@pytest.fixture(scope="module")
def usr1_chain(slurm_ready, tmp_path_factory, compile_cache, uninterrupted) -> dict:
    """A chain of two (``--chain 2``: afterany) on a cluster of its own, its first job stopped by the job script's
    SIGUSR1 as the time limit's ``--signal=B:USR1`` sends it (``scancel --batch``: the script's process alone) once
    it has saved step SAVE_EVERY, and ended; the second is then Slurm's to start. The cluster stays up for both
    tests (its slurmctld runs the second job) and goes down at the end of this file: one cluster at a time, so
    these tests come last. ``uninterrupted`` is asked for first: its own cluster is up and down before this one."""
    tmp = tmp_path_factory.mktemp("slurm-usr1-chain")
    with sim.Cluster(tmp / "cluster") as c, sim_slurm.Slurm(c) as s:
        latency = s.latency()
        step_time = chain_step_time(latency)
        job = launch(s, tmp, compile_cache, "--chain", "2", step_time=step_time)
        dependency = s.job(job.ids[1])["Dependency"]
        job.wait_for(job.work / "runs" / "smoke" / str(SAVE_EVERY))
        s.client("node001", ["scancel", "--batch", "--signal=USR1", job.ids[0]])
        final = job.wait(0)
        # Rank 0's record of the first job: read before the second one ends and writes its own there.
        stopped = job.record() if final["JobState"] == "COMPLETED" else None
        yield dict(
            job=job,
            dependency=dependency,
            final=final,
            stopped=stopped,
            paced=f"(--step-time {step_time}: commands took {latency:.2f} s)",
        )


def test_slurms_usr1_to_the_job_script_stops_every_rank_of_the_first_job_of_a_chain(usr1_chain):
    """Every rank checkpoints and the job ends 0 (Slurm: COMPLETED), between its checkpoint and its last step; the
    second job of the chain waits for it (afterany)."""
    job = usr1_chain["job"]
    first = job.ids[0]
    assert usr1_chain["dependency"] == f"afterany:{first}(unfulfilled)", usr1_chain["dependency"]
    final, stopped = usr1_chain["final"], usr1_chain["stopped"]
    assert final["JobState"] == "COMPLETED" and final["ExitCode"] == "0:0", (final, job.tail(0))
    assert stopped["stopped_by"] and SAVE_EVERY < stopped["end_step"] < STEPS, (
        stopped,
        usr1_chain["paced"],
        job.tail(0),
    )
    hosts(stopped)
    assert "SIGUSR1 after" in job.log(0), job.tail(0)  # "SIGUSR1 after Ns: asking every rank..."


def test_the_chained_job_resumes_the_stopped_one_bit_identical_to_the_uninterrupted_run(
    usr1_chain, uninterrupted
):
    """The second job of the chain resumes from the first one's checkpoint and ends equal, bit for bit, to the
    uninterrupted run."""
    job, stopped = usr1_chain["job"], usr1_chain["stopped"]
    assert stopped, (
        "the first job of the chain did not complete",
        usr1_chain["final"],
        job.tail(0),
    )
    resumed_final = job.wait(1)
    assert resumed_final["JobState"] == "COMPLETED", (resumed_final, job.tail(1))
    resumed = job.record()
    assert resumed["start_step"] == stopped["end_step"] and resumed["end_step"] == STEPS, resumed
    hosts(resumed)
    assert uninterrupted["record"], uninterrupted["tail"]
    assert resumed["digests"] == uninterrupted["record"]["digests"], (
        "the stopped and resumed run differs from the uninterrupted one",
        resumed["digests"],
        uninterrupted["record"]["digests"],
    )
    report(f"stop chain: stopped after step {stopped['end_step']} of {STEPS} {usr1_chain['paced']}")
