"""The rendered PBS job under an imitation of PBS Professional that behaves as a real PBS was measured to behave.

``tests/cluster/pbs.py`` (its docstring lists what it imitates and what it does not) runs PBS's server, scheduler
and moms as one daemon on the namespace cluster, with ABCI's queues ``rt_HF``/``rt_HG``. A job is its sessions:
``qdel`` SIGTERMs every process of them on every node, waits the queue's kill delay and SIGKILLs what is left; a
process that left them is found and named (``escapes``). The first tests check the imitation itself with plain
shell jobs (seconds each): the measured behaviours the product's tests rely on, each one able to fail.

Then every product job is rendered and submitted as a user does it, by a user that is not root, on node001:
``octo-dist launch pbs ... --submit`` (the imitation's ``qsub``; ``--chain`` its ``-W depend``), from a submit
directory in that user's home, with ``NCCL_*``/``OCTO_DIST_*`` exported in the submitting shell. The ranks run from
this checkout's venv under Debian's Open MPI 4.1 ``mpirun``; node002's are started through ``pbs_tmrsh`` (the
site's rsh agent). Results come from rank 0's record (``--record``), the save directory (its checkpoints verified
as a resume verifies them, the job's exit file and lock), each rank's environment as the site's ``sitecustomize``
recorded it (one file per rank), the processes left on the nodes, and ``qstat -x -f``; never from interleaved
output. All of them share one cluster (set up in about a second), each job in a submit directory of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cluster import pbs as sim_pbs
from cluster import sim
from helpers import (
    COMPILE_FAST,
    HANG_S,
    MANIFEST,
    SubmittedJobs,
    changed_since,
    checkpoints,
    wait_until,
    with_growing_budget,
)

pytestmark = [pytest.mark.cluster]

VENV = Path(sys.executable).parent.parent
GROUP = "gxx00000"  # -P: an ABCI group
STEPS = 10
SAVE_EVERY = 2
LONG = 10**6  # steps of a run that only a stop ends
# Such a run sleeps between steps (the tests beside it keep the cores) and checkpoints every 5 s, its first 5 s into
# training: a checkpoint of the tiny model costs a rank about 0.37 s of CPU (100 of them: 37 s), so one every 2
# steps of 0.1 s kept each rank checkpointing flat out until the stop or the fault.
LONG_STEP_TIME = 0.25
LONG_SAVE_EVERY = 20
# Exported in the submit shell: the README says NCCL_*, XLA_*, OCTO_DIST_* ... reach every rank.
# OCTO_DIST_LOG_ALL_RANKS=1 makes it visible in the job's log: INFO lines from every rank, not only rank 0's.
# XLA_FLAGS compiles the ranks' programs fast (helpers.COMPILE_FAST): these jobs test PBS and the job runtime, not
# what XLA makes of the step.
SUBMIT_VARS = {
    "NCCL_DEBUG": "WARN",
    "OCTO_DIST_CLUSTER_MARK": "from-the-submit-shell",
    "OCTO_DIST_LOG_ALL_RANKS": "1",
    "XLA_FLAGS": COMPILE_FAST,
}
# Set by a directive of the two-node job's script ("#PBS -v NAME=from-a-directive") and, to another value, in the
# submit shell: the script's wins, in the job and in the job chained after it.
DIRECTIVE_VAR = "OCTO_DIST_CLUSTER_DIRECTIVE"
DIRECTIVE_MARK = "from-a-directive"
# A lost node: from the fault to the job's end. What it takes: a rank noticing (a SIGKILLed one at once; with the link
# cut, JAX's coordination service timing out node002's rank), the runtime's FAILED_GRACE_S (20 s) for mpirun to end
# by itself, its END_WAIT_S (10 s) after a SIGTERM, on a loaded 2-core machine. Not a timing assertion: the bound
# past which a job that does not end is a job held until its wall time. A constant, not FAILED_GRACE_S read from the
# runtime: a runtime whose grace grew must fail here.
LOST_NODE_BOUND_S = 150


@pytest.fixture(scope="module")
def pbs(tmp_path_factory):
    reason = sim_pbs.unavailable()
    if reason:
        pytest.skip(reason)
    cluster = sim.Cluster(tmp_path_factory.mktemp("pbs") / "cluster")
    cluster.up()
    try:
        with sim_pbs.Pbs(cluster) as p:
            yield p
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def compile_cache(pbs):
    """One JAX compilation cache for the module's jobs (the jobs' user writes it): only the first job compiles."""
    path = Path(tempfile.mkdtemp(prefix=f"{sim.PREFIX}-pbs-cache-", dir="/var/tmp"))
    path.chmod(0o755)
    os.chown(path, pbs.uid, pbs.gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def workdir(p: sim_pbs.Pbs, name: str) -> Path:
    """A submit directory of the jobs' user, in its home."""
    work = p.home / name
    work.mkdir()
    os.chown(work, p.uid, p.gid)
    return work


# ---- the imitation itself, with plain shell jobs -----------------------------------------------------------------


def qsub(p: sim_pbs.Pbs, work: Path, script: str, *options: str, env=()) -> str:
    """Writes ``script`` as job.sh in ``work`` and submits it as the jobs' user: the job id."""
    (work / "job.sh").write_text(script)
    proc = p.run(["qsub", *options, "job.sh"], user=True, cwd=work, env=dict(env))
    return proc.stdout.strip()


def ended(p: sim_pbs.Pbs, job_id: str) -> dict:
    """A plain shell job's final record (seconds of work; HANG_S only ends a hang)."""
    record = p.wait_ended(job_id, HANG_S)
    assert record.get("job_state") == "F", (record, p.logs())
    return record


def wait_file(path: Path) -> str:
    """``path``'s text once its last line is written (HANG_S only ends a hang)."""
    return wait_until(
        lambda: path.exists() and path.read_text().endswith("\n") and path.read_text(),
        what=f"{path}",
        poll_s=0.2,
    )


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_the_imitation_qdel_terms_every_session_waits_the_kill_delay_then_kills(pbs):
    """A job with a task on node002 (pbs_tmrsh): qdel SIGTERMs the job shell (Exit_status 271), the script and the
    remote task; a process that ignores SIGTERM is SIGKILLed after the queue's kill delay; nothing is left."""
    work = workdir(pbs, "imitation-qdel")
    pbs.qmgr("set queue rt_HG kill_delay = 2")
    script = f"""#!/bin/bash
#PBS -q rt_HG
#PBS -l select=2:ncpus=1
#PBS -l place=scatter
trap 'echo term >> {work}/script-term' TERM
{pbs.exec}/bin/pbs_tmrsh node002 /bin/bash {work}/task.sh &
python3 -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)' &
echo $! > {work}/stubborn-pid
echo "$$ $PBS_JOBID" > {work}/started
wait
"""
    (work / "task.sh").write_text(
        f'trap "echo $(hostname) \\$PBS_JOBID >> {work}/task-term; exit 0" TERM\n'
        f"echo $$ > {work}/task-pid\n"
        "while :; do sleep 0.2; done\n"
    )
    job = qsub(pbs, work, script)
    wait_file(work / "started")
    wait_file(work / "task-pid")
    stubborn = int(wait_file(work / "stubborn-pid"))
    pbs.run(["qdel", job], user=True)
    record = ended(pbs, job)
    assert record["Exit_status"] == 271, record
    assert wait_file(work / "task-term").split() == ["node002", job]
    assert stat_gone(stubborn), f"{stubborn} ignored SIGTERM and outlived the job"
    assert pbs.carrying(job) == [] and sim_pbs.escapes(record) == [], record
    queue = json.loads(pbs.run(["qstat", "-Qf", "-F", "json", "rt_HG"]).stdout)["Queue"]["rt_HG"]
    assert queue["kill_delay"] == 2, queue
    pbs.qmgr("unset queue rt_HG kill_delay")
    assert (
        "kill_delay"
        not in json.loads(pbs.run(["qstat", "-Qf", "-F", "json", "rt_HG"]).stdout)["Queue"]["rt_HG"]
    )


def stat_gone(pid: int) -> bool:
    state = sim_pbs.pbs_server.stat_of(pid)
    return state is None or state[1] in "ZX"


def test_the_imitation_finds_a_process_that_left_the_jobs_session(pbs):
    """setsid: invisible to PBS, it survives the job's end; the imitation names it, once seen and once alive after."""
    work = workdir(pbs, "imitation-setsid")
    script = f"""#!/bin/bash
setsid sleep 600 < /dev/null > /dev/null 2>&1 &
sleep 600 &
echo $! > {work}/inside
sleep 3
"""
    job = qsub(pbs, work, script)
    record = ended(pbs, job)
    left = pbs.carrying(job)
    try:
        assert record["Exit_status"] == 0, record
        assert [ln.split()[-2:] for ln in left] == [["sleep", "600"]], left
        found = sim_pbs.escapes(record)
        assert any("alive after the job ended" in f and "sleep 600" in f for f in found), record
        assert stat_gone(int((work / "inside").read_text())), (
            "the sleep in the job's session outlived it"
        )
    finally:
        kill_all(ln.split()[1] for ln in left)


def test_the_imitation_places_chunks_and_forwards_variables_as_pbs_does(pbs):
    """Without place=scatter two chunks share node001; with it each has its own host. A command line's -v replaces
    the script's #PBS -v; only -v'd variables and PBS_O_* reach the job; NCPUS/OMP_NUM_THREADS are the chunk's ncpus;
    -k oe keeps the log in the home while the job runs."""
    work = workdir(pbs, "imitation-place")
    script = """#!/bin/bash
#PBS -l select=2:ncpus=2:mpiprocs=1
#PBS -v FROM_DIRECTIVE=yes
#PBS -N place
#PBS -j oe
#PBS -k oe
echo "nodefile=$(tr '\\n' ' ' < "$PBS_NODEFILE")"
echo "directive=${FROM_DIRECTIVE:-unset} listed=${LISTED:-unset} unlisted=${UNLISTED:-unset}"
echo "ncpus=$NCPUS omp=$OMP_NUM_THREADS workdir=$PBS_O_WORKDIR queue=$PBS_QUEUE pwd=$PWD"
"""
    env = {"LISTED": "by-name", "UNLISTED": "never"}
    packed = qsub(pbs, work, script, env=env)
    scattered = qsub(pbs, work, script, "-l", "place=scatter", "-v", "LISTED", env=env)
    outputs = {}
    for job in (packed, scattered):
        record = ended(pbs, job)
        assert record["Exit_status"] == 0, record
        outputs[job] = (pbs.home / f"place.o{job.split('.')[0]}").read_text()
    assert ended(pbs, packed)["exec_host"] == "node001/0*2+node001/1*2"
    assert "nodefile=node001 node001 " in outputs[packed]
    assert "directive=yes listed=unset unlisted=unset" in outputs[packed]
    assert ended(pbs, scattered)["exec_host"] == "node001/0*2+node002/0*2"
    assert "nodefile=node001 node002 " in outputs[scattered]
    assert "directive=unset listed=by-name unlisted=unset" in outputs[scattered], outputs[scattered]
    assert f"ncpus=2 omp=2 workdir={work} queue=rt_HF pwd={pbs.home}" in outputs[scattered]


def test_the_imitation_runs_a_chain_after_its_predecessor(pbs):
    work = workdir(pbs, "imitation-chain")
    first = qsub(pbs, work, f"#!/bin/bash\nsleep 2\necho first >> {work}/order\nexit 3\n")
    second = qsub(
        pbs, work, f"#!/bin/bash\necho second >> {work}/order\n", "-W", f"depend=afterany:{first}"
    )
    assert pbs.job(second)["depend"].startswith(f"afterany:{first}")
    assert ended(pbs, first)["Exit_status"] == 3
    assert ended(pbs, second)["Exit_status"] == 0
    assert (work / "order").read_text().split() == ["first", "second"]
    assert (
        work / f"job.sh.o{second.split('.')[0]}"
    ).exists()  # no -k: copied to PBS_O_WORKDIR at the end


def test_the_imitation_ends_a_job_at_its_wall_time_as_a_qdel_does(pbs):
    """-l walltime: SIGTERM to the job's sessions at the limit (the script's trap runs), then as a qdel; -V gives the
    job the whole submitting environment.

    The limit counts from the job's start, so a busy machine can reach it before the shell has read its ``trap`` line
    (a CI run's job ended 271 with no trap run). The script notes when its trap is armed; a job whose limit came
    first says nothing of the property, and another runs with the wall time doubled (helpers.with_growing_budget)."""

    def job_of(walltime: int) -> tuple:
        work = workdir(pbs, f"imitation-walltime-{walltime}")
        script = f"""#!/bin/bash
#PBS -l walltime=00:00:{walltime:02d}
trap 'echo "term $WHOLE_ENV" > {work}/term' TERM
echo armed > {work}/armed
sleep 600 &
wait
"""
        job = qsub(pbs, work, script, "-V", env={"WHOLE_ENV": "came-with-V"})
        return work, job, ended(pbs, job)

    # 2 to 16 s: a job shell that has not read its third line in 16 s is a hang
    walltime, (work, job, record) = with_growing_budget(
        job_of, lambda result: (result[0] / "armed").exists(), budgets=(2, 4, 8, 16)
    )
    assert (work / "armed").exists(), (
        f"the wall time came before the job's trap line at every limit up to {walltime} s"
    )
    assert record["Exit_status"] == 271, record
    assert "walltime" in record["comment"], record
    # the trap writes before the shell exits, and the job ends once its last process has: no waiting
    assert (work / "term").exists(), f"the armed trap did not run before the job ended: {record}"
    assert (work / "term").read_text() == "term came-with-V\n"
    assert pbs.carrying(job) == [] and sim_pbs.escapes(record) == [], record


# ---- the rendered job ----------------------------------------------------------------------------------------------


class Submitted(SubmittedJobs):
    """What ``octo-dist launch pbs ... --submit`` said (helpers.SubmittedJobs), waited for under PBS."""

    def __init__(self, p: sim_pbs.Pbs, work: Path, stdout: str):
        super().__init__(work, stdout)
        self.pbs = p

    @property
    def save_dir(self) -> Path:
        return self.work / "runs" / "smoke"

    def tail(self, i: int = 0, n: int = 4000) -> str:
        return (
            f"--- job {self.ids[i]} log ---\n{self.log(i)[-n:]}\n"
            f"--- qstat -x -f ---\n{json.dumps(brief(self.pbs.job(self.ids[i])))}\n"
            f"{self.pbs.logs(1500)}"
        )

    def record_of(self, job_id: str) -> dict:
        return self.pbs.job(job_id)  # qstat -x -f

    def has_ended(self, record: dict) -> bool:
        return record.get("job_state") in sim_pbs.ENDED

    def cancel(self, job_id: str) -> None:
        self.pbs.run(["qdel", "-W", "force", job_id], check=False)


def require(condition, message: str) -> None:
    """A premise of a test, not what it asserts: fails it outright."""
    if not condition:
        pytest.fail(message)


def brief(record: dict) -> dict:
    """The fields of a ``qstat -x -f`` record a failure's message needs."""
    keys = ("job_state", "Exit_status", "exec_host", "exec_vnode", "queue", "project", "Resource_List",
            "comment", "Variable_List", "depend", "octo_outside_sessions", "octo_survivors")  # fmt: skip
    return {k: record[k] for k in keys if k in record}


def launch(
    p: sim_pbs.Pbs,
    cache: Path,
    work: Path,
    *extra: str,
    nodes: int = 2,
    ranks_per_node: int = 1,
    steps: int = STEPS,
    save_every: int = SAVE_EVERY,
    step_time: float = 0,
    chain: int = 0,
    cpus_per_rank: int = 1,
    shell: dict = SUBMIT_VARS,
) -> Submitted:
    """``octo-dist launch pbs ... --submit`` by the jobs' user on node001, in ``work`` (in its home), with ``shell``
    exported."""
    argv = [
        str(VENV / "bin" / "octo-dist"), "launch", "pbs", "--nodes", str(nodes), "--gpus-per-node",
        str(ranks_per_node), "--cpus-per-rank", str(cpus_per_rank), "--group", GROUP, "--module", "",
        "--venv", str(VENV), "--global-batch", str(4 * nodes * ranks_per_node), "--steps", str(steps),
        "--save-dir", "runs/smoke", "--wandb-mode", "disabled", "--compile-cache", str(cache), "-o", "job.sh",
        *extra, "--submit", *(["--chain", str(chain)] if chain else []),
        "--", "smoke", "--model", "tiny", f"--save-every={save_every}", f"--record={work / 'record.json'}",
        *([f"--step-time={step_time}"] if step_time else []),
    ]  # fmt: skip
    proc = p.run(argv, user=True, cwd=work, env=shell, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Submitted(p, work, proc.stdout)


def training_ranks(p: sim_pbs.Pbs, job_id: str) -> list[dict]:
    """The training ranks' environments (not the preflight's), newest first per rank, of one job."""
    seen, out = set(), []
    for env in reversed(p.rank_envs()):
        if " smoke " not in f" {env['_argv']} " or env.get("PBS_JOBID") != job_id:
            continue
        if env["_rank"] not in seen:
            seen.add(env["_rank"])
            out.append(env)
    return out


def hosts_of(exec_host: str) -> list[str]:
    """'node001/0+node002/0' -> ['node001', 'node002']."""
    return [chunk.split("/")[0] for chunk in exec_host.split("+") if chunk]


def steps_in(save_dir: Path) -> list[int]:
    if not save_dir.is_dir():
        return []
    return sorted(int(d.name) for d in save_dir.iterdir() if d.name.isdigit())


def verified_steps(save_dir: Path) -> list[int]:
    from octo_dist.engine.checksums import verify

    return [s for s in steps_in(save_dir) if verify(save_dir / str(s), s) is None]


@pytest.fixture(scope="module")
def one_node(pbs, compile_cache) -> Submitted:
    """The venv job on 1 node x 2 ranks, submitted, not waited for: it runs beside the two-node jobs (the imitation
    places it on node001's CPUs left free), as on a site's shared nodes."""
    return launch(pbs, compile_cache, workdir(pbs, "one-node"), nodes=1, ranks_per_node=2)


@pytest.fixture(scope="module")
def two_nodes(pbs, compile_cache, one_node) -> dict:  # one_node: submitted first, to run beside
    """The venv job on 2 nodes x 1 rank, each rank given 2 CPUs, rendered without any --resource but a ``#PBS -v``
    directive, submitted as a chain of 2 with NCCL_*/XLA_*/OCTO_DIST_* exported: the first job run once to the end;
    what PBS, the ranks and the save directory said. The chained job (``job``'s second) is the chain test's."""
    job = launch(
        pbs, compile_cache, workdir(pbs, "two-nodes"), "--directive",
        f"#PBS -v {DIRECTIVE_VAR}={DIRECTIVE_MARK}", cpus_per_rank=2, chain=2,
        shell={**SUBMIT_VARS, DIRECTIVE_VAR: "from-the-submit-shell"},
    )  # fmt: skip
    queued = pbs.job(job.ids[1])  # while the first job runs
    final = job.wait()
    rec = job.work / "record.json"
    return {
        "job": job,
        "queued": queued,
        "final": final,
        "record": json.loads(rec.read_text()) if rec.exists() else None,
        "script": (job.work / "job.sh").read_text(),
        "ranks": training_ranks(pbs, job.id),
        "log": job.log(),
        "tail": job.tail(),
        "id": job.id,
        "verified": verified_steps(job.save_dir),
        "left": pbs.carrying(job.id),
    }


def test_a_2_node_job_trains_on_both_hosts_and_exits_0(two_nodes):
    final, tail = two_nodes["final"], two_nodes["tail"]
    assert final["job_state"] == "F" and final.get("Exit_status") == 0, tail
    assert final["queue"] == "rt_HF" and final["project"] == GROUP, brief(final)
    rec = two_nodes["record"]
    assert rec, tail
    assert sorted(rec["hosts"]) == ["node001", "node002"], rec["hosts"]
    assert len(rec["digests"]) == 2 and len(set(rec["digests"])) == 1, rec["digests"]
    assert rec["end_step"] == STEPS and not rec["stopped_by"], rec
    assert STEPS in two_nodes["verified"], two_nodes["verified"]
    assert "2 rank(s) on 2 host(s)" in two_nodes["log"], tail
    # node002's rank was started by PBS for this job (pbs_tmrsh: a task of the job), not by ssh.
    remote = [e for e in two_nodes["ranks"] if e["_host"] == "node002"]
    assert remote and all(e.get("PBS_JOBID") == two_nodes["id"] for e in remote), [
        {k: e.get(k) for k in ("_host", "_rank", "PBS_JOBID", "PBS_TASKNUM")}
        for e in two_nodes["ranks"]
    ]
    # Every process of the job stayed in its sessions (PBS saw, signalled and ended them) and none outlived it.
    assert sim_pbs.escapes(final) == [] and two_nodes["left"] == [], (
        sim_pbs.escapes(final),
        two_nodes["left"],
    )


def test_a_2_node_job_gets_two_hosts(two_nodes):
    """Without place=scatter PBS may put both chunks on one host (the imitation does, as the real one did)."""
    final = two_nodes["final"]
    asked = [ln for ln in two_nodes["script"].splitlines() if ln.startswith("#PBS -l")]
    assert sorted(hosts_of(final["exec_host"])) == ["node001", "node002"], (
        f"a job rendered for 2 nodes ran on exec_host {final['exec_host']} (exec_vnode {final.get('exec_vnode')}); "
        f"its script asks: {' | '.join(asked)}"
    )


def test_the_submit_shells_forwarded_variables_reach_every_rank(two_nodes):
    ranks = two_nodes["ranks"]
    require(sorted(e["_host"] for e in ranks) == ["node001", "node002"], two_nodes["tail"])
    seen = {f"{e['_host']} rank {e['_rank']}": {k: e.get(k) for k in SUBMIT_VARS} for e in ranks}
    missing = {who: got for who, got in seen.items() if got != SUBMIT_VARS}
    assert not missing, (
        f"exported in the submitting shell {SUBMIT_VARS}; the training ranks saw {missing} "
        f"(qstat Variable_List: {sorted(two_nodes['final'].get('Variable_List', {}))})"
    )
    listed = two_nodes["final"].get("Variable_List", {})
    assert all(listed.get(k) == v for k, v in SUBMIT_VARS.items()), listed
    # Visible in the log as a user would see it on ABCI: OCTO_DIST_LOG_ALL_RANKS=1 gave node002's rank INFO lines
    # (many of them: one intact is enough however the ranks' output interleaves).
    assert "[rank 1/2 node002] INFO" in two_nodes["log"], two_nodes["tail"]


def test_ranks_get_the_cpus_they_are_given(two_nodes):
    """Each rank was given 2 CPUs (--cpus-per-rank 2, one rank per node): nothing may tell it it has 1."""
    ranks = two_nodes["ranks"]
    require(len(ranks) == 2, two_nodes["tail"])
    seen = {
        f"{e['_host']} rank {e['_rank']}": {
            "NCPUS": e.get("NCPUS"),
            "OMP_NUM_THREADS": e.get("OMP_NUM_THREADS"),
        }
        for e in ranks
    }
    short = {
        who: got
        for who, got in seen.items()
        if any(got[k] not in (None, "") and int(got[k]) < 2 for k in ("NCPUS", "OMP_NUM_THREADS"))
    }
    assert not short, (
        f"each rank was given 2 CPUs; they saw {short} (exec_vnode {two_nodes['final'].get('exec_vnode')})"
    )


def test_a_1_node_job_of_2_ranks_trains_and_exits_0(pbs, one_node):
    job = one_node
    final = job.wait()
    assert final["job_state"] == "F" and final.get("Exit_status") == 0, job.tail()
    assert hosts_of(final["exec_host"]) == ["node001"], brief(final)
    rec = job.record()
    assert rec["hosts"] == ["node001", "node001"] and len(set(rec["digests"])) == 1, rec
    assert rec["end_step"] == STEPS and STEPS in verified_steps(job.save_dir), rec
    assert sim_pbs.escapes(final) == [] and pbs.carrying(job.id) == [], job.tail()


def test_a_chained_job_keeps_the_scripts_directives_and_starts_ranks_through_pbs(pbs, two_nodes):
    """The two-node job's chained job: held for the first (``-W depend``), then given the script's ``#PBS -v`` (a
    command line's -v replaces the script's list: the submission must repeat it), over the submit shell's value of
    the same variable, on both its ranks, started through PBS on both hosts."""
    job, queued = two_nodes["job"], two_nodes["queued"]
    first, second = job.ids
    assert queued.get("depend", "").startswith(f"afterany:{first}") or queued["job_state"] != "H", (
        queued
    )
    require(two_nodes["final"].get("Exit_status") == 0, two_nodes["tail"])
    final = job.wait(1)
    require(final.get("Exit_status") == 0, job.tail(1))
    listed = final.get("Variable_List", {})
    ranks = training_ranks(pbs, second)
    seen = {f"{e['_host']} rank {e['_rank']}": e.get(DIRECTIVE_VAR) for e in ranks}
    assert listed.get(DIRECTIVE_VAR) == DIRECTIVE_MARK, (
        f"the script says '#PBS -v {DIRECTIVE_VAR}={DIRECTIVE_MARK}'; the chained job {second}'s "
        f"Variable_List is {listed}; its training ranks saw {DIRECTIVE_VAR}={seen}"
    )
    assert sorted(e["_host"] for e in ranks) == ["node001", "node002"], job.tail(1)
    assert all(v == DIRECTIVE_MARK for v in seen.values()), seen


# ---- a lost node (long) ----------------------------------------------------------------------------------------


def mend_link(node: str) -> None:
    """Plugs node's cable back in (``Cluster.cut_link`` undone): the module's other jobs use node002."""
    sim._ip("-n", sim.SWITCH, "link", "set", f"{sim.PREFIX}-{node}", "up")


@pytest.mark.cluster_long
@pytest.mark.parametrize("fault", ["sigkill", "link-cut"])
def test_a_lost_node_ends_the_job_fast_and_keeps_its_checkpoints(fault, pbs, compile_cache):
    """A 2-node job as rendered, paced; after its first checkpoint node002's rank is SIGKILLed, or node002's link
    cut (packets dropped, no RST: mpirun and the ranks on node001 hear nothing more). The job ends well before its
    wall time, fails (PBS's Exit_status non-zero), its log names node002 or rank 1 after the fault, the checkpoints
    written before it are intact and verify, and nothing of the job is left on either node."""
    job = launch(
        pbs,
        compile_cache,
        workdir(pbs, f"lost-{fault}"),
        "--walltime",
        "1:00:00",
        steps=LONG,
        step_time=LONG_STEP_TIME,
        save_every=LONG_SAVE_EVERY,
    )
    job.wait_for(job.save_dir / str(LONG_SAVE_EVERY) / MANIFEST)
    before = checkpoints(job.save_dir)
    seen = len(job.log())  # the preflight already names node002: read what follows
    t0 = time.monotonic()
    try:
        if fault == "link-cut":
            pbs.cluster.cut_link("node002")
        else:
            require(
                pbs.cluster.kill_ranks("node002", also=b"smoke"),
                "no rank process found on node002\n" + job.tail(),
            )
        final = pbs.wait_ended(job.id, LOST_NODE_BOUND_S)
        took = time.monotonic() - t0
    finally:
        if fault == "link-cut":
            mend_link("node002")
    if final.get("job_state") not in sim_pbs.ENDED:
        pbs.run(["qdel", "-W", "force", job.id], check=False)
        pytest.fail(
            f"{fault}: job {job.id} still {final.get('job_state')} {took:.0f} s after node002 was lost "
            f"(a job that holds its nodes until the wall time)\n" + job.tail()
        )
    left = pbs.carrying(job.id)
    said = job.log()[seen:]
    what = (
        f"{fault}, ended {took:.0f} s after: {json.dumps(brief(final))}; left: {left}\n{job.tail()}"
    )
    assert final.get("Exit_status") not in (None, 0), "the job did not fail: " + what
    # A killed rank: the runtime's own words (its rank guard's note), whatever the MPI's messages say. A cut link:
    # node002's rank may never fail by itself, so whoever notices (the coordination service, mpirun) names it.
    names = ["rank 1 on node002"] if fault == "sigkill" else ["node002", "rank 1 "]
    assert any(n in said for n in names), (
        f"nothing the job said after the fault names {' or '.join(names)}: {said[-3000:]}\n{what}"
    )
    after = checkpoints(job.save_dir)
    assert before and changed_since(before, after) == {}, (
        "a checkpoint written before the fault changed: " + what
    )
    newest = max(int(k.split("/")[0]) for k in before)
    assert newest in verified_steps(job.save_dir), (newest, steps_in(job.save_dir), what)
    assert sim_pbs.escapes(final) == [] and left == [], (
        "processes of the job that PBS could not end: " + what
    )
    print(f"\nlost node ({fault}): job {job.id} ended {took:.1f} s after the fault, Exit_status "
          f"{final.get('Exit_status')}")  # fmt: skip
