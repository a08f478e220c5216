"""The rendered job scripts, run as deployed on a two-node cluster simulated on this machine (root only).

``tests/cluster/`` makes the cluster: nodes ``node001``/``node002`` as network + UTS + mount namespaces on a
private link, ``mpirun``'s daemons started through an ssh agent that enters a node with a clean environment, the
PBS / Grid Engine / SLURM variables of a batch job (the PBS node file in a spool directory outside the job's
working directory), real Slurm 22.05 daemons for the SLURM job (``cluster/slurm.py``), and a ``singularity`` that
runs the *installed* image prefix (built from this checkout by ``containers/install.sh``), binding only what
Singularity binds.

Every job is rendered by ``octo-dist launch ... -o job.sh`` in a working directory outside the checkout and run
unchanged (``bash job.sh`` on node001). Results come from rank 0's record (``--record``), rank 0's stdout and the
per-rank environment files the singularity stand-in writes; never from interleaved output. Few, short runs: each
rank costs two JAX start-ups (preflight, training), so only the SLURM job runs two ranks on a node; the others run
one, and the PBS job stopped and resumed is compared with an uninterrupted run of its layout under this host's mpirun.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster import image as sim_image
from cluster import sim
from cluster import slurm as sim_slurm
from helpers import (
    COMPILE_FAST,
    MANIFEST,
    HANG_S,
    REPO,
    changed_since,
    checkpoints,
    clean_env,
    wait_until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Enough steps for a checkpoint (step 2), a stop after it and a resumed rest; the reference's cost is its start-up and
# compilation, not its steps (10 steps: 17.1 s of CPU, 4 steps: 16.6 s), the jobs' is their checkpoints.
STEPS = 6
GLOBAL_BATCH = 16  # 4 per rank on 2 nodes x 2 ranks, 8 on 2 nodes x 1 rank
SAVE_EVERY = 2
# The PBS job stopped by SIGTERM once its step-2 checkpoint is there: its 4 steps after it sleep this long each
# (smoke --step-time: the same parameters at any pace), so the stop always comes before the last step.
STOP_STEP_TIME = 3.0
# A lost node: from the fault to the job's end (1-40 s measured here). What it takes: a rank noticing (a SIGKILLed
# one at once, a stopped one after the rank guard's STOPPED_LIMIT checks, 20 s by default), the supervisor's
# FAILED_GRACE_S (20 s) for mpirun to end by itself, its END_WAIT_S (10 s) after a SIGTERM, on a loaded 2-core
# machine. The bound is the property, not a budget for the machine: a job still running at it holds its nodes until
# the wall time (or until JAX's coordination service gives up, which names rank 0, not the lost rank). A constant,
# not read from the runtime: a runtime whose grace grew must fail here.
LOST_NODE_BOUND_S = 150
LOST_STEP_TIME = 0.5  # the pace of a job that only a lost node ends (smoke --step-time)
# Its checkpoints: one every 5 s, the first 5 s into training. A checkpoint of the tiny model costs a rank about
# 0.37 s of CPU: one a second (every 2 steps) kept each rank checkpointing a third of the time.
LOST_SAVE_EVERY = 10
# The hung rank's job sets the rank guard's limit in the submit shell (OCTO_DIST_STOPPED_RANK_LIMIT_S, forwarded to
# node002 by prefix): a rank stopped 5 s in a row, not the default 20 s, is hung (15 s less of waiting). Load cannot
# stop a process, so no running rank reaches it; node002's guard naming "5 s" shows the job's setting reached it.
STOPPED_LIMIT_S = 5
# Exported in the submit shell; the ranks on node002 must see them (forwarded by prefix). XLA_FLAGS compiles the
# ranks' programs fast (helpers.COMPILE_FAST: about half a tiny smoke's CPU): these jobs test the scheduler, the image
# and the job runtime, not what XLA makes of the model; every run a job is compared with gets the same flags.
SUBMIT_VARS = {
    "NCCL_DEBUG": "WARN",
    "NCCL_SOCKET_IFNAME": "eth0",
    "XLA_FLAGS": f"--xla_cpu_enable_fast_math=false {COMPILE_FAST}",
    "OCTO_DIST_CLUSTER_MARK": "from-the-submit-shell",
    "JAX_ENABLE_CHECKS": "0",
}
# Set in the submit shell under no forwarded prefix: node001's ranks inherit it from mpirun, node002's must not.
LOCAL_ONLY = {"SUBMIT_SHELL_ONLY": "1"}
SUBMITTED = {**SUBMIT_VARS, **LOCAL_ONLY}  # the submit shell's exports, forwarded or not
REPORT = sim_image.CACHE / "cluster-smoke.txt"

# ---- fixtures: the image, the cluster, one reference run ----------------------------------------------------------


@pytest.fixture(scope="session")
def cluster_ready():
    reason = sim.unavailable()
    if reason:
        pytest.skip(reason)
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text("")


def report(title: str, job: sim.Job, *lines: str) -> None:
    """What `make cluster-smoke` prints at the end: rank 0's preflight table and verdict, per run, with wall times."""
    out = job.output().splitlines()
    ours = [
        ln
        for i, ln in enumerate(out)
        if ln.startswith(("octo-dist preflight:", "octo-dist smoke:", "octo-dist finetune:"))
        or (ln.startswith("  ") and i > 0)
    ]
    with open(REPORT, "a") as f:
        f.write(
            f"== {title}: exit {job.proc.returncode} after {job.elapsed():.0f} s\n"
            + "\n".join(ours + list(lines))
            + "\n\n"
        )


@pytest.fixture(scope="session")
def sif(cluster_ready, tmp_path_factory) -> Path:
    """A fake .sif naming the image prefix built from this checkout (reused while its inputs are unchanged)."""
    groups = tmp_path_factory.mktemp("groups")
    return sim_image.write_sif(groups / "octo-dist.sif", sim_image.build())


@pytest.fixture
def cluster(cluster_ready, tmp_path):
    """Two nodes; torn down (namespaces, processes, hosts files) even when the test fails."""
    c = sim.Cluster(tmp_path / "cluster")
    c.up()
    yield c
    c.down()


@contextlib.contextmanager
def spooled():
    """The scheduler's spool, removed afterwards: outside the working directory, $HOME and /tmp, so no container
    binds it (not in the clone either: a clone under /tmp is bound into every container, as Singularity binds /tmp)."""
    sim.SPOOL.mkdir(parents=True, exist_ok=True)
    try:
        yield sim.SPOOL
    finally:
        shutil.rmtree(sim.SPOOL, ignore_errors=True)


@pytest.fixture
def spool(cluster):
    with spooled() as path:
        yield path


class ReferenceRun:
    """``[launcher] python -m octo_dist smoke --model tiny --steps STEPS --global-batch GLOBAL_BATCH --record out
    [flags]`` on this host, started in the background when made: it computes while the job it is compared with is
    submitted, queued and started (a session's first test that needs it waits for the sum otherwise). Its record
    from :meth:`result`, waited for as long as it takes (HANG_S only ends a hang)."""

    def __init__(self, out: Path, env: dict, launcher: tuple = (), *flags: str):
        smoke = ["-m", "octo_dist", "smoke", "--model", "tiny", "--steps", str(STEPS)]
        smoke += ["--global-batch", str(GLOBAL_BATCH), "--record", str(out), *flags]
        self.out, self.log = out, out.with_suffix(".log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [*launcher, sys.executable, *smoke],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=out.parent,
                stdin=subprocess.DEVNULL,
            )
        self.record: dict | None = None

    def result(self) -> dict:
        if self.record is None:
            code = self.proc.wait(timeout=HANG_S)
            assert code == 0, self.log.read_text(errors="replace")[-5000:]
            self.record = json.loads(self.out.read_text())
        return self.record

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """1 process x 4 devices, same global batches: what every 2 x 2 run must match (a :class:`ReferenceRun`).

    Mostly initialising and compiling for 4 devices: 90 s beside 5 other processes on 2 cores, over 300 s at a load
    of 15 to 33 while the cluster streams run."""
    out = tmp_path_factory.mktemp("reference") / "reference.json"
    # compiled as the jobs' ranks are (the submit shell's XLA_FLAGS), on 4 devices
    env = clean_env(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=4 {SUBMIT_VARS['XLA_FLAGS']}"
    )
    run = ReferenceRun(out, env, (), "--launcher", "single")
    yield run
    run.close()


@pytest.fixture(scope="session")
def uninterrupted_2x1(cluster_ready, tmp_path_factory):
    """2 processes x 1 device under this venv's mpirun on this host, trained to the end without a stop: what the
    PBS job of 1 rank per node, stopped and resumed, must equal bit for bit (the same layout, the same collectives;
    two JAX start-ups instead of a third 2-node job's four). A :class:`ReferenceRun`."""
    mpirun = Path(sys.executable).parent / "mpirun"
    if not mpirun.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    out = tmp_path_factory.mktemp("uninterrupted") / "record.json"
    env = clean_env(XLA_FLAGS=SUBMIT_VARS["XLA_FLAGS"])  # the job's ranks get the submit shell's
    run = ReferenceRun(out, env, (str(mpirun), "--oversubscribe", "-np", "2"))
    yield run
    run.close()


# ---- helpers ------------------------------------------------------------------------------------------------------


def workdir(tmp_path: Path) -> tuple[Path, Path]:
    """(submit directory, $HOME): neither is the checkout."""
    work, home = tmp_path / "submit", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    assert REPO not in work.parents
    return work, home


def render(
    scheduler: str,
    work: Path,
    sif: Path,
    *extra: str,
    steps: int = STEPS,
    ranks_per_node: int = 2,
    global_batch: int = GLOBAL_BATCH,
    save_dir: str = "runs/smoke",
    train: list | None = None,
    step_time: float = 0,
    save_every: int = SAVE_EVERY,
) -> Path:
    """``octo-dist launch SCHEDULER ... -o job.sh`` from the submit directory, as a user does on the login node;
    ``train`` is the command after ``--`` (default: the smoke job, recording to ``record.json``)."""
    # As many GPUs per node as ranks: the nodes here are CPUs, and a rank of several GPUs is another test's.
    gpus = ["--gpus-per-node", str(ranks_per_node)]
    args = {"pbs": ["--group", "gxx00000", *gpus], "slurm": gpus}[scheduler]
    if train is None:
        train = [
            "smoke",
            "--model",
            "tiny",
            f"--save-every={save_every}",
            f"--record={work / 'record.json'}",
            *([f"--step-time={step_time}"] if step_time else []),
        ]
    cmd = [
        sys.executable,
        "-m",
        "octo_dist",
        "launch",
        scheduler,
        "--nodes",
        "2",
        "--ranks-per-node",
        str(ranks_per_node),
        *args,
        "--walltime",
        "0:30:00",
        "--image",
        str(sif),
        "--global-batch",
        str(global_batch),
        "--steps",
        str(steps),
        "--save-dir",
        save_dir,
        "--wandb-mode",
        "disabled",
        "-o",
        "job.sh",
        *extra,
        "--",
        *train,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=clean_env())
    assert res.returncode == 0, res.stderr
    return work / "job.sh"


def submit(
    cluster: sim.Cluster,
    script: Path,
    work: Path,
    home: Path,
    spool: Path,
    name: str,
    job_id: str,
    submit_env: dict | None = None,
    ranks_per_node: int = 2,
) -> sim.Job:
    """The job started on node001 with what PBS gives a batch job (qsub -V: the submit env). Only PBS is imitated
    here (OpenPBS is not packaged): Grid Engine and Slurm run for real (test_cluster_gridengine.py,
    test_cluster_slurm.py)."""
    env = sim.base_env(cluster, home, submit_env or {})
    env.update(sim.pbs_env(cluster, spool, job_id, work, ranks_per_node=ranks_per_node))
    return sim.Job(cluster, script, env, work, name).start()


def finish(job: sim.Job) -> int:
    """The job's exit status, however long a loaded machine makes it take (``wait_until``: a job that changes
    nothing in its submit directory for HANG_S is hung, killed, and the test fails)."""
    wait_until(
        lambda: job.proc.poll() is not None,
        watch=[job.cwd],
        what=f"job {job.name} to exit",
        tail=lambda: tail(job),
        on_hang=job.kill,
    )
    return job.proc.returncode


def tail(job: sim.Job, n: int = 4000) -> str:
    return f"--- stdout ---\n{job.output()[-n:]}\n--- stderr ---\n{job.errors()[-n:]}"


def preflight(job: sim.Job) -> list[str]:
    """Rank 0's preflight table (only rank 0 prints to stdout)."""
    lines = job.output().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("octo-dist preflight:")), None)
    assert start is not None, "no preflight table on stdout\n" + tail(job)
    return lines[start : start + 6]


def check_smoke_run(job: sim.Job, record: dict, reference: dict, cluster: sim.Cluster) -> str:
    """2 hosts, coordinator on node001, identical parameters, equivalent to 1 process x 4 devices."""
    from octo_dist.apps.smoke import equivalence

    table = preflight(job)
    assert "4 rank(s) on 2 host(s)" in table[0], table
    coordinator = table[0].split("coordinator ", 1)[1].split()[0]
    assert coordinator.rsplit(":", 1)[0] in ("node001", cluster.address["node001"]), table[0]
    assert sorted(record["hosts"]) == ["node001", "node001", "node002", "node002"], record["hosts"]
    assert len(set(record["digests"])) == 1, record["digests"]
    problems = equivalence.compare(reference, record, 4, 1e-5)
    assert problems == [], problems
    return (
        f"equivalence: OK: {len(record['losses'])} steps, 2 nodes x 2 processes x 1 device match 1 process x 4 "
        f"devices (largest relative loss difference {equivalence.max_relative(reference, record):.1e} <= 1e-05); "
        f"parameters identical on all {len(record['digests'])} ranks"
    )


def wait_for(path: Path, job: sim.Job) -> None:
    """Until ``path`` appears, however long a loaded machine makes it take (``wait_until``: only a job that changes
    nothing for HANG_S is hung); a job that ends first fails the test."""

    def there() -> bool:
        if path.exists():
            return True
        if job.proc.poll() is not None:
            pytest.fail(
                f"job ended (exit {job.proc.returncode}) before {path.name} appeared\n" + tail(job)
            )
        return False

    wait_until(
        there, watch=[job.cwd], what=str(path), tail=lambda: tail(job), on_hang=job.kill, poll_s=0.5
    )


# ---- the harness itself (no JAX: seconds) ------------------------------------------------------------------------


def test_the_simulated_cluster_is_what_the_runs_assume(cluster, sif, tmp_path, spool):
    work, home = workdir(tmp_path)
    (work / "rank.sh").write_text(
        'exec > "probe-$OMPI_COMM_WORLD_RANK.txt"\n'
        'echo "host=$(hostname)" "node002=$(getent hosts node002 | cut -d" " -f1)" '
        '"default_routes=$(ip -4 route | grep -c default)"\n'
        'echo "SUBMIT_SHELL_ONLY=${SUBMIT_SHELL_ONLY:-unset}" "NCCL_DEBUG=${NCCL_DEBUG:-unset}"\n'
    )
    (work / "container.sh").write_text(
        'echo "nodefile=$(test -e "$PBS_NODEFILE" && echo visible || echo hidden)"\n'
        f'echo "checkout=$(test -e {REPO}/pyproject.toml && echo visible || echo hidden)"\n'
        'echo "octo-dist=$(command -v octo-dist)" "data=$(ls /data/rank.sh)" "mark=$MARK"\n'
        "python -c \"import octo_dist; print('import=' + octo_dist.__file__)\"\n"
    )
    # mpirun on node001 (after `module load`), one process per node, NCCL_DEBUG forwarded by name; then a container.
    (work / "probe.sh").write_text(
        "module load hpcx/2.20\n"
        f'mpirun -npernode 1 -hostfile "$PBS_NODEFILE" -x NCCL_DEBUG --wdir {work} bash {work}/rank.sh\n'
        f"SINGULARITYENV_MARK=set singularity exec --bind {work}:/data {sif} bash /data/container.sh > container.txt\n"
    )
    submitted = {"SUBMIT_SHELL_ONLY": "1", "NCCL_DEBUG": "WARN"}
    job = submit(cluster, work / "probe.sh", work, home, spool, "probe", "7.pbs1", submitted, 1)
    assert finish(job) == 0, tail(job)
    ranks = [
        dict(kv.split("=", 1) for kv in (work / f"probe-{r}.txt").read_text().split())
        for r in (0, 1)
    ]
    # node002's address on this instance's subnet (10.231.<OCTOSIM_INSTANCE>.2)
    common = {"node002": cluster.address["node002"], "default_routes": "0", "NCCL_DEBUG": "WARN"}
    assert ranks[0] == {"host": "node001", "SUBMIT_SHELL_ONLY": "1", **common}, ranks[0]
    # node002 was entered through the agent with a clean environment: only the -x name arrived.
    assert ranks[1] == {"host": "node002", "SUBMIT_SHELL_ONLY": "unset", **common}, ranks[1]
    inside = dict(kv.split("=", 1) for kv in (work / "container.txt").read_text().split())
    py = "python%d.%d" % sys.version_info[:2]
    # A checkout under a path Singularity binds by default (a clone in /tmp) is visible, as it would be on a
    # cluster; what matters is that the image's own code is what runs (the octo-dist and import lines).
    checkout = (
        "visible" if REPO.is_relative_to("/tmp") or REPO.is_relative_to("/var/tmp") else "hidden"
    )
    assert inside == {
        "nodefile": "hidden",
        "checkout": checkout,
        "octo-dist": "/opt/octo-dist/venv/bin/octo-dist",
        "data": "/data/rank.sh",
        "mark": "set",
        "import": f"/opt/octo-dist/venv/lib/{py}/site-packages/octo_dist/__init__.py",
    }, inside


def test_an_image_built_twice_at_once_is_used_once_and_kept(tmp_path):
    """Two streams building the same key: the one renaming second finds the other's image there (the rename fails,
    dest not empty), drops its copy and uses it; clearing old images keeps a fresh one of that key."""
    cache = tmp_path / ".cluster"
    dest = cache / "image-k1"
    for d, mark in ((dest, "first"), (cache / "building-k1-2", "second")):
        d.mkdir(parents=True)
        (d / "environment.sh").write_text(mark)
    assert sim_image.install(cache / "building-k1-2", dest) is False
    assert not (cache / "building-k1-2").exists()
    assert (dest / "environment.sh").read_text() == "first"
    # a half-built image is never taken for one: the rename's error stands
    half = cache / f"building-k2-{os.getpid()}"
    half.mkdir()
    (cache / "image-k2").mkdir()
    (cache / "image-k2" / "partial").write_text("")
    with pytest.raises(OSError):
        sim_image.install(half, cache / "image-k2")
    # another key's image and a dead builder's directory go; this key's image and a live builder's stay
    dead = subprocess.Popen(["true"])
    dead.wait()
    (cache / f"building-k1-{dead.pid}").mkdir()
    sim_image.remove_stale(dest)
    assert sorted(p.name for p in cache.iterdir()) == [half.name, "image-k1"]
    assert sim_image.install(half, cache / "image-k3") is True


# One CI stream's image build, with the cache elsewhere: prints the image directory it was given.
BUILD = """
import sys
from pathlib import Path
from cluster import image
image.CACHE = Path(sys.argv[1])
print(image.build())
"""


def test_two_processes_building_at_once_get_the_same_image_without_an_error(
    cluster_ready, tmp_path
):
    """What the CI's streams do on a fresh clone: two pytest processes ask for the image at the same moment. Before
    the lock, both built and the second rename failed (dest not empty), ending that stream's first image test."""
    cache = tmp_path / ".cluster"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(cache)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=HANG_S) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0] == f"{cache / f'image-{sim_image.input_key()}'}\n", outs
    assert sum(err.count("built the simulated image") for _, err in outs) == 1, outs
    assert sorted(p.name for p in cache.iterdir()) == [
        "build.lock",
        f"image-{sim_image.input_key()}",
    ]


def test_cleanup_removes_an_earlier_crashed_run(cluster_ready, tmp_path):
    crashed = sim.Cluster(tmp_path / "crashed").up()
    holder = crashed.pid("node002")
    crashed._lock.close()  # "crashed": no down(), the namespaces and holders stay behind
    crashed._lock = None
    sim._HELD = False
    again = sim.Cluster(tmp_path / "again").up()
    try:
        assert (
            not Path(f"/proc/{holder}").exists()
            or Path(f"/proc/{holder}/stat").read_text().split()[2] == "Z"
        )
        assert sorted(sim.namespaces()) == [
            f"{sim.PREFIX}-{n}" for n in ("node001", "node002", "sw")
        ]
    finally:
        again.down()
        for p in crashed.holders.values():
            p.wait()
    assert sim.namespaces() == [] and not list(Path("/etc/netns").glob(f"{sim.PREFIX}-*"))


# ---- the runs -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_usable():
    reason = sim_slurm.unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_2x2(cluster_ready, slurm_usable, sif, tmp_path_factory, reference) -> dict:
    """The SLURM job in the image, submitted with the real ``sbatch`` to real Slurm (``cluster/slurm.py``) and run
    once to the end: the one job here of two ranks on a node (the real srun's task layout, which
    ``tests/test_cluster_slurm.py``'s jobs of one rank per node leave to it). The reference it is compared with
    runs beside it (``reference``, started first)."""
    tmp = tmp_path_factory.mktemp("slurm")
    with sim.Cluster(tmp / "cluster") as c, sim_slurm.Slurm(c) as s:
        work, home = workdir(tmp)
        # One checkpoint, at the end (--save-every=0): what this job shows is srun's layout and the equivalence;
        # checkpoints every SAVE_EVERY steps and a resume from one are the PBS job's.
        script = render("slurm", work, sif, save_every=0)
        env = sim.base_env(c, home, {**SUBMIT_VARS, **LOCAL_ONLY})
        env.update(s.env({"PATH": env["PATH"], "HOME": str(home)}))
        started = time.monotonic()
        job_id = s.client("node001", ["sbatch", "--parsable", str(script)], env=env, cwd=str(work))
        job_id = job_id.stdout.strip()
        final = wait_until(
            lambda: (r := s.job(job_id)).get("JobState") in sim_slurm.ENDED and r,
            watch=[work],
            what=f"Slurm job {job_id} to end",
            tail=lambda: s.logs(),
            on_hang=lambda: s.client("node001", ["scancel", job_id], check=False),
        )
        log = work / f"octo-dist-{job_id}.out"
        job = sim.Job(c, script, env, work, "slurm")
        job.out = log  # rank 0's stdout and the ranks' stderr: Slurm's one output file
        job.err = log
        job.started = started
        return {
            "final": final,
            "job": job,
            "work": work,
            "cluster": c,
            "envs": sim.rank_envs(c),
            "record": json.loads((work / "record.json").read_text())
            if (work / "record.json").exists()
            else None,
            "tail": log.read_text()[-4000:] if log.exists() else s.logs(),
        }


def test_slurm_job_runs_2_nodes_x_2_ranks_in_the_image(slurm_2x2, reference):
    job = slurm_2x2["job"]
    assert slurm_2x2["final"]["JobState"] == "COMPLETED", slurm_2x2["tail"]
    record = slurm_2x2["record"]
    line = check_smoke_run(job, record, reference.result(), slurm_2x2["cluster"])
    job.proc = subprocess.CompletedProcess([], 0)  # for report(): Slurm said COMPLETED, exit 0:0
    report("SLURM 22.05 (sbatch, srun), 2 nodes x 2 ranks, in the image", job, line)
    assert record["end_step"] == STEPS and not record["stopped_by"]
    # The real srun started every task (preflight, then training) on its node with its own SLURM_PROCID, in the
    # image, with the submit shell's settings (sbatch and srun pass the whole environment).
    tasks = sorted((e["_host"], e["SLURM_PROCID"]) for e in slurm_2x2["envs"])
    assert tasks == sorted(
        2 * [("node001", "0"), ("node001", "1"), ("node002", "2"), ("node002", "3")]
    ), tasks
    assert all(e["PATH"].startswith("/opt/octo-dist/venv/bin:") for e in slurm_2x2["envs"])
    assert all(e.get("NCCL_DEBUG") == "WARN" for e in slurm_2x2["envs"])


@pytest.fixture(scope="module")
def pbs_stopped(cluster_ready, sif, uninterrupted_2x1, tmp_path_factory) -> dict:
    """The PBS job in the image, stopped by SIGTERM (as qdel and the wall time stop one) once its step-2 checkpoint
    directory is there, on a cluster of its own, down once the job has ended: the next job resumes from its submit
    directory on another (a chained job gets other nodes, or the same ones afresh).

    One rank per node: what is checked (node002's ranks see what was forwarded and only that, a SIGTERM stops every
    rank with a checkpoint, the next job resumes from it bit for bit) does not need two ranks on a node, which the
    SLURM job checks; two jobs of 2 ranks are eight JAX start-ups (preflight, training) instead of sixteen. The
    uninterrupted run the chain must equal (``uninterrupted_2x1``) starts first and runs beside both jobs."""
    tmp = tmp_path_factory.mktemp("pbs-chain")
    work, home = workdir(tmp)
    script = render("pbs", work, sif, step_time=STOP_STEP_TIME, ranks_per_node=1)
    with sim.Cluster(tmp / "cluster") as c, spooled() as spool:
        first = submit(c, script, work, home, spool, "pbs-1", "101.pbs1", SUBMITTED, 1)
        wait_for(work / "runs" / "smoke" / str(SAVE_EVERY), first)
        first.signal(signal.SIGTERM)
        code = finish(first)
        envs = sim.rank_envs(c)
    record = work / "record.json"
    record = json.loads(record.read_text()) if record.exists() else None
    return dict(work=work, home=home, script=script, job=first, code=code, envs=envs, record=record)


def test_a_pbs_job_in_the_image_forwards_the_submit_env_and_sigterm_stops_every_rank(pbs_stopped):
    first, stopped = pbs_stopped, pbs_stopped["record"]
    assert first["code"] == 0, tail(first["job"])
    assert stopped["stopped_by"] and stopped["end_step"] < STEPS, stopped
    assert sorted(stopped["hosts"]) == ["node001", "node002"], stopped["hosts"]
    table = preflight(first["job"])
    assert "2 rank(s) on 2 host(s)" in table[0], table
    # node002's ranks (the preflight's and the training's) saw the submit shell's settings, and only what was
    # forwarded.
    remote = [e for e in first["envs"] if e["_host"] == "node002"]
    assert len(remote) >= 2, [e["_host"] for e in first["envs"]]
    for e in remote:
        assert {k: e.get(k) for k in SUBMIT_VARS} == SUBMIT_VARS
        assert "SUBMIT_SHELL_ONLY" not in e


def test_the_next_pbs_job_resumes_the_stopped_one_bit_identical_to_an_uninterrupted_run(
    pbs_stopped, uninterrupted_2x1, cluster, spool
):
    first, stopped = pbs_stopped, pbs_stopped["record"]
    assert first["code"] == 0, tail(first["job"])
    work, home, script = first["work"], first["home"], first["script"]
    second = submit(cluster, script, work, home, spool, "pbs-2", "102.pbs1", SUBMITTED, 1)
    assert finish(second) == 0, tail(second)
    resumed = json.loads((work / "record.json").read_text())
    assert resumed["start_step"] == stopped["end_step"] and resumed["end_step"] == STEPS, resumed
    # Bit for bit the uninterrupted run of the same layout (run beside the jobs, started first): every step's loss
    # and the parameters on both ranks.
    uninterrupted = uninterrupted_2x1.result()
    losses = {**stopped["losses"], **resumed["losses"]}
    assert losses == uninterrupted["losses"], (losses, uninterrupted["losses"])
    assert set(resumed["digests"]) == set(uninterrupted["digests"]), (
        resumed["digests"],
        uninterrupted["digests"],
    )
    assert len(set(uninterrupted["digests"])) == 1, uninterrupted["digests"]
    report(
        f"PBS, 2 nodes x 1 rank, SIGTERM at step {stopped['end_step']} (exit 0 on every rank), then resumed",
        second,
        f"resumed to step {STEPS}: losses and parameters identical to an uninterrupted 2-rank run",
    )


def test_a_hung_rank_on_node002_ends_the_job_fast_and_keeps_its_checkpoints(
    cluster, sif, spool, tmp_path
):
    """node002's rank SIGSTOPped (hung: its node and network fine) in the image: its rank guard names it, the job
    ends within LOST_NODE_BOUND_S and fails, and the checkpoints from before the fault are intact.

    A SIGKILLed rank and a cut link take the same path here as from a venv (the job runtime, the image's own
    zipapp of the same supervisor, runs on the host; the rank guard, checked here, in the image): they are checked
    with the venv under each scheduler (test_cluster_pbs.py, test_cluster_slurm.py, test_cluster_gridengine.py)."""
    work, home = workdir(tmp_path)
    # One rank per node: losing node002 is the point, and two start-ups are half the cost of four. Paced (a sleep
    # after each step, the same parameters): the job waits for the fault instead of training and checkpointing flat
    # out, and its 200 steps last minutes, whatever the load, before the fault comes.
    script = render(
        "pbs",
        work,
        sif,
        steps=200,
        ranks_per_node=1,
        step_time=LOST_STEP_TIME,
        save_every=LOST_SAVE_EVERY,
    )
    limit = {"OCTO_DIST_STOPPED_RANK_LIMIT_S": str(STOPPED_LIMIT_S), "XLA_FLAGS": COMPILE_FAST}
    job = submit(cluster, script, work, home, spool, "sigstop", "103.pbs1", limit, ranks_per_node=1)
    save_dir = work / "runs" / "smoke"
    wait_for(save_dir / str(LOST_SAVE_EVERY) / MANIFEST, job)  # the first checkpoint, complete
    before = checkpoints(save_dir)
    # the preflight table already names node002: read what follows
    seen = (len(job.output()), len(job.errors()))
    assert cluster.kill_ranks("node002", signal.SIGSTOP), "no rank processes found on node002"
    t0 = time.monotonic()
    rc = job.wait(LOST_NODE_BOUND_S)
    took = time.monotonic() - t0
    if rc is None:
        job.kill()
    assert rc is not None, f"the job was still running {took:.0f} s after the fault\n" + tail(job)
    assert rc != 0, "the job exited 0 after losing node002\n" + tail(job)
    said = job.output()[seen[0] :] + job.errors()[seen[1] :]
    # A hung rank, named with its node by its rank guard (JAX's timeout names rank 0), after the job's own limit.
    hung = f"rank 1 on node002 hung: stopped (SIGSTOP) for {STOPPED_LIMIT_S} s"
    assert hung in said, (took, tail(job))
    # Intact: every file of every checkpoint from before the fault that is still there (max_to_keep may retire old
    # ones), and the newest of them is still there.
    after = checkpoints(save_dir)
    assert changed_since(before, after) == {}, "a checkpoint written before the fault changed"
    newest = max((k.split("/")[0] for k in before), key=int)
    assert any(k.startswith(newest + "/") for k in after), f"checkpoint {newest} is gone"
    report(f"fault sigstop on node002: the job ended {took:.0f} s after it", job)


def test_a_manual_mpirun_into_the_image_on_one_node_of_a_pbs_job(cluster, sif, spool, tmp_path):
    """`qsub -I`, then by hand: mpirun -np 2 singularity exec IMAGE octo-dist smoke (the image has no MPI library)."""
    work, home = workdir(tmp_path)
    (work / "by-hand.sh").write_text(
        "module load hpcx/2.20\n"
        f"mpirun -np 2 singularity exec {sif} octo-dist smoke --model tiny --steps 2 --global-batch 4 "
        f"--wandb-mode disabled --record {work}/record.json\n"
    )
    # compiled fast (XLA_FLAGS reaches both ranks: one node, mpirun's environment, Singularity's)
    fast = {"XLA_FLAGS": COMPILE_FAST}
    job = submit(cluster, work / "by-hand.sh", work, home, spool, "by-hand", "104.pbs1", fast)
    assert finish(job) == 0, tail(job)
    record = json.loads((work / "record.json").read_text())
    assert record["hosts"] == ["node001", "node001"] and len(set(record["digests"])) == 1, record


# ---- Octo fine-tuning (where octo and dlimp are importable: by hand; CI has neither) --------------------------------

FT_STEPS = 4
FT_SAVE_EVERY = 2
FT_GLOBAL_BATCH = 8  # 2 per rank on 2 nodes x 2 ranks


@pytest.mark.octo
def test_finetune_job_runs_2_nodes_x_2_ranks_in_the_image(cluster, sif, spool, tmp_path):
    """``octo-dist finetune`` with the packaged smoke config (a tiny Octo from its model_config, no pretrained
    weights) on the synthetic RLDS dataset: the PBS job as rendered, the image's own octo-dist and the octo it was
    built with."""
    for name in sim_image.GIT_PACKAGES:
        pytest.importorskip(
            name,
            reason=f"{name} is not importable here: the image's octo is the lock's git line, "
            "which the simulated image skips; with octo and dlimp importable (by hand, e.g. on "
            "PYTHONPATH) the image reaches them and this job runs",
        )
    image = sim_image.image_dir_of(sif)
    py = "python%d.%d" % sys.version_info[:2]
    overlay = (
        (image / "venv" / "lib" / py / "site-packages" / sim_image.OVERLAY).read_text().split()
    )
    assert overlay[1:] == sim_image.git_package_dirs() != [], (
        overlay
    )  # the image reaches this process's octo

    work, home = workdir(tmp_path)
    data = subprocess.run(
        [
            sys.executable,
            "-m",
            "octo_dist.apps.finetune.synthetic_rlds",
            "data",
            "--train-episodes",
            "6",
            "--val-episodes",
            "2",
            "--steps",
            "6",
            "--image-size",
            "32",
        ],
        capture_output=True,
        text=True,
        cwd=work,
        env=clean_env(),
        timeout=HANG_S,
    )
    assert data.returncode == 0, data.stderr[-3000:]
    script = render(
        "pbs",
        work,
        sif,
        "--data-dir",
        "data",
        steps=FT_STEPS,
        global_batch=FT_GLOBAL_BATCH,
        save_dir="runs/ft",
        train=[
            "finetune",
            "--config=finetune_smoke_config.py",
            f"--config.save_interval={FT_SAVE_EVERY}",
            "--name=cluster",
        ],
    )
    assert (
        '"train": ["octo-dist", "finetune", "--config=finetune_smoke_config.py"'
        in script.read_text()
    )
    job = submit(cluster, script, work, home, spool, "finetune", "105.pbs1")
    assert finish(job) == 0, tail(job)

    # Rank 0's files in the run directory: <save dir>/<wandb project>/<name>.
    run_dir = work / "runs" / "ft" / "octo_finetune_smoke" / "cluster"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {
        k: summary[k]
        for k in ("command", "processes", "global_batch", "start_step", "end_step", "stopped_by")
    } == {
        "command": "finetune",
        "processes": 4,
        "global_batch": FT_GLOBAL_BATCH,
        "start_step": 0,
        "end_step": FT_STEPS,
        "stopped_by": None,
    }, summary
    assert len(summary["params_digests"]) == 4 and len(set(summary["params_digests"])) == 1, summary
    # The engine's resumable checkpoints, every save_interval steps...
    assert sorted(p.name for p in (run_dir / "train_state").iterdir() if p.name.isdigit()) == [
        "2",
        "4",
    ]
    # ...and Octo's own layout from save_pretrained (what OctoModel.load_pretrained reads).
    for name in (
        "config.json",
        "example_batch.msgpack",
        "dataset_statistics.json",
        "finetune_config.json",
    ):
        assert (run_dir / name).is_file(), sorted(p.name for p in run_dir.iterdir())
    assert (run_dir / str(FT_STEPS) / "default").is_dir(), sorted(p.name for p in run_dir.iterdir())
    # OctoModel.load_pretrained reads it (in a process of its own: no JAX or TensorFlow in this one).
    load = (
        "import json, sys, jax\n"
        "from octo.model.octo_model import OctoModel\n"
        "m = OctoModel.load_pretrained(sys.argv[1])\n"
        "print(json.dumps({'window_size': m.config['window_size'], 'leaves': len(jax.tree_util.tree_leaves(m.params)),"
        " 'action_mean': len(m.dataset_statistics['action']['mean'])}))\n"
    )
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), *sim_image.git_package_dirs()]))
    loaded = subprocess.run(
        [sys.executable, "-c", load, str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=HANG_S,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    model = json.loads(loaded.stdout.splitlines()[-1])
    assert model["window_size"] == 2 and model["action_mean"] == 7 and model["leaves"] > 0, model

    # Rank 0's lines (the only rank that prints to stdout): the process count and the steps.
    said = job.output().splitlines()
    line = (
        f"octo-dist finetune: 4 process(es), 4 device(s), global batch {FT_GLOBAL_BATCH} (2 per process); "
        f"steps 0 -> {FT_STEPS} of {FT_STEPS}"
    )
    assert sum(ln.startswith(line) for ln in said) == 1, "\n".join(said[-20:])
    assert any(
        ln.startswith("octo-dist preflight:") and "4 rank(s) on 2 host(s)" in ln for ln in said
    ), tail(job)

    # Every rank (preflight, then training) ran in the image, two on each node.
    envs = sim.rank_envs(cluster)
    assert sorted(e["_host"] for e in envs) == 4 * ["node001"] + 4 * ["node002"], [
        e["_host"] for e in envs
    ]
    assert all(e["PATH"].startswith("/opt/octo-dist/venv/bin:") for e in envs)
    report("PBS finetune (Octo smoke config, synthetic RLDS), 2 nodes x 2 ranks, in the image", job)
