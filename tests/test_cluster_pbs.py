"""The rendered PBS job under a real PBS (OpenPBS 23.06.06, the open-source PBS Professional) on the namespace cluster.

``tests/cluster/pbs.py`` starts the server (with its PostgreSQL datastore), scheduler and comm on node001 and a mom
on node001 and node002, with ABCI's queues ``rt_HF``/``rt_HG``; OpenPBS is built once per machine by
``tests/cluster/openpbs-build.sh`` (root). Every job is rendered and submitted as a user does it, by a user that is
not root, on node001: ``octo-dist launch pbs ... --submit`` (the real ``qsub``; ``--chain`` its ``-W depend``), from
a submit directory in that user's home, with ``NCCL_*``/``OCTO_DIST_*`` exported in the submitting shell. The ranks
run from this checkout's venv under Debian's Open MPI 4.1 ``mpirun``; node002's are started by PBS's task manager
(``pbs_tmrsh``, the site's rsh agent). Results come from rank 0's record (``--record``), the save directory (its
checkpoints verified as a resume verifies them, the job's exit file and lock), each rank's environment as the
site's ``sitecustomize`` recorded it (one file per rank), the processes left on the nodes, and ``qstat -x -f``;
never from interleaved output.

Six behaviours a real PBS showed (``test_finding_N``) are asserted as they should be: each failed before its fix
(marked ``xfail(strict=True)`` until then).
"""

from __future__ import annotations

import json
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cluster import pbs as sim_pbs
from cluster import sim

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

VENV = Path(sys.executable).parent.parent
GROUP = "gxx00000"  # -P: an ABCI group
STEPS = 10
SAVE_EVERY = 2
LONG = 10**6  # steps of a run that only a stop or a fault ends
LONG_STEP_TIME = 0.1  # such a run sleeps between steps: the tests beside it keep the cores
JOB_TIMEOUT_S = 480  # a whole job (queueing, preflight, training) on a loaded 2-core machine
END_TIMEOUT_S = 180  # qdel to the job's end: PBS's kill delay (10 s) and a loaded machine
FAULT_DEADLINE_S = 90  # keepalive (25 s) + the script's failed-rank grace (20 s) + a loaded machine
LINGER_S = 100  # how long after the job's end the test watches for processes it left
# Exported in the submit shell: the README says NCCL_*, OCTO_DIST_* ... reach every rank.
SUBMIT_VARS = {"NCCL_DEBUG": "WARN", "OCTO_DIST_CLUSTER_MARK": "from-the-submit-shell"}
DIRECTIVE_MARK = "from-a-directive"
PLACE_SCATTER = ()  # one chunk per host: the rendered header asks for it (#PBS -l place=scatter)


@pytest.fixture(scope="session")
def pbs_ready():
    reason = sim_pbs.unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def compile_cache(pbs_ready):
    """One JAX compilation cache for the session's jobs (the jobs' user writes it): only the first job compiles."""
    path = Path(tempfile.mkdtemp(prefix=f"{sim.PREFIX}-pbs-cache-", dir="/var/tmp"))
    path.chmod(0o755)
    pw = sim_pbs.ensure_user()
    shutil.chown(path, pw.pw_uid, pw.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def up(state: Path):
    """A cluster with PBS up, for a ``with`` block."""
    cluster = sim.Cluster(state)

    class Both:
        def __enter__(self):
            cluster.up()
            try:
                self.pbs = sim_pbs.Pbs(cluster).up()
            except BaseException:
                cluster.down()
                raise
            return self.pbs

        def __exit__(self, *exc):
            try:
                self.pbs.down()
            finally:
                cluster.down()

    return Both()


@pytest.fixture
def pbs(pbs_ready, tmp_path):
    with up(tmp_path / "cluster") as p:
        yield p


class Submitted:
    """What ``octo-dist launch pbs ... --submit`` said: the job ids and their logs; the submit directory."""

    def __init__(self, p: sim_pbs.Pbs, work: Path, stdout: str):
        self.pbs, self.work = p, work
        # "submitted job 3.node001, after 2.node001: log /var/spool/octosim-pbs/home/octo-dist.o3"
        found = re.findall(r"^submitted job (\S+?)(?:, after \S+)?: log (\S+)$", stdout, re.M)
        assert found, stdout
        self.ids = [j for j, _ in found]
        self.logs = [Path(log) for _, log in found]

    @property
    def id(self) -> str:
        return self.ids[0]

    @property
    def save_dir(self) -> Path:
        return self.work / "runs" / "smoke"

    def log(self, i: int = 0) -> str:
        return self.logs[i].read_text(errors="replace") if self.logs[i].exists() else "(no log yet)"

    def tail(self, i: int = 0, n: int = 4000) -> str:
        return (
            f"--- job {self.ids[i]} log ---\n{self.log(i)[-n:]}\n"
            f"--- qstat -x -f ---\n{json.dumps(brief(self.pbs.job(self.ids[i])))}\n"
            f"--- daemons ---\n{self.pbs.logs(1500)}"
        )

    def wait(self, i: int = 0, timeout: float = JOB_TIMEOUT_S) -> dict:
        """The job's final record (``qstat -x -f``); fails the test if it has not ended by ``timeout``."""
        t0 = time.monotonic()
        record = self.pbs.wait_ended(self.ids[i], timeout)
        if record.get("job_state") not in sim_pbs.ENDED:
            self.pbs.run(["qdel", "-W", "force", self.ids[i]], check=False)
            pytest.fail(
                f"job {self.ids[i]} is {record.get('job_state')} after {time.monotonic() - t0:.0f} s\n"
                + self.tail(i)
            )
        return record

    def wait_running(self, i: int = 0, timeout: float = JOB_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            record = self.pbs.job(self.ids[i])
            if record.get("job_state") == "R" and record.get("exec_host"):
                return record
            if record.get("job_state") in sim_pbs.ENDED:
                pytest.fail(f"job {self.ids[i]} ended before it was seen running\n" + self.tail(i))
            if time.monotonic() > deadline:
                pytest.fail(f"job {self.ids[i]} not running after {timeout:.0f} s\n" + self.tail(i))
            time.sleep(0.5)


def require(condition, message: str) -> None:
    """A premise of a test, not what it asserts: fails it outright (never counted as its expected failure, which
    ``xfail(raises=AssertionError)`` limits to the assertions)."""
    if not condition:
        pytest.fail(message)


def brief(record: dict) -> dict:
    """The fields of a ``qstat -x -f`` record a failure's message needs."""
    keys = ("job_state", "substate", "Exit_status", "exec_host", "exec_vnode", "queue", "project",
            "Resource_List", "resources_used", "comment", "Variable_List")  # fmt: skip
    return {k: record[k] for k in keys if k in record}


def launch(
    p: sim_pbs.Pbs,
    cache: Path,
    *extra: str,
    nodes: int = 2,
    ranks_per_node: int = 1,
    steps: int = STEPS,
    save_every: int = SAVE_EVERY,
    step_time: float = 0,
    chain: int = 0,
    cpus_per_rank: int = 1,
    work: Path | None = None,
) -> Submitted:
    """``octo-dist launch pbs ... --submit`` by the jobs' user on node001, in a submit directory in its home."""
    work = work or p.home / "submit"
    if not work.exists():
        work.mkdir()
        pw = pwd.getpwnam(p.user)
        shutil.chown(work, pw.pw_uid, pw.pw_gid)
    argv = [
        str(VENV / "bin" / "octo-dist"),
        "launch",
        "pbs",
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        str(ranks_per_node),
        "--cpus-per-rank",
        str(cpus_per_rank),
        "--group",
        GROUP,
        "--module",
        "",
        "--venv",
        str(VENV),
        "--global-batch",
        str(4 * nodes * ranks_per_node),
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
    proc = p.run(argv, user=True, cwd=work, env=SUBMIT_VARS, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Submitted(p, work, proc.stdout)


def record(work: Path) -> dict:
    path = work / "record.json"
    assert path.exists(), f"rank 0 wrote no {path}"
    return json.loads(path.read_text())


def wait_for(path: Path, job: Submitted, timeout: float = JOB_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        state = job.pbs.job(job.id).get("job_state")
        if state in sim_pbs.ENDED:
            pytest.fail(f"job {job.id} ended before {path.name} appeared\n" + job.tail())
        if time.monotonic() > deadline:
            pytest.fail(f"no {path} after {timeout:.0f} s\n" + job.tail())
        time.sleep(0.5)


def job_processes(p: sim_pbs.Pbs) -> list[str]:
    """Every live process of the jobs' user on the nodes, qsub's excepted: 'node002: 4242 /usr/bin/orted ...'."""
    uid = pwd.getpwnam(p.user).pw_uid
    out = []
    for node in p.cluster.nodes:
        for pid in p.cluster.processes_on(node):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            uids = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("Uid:")), [])
            if cmd.split(b" ")[0].endswith(b"qsub"):
                continue  # qsub's own background process on the login node, left by the submission
            if uids and int(uids[0]) == uid and "\nState:\tZ" not in status:
                out.append(f"{node}: {pid} {cmd.decode(errors='replace').strip()[:160]}")
    return out


def training_ranks(p: sim_pbs.Pbs, job_id: str | None = None) -> list[dict]:
    """The training ranks' environments (not the preflight's), newest first per rank, of one job or all."""
    seen, out = set(), []
    for env in reversed(p.rank_envs()):
        if " smoke " not in f" {env['_argv']} " or (job_id and env.get("PBS_JOBID") != job_id):
            continue
        key = (env.get("PBS_JOBID"), env["_rank"])
        if key not in seen:
            seen.add(key)
            out.append(env)
    return out


def hosts_of(exec_host: str) -> list[str]:
    """'node001/0+node002/0' -> ['node001', 'node002']."""
    return [chunk.split("/")[0] for chunk in exec_host.split("+") if chunk]


def steps_in(save_dir: Path) -> list[int]:
    return (
        sorted(int(d.name) for d in save_dir.iterdir() if d.name.isdigit())
        if save_dir.is_dir()
        else []
    )


def verified_steps(save_dir: Path) -> list[int]:
    from octo_dist.engine.checkpoint import verify

    return [s for s in steps_in(save_dir) if verify(save_dir / str(s), s) is None]


# ---- a crashed run, and the jobs that train to the end ------------------------------------------------------------

CRASHING_RUN = """
import json, os, sys
from pathlib import Path
from cluster import pbs, sim
cluster = sim.Cluster(Path(sys.argv[1])).up()
server = pbs.Pbs(cluster).up()
pids = [p for n in cluster.nodes for p in cluster.processes_on(n)
        if b"pbs_" in Path(f"/proc/{p}/cmdline").read_bytes() or b"postgres" in Path(f"/proc/{p}/cmdline").read_bytes()]
shmid = (pbs.RUN / "node001" / "datastore" / "postmaster.pid").read_text().splitlines()[6].split()[1]
print(json.dumps({"pids": pids, "shmid": shmid}), flush=True)
os.kill(os.getpid(), 9)  # no teardown at all
"""


def alive(pids: list) -> list:
    out = []
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if "\nState:\tZ" not in status:
            out.append(pid)
    return out


def test_a_crashed_run_leaves_no_daemon_and_no_file_behind(pbs_ready, tmp_path):
    """A run killed with its daemons up (no teardown): the next set-up ends them and removes their run directory
    and the postmaster's shared memory; nothing was written to /etc."""
    out, err = tmp_path / "crashed.out", tmp_path / "crashed.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASHING_RUN, str(tmp_path / "crashed")],
            stdout=o,
            stderr=e,
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).parent,
        )
        rc = proc.wait(timeout=300)
    assert rc == -9, err.read_text()[-3000:]
    crashed = json.loads(out.read_text())
    daemons = crashed["pids"]
    # pbs_comm, pbs_server, pbs_sched, two pbs_mom, the postmaster and its workers
    assert len(daemons) >= 6, daemons
    with up(tmp_path / "next") as p:
        deadline = time.monotonic() + 60
        while alive(daemons) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert alive(daemons) == [], alive(daemons)
        assert p._nodes_free()
        # The SIGKILLed postmaster's shared memory, which only its own clean exit would have removed.
        segments = [ln.split()[1] for ln in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
        assert crashed["shmid"] not in segments, crashed
    assert not sim_pbs.RUN.exists()
    assert not Path("/etc/pbs.conf").exists()


@pytest.fixture(scope="session")
def two_nodes(pbs_ready, compile_cache, tmp_path_factory) -> dict:
    """The venv job on 2 nodes x 1 rank, each rank given 2 CPUs, one chunk per host, submitted with NCCL_*/OCTO_DIST_*
    exported: run once to the end; what PBS, the ranks and the save directory said."""
    with up(tmp_path_factory.mktemp("pbs-two-nodes") / "cluster") as p:
        job = launch(p, compile_cache, *PLACE_SCATTER, cpus_per_rank=2)
        final = job.wait()
        return {
            "final": final,
            "record": json.loads((job.work / "record.json").read_text())
            if (job.work / "record.json").exists()
            else None,
            "script": (job.work / "job.sh").read_text(),
            "ranks": training_ranks(p, job.id),
            "log": job.log(),
            "tail": job.tail(),
            "id": job.id,
            "verified": verified_steps(job.save_dir),
        }


def test_a_2_node_job_trains_on_both_hosts_and_exits_0(two_nodes):
    final, tail = two_nodes["final"], two_nodes["tail"]
    assert final["job_state"] == "F" and final.get("Exit_status") == 0, tail
    assert sorted(hosts_of(final["exec_host"])) == ["node001", "node002"], brief(final)
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


def test_a_1_node_job_of_2_ranks_trains_and_exits_0(pbs, compile_cache):
    job = launch(pbs, compile_cache, nodes=1, ranks_per_node=2)
    final = job.wait()
    assert final["job_state"] == "F" and final.get("Exit_status") == 0, job.tail()
    assert hosts_of(final["exec_host"]) == ["node001"], brief(final)
    rec = record(job.work)
    assert rec["hosts"] == ["node001", "node001"] and len(set(rec["digests"])) == 1, rec
    assert rec["end_step"] == STEPS and STEPS in verified_steps(job.save_dir), rec


def test_finding_2_the_submit_shells_forwarded_variables_reach_every_rank(two_nodes):
    ranks = two_nodes["ranks"]
    require(sorted(e["_host"] for e in ranks) == ["node001", "node002"], two_nodes["tail"])
    seen = {f"{e['_host']} rank {e['_rank']}": {k: e.get(k) for k in SUBMIT_VARS} for e in ranks}
    missing = {who: got for who, got in seen.items() if got != SUBMIT_VARS}
    assert not missing, (
        f"exported in the submitting shell {SUBMIT_VARS}; the training ranks saw {missing} "
        f"(qstat Variable_List: {sorted(two_nodes['final'].get('Variable_List', {}))})"
    )


def test_finding_6_ranks_get_the_cpus_they_are_given(two_nodes):
    """Each rank was given 2 CPUs (--cpus-per-rank 2, one rank per node): nothing may tell it it has 1."""
    ranks = two_nodes["ranks"]
    require(len(ranks) == 2, two_nodes["tail"])
    seen = {
        f"{e['_host']} rank {e['_rank']}": {
            "NCPUS": e.get("NCPUS"),
            "OMP_NUM_THREADS": e.get("OMP_NUM_THREADS"),
            "cpus it may run on": int(e["_affinity"]),
        }
        for e in ranks
    }
    short = {
        who: got
        for who, got in seen.items()
        if got["cpus it may run on"] < 2
        or any(got[k] not in (None, "") and int(got[k]) < 2 for k in ("NCPUS", "OMP_NUM_THREADS"))
    }
    assert not short, (
        f"each rank was given 2 CPUs; they saw {short} (qstat Resource_List "
        f"{two_nodes['final'].get('Resource_List')}, exec_vnode {two_nodes['final'].get('exec_vnode')})"
    )


def test_finding_4_a_2_node_job_gets_two_hosts(pbs, compile_cache):
    """Rendered as a user does without a --resource: its chunks must land on two hosts. Read as soon as it runs."""
    job = launch(pbs, compile_cache, steps=LONG, step_time=LONG_STEP_TIME)
    running = job.wait_running()
    pbs.run(["qdel", job.id], user=True, check=False)
    hosts = hosts_of(running["exec_host"])
    assert sorted(set(hosts)) == ["node001", "node002"], (
        f"a job rendered for 2 nodes got exec_host {running['exec_host']} (exec_vnode {running.get('exec_vnode')}, "
        f"Resource_List {running.get('Resource_List')}); its script asks: "
        + " | ".join(
            ln for ln in (job.work / "job.sh").read_text().splitlines() if ln.startswith("#PBS -l")
        )
    )


def test_the_wall_time_timer_stops_every_rank_and_the_chained_job_resumes(pbs, compile_cache):
    """--walltime 6 min, --stop-margin 210 s: the job's own timer asks the ranks to stop 150 s in (PBS itself kills
    at the wall time), they checkpoint and the job ends 0; the chained job (qsub -W depend=afterany) resumes from it.
    1500 steps at 0.1 s outlast the first job whatever its start-up took."""
    job = launch(
        pbs,
        compile_cache,
        *PLACE_SCATTER,
        "--walltime",
        "0:06:00",
        "--stop-margin",
        "210",
        steps=1500,
        step_time=LONG_STEP_TIME,
        chain=2,
    )
    first, second = job.ids
    assert (
        pbs.job(second).get("depend", "").startswith(f"afterany:{first}")
        or pbs.job(second).get("job_state") != "Q"
    ), brief(pbs.job(second))
    final = job.wait(0)
    assert final.get("Exit_status") == 0, job.tail(0)
    stopped = record(job.work)
    assert stopped["stopped_by"] and 0 < stopped["end_step"] < 1500, (stopped, job.tail(0))
    assert stopped["end_step"] in verified_steps(job.save_dir), (stopped, steps_in(job.save_dir))
    assert (job.save_dir / f".octo-dist-exit-{first}").read_text().strip() == "0"

    final = job.wait(1)
    assert final.get("Exit_status") == 0, job.tail(1)
    resumed = record(job.work)
    assert resumed["start_step"] == stopped["end_step"], (stopped, resumed)
    assert resumed["end_step"] > resumed["start_step"] and len(set(resumed["digests"])) == 1, (
        resumed
    )


# ---- qdel, a lost node, --chain with the script's own directives (long) ------------------------------------------


def qdel_scenario(
    p: sim_pbs.Pbs, cache: Path, nodes: int, step_time: float, kill_delay: int | None
) -> dict:
    """A paced job (one rank per node, a checkpoint every step) qdel'led once it has one, in queue rt_HF with
    ``kill_delay`` (None: PBS's default, 10 s): what PBS, the nodes and the save directory showed at and after
    its end."""
    if kill_delay is not None:
        p.qmgr(f"set queue rt_HF kill_delay={kill_delay}")
    extra = PLACE_SCATTER if nodes > 1 else ()
    job = launch(p, cache, *extra, nodes=nodes, steps=LONG, step_time=step_time, save_every=1)
    wait_for(job.save_dir / "1", job)
    before = job_processes(p)
    p.run(["qdel", job.id], user=True)
    t0 = time.monotonic()
    final = p.wait_ended(job.id, END_TIMEOUT_S)
    ended_s = time.monotonic() - t0
    at_end = job_processes(p)
    # How long what was left kept running after PBS declared the job over.
    lingered, left = 0.0, at_end
    while left and lingered < LINGER_S:
        time.sleep(1)
        lingered = time.monotonic() - t0 - ended_s
        left = job_processes(p)
    exit_file = job.save_dir / f".octo-dist-exit-{job.id}"
    rec = job.work / "record.json"
    return {
        "id": job.id,
        "final": final,
        "ended_s": ended_s,
        "before": before,
        "at_end": at_end,
        "lingered_s": lingered,
        "still_left": left,
        "record": json.loads(rec.read_text()) if rec.exists() else None,
        "steps": steps_in(job.save_dir),
        "verified": verified_steps(job.save_dir),
        "exit_file": exit_file.read_text().strip() if exit_file.exists() else None,
        "lock": (job.save_dir / ".octo-dist.lock").exists(),
        "log": job.log(),
        "tail": job.tail(),
    }


# A step that outlasts PBS's default kill delay (10 s: SIGTERM, then SIGKILL to the job's session): the ranks agree
# on a stop in the step after the signal and end after the one after it, so their stop takes two or three steps (as
# a large model's steps and checkpoint may).
SLOW_STEP_TIME = 15
# A queue's kill delay that such a stop fits in, loaded machine included (measured: 3 steps of 25 s and the
# checkpoint did not fit in 60 s). A site sets it with qmgr -c "set queue rt_HF kill_delay=90".
LONG_KILL_DELAY_S = 90


@pytest.fixture(scope="module")
def qdelled(pbs_ready, compile_cache, tmp_path_factory):
    """The qdel scenario by nodes, step time and the queue's kill delay, each run once (on its own cluster) when a
    test first asks."""
    runs: dict[tuple, dict] = {}

    def get(nodes: int, step_time: float, kill_delay: int | None = None) -> dict:
        key = (nodes, step_time, kill_delay)
        if key not in runs:
            with up(tmp_path_factory.mktemp(f"pbs-qdel-{nodes}") / "cluster") as p:
                runs[key] = qdel_scenario(p, compile_cache, *key)
        return runs[key]

    return get


def what_qdel_left(run: dict) -> str:
    final, rec = run["final"], run["record"]
    return (
        f"qdel: PBS said job_state={final.get('job_state')} Exit_status={final.get('Exit_status')} "
        f"resources_used={final.get('resources_used')} {run['ended_s']:.0f} s after qdel; processes of the job at "
        f"that moment: {run['at_end'] or 'none'}; still running {run['lingered_s']:.0f} s later: "
        f"{run['still_left'] or 'none'}; rank 0's record: "
        f"{ {k: rec.get(k) for k in ('stopped_by', 'end_step')} if rec else 'none' }; "
        f"checkpoints {run['steps']}, verified {run['verified']}; exit file: {run['exit_file']}; "
        f"lock left: {run['lock']}\n--- the job's log ---\n{run['log'][-2500:]}"
    )


def assert_a_clean_stop(run: dict) -> None:
    said = what_qdel_left(run)
    require(run["final"].get("job_state") == "F", said)
    assert not run["at_end"], "processes of the job outlived it: " + said
    rec = run["record"]
    assert rec and rec["stopped_by"], "no stop recorded by rank 0: " + said
    assert rec["end_step"] in run["verified"], "the stop checkpoint does not verify: " + said
    assert run["exit_file"] == "0", "no exit file saying 0: " + said
    assert not run["lock"], "the save directory's lock was left behind: " + said


@pytest.mark.cluster_long
def test_qdel_mid_run_stops_every_rank_cleanly_when_the_stop_fits_the_kill_delay(qdelled):
    """Steps of 0.1 s: the ranks checkpoint and exit within PBS's kill delay; nothing of the job is left on either
    node, the stop checkpoint verifies, the exit file says 0, no lock is left."""
    assert_a_clean_stop(qdelled(2, LONG_STEP_TIME))


@pytest.mark.cluster_long
@pytest.mark.parametrize("nodes", [1, 2])
def test_finding_1_qdel_during_training_leaves_no_process_and_a_verified_stop_checkpoint(
    qdelled, nodes
):
    """Steps of 15 s in a queue whose kill delay (90 s) the stop fits: mpirun and the ranks belong to the job
    (PBS signals them, and its end waits for them), mpirun is told the kill delay (Open MPI 4 would kill its
    ranks 1 s after PBS's SIGTERM), and the stop leaves a verified checkpoint, the exit file and no lock."""
    run = qdelled(nodes, SLOW_STEP_TIME, LONG_KILL_DELAY_S)
    assert_a_clean_stop(run)
    said = f"a qdel gives this job {LONG_KILL_DELAY_S}s from SIGTERM to SIGKILL (queue rt_HF's kill_delay)"
    assert said in run["log"], what_qdel_left(run)


@pytest.mark.cluster_long
def test_a_qdel_whose_stop_outlasts_the_kill_delay_leaves_nothing_running_and_keeps_the_checkpoints(
    qdelled,
):
    """Steps of 15 s, PBS's default kill delay (10 s): the stop cannot finish before PBS's SIGKILL. The job said
    so when it started; PBS's end is the end of every process of the job on both nodes, and the checkpoints
    written before the qdel still verify."""
    run = qdelled(2, SLOW_STEP_TIME)
    said = what_qdel_left(run)
    require(run["final"].get("job_state") == "F", said)
    assert not run["at_end"] and not run["still_left"], "processes of the job outlived it: " + said
    assert run["verified"] and run["verified"][-1] >= 1, "no checkpoint verifies: " + said
    assert (
        "a qdel gives this job 10s from SIGTERM to SIGKILL (PBS's default: queue rt_HF sets no kill_delay)"
        in run["log"]
    ), said


@pytest.mark.cluster_long
def test_finding_5_a_qdel_after_a_clean_checkpoint_reports_what_happened(qdelled):
    run = qdelled(2, LONG_STEP_TIME)
    said = what_qdel_left(run)
    rec = run["record"]
    # The premise: the job stopped cleanly (rank 0's stop checkpoint verifies, the job's exit file says 0).
    require(rec and rec["stopped_by"] and rec["end_step"] in run["verified"], said)
    require(run["exit_file"] == "0", said)
    status = run["final"].get("Exit_status")
    explained = [
        ln
        for ln in run["log"].splitlines()
        if ln.startswith("octo-dist job:") and str(rec["end_step"]) in ln and str(status) in ln
    ]
    assert status == 0 or explained, (
        f"the job checkpointed step {rec['end_step']} and wrote exit 0, PBS reports Exit_status {status}, and no "
        f"line of the job's log names both (the step and {status}): " + said
    )


@pytest.mark.cluster_long
def test_qdel_mid_checkpoint_then_the_resubmitted_job_resumes_from_the_newest_verified_step(
    pbs, compile_cache
):
    """Checkpoints every step, steps unpaced: most of the run is saving, so the qdel lands in a save. Whatever it
    interrupted, the next job resumes from the newest step that verifies, trains to the end and exits 0."""
    job = launch(pbs, compile_cache, *PLACE_SCATTER, steps=LONG, save_every=1)
    wait_for(job.save_dir / "2", job)
    pbs.run(["qdel", job.id], user=True)
    final = pbs.wait_ended(job.id, END_TIMEOUT_S)
    assert final.get("job_state") == "F", job.tail()
    deadline = (
        time.monotonic() + LINGER_S
    )  # processes the qdel left (see finding 1) must not race the next job
    while job_processes(pbs) and time.monotonic() < deadline:
        time.sleep(1)
    verified = verified_steps(job.save_dir)
    assert verified and verified[-1] >= 1, (steps_in(job.save_dir), job.tail())
    newest = verified[-1]
    again = launch(
        pbs, compile_cache, *PLACE_SCATTER, steps=newest + 3, save_every=1, work=job.work
    )
    final = again.wait()
    assert final.get("Exit_status") == 0, again.tail()
    resumed = record(again.work)
    assert resumed["start_step"] == newest and resumed["end_step"] == newest + 3, (
        verified,
        resumed,
        again.tail(),
    )
    assert newest + 3 in verified_steps(job.save_dir)


@pytest.mark.cluster_long
def test_a_lost_node_ends_the_job_naming_it(pbs, compile_cache):
    """node002's link cut mid-run: the job script ends within FAULT_DEADLINE_S, fails, and its log names node002
    (or its rank, 1 of 2)."""
    job = launch(pbs, compile_cache, *PLACE_SCATTER, steps=LONG, step_time=LONG_STEP_TIME)
    wait_for(job.save_dir / str(SAVE_EVERY), job)
    seen = len(job.log())  # the preflight already names node002: read what follows
    pbs.cluster.cut_link("node002")
    t0 = time.monotonic()
    while "training exited with" not in job.log() and time.monotonic() - t0 < FAULT_DEADLINE_S:
        time.sleep(1)
    took = time.monotonic() - t0
    text = job.log()
    assert "training exited with" in text, (
        f"still running {took:.0f} s after the cut\n" + job.tail()
    )
    said = text[seen:]
    assert "training exited with 0" not in said, said[-4000:]
    assert "node002" in said or "rank 1" in said, said[-4000:]
    assert SAVE_EVERY in verified_steps(job.save_dir), steps_in(job.save_dir)


@pytest.mark.cluster_long
def test_finding_3_a_chained_job_keeps_the_scripts_directives_and_starts_ranks_through_pbs(
    pbs, compile_cache
):
    job = launch(
        pbs,
        compile_cache,
        *PLACE_SCATTER,
        "--directive",
        f"#PBS -v OCTO_DIST_CLUSTER_MARK={DIRECTIVE_MARK}",
        steps=4,
        chain=2,
    )
    first, second = job.ids
    listed = pbs.job(second).get("Variable_List", {})
    for i in (0, 1):
        final = job.wait(i)
        require(final.get("Exit_status") == 0, job.tail(i))
    ranks = training_ranks(pbs, second)
    seen = {f"{e['_host']} rank {e['_rank']}": e.get("OCTO_DIST_CLUSTER_MARK") for e in ranks}
    assert listed.get("OCTO_DIST_CLUSTER_MARK") == DIRECTIVE_MARK, (
        f"the script says '#PBS -v OCTO_DIST_CLUSTER_MARK={DIRECTIVE_MARK}'; the chained job {second}'s "
        f"Variable_List is {listed}; its training ranks saw OCTO_DIST_CLUSTER_MARK={seen}"
    )
    assert sorted(e["_host"] for e in ranks) == ["node001", "node002"], job.tail(1)
    assert all(v == DIRECTIVE_MARK for v in seen.values()), seen
    remote = [e for e in ranks if e["_host"] == "node002"]
    assert all(e.get("PBS_JOBID") == second for e in remote), remote
