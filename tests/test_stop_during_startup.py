"""A stop signal while a rank starts up stops the run at its first step with a checkpoint; it never kills the rank.

Two ranks of `octo-dist smoke` on this machine, without mpirun (Open MPI's variables set by hand, no mpi4py). Rank 0
is started alone: its start-up cannot end before rank 1 exists (``jax.distributed.initialize`` waits for every
rank), so a signal sent before rank 1 is started lands inside start-up, whatever the load. The test waits until
rank 0 listens on the coordinator's port (JAX's coordination service, started inside that call; octo-dist's own
check of the port, an instant before it, is inside start-up too), signals it, and only then starts rank 1."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import helpers
from helpers import COMPILE_FAST, HANG_S, REPO, SMOKE, clean_env, with_growing_budget
from octo_dist.engine import checksums
from octo_dist.launchers import coordinator as coord

STEPS = 20  # far more than the stop leaves: a run that was not stopped trains them all


def rank_env(rank: int, port: int) -> dict:
    """Rank ``rank`` of 2 as Open MPI would describe it, the coordinator on ``port``, mpi4py never imported."""
    return clean_env(
        OMPI_COMM_WORLD_SIZE="2",
        OMPI_COMM_WORLD_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
        OMPI_COMM_WORLD_LOCAL_SIZE="2",
        COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
        OCTO_DIST_NO_MPI4PY="1",
        XLA_FLAGS=COMPILE_FAST,
    )


class Rank:
    """One rank of ``octo-dist smoke`` with ``flags``, its output in ``<out>/<rank>.out`` and ``.err`` (files, not
    pipes: the test polls the process, and a full pipe would stall it)."""

    def __init__(
        self, rank: int, port: int, flags, out: Path, *, session: bool = False, ignored=()
    ):
        """``session``: in a session (and process group) of its own, as a scheduler's job step starts it;
        ``ignored``: signals ignored on entry (``trap '' USR2`` before it)."""
        self.out, self.err = out / f"{rank}.out", out / f"{rank}.err"
        with open(self.out, "w") as stdout, open(self.err, "w") as stderr:
            self.proc = subprocess.Popen(
                [*SMOKE, *flags],
                preexec_fn=helpers.ignoring(*ignored),
                env=rank_env(rank, port),
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=session,
            )

    def output(self) -> str:
        return helpers.tail(self.out.read_text()) + helpers.tail(self.err.read_text())

    def wait_until(self, what: str, there) -> None:
        """Until ``there(pid)``; the process exiting first fails the test with its output. HANG_S ends a hang."""
        deadline = time.monotonic() + HANG_S
        while not there(self.proc.pid):
            assert self.proc.poll() is None, (
                f"exited ({self.proc.returncode}) before {what}: {self.output()}"
            )
            assert time.monotonic() < deadline, f"waited {HANG_S} s for {what}: {self.output()}"
            time.sleep(0.02)


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` has a socket listening on TCP ``port`` (JAX's coordination service on rank 0)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:  # exited (the caller says how)
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def has_children(pid: int) -> bool:
    """Whether process ``pid`` has started a child (a rank in start-up: its watchdog's)."""
    try:
        return bool(psutil.Process(pid).children())
    except psutil.Error:  # exited (the caller says how)
        return False


def finish(ranks) -> list:
    """Every rank's ``(returncode, stdout, stderr)``. One that fails ends the others (a rank killed in start-up
    leaves the other waiting out its start-up timeout); any still running after HANG_S is killed."""
    procs = [r.proc for r in ranks]
    deadline = time.monotonic() + HANG_S
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [(r.proc.returncode, r.out.read_text(), r.err.read_text()) for r in ranks]


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_signal_while_rank_0_waits_for_rank_1_stops_the_run_with_a_checkpoint(tmp_path, sig):
    """SIGUSR1 (the job runtime's stop, through mpirun) or SIGTERM (a PBS qdel's, to a rank outside mpirun) to rank 0
    inside ``jax.distributed.initialize``: both ranks exit 0 after the first steps, a verified checkpoint of the
    last one on disk, and rank 0's log names the signal. Rank 0 starts with SIGUSR2 ignored: the handler re-arms it
    before start-up and says so once, through the rank's logging (set up after start-up).

    Broken by hand: with the stop handler installed after ``runtime.initialize`` (the harness before this test),
    rank 0 ended by the signal's default action (returncode -10 for SIGUSR1, -15 for SIGTERM); without
    ``StopSignal.reinstall`` after start-up, the SIGTERM held back until then went to the preemption notifier's
    handler, which ``jax.distributed.initialize`` installs, and the run trained all its steps."""
    port, ckpt, rec = coord.free_port(), tmp_path / "ckpt", tmp_path / "rec.json"
    flags = ["--steps", str(STEPS), "--save-dir", str(ckpt), "--record", str(rec)]
    ranks = [Rank(0, port, flags, tmp_path, ignored=(signal.SIGUSR2,))]
    try:
        ranks[0].wait_until(
            f"it listened on the coordinator's port {port}", lambda pid: listens(pid, port)
        )
        ranks[0].proc.send_signal(sig)
        ranks.append(Rank(1, port, flags, tmp_path))
    finally:
        (code0, out0, err0), *rest = finish(ranks)
    assert code0 == 0, (code0, helpers.tail(err0))
    assert rest[0][0] == 0, (rest[0][0], helpers.tail(rest[0][2]))
    record = json.loads(rec.read_text())
    end = record["end_step"]
    assert record["stopped_by"] == sig.name and 1 <= end < STEPS, record
    assert checksums.verify(ckpt / str(end), end) is None
    said = f"{sig.name} came during start-up: the ranks agree on the stop in their first step"
    assert said in err0, helpers.tail(err0)
    assert f"stopping after step {end} on {sig.name}: saving a checkpoint" in err0, helpers.tail(
        err0
    )
    assert f"stopped by {sig.name} (checkpoint saved)" in out0, helpers.tail(out0)
    rearmed = [ln for ln in err0.splitlines() if "ignored when this process started" in ln]
    assert len(rearmed) == 1 and re.match(
        r"\[rank 0/2 \S+\] WARNING octo_dist\.runtime\.stopping: SIGUSR2 ignored when", rearmed[0]
    ), helpers.tail(err0)


def alone_with_a_stop(budget: float, tmp_path: Path):
    """Rank 1 of 2, alone (nothing ever listens on the coordinator's port), its start-up timeout ``budget`` seconds,
    given SIGUSR1 once its stop handler is in: ``(returncode, stdout, stderr)``."""
    out = tmp_path / f"budget-{budget:g}"
    out.mkdir()
    flags = ["--steps", "3", "--save-dir", str(out / "ckpt"), "--init-timeout", str(budget)]
    rank = Rank(1, coord.free_port(), flags, out)
    try:
        rank.wait_until(
            "its stop handler was in",
            lambda pid: signal.SIGUSR1 in helpers.process_signals(pid, "SigCgt"),
        )
        rank.proc.send_signal(signal.SIGUSR1)
    finally:
        ((code, stdout, stderr),) = finish([rank])
    return code, stdout, stderr


def test_a_start_up_that_fails_after_a_stop_signal_reports_its_failure_not_a_stop(tmp_path):
    """Rank 1 alone waits for a coordinator that never comes, a stop signal arrives, then start-up gives up: the
    rank's report is its start-up failure (exit 1, the coordinator named), not a stop, and no checkpoint is made.
    The budget grows where the imports before the wait spent it (helpers.with_growing_budget).

    Broken by hand: the harness before this test installed no stop handler before start-up ended (here: failed),
    so the test fails waiting for it; a signal in that time ended the rank by its default action (returncode
    -10)."""
    budget, (code, out, err) = with_growing_budget(
        lambda s: alone_with_a_stop(s, tmp_path), lambda r: "did not accept connections" in r[2]
    )
    assert code == 1, (code, helpers.tail(err))
    assert re.search(
        rf"^octo-dist smoke: error: rank 1: coordinator 127\.0\.0\.1:\d+ \(COORDINATOR_ADDRESS\) did not accept "
        rf"connections within {budget:g} s",
        err,
        re.M,
    ), helpers.tail(err)
    assert "stopped by" not in out + err and "came during start-up" not in err, helpers.tail(err)
    assert not list((tmp_path / f"budget-{budget:g}").glob("ckpt/*/" + checksums.MANIFEST))


def group_signalled(budget: float, tmp_path: Path):
    """Rank 1 of 2 in a session of its own, its start-up timeout ``budget`` seconds: SIGUSR1 to its whole process
    group once its start-up watchdog's child runs, then the coordinator's port answers (a listening socket, no JAX
    behind it: start-up goes on to ``jax.distributed.initialize`` and times out there). ``(returncode, stderr)``."""
    out = tmp_path / f"budget-{budget:g}"
    out.mkdir()
    with socket.socket() as coordinator:
        coordinator.bind(("127.0.0.1", 0))
        port = coordinator.getsockname()[1]
        flags = ["--steps", "3", "--save-dir", str(out / "ckpt"), "--init-timeout", str(budget)]
        rank = Rank(1, port, flags, out, session=True)
        try:
            rank.wait_until("its start-up watchdog's child ran", has_children)
            os.killpg(rank.proc.pid, signal.SIGUSR1)
            coordinator.listen(1)
        finally:
            ((code, _, err),) = finish([rank])
    return code, err


def test_a_stop_signal_to_the_ranks_process_group_in_start_up_leaves_a_start_up_failure_its_own_report(
    tmp_path,
):
    """Slurm (its proctrack signals every process of a step) and PBS's qdel (every process of the session) signal
    the start-up watchdog's child process too. The stop signals are held back during start-up, in the rank and in
    what it starts, so the child lives on: a start-up that then fails is reported as itself (the watchdog's line,
    exit 1). Deterministic: the rank cannot write its next stage (``jax.distributed.initialize``) to the child
    before the test's socket listens, which it does after the signal.

    Broken by hand: with the handler installed before start-up but the signals not held, the child died of the
    signal and the rank crashed with a BrokenPipeError traceback at its next stage (a start-up that would have
    succeeded too); with the handler installed after start-up, the rank itself died of it (returncode -10)."""
    _, (code, err) = with_growing_budget(
        lambda s: group_signalled(s, tmp_path),
        lambda r: "jax.distributed.initialize" in r[1] or "BrokenPipeError" in r[1],
    )
    assert code == 1 and "Traceback" not in err, (code, helpers.tail(err))
    assert "rank 1/2: jax.distributed.initialize did not complete within" in err, helpers.tail(err)
