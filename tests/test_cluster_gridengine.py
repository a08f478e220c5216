"""The rendered Grid Engine job under a real Grid Engine 8.1.9 and Debian's Open MPI 4.1.4, on the namespace cluster.

``tests/cluster/gridengine.py`` starts ``sge_qmaster`` on node001 and ``sge_execd`` on node001 and node002 (a queue
with 2 slots per host, a PE ``mpi`` with ``control_slaves TRUE`` and ``allocation_rule 2``; 1 slot and
``allocation_rule 1`` for the chains (h_rt's, and the one ``octo-dist jobs`` reads and qdels) and the lost node:
two ranks per node are only the 2 x 2 job's property, and each rank costs two JAX start-ups, preflight and
training, per job). Every job is rendered and submitted by ``octo-dist launch sge ... --submit`` run on node001
(the real ``qsub``); the ranks run from this checkout's venv under ``/usr/bin/mpirun`` (Debian's Open MPI 4.1.4),
which starts node002's ranks through ``qrsh -inherit`` (Grid Engine's tight integration; no ssh, no agent of ours).
Results come from rank 0's record (``--record``), the run's ``summary.json``, the job's log (rank 0 alone prints)
and ``qacct``; never from interleaved output of several ranks. Five jobs train here: the 2 x 2 one, the h_rt
chain's two, the chain ``octo-dist jobs`` reads and qdels (its second job never starts), and the lost node's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import gridengine, sim
from helpers import COMPILE_FAST, HANG_S, chain_running, wait_until
from octo_dist import savelayout
from octo_dist.engine import checksums
from octo_dist.jobs.settings import MIN_TRAINING_S, format_walltime

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

VENV = Path(sys.executable).parent.parent
STEPS = 4  # two checkpoints (SAVE_EVERY): the 2 x 2 job's cost is its eight JAX start-ups, not its steps
GLOBAL_BATCH = 16  # 4 per rank on 2 nodes x 2 ranks
SAVE_EVERY = 2
LONG_STEPS = 1_000_000  # a run that only ends by being stopped
# Every job's ranks compile fast (helpers.COMPILE_FAST), from a directive of the job's script: Grid Engine passes
# nothing of the submitting shell (no -V), and the job's runtime forwards XLA_* to every rank. These jobs test Grid
# Engine and the job's runtime, not what XLA makes of the step; no result here is compared with a run compiled
# otherwise.
XLA_DIRECTIVE = f"#$ -v XLA_FLAGS={COMPILE_FAST}"
# The h_rt chain's jobs are stopped by their own timer MIN_TRAINING_S (30 s, the least window the product accepts)
# after their start. What the window must outlast is a job's start-up up to its ranks' stop handler: the preflight's
# ranks (a Python start and check-env, 0.6 s of CPU each), then the training ranks' Python start (harness.run
# installs the handler before jax.distributed.initialize, the parameters and the compilation: a stop then is
# honoured at the first step, as in a CI run whose second job compiled for 22 s). Measured, the job's first step,
# which comes seconds after the handler: quiet 5-7 s after the job's start; beside a busy process and another
# scheduler's chain 10.5-15 s; beside four busy processes 8 s. A stop before the training ranks start is the
# product's to refuse ("stop requested during the preflight: not training", exit 0), and leaves nothing to resume:
# the test then runs another chain with the window doubled (at most WINDOW_ATTEMPTS chains), from what the machine
# just did, not a guess of it.
WINDOW_ATTEMPTS = 4
# What the job's log says when its stop came before its ranks trained (supervise.py): the attempt shows nothing.
NOT_TRAINING = re.compile(r"stop requested .*: not training")
# The stop gets 300 s (a quiet machine needs seconds): beside two busy processes and four other test streams on 2
# cores, 120 s was not enough to agree the stop and write a tiny checkpoint, and h_rt's kill came first. A margin
# only a slow stop waits for: the job ends as soon as its ranks have saved.
CHAIN_STOP_MARGIN_S = 300
# A run that only a stop or a fault ends sleeps between steps (smoke --step-time) instead of training flat out: the
# scenario lasts as long, and the tests beside it keep the machine's cores. It checkpoints every 5 s, its first 5 s
# into training (a checkpoint of the tiny model costs a rank about 0.37 s of CPU); each rank computes two steps a
# second.
LONG_STEP_TIME = 0.5
LONG_SAVE_EVERY = 10
# A lost node: from the link cut to the job script's last line. What it takes: Open MPI's keepalive over qrsh (25 s),
# the supervisor's FAILED_GRACE_S (20 s), END_WAIT_S (10 s) after a SIGTERM, on a loaded 2-core machine. The bound is
# the property, not a budget for the machine: past it the job holds its nodes until h_rt. A constant, not read from
# the runtime: a runtime whose grace grew must fail here.
LOST_NODE_BOUND_S = 150


def engine(tmp_path: Path, slots_per_host: int):
    for reason in (sim.unavailable(), gridengine.unavailable()):
        if reason:
            pytest.skip(reason)
    cluster = sim.Cluster(tmp_path / "cluster").up()
    try:
        ge = gridengine.GridEngine(cluster, slots_per_host=slots_per_host).up()
        try:
            yield ge
        finally:
            ge.down()
    finally:
        cluster.down()


@pytest.fixture
def ge(tmp_path):
    """2 slots per host (the PE's allocation_rule 2): 2 nodes x 2 ranks."""
    yield from engine(tmp_path, 2)


@pytest.fixture
def ge_one_per_node(tmp_path):
    """1 slot per host: the chain, qdel and lost-node scenarios, where a stop, a resume or losing node002 is the point
    and two JAX start-ups cost half of four on a busy machine."""
    yield from engine(tmp_path, 1)


def launch(
    ge: gridengine.GridEngine,
    work: Path,
    *extra: str,
    steps: int = STEPS,
    chain=None,
    step_time: float = 0,
    ranks_per_node: int = 2,
    save_every: int = SAVE_EVERY,
):
    """``octo-dist launch sge ... --submit`` on node001 from the submit directory; the job ids it printed."""
    argv = [
        str(VENV / "bin" / "octo-dist"),
        "launch",
        "sge",
        "--nodes",
        "2",
        "--gpus-per-node",
        str(ranks_per_node),
        "--venv",
        str(VENV),
        "--global-batch",
        str(GLOBAL_BATCH // 2 * ranks_per_node),  # 4 per rank
        "--steps",
        str(steps),
        "--save-dir",
        "runs/smoke",
        "--wandb-mode",
        "disabled",
        "-o",
        "job.sh",
        "--directive",
        XLA_DIRECTIVE,
        *extra,
        "--submit",
        *(["--chain", str(chain)] if chain else []),
        "--",
        "smoke",
        "--model",
        "tiny",
        f"--save-every={save_every}",
        f"--record={work / 'record.json'}",
        *([f"--step-time={step_time}"] if step_time else []),
    ]
    proc = ge.run(argv, cwd=work, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = re.findall(r"^submitted job (\d+)", proc.stdout, re.M)
    assert ids, proc.stdout
    return ids


def log(work: Path, job_id: str) -> str:
    path = work / f"octo-dist.o{job_id}"
    return path.read_text() if path.exists() else f"(no {path.name})"


def ended(ge: gridengine.GridEngine, work: Path, job_id: str) -> dict:
    """The job's accounting record once it has left the queue, however long a loaded machine makes it take
    (``wait_until``: a job that changes nothing in its submit directory for HANG_S is hung: qdel'd, the test
    fails)."""
    wait_until(
        lambda: ge.job_state(job_id) is None,
        watch=[work],
        what=f"job {job_id} to leave the queue",
        tail=lambda: f"--- job log ---\n{log(work, job_id)[-4000:]}\n{ge.diagnose()[-3000:]}",
        on_hang=lambda: ge.run(["qdel", "-f", job_id], check=False),
        poll_s=2,
    )
    return ge.wait_ended(job_id, HANG_S)  # its accounting record: written as the job leaves


def wait_for(path: Path, ge: gridengine.GridEngine, work: Path, job_id: str) -> None:
    """Until ``path`` appears (``wait_until``: only a job that changes nothing for HANG_S is hung); a job that
    ends first fails the test."""

    def there() -> bool:
        if path.exists():
            return True
        if ge.job_state(job_id) is None:
            pytest.fail(f"job {job_id} ended before {path} appeared\n{log(work, job_id)[-4000:]}")
        return False

    wait_until(there, watch=[work], what=str(path), tail=lambda: log(work, job_id)[-4000:])


def launch_until_stopped(ge: gridengine.GridEngine, work: Path) -> tuple[str, Path]:
    """``(job id, save directory)`` of a paced 1-rank-per-node job that only a stop or a fault ends, once it has
    written its first checkpoint."""
    (job,) = launch(
        ge,
        work,
        steps=LONG_STEPS,
        step_time=LONG_STEP_TIME,
        ranks_per_node=1,
        save_every=LONG_SAVE_EVERY,
    )
    save_dir = work / "runs" / "smoke"
    wait_for(save_dir / str(LONG_SAVE_EVERY), ge, work, job)
    return job, save_dir


def workdir(tmp_path: Path) -> Path:
    work = tmp_path / "submit"
    work.mkdir()
    return work


def rank_processes(ge: gridengine.GridEngine, node: str) -> list[int]:
    """The job's processes on a node (anything running octo-dist), the Grid Engine daemons excepted."""
    out = []
    for pid in ge.cluster.processes_on(node):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"octo-dist" in cmdline or b"orted" in cmdline:
            out.append(pid)
    return out


CRASHING_RUN = """
import json, os, sys
from pathlib import Path
from cluster import gridengine, sim
cluster = sim.Cluster(Path(sys.argv[1])).up()
engine = gridengine.GridEngine(cluster).up()
pids = [p for n in cluster.nodes for p in cluster.processes_on(n)
        if b"sge_" in Path(f"/proc/{p}/cmdline").read_bytes()]
print(json.dumps(pids), flush=True)
os.kill(os.getpid(), 9)  # no teardown at all
"""


def alive(pids: list) -> list:
    """The pids still running: a /proc entry whose state is not Z (zombie)."""
    out = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "\nState:\tZ" not in status:
            out.append(pid)
    return out


def test_a_crashed_run_leaves_no_daemon_behind(tmp_path):
    """A run killed with its daemons up (no teardown): the next set-up ends them; they wrote only under the dead
    run's state directory."""
    for reason in (sim.unavailable(), gridengine.unavailable()):
        if reason:
            pytest.skip(reason)
    crashed = tmp_path / "crashed"
    # Files, not pipes: the daemons and the nodes' holder processes it leaves behind would hold a pipe open.
    out, err = tmp_path / "crashed.out", tmp_path / "crashed.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASHING_RUN, str(crashed)],
            stdout=o,
            stderr=e,
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).parent,
        )
        rc = proc.wait(timeout=HANG_S)
    assert rc == -9, err.read_text()[-3000:]
    daemons = json.loads(out.read_text())
    assert len(daemons) >= 3, daemons  # sge_qmaster and two sge_execd
    # Not asserted that they are still running here: another session's cluster set-up (the lock is free once the
    # crashed run died) may already have ended them, which is the behaviour under test too.
    again = sim.Cluster(tmp_path / "next").up()
    try:
        # SIGKILLed by the set-up; gone once the kernel has ended them (a zombie awaiting its reaper counts as gone).
        wait_until(
            lambda: alive(daemons) == [],
            what="the crashed run's daemons to be gone",
            tail=lambda: str(alive(daemons)),
            poll_s=0.5,
        )
    finally:
        again.down()
    assert (crashed / "sge" / "spool" / "qmaster" / "messages").exists()


def test_submitted_job_runs_2_nodes_x_2_ranks_through_qrsh_inherit(ge, tmp_path):
    work = workdir(tmp_path)
    (job,) = launch(ge, work)
    script = (work / "job.sh").read_text()
    assert "#$ -pe mpi 4\n" in script and "rt_F" not in script and "USE_SSH" not in script
    record = ended(ge, work, job)
    text = log(work, job)
    assert record["failed"] == "0" and record["exit_status"] == "0", (record, text[-4000:])
    assert record["granted_pe"] == "mpi" and record["slots"] == "4", record
    rec = json.loads((work / "record.json").read_text())
    assert sorted(rec["hosts"]) == ["node001", "node001", "node002", "node002"], rec["hosts"]
    assert len(rec["digests"]) == 4 and len(set(rec["digests"])) == 1, rec["digests"]
    assert rec["end_step"] == STEPS
    summary = json.loads((work / "runs" / "smoke" / "summary.json").read_text())
    assert set(summary["params_digests"]) == set(rec["digests"]), summary
    assert "4 rank(s) on 2 host(s)" in text, text[-4000:]


def h_rt_chain(ge: gridengine.GridEngine, work: Path, window_s: int) -> bool:
    """A chain of two whose jobs ask their ranks to stop ``window_s`` after their start (h_rt minus the margin),
    checked; False when a job's stop came before its ranks trained (said in its log), which shows nothing.

    The first job, stopped by its timer, saves and ends 0. The second, started after it (qsub -hold_jid), resumes
    from that checkpoint; once it has saved past it (a checkpoint every LONG_SAVE_EVERY steps, or its own timer's
    stop) it is qdel'd: -notify's SIGUSR2 first, so it checkpoints and stops too (its record says where it started)."""
    walltime = format_walltime(window_s + CHAIN_STOP_MARGIN_S)
    first, second = launch(
        ge,
        work,
        "--walltime",
        walltime,
        "--stop-margin",
        str(CHAIN_STOP_MARGIN_S),
        steps=LONG_STEPS,
        chain=2,
        step_time=LONG_STEP_TIME,
        ranks_per_node=1,
        save_every=LONG_SAVE_EVERY,
    )
    script = (work / "job.sh").read_text()
    assert f"#$ -l h_rt={walltime}\n" in script and "#$ -notify\n" in script
    record = ended(ge, work, first)
    text = log(work, first)
    assert record["failed"] == "0" and record["exit_status"] == "0", (record, text[-4000:])
    if NOT_TRAINING.search(text):
        ge.run(["qdel", second], check=False)
        # Not ended(): a job deleted while it waits for the first is never accounted.
        wait_until(lambda: ge.job_state(second) is None, what=f"job {second} to leave the queue")
        return False
    assert "SIGUSR1 after" in text and "stop requested by SIGUSR1" in text, text[-4000:]
    stopped_at = json.loads((work / "record.json").read_text())
    assert stopped_at["stopped_by"] and stopped_at["end_step"] > 0, (stopped_at, window_s)
    save_dir = work / "runs" / "smoke"
    assert checksums.verify(save_dir / str(stopped_at["end_step"]), stopped_at["end_step"]) is None

    def saved_past() -> bool:
        """A complete checkpoint (its checksums are written last) past the stop's step, or the second job gone."""
        steps = [int(p.name) for p in save_dir.iterdir() if p.name.isdigit()]
        done = [
            n
            for n in steps
            if n > stopped_at["end_step"] and (save_dir / str(n) / savelayout.CHECKSUMS).exists()
        ]
        return bool(done) or ge.job_state(second) is None

    wait_until(
        saved_past, watch=[work], what=f"job {second} to save past step {stopped_at['end_step']}"
    )
    ge.run(["qdel", second], check=False)
    ended(ge, work, second)
    text = log(work, second)
    if NOT_TRAINING.search(text):
        return False
    # The qdel's SIGUSR2 (-notify, before the kill) or its own timer's SIGUSR1: the ranks checkpoint and stop.
    assert "SIGUSR2 after" in text or "SIGUSR1 after" in text, text[-4000:]
    resumed = json.loads((work / "record.json").read_text())
    assert resumed["start_step"] == stopped_at["end_step"], (stopped_at, resumed)
    assert resumed["end_step"] > resumed["start_step"] and resumed["stopped_by"], resumed
    assert len(set(resumed["digests"])) == 1, resumed
    return True


def test_stop_before_h_rt_then_the_chained_job_resumes_after_hold_jid(ge_one_per_node, tmp_path):
    """The first job asks its ranks to stop CHAIN_STOP_MARGIN_S before h_rt: they checkpoint and the job ends 0 before
    Grid Engine's kill; the second job (qsub -hold_jid) starts after it and resumes from that checkpoint
    (``h_rt_chain``). One rank per node: the 2 x 2 job through qrsh -inherit is the test above's.

    The window before the stop (h_rt minus the margin) is MIN_TRAINING_S, doubled for another chain when a job's
    stop came before its ranks trained. The chain's steps are endless: only a stop ends a job."""
    for attempt in range(WINDOW_ATTEMPTS):
        work = tmp_path / f"submit-{attempt}"
        work.mkdir()
        if h_rt_chain(ge_one_per_node, work, MIN_TRAINING_S * 2**attempt):
            return
    pytest.fail(f"in each of {WINDOW_ATTEMPTS} chains a job's stop came before its ranks trained")


def jobs(ge: gridengine.GridEngine, work: Path, *argv: str) -> subprocess.CompletedProcess:
    """``octo-dist jobs --save-dir runs/smoke ...`` on node001, in the submit directory."""
    argv = [str(VENV / "bin" / "octo-dist"), "jobs", "--save-dir", "runs/smoke", *argv]
    return ge.run(argv, cwd=work, check=False)


def test_jobs_shows_a_chain_and_its_qdel_stops_the_ranks_keeping_the_checkpoints(
    ge_one_per_node, tmp_path
):
    """``octo-dist jobs`` on a chain of two submitted on node001: its states (the first running, the second held
    for it), the running job's log, and cancelling the rest of the chain with qdel. The running job is -notify:
    SIGUSR2 first (the queue's notify time, 30 s, before the kill), so its ranks checkpoint and stop, and nothing
    of the job is left on either node."""
    ge, work = ge_one_per_node, workdir(tmp_path)
    first, second = launch(
        ge,
        work,
        steps=LONG_STEPS,
        chain=2,
        step_time=LONG_STEP_TIME,
        ranks_per_node=1,
        save_every=LONG_SAVE_EVERY,
    )
    save_dir = work / "runs" / "smoke"
    out, rows = chain_running(
        lambda: jobs(ge, work),
        first,
        save_dir / str(LONG_SAVE_EVERY),
        [work],
        lambda: log(work, first)[-4000:],
    )
    assert out.startswith("chain of 2 (sge, submitted "), out
    assert rows[second] == "held" and "waits for the job before it" in out
    tail = jobs(ge, work, "log")
    assert tail.returncode == 0 and tail.stdout.startswith(
        f"job {first} (running), {work / f'octo-dist.o{first}'}:"
    )
    cancel = jobs(ge, work, "cancel")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout == f"cancelled {first}, {second} (qdel {first} {second})\n"
    ended(ge, work, first)
    text = log(work, first)
    assert "SIGUSR2 after" in text, text[-4000:]
    steps = sorted(int(p.name) for p in save_dir.iterdir() if p.name.isdigit())
    assert steps and steps[-1] >= LONG_SAVE_EVERY, steps
    # Gone once the kill after the notify time has come (HANG_S only ends a hang).
    wait_until(
        lambda: not any(rank_processes(ge, n) for n in ge.cluster.nodes),
        what="the job's ranks to end after qdel",
        tail=lambda: str({n: rank_processes(ge, n) for n in ge.cluster.nodes}),
    )
    wait_until(
        lambda: ge.job_state(second) is None, what=f"job {second} to leave the queue after qdel"
    )
    assert (
        jobs(ge, work, "cancel").stdout
        == "nothing to cancel: no job of the chain is queued or running\n"
    )


@pytest.mark.cluster_long
def test_a_lost_node_ends_the_job_naming_it(ge_one_per_node, tmp_path):
    """node002's link cut mid-run: the job ends within LOST_NODE_BOUND_S, fails, and its log names node002 (or its
    rank, 1 of 2)."""
    ge = ge_one_per_node
    work = workdir(tmp_path)
    job, save_dir = launch_until_stopped(ge, work)
    seen = len(log(work, job))  # the preflight already names node002: read what follows
    ge.cluster.cut_link("node002")
    t0 = time.monotonic()
    deadline = t0 + LOST_NODE_BOUND_S
    # The job script on node001 writes its last line when it ends; Grid Engine may hold the job until node002's
    # execd is heard from again, which is not what is measured here.
    while "training exited with" not in log(work, job) and time.monotonic() < deadline:
        time.sleep(1)
    took = time.monotonic() - t0
    text = log(work, job)
    assert "training exited with" in text, (
        f"still running {took:.0f} s after the cut\n{text[-4000:]}"
    )
    said = text[seen:]
    assert "training exited with 0" not in said, said[-4000:]
    assert "node002" in said or "rank 1" in said, said[-4000:]
