"""The job runtime's stop and failure paths, each with real processes: a fake ``mpirun`` and fake ranks (small
Python programs) under the real supervisor and the real rank guard, in this process (a second or two each).

The supervisor runs in the test's own process (its signal handlers are put back after each test), so a test sends
the job's signal with ``os.kill(os.getpid(), ...)`` when a fake rank says it reached the moment under test."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import HANG_S, settings_mapping

from octo_dist.jobs import settings as job_settings
from octo_dist.jobs import settingsread
from octo_dist.jobs.supervisor import prepare, rankguard, ranks, supervise

# Stands in for mpirun: skips its options (each with a value, as the Grid Engine launcher line has them), starts
# FAKE_RANKS copies of the rest (the rank guard, then the rank's command) and forwards SIGUSR1; on SIGTERM it ends
# the ranks. FAKE_LAUNCHER: "ranks" (a failed rank ends the others, mpirun's way), "stuck" (after a failure it waits
# forever: a node it cannot reach), "dies" (killed before any rank starts), "lose" (the last rank's node is lost:
# never started, and the launcher still exits 0, as prterun may), "lingers" (after the training's ranks exited it
# waits forever, as Open MPI 4's mpirun told to wait for PBS's kill delay; "lingers-preflight": after the
# preflight's; 60 s at most, then it exits 143, so a runtime that does not end it fails the test rather than
# hanging it). It notes "launcher pid P sid S pgid G"; to --version it answers as Open MPI's.
FAKE_MPIRUN = r"""
import os, signal, subprocess, sys, time
if sys.argv[1:] == ["--version"]:  # as Open MPI's says it (the job runtime asks whether it is Hydra)
    print("mpirun (Open MPI) 5.0.8")
    sys.exit(0)
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args = args[2:]
mode = os.environ.get("FAKE_LAUNCHER", "ranks")
n = int(os.environ.get("FAKE_RANKS", "2"))
if mode == "dies":
    os.kill(os.getpid(), signal.SIGKILL)
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(f"launcher pid {os.getpid()} sid {os.getsid(0)} pgid {os.getpgid(0)}\n")
started = n - 1 if mode == "lose" else n
procs = [subprocess.Popen(args, env={**os.environ, "OMPI_COMM_WORLD_RANK": str(r)}) for r in range(started)]
def forward(sig, _frame):
    for p in procs:
        if p.poll() is None:
            p.send_signal(sig)
signal.signal(signal.SIGUSR1, forward)
def end(sig, _frame):
    forward(signal.SIGTERM, None)
    for p in procs:
        p.wait()
    sys.exit(143)
signal.signal(signal.SIGTERM, end)
failed = 0
while any(p.poll() is None for p in procs):
    time.sleep(0.02)
    bad = [p.returncode for p in procs if p.returncode]
    if bad and not failed:
        failed = bad[0]
        if mode == "stuck":
            while True:
                time.sleep(1)
        forward(signal.SIGTERM, None)
preflight = "check-env" in args
if mode == ("lingers-preflight" if preflight else "lingers"):
    time.sleep(60)
    sys.exit(143)
sys.exit(failed or max(p.returncode for p in procs))
"""

# Stands in for `octo-dist` on every rank: "check-env" is the preflight, anything else the training. It notes
# "<stage>-started <rank>" and "job-id-<OCTO_DIST_JOB_ID> <rank>" in FAKE_LOG; FAKE_FAIL_<STAGE>="1:3" makes rank 1
# exit 3; the training (and the preflight with FAKE_PREFLIGHT_WAITS) waits for a stop signal, notes
# "<stage>-stopping", then waits for the file FAKE_SHUTDOWN (when set) before it exits 0, as a rank writing its
# checkpoint, and rank 0 notes the step it saved (7) as octo-dist's ranks do; FAKE_STOP_TRAIN=1 makes rank 1 stop
# itself (SIGSTOP) once its training started.
FAKE_RANK = r"""
import os, signal, sys, time
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
stage = "preflight" if sys.argv[1:2] == ["check-env"] else "train"
def say(what):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(f"{what} {rank}\n")
stops = []
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda s, _f: stops.append(s))
say(f"{stage}-started")
say(f"job-id-{os.environ.get('OCTO_DIST_JOB_ID')}")
say(f"rank0-wait-{os.environ.get('OCTO_DIST_RANK0_WAIT_TIMEOUT')}")
if stage == "train" and os.environ.get("FAKE_STOP_TRAIN") == rank:  # a rank stopped on its node
    os.kill(os.getpid(), signal.SIGSTOP)
fail = os.environ.get(f"FAKE_FAIL_{stage.upper()}", "")
if fail and fail.split(":")[0] == rank:
    sys.exit(int(fail.split(":")[1]))
if stage == "preflight" and not os.environ.get("FAKE_PREFLIGHT_WAITS"):
    sys.exit(0)
if stage == "train" and os.environ.get("FAKE_TRAIN_FINISHES"):  # every step trained, no stop asked
    sys.exit(0)
deadline = time.monotonic() + 60
while not stops and time.monotonic() < deadline:
    time.sleep(0.01)
for sig in (signal.SIGUSR1, signal.SIGTERM):  # as octo-dist's ranks: one stop, further signals ignored
    signal.signal(sig, signal.SIG_IGN)
say(f"{stage}-stopping {signal.Signals(stops[0]).name[3:] if stops else 'none'}")
shutdown = os.environ.get("FAKE_SHUTDOWN")
while shutdown and not os.path.exists(shutdown) and time.monotonic() < deadline:
    time.sleep(0.01)
if stops and stage == "train" and rank == "0":
    from octo_dist.apps import harness
    harness.note_stop(7)
sys.exit(0 if stops else 1)
"""


def program(path: Path, text: str) -> None:
    path.write_text(f"#!{sys.executable}\n{text}")
    path.chmod(0o755)


@pytest.fixture
def job(tmp_path, monkeypatch, capfd):
    """(supervisor factory, log): a Grid Engine job of 1 node x 2 ranks in tmp_path, fake mpirun and ranks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program(bin_dir / "mpirun", FAKE_MPIRUN)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    program(venv / "python", "")
    program(venv / "octo-dist", FAKE_RANK)
    (tmp_path / "pe_hostfile").write_text("localhost 2 all.q@localhost UNDEFINED\n")
    log = tmp_path / "ranks.log"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ranks, "FAILED_GRACE_S", 0.5)
    # 30 s from TERM to KILL: a launcher ending its ranks on a loaded machine is never killed for being slow
    # (a KILL would turn its 143 into 137); one that ends at once costs nothing.
    monkeypatch.setattr(ranks, "END_WAIT_S", 30)
    monkeypatch.setattr(ranks, "POLL_S", 0.05)
    saved = {s: signal.getsignal(s) for s in supervise.STOP_SIGNALS}
    settings = settingsread.from_mapping(
        settings_mapping(
            "sge", ranks_per_node=2, venv=str(tmp_path / "venv"), forward_prefixes=["FAKE_"]
        )
    )

    def make(**env):
        base = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "PE_HOSTFILE": str(tmp_path / "pe_hostfile"),
            "NSLOTS": "2",
            "JOB_ID": "42",
            "HOME": str(tmp_path),
            "FAKE_LOG": str(log),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
        return supervise.Supervisor(settings, {**base, **env})

    yield make, log
    for s, handler in saved.items():
        signal.signal(s, handler)


def when_logged(log: Path, needle: str, then) -> threading.Thread:
    """Calls ``then()`` from a thread once ``needle`` is in ``log`` for every rank ("train-started": rank 0 and 1
    have their handlers), 60 s at most."""

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if log.exists() and all(f"{needle} {r}" in log.read_text() for r in (0, 1)):
                then()
                return
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def signal_me(*sigs):
    def send():
        for s in sigs:
            os.kill(os.getpid(), s)

    return send


def exit_file(tmp_path: Path) -> str:
    return (tmp_path / "save" / ".octo-dist-exit-42").read_text().strip()


def stopped_in_training(job, capfd):
    """``(supervisor, its stderr, the ranks' log)``: the job run through its preflight into training, then stopped
    by SIGUSR1 once the ranks trained; the supervisor ended 0."""
    make, log = job
    sup = make(FAKE_PREFLIGHT_WAITS="")
    when_logged(log, "train-started", signal_me(signal.SIGUSR1))
    assert sup.main() == 0
    return sup, capfd.readouterr().err, log.read_text()


def test_a_job_without_a_stop_runs_preflight_then_training(job, tmp_path, capfd):
    _, err, text = stopped_in_training(job, capfd)
    assert "1 node(s) x 2 rank(s); preflight: " in err and "stop requested by SIGUSR1" in err, err
    assert "train-stopping USR1 0" in text and "train-stopping USR1 1" in text
    assert exit_file(tmp_path) == "0" and not (tmp_path / "save" / ".octo-dist-job-42").exists()


def test_the_ranks_get_the_job_id_the_runtime_read_and_checked(job, tmp_path, capfd):
    """Grid Engine's JOB_ID=42, read by its scheduler module once: every rank reads OCTO_DIST_JOB_ID, which mpirun
    passes to the other nodes' ranks too (-x)."""
    sup, _, text = stopped_in_training(job, capfd)
    assert "job-id-42 0" in text and "job-id-42 1" in text, text
    pairs = list(zip(sup.launcher, sup.launcher[1:]))
    assert ("-x", "OCTO_DIST_JOB_ID") in pairs, sup.launcher


def test_the_ranks_wait_for_rank_0_up_to_the_jobs_time_less_its_stop_margin(job, tmp_path, capfd):
    """Rank 0's dataset statistics may take longer than the ranks' own two-hour default on a large dataset: within
    a job they wait as long as the job may run (the wall time less the stop margin), the name rankwait reads."""
    from octo_dist.runtime import rankwait

    sup, _, text = stopped_in_training(job, capfd)
    timing = sup.s.timing
    limit = timing.walltime_s - timing.stop_margin_s
    assert limit != rankwait.DEFAULT_TIMEOUT_S
    assert f"rank0-wait-{limit} 0" in text and f"rank0-wait-{limit} 1" in text, text
    assert ("-x", rankwait.TIMEOUT_ENV) in list(zip(sup.launcher, sup.launcher[1:])), sup.launcher


def test_a_signal_before_the_launcher_started_ends_the_job_without_ranks(
    job, tmp_path, capfd, monkeypatch
):
    make, log = job
    sup = make()
    send = signal_me(signal.SIGTERM)
    monkeypatch.setattr(
        prepare, "wandb_key", lambda env: send()
    )  # during the checks before the ranks
    assert sup.main() == 0
    err = capfd.readouterr().err
    assert "stop requested (SIGTERM) before the ranks started: not training" in err, err
    assert not log.exists() and exit_file(tmp_path) == "0"


def test_a_signal_during_the_preflight_stops_before_training(job, tmp_path, capfd):
    make, log = job
    sup = make(FAKE_PREFLIGHT_WAITS="1")
    when_logged(log, "preflight-started", signal_me(signal.SIGINT))
    assert sup.main() == 0
    err = capfd.readouterr().err
    assert "SIGINT after" in err and "stop requested during the preflight: not training" in err, err
    assert "preflight-stopping USR1" in log.read_text() and "train-started" not in log.read_text()


@pytest.mark.parametrize(
    "sigs",
    [(signal.SIGTERM,), (signal.SIGHUP,), (signal.SIGTERM, signal.SIGINT)],
    ids=lambda s: "+".join(x.name for x in s),
)
def test_a_signal_during_training_or_twice_is_one_clean_stop(job, tmp_path, capfd, sigs):
    make, log = job
    sup = make()
    when_logged(log, "train-started", signal_me(*sigs))
    assert sup.main() == 0
    err = capfd.readouterr().err
    for s in sigs:
        assert f"{s.name} after" in err, err
    assert "training exited with 0" in err and exit_file(tmp_path) == "0", err
    assert "train-stopping USR1 0" in log.read_text()  # the launcher got SIGUSR1, never SIGTERM
    said = (
        ": step 7 saved; this job's exit status is 0 (.octo-dist-exit-42 in the save directory, which a chained "
        "job reads)"
    )
    assert any(f"stopped by {s.name}{said}" in err for s in sigs), err


def test_the_launcher_has_a_process_group_of_its_own_in_the_jobs_session(job, capfd):
    # PBS finds a job's processes by its session (qdel signals them, the accounting counts them); a signal for the
    # job's process group (Grid Engine's -notify) must not reach the ranks twice.
    make, log = job
    sup = make()
    when_logged(log, "train-started", signal_me(signal.SIGTERM))
    assert sup.main() == 0
    launches = [ln.split() for ln in log.read_text().splitlines() if ln.startswith("launcher pid")]
    assert len(launches) == 2, launches  # the preflight's and the training's
    for _, _, pid, _, sid, _, pgid in launches:
        assert int(sid) == os.getsid(0) and pgid == pid and int(pgid) != os.getpgid(0), launches


def test_a_launcher_that_lingers_after_every_rank_stopped_is_ended_and_the_stop_is_clean(
    job, tmp_path, capfd
):
    make, log = job
    sup = make(FAKE_LAUNCHER="lingers")
    when_logged(log, "train-started", signal_me(signal.SIGTERM))
    started = time.monotonic()
    assert sup.main() == 0
    err = capfd.readouterr().err
    assert (
        f"every rank stopped and finished; the launcher is still running {ranks.DONE_GRACE_S}s later: ending it"
    ) in err, err
    assert "training exited with 0" in err and "stopped by SIGTERM: step 7 saved" in err, err
    assert exit_file(tmp_path) == "0" and time.monotonic() - started < 30


def test_a_launcher_that_lingers_without_a_stop_is_not_ended_for_it(job, tmp_path, capfd):
    # Only a stop ends a launcher whose ranks finished: here the stop is asked for after the ranks exited
    # (the preflight's ranks exit without one), and until then nothing ended the launcher.
    make, log = job
    sup = make(FAKE_LAUNCHER="lingers-preflight")
    done = tmp_path / "save" / ".octo-dist-job-42" / "done"

    def stop_after_the_ranks_finished():
        # Both preflight ranks noted they finished (whenever that is on a loaded machine), then longer than a
        # stop's grace: a launcher wrongly ended for lingering would have been ended by now.
        deadline = time.monotonic() + 120
        while (
            not all((done / f"rank-{r}").exists() for r in (0, 1)) and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        time.sleep(ranks.DONE_GRACE_S + 1.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_after_the_ranks_finished, daemon=True).start()
    assert sup.main() == 0
    err = capfd.readouterr().err
    assert err.index("SIGTERM after") < err.index("the launcher is still running"), err
    assert "stop requested during the preflight: not training" in err, err
    assert "train-started" not in log.read_text()


def test_a_signal_during_shutdown_keeps_the_clean_stop(job, tmp_path, capfd):
    make, log = job
    done = tmp_path / "shutdown-done"
    sup = make(FAKE_SHUTDOWN=str(done))
    when_logged(log, "train-started", signal_me(signal.SIGUSR1))

    def again():
        os.kill(os.getpid(), signal.SIGTERM)
        done.write_text("")

    when_logged(log, "train-stopping USR1", again)
    assert sup.main() == 0
    err = capfd.readouterr().err
    assert "SIGUSR1 after" in err and "SIGTERM after" in err and "training exited with 0" in err, (
        err
    )


def test_a_signal_ignored_on_entry_is_armed_again(job, capfd):
    make, log = job
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        sup = make()
        when_logged(log, "train-started", signal_me(signal.SIGINT))
        assert sup.main() == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "stop requested by SIGINT" in capfd.readouterr().err


def test_a_launcher_that_dies_fails_the_job(job, tmp_path, capfd):
    make, log = job
    assert make(FAKE_LAUNCHER="dies").main() == 137
    err = capfd.readouterr().err
    assert "preflight failed (exit 137): not training" in err, err
    assert exit_file(tmp_path) == "137"


def test_a_failed_rank_decides_the_status_and_is_named(job, tmp_path, capfd):
    make, log = job
    assert make(FAKE_FAIL_TRAIN="1:3").main() == 3
    err = capfd.readouterr().err
    assert "rank 1 on " in err and "exited with status 3" in err, err
    assert "training exited with 3" in err and exit_file(tmp_path) == "3", err


def test_a_launcher_that_outlives_a_failed_rank_is_ended(job, tmp_path, capfd):
    make, log = job
    started = time.monotonic()
    assert make(FAKE_LAUNCHER="stuck", FAKE_FAIL_TRAIN="0:5").main() == 5
    err = capfd.readouterr().err
    assert "the launcher is still running 0.5s after a rank failed: ending it" in err, err
    assert "(the launcher then exited with status 143)" in err, err
    assert time.monotonic() - started < 30


def test_a_lost_node_fails_a_job_whose_launcher_exits_0(job, tmp_path, capfd):
    make, log = job
    assert make(FAKE_LAUNCHER="lose").main() == 1
    err = capfd.readouterr().err
    assert (
        "the launcher exited 0 but rank(s) 1 never finished" in err
        and "preflight failed (exit 1)" in err
    ), err


# Stands in for srun as the job's node probe runs it, each probe's pid noted first: the first probe hangs (node002's
# link cut while it ran: the real srun waits for ever); every later one fails naming node002, as the real srun does.
FAKE_PROBE_SRUN = """#!/bin/sh
echo $$ >> "$FAKE_DIR/probe-pids"
if mkdir "$FAKE_DIR/probed" 2>/dev/null; then
  exec sleep 3600
fi
echo "srun: error: Task launch for StepId=1.2 failed on node node002: Communication connection failure" >&2
echo "srun: error: Application launch failed: Communication connection failure" >&2
exit 1
"""


def probing(tmp_path: Path, srun: str, launcher: list) -> tuple:
    """``(launcher's exit status, the notes)``: ``Launcher._probe_nodes`` of a 2-node SLURM job whose ``srun`` is
    ``srun`` (a script) and whose launcher runs ``launcher``; the probing ends when the launcher has ended, as in
    ``Launcher.run``. HANG_S only ends a hang: probes that never name a node go on until the launcher ends."""
    from types import SimpleNamespace

    from octo_dist.jobs import schedulers

    (tmp_path / "srun").write_text(srun)
    (tmp_path / "srun").chmod(0o755)
    notes = []
    job = SimpleNamespace(
        scheduler=schedulers.get("slurm"),
        note=notes.append,
        s=SimpleNamespace(allocation=SimpleNamespace(nodes=2)),
        env={"PATH": f"{tmp_path}:/usr/bin:/bin", "FAKE_DIR": str(tmp_path)},
    )
    runner = ranks.Launcher(job)
    runner.proc = subprocess.Popen(launcher)
    finished = threading.Event()
    threading.Thread(target=lambda: (runner.proc.wait(), finished.set()), daemon=True).start()
    thread = threading.Thread(target=runner._probe_nodes, args=(finished,), daemon=True)
    thread.start()
    thread.join(HANG_S)
    runner.proc.kill()
    thread.join()
    return runner.proc.wait(), notes


def probes_left(tmp_path: Path) -> list:
    """The stand-in probes (their pids noted) still running."""
    pids = [int(pid) for pid in (tmp_path / "probe-pids").read_text().split()]
    return [p for p in pids if Path(f"/proc/{p}").exists()]


def test_a_node_probe_that_hangs_is_killed_and_the_next_names_the_lost_node(tmp_path, monkeypatch):
    """A SLURM job's probe in flight when node002's link is cut never ends (measured under real Slurm 22.05: over
    200 s), and no probe ran after it until its 120 s timeout. Now it is killed after PROBE_TIMEOUT_S and the next
    one, at once, names node002: the launcher (the job's srun) is ended."""
    # 1 s, then 2, 4... for each probe without an answer: a loaded machine slow to start one only adds a probe.
    monkeypatch.setattr(ranks, "PROBE_TIMEOUT_S", 1)
    monkeypatch.setattr(ranks, "NODE_PROBE_S", 0.05)
    status, notes = probing(tmp_path, FAKE_PROBE_SRUN, ["sleep", "3600"])
    assert status == -signal.SIGTERM, notes
    assert notes[0] == (
        "a node probe had no answer after 1s (a node that stopped answering while it ran?): probing again"
    ), notes
    assert notes[-1].startswith(
        "node node002 cannot be reached by SLURM: ending the job step (srun: error: Task launch for StepId=1.2"
    ), notes
    assert len((tmp_path / "probe-pids").read_text().split()) >= 2 and not probes_left(tmp_path)


def test_a_probe_still_hanging_when_the_launcher_ended_only_ends_the_probing(tmp_path, monkeypatch):
    """The job's launcher ended by itself while a probe hung: the probe is killed at its timeout and nothing more
    is said or probed (a note then would come after the job's own last lines)."""
    monkeypatch.setattr(ranks, "PROBE_TIMEOUT_S", 2)
    monkeypatch.setattr(ranks, "NODE_PROBE_S", 0.05)
    hangs = '#!/bin/sh\necho $$ >> "$FAKE_DIR/probe-pids"\nexec sleep 3600\n'
    # The launcher ends once the probe has started (its pid noted), however slowly the machine starts it.
    ends = ["sh", "-c", 'while [ ! -s "$0/probe-pids" ]; do sleep 0.05; done', str(tmp_path)]
    status, notes = probing(tmp_path, hangs, ends)
    assert status == 0 and notes == [], notes
    assert len((tmp_path / "probe-pids").read_text().split()) == 1 and not probes_left(tmp_path)


def test_the_previous_job_of_a_chain_that_failed_stops_this_one(job, tmp_path, capfd):
    make, log = job
    (tmp_path / "save").mkdir()
    (tmp_path / "save" / ".octo-dist-exit-41").write_text("3\n")
    assert make(OCTO_DIST_AFTER="41").main() == 2
    assert (
        "the previous job of this chain (41) failed with exit 3: not training"
        in capfd.readouterr().err
    )
    assert not log.exists() and exit_file(tmp_path) == "2"


def test_the_rank_guard_notes_and_passes_the_status(tmp_path):
    status = rankguard.main(str(tmp_path), [sys.executable, "-c", "import sys; sys.exit(4)"])
    note = (tmp_path / "failed" / "rank-unknown").read_text()
    assert (
        status == 4
        and note.startswith("rank unknown on ")
        and note.endswith("exited with status 4\n")
    )
    assert rankguard.rank_of({"PMIX_RANK": "3", "SLURM_PROCID": "1"}) == "3"
    assert rankguard.exit_status(-15) == 143


def test_settings_as_rendered_are_what_the_supervisor_reads():
    from octo_dist.jobs import render
    from octo_dist.jobs.cli import parse

    values = render.settings(parse(["sge", "--nodes", "2", "--gpus-per-node", "4"]), "job.sh")
    assert settingsread.from_json(values.to_json()) == values
    assert json.loads(values.to_json())["schema"] == job_settings.SCHEMA


@pytest.mark.parametrize(
    "field, value, what",
    [
        ("save_dir", "/etc/passwd", "save directory '/etc/passwd' cannot be made"),
        ("save_dir", "/etc/passwd/x", "save directory '/etc/passwd/x' cannot be made"),
        ("save_dir", "/proc/x", "save directory '/proc/x' cannot be made"),
        ("save_dir", "x" * 300, "(File name too long)"),
        (
            "compile_cache",
            "/etc/passwd",
            "compilation cache directory '/etc/passwd' cannot be made",
        ),
    ],
)
def test_a_directory_that_cannot_be_made_is_one_line_and_starts_no_rank(
    job, tmp_path, capfd, field, value, what
):
    make, log = job
    sup = make()
    storage = dataclasses.replace(sup.s.storage, **{field: value})
    sup.s = dataclasses.replace(sup.s, storage=storage)
    assert sup.main() == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and what in err and "Traceback" not in err, err
    assert "expected a directory this job can write. Fix: re-render with --" in err, err
    assert not log.exists()  # no preflight, no training


def test_a_stopped_rank_ends_the_job_within_a_minute_naming_it_and_its_node(job, tmp_path, capfd):
    # The job's own limit (3 s; the default 20 is stopped_limit's, below) reaches the guard through the launcher.
    make, log = job
    started = time.monotonic()
    limit = {rankguard.STOPPED_LIMIT_ENV: "3"}
    assert make(FAKE_STOP_TRAIN="1", **limit).main() == rankguard.HUNG_STATUS
    took = time.monotonic() - started
    err = capfd.readouterr().err
    host = socket.gethostname()
    assert f"rank 1 on {host} hung: stopped (SIGSTOP) for 3 s, ended with status 137" in err, err
    assert "training exited with 137" in err and took < 60, (took, err)
    assert exit_file(tmp_path) == "137"


def test_the_stopped_rank_limit_is_the_jobs_setting_or_20_s_and_a_bad_one_is_said():
    assert rankguard.stopped_limit({}) == (20, "")
    assert rankguard.stopped_limit({rankguard.STOPPED_LIMIT_ENV: "60"}) == (60, "")
    for bad in ("0", "-5", "1.5", "abc", ""):
        limit, said = rankguard.stopped_limit({rankguard.STOPPED_LIMIT_ENV: bad})
        assert (
            limit == 20
            and f"OCTO_DIST_STOPPED_RANK_LIMIT_S={bad!r}; expected a whole number" in said
        )
        assert "stopped for 20 s. Fix: export OCTO_DIST_STOPPED_RANK_LIMIT_S=60" in said


def test_a_rank_stopped_for_a_moment_is_left_alone(tmp_path, monkeypatch):
    # Stopped for 1.5 s against a limit of 30: left alone however late the SIGCONT comes on a loaded machine.
    monkeypatch.setattr(rankguard, "STOPPED_LIMIT", 30)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    os.kill(proc.pid, signal.SIGSTOP)
    threading.Timer(1.5, os.kill, (proc.pid, signal.SIGCONT)).start()
    assert rankguard.wait_watching(proc, "0", "h") == (0, "")


def test_the_rank_guard_ends_a_stopped_rank_as_hung(tmp_path, monkeypatch):
    monkeypatch.setattr(rankguard, "STOPPED_LIMIT", 2)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(proc.pid, signal.SIGSTOP)
    started = time.monotonic()
    assert rankguard.wait_watching(proc, "3", "g0002") == (
        137,
        "hung: stopped (SIGSTOP) for 2 s, ended",
    )
    assert proc.returncode == -9 and time.monotonic() - started < 30
    rankguard.write_note(str(tmp_path), "3", 137, "g0002", "hung: stopped (SIGSTOP) for 2 s, ended")
    note = (tmp_path / "failed" / "rank-3").read_text()
    assert note == "rank 3 on g0002 hung: stopped (SIGSTOP) for 2 s, ended with status 137\n"


def test_the_process_tree_is_read_after_the_last_parenthesis(tmp_path):
    # 42 the rank's starter ("singularity"), 43 the training process below it (a name with ") T "), 44 below that,
    # 50 someone else's; "self" and a vanished entry are skipped.
    stats = {
        42: "42 (starter-suid) S 41 42 42 0 -1",
        43: "43 (a) b (T) c) T 42 42 42 0 -1",
        44: "44 (python3) S 43 42 42 0 -1",
        50: "50 (bash) T 1 50 50 0 -1",
    }
    for pid, text in stats.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(text + "\n")
    (tmp_path / "60").mkdir()  # gone before its stat was read
    (tmp_path / "self").mkdir()
    tree = rankguard.process_tree(42, str(tmp_path))
    assert sorted(tree) == [(42, "S", 41), (43, "T", 42), (44, "S", 43)]
    assert rankguard.process_tree(44, str(tmp_path)) == [(44, "S", 43)]
    assert rankguard.process_tree(99, str(tmp_path)) == []
    assert rankguard.process_tree(os.getpid())[0][:2] in ((os.getpid(), "R"), (os.getpid(), "S"))
    # A check between scans reads the known processes again: 43 continued, 44 gone and its pid taken by a process
    # of another parent (left out, never signalled as the rank's).
    (tmp_path / "43" / "stat").write_text("43 (a) b (T) c) S 42 42 42 0 -1\n")
    (tmp_path / "44" / "stat").write_text("44 (vim) T 7 7 7 0 -1\n")
    assert sorted(rankguard.recheck(tree, str(tmp_path))) == [(42, "S", 41), (43, "S", 42)]


def test_a_rank_stopped_below_its_starter_is_found_and_every_process_of_it_ended(monkeypatch):
    # As under singularity exec: the guard's child waits for the training process, which is the one stopped.
    monkeypatch.setattr(rankguard, "STOPPED_LIMIT", 2)
    code = (
        "import os, signal, subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import os, signal; os.kill(os.getpid(), signal.SIGSTOP)']); "
        "print(p.pid, flush=True); p.wait(60)"  # 60 s: a guard that misses the stop ends with 0, not a hang
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    inner = int(proc.stdout.readline())
    started = time.monotonic()
    assert rankguard.wait_watching(proc, "1", "node002") == (
        137,
        "hung: stopped (SIGSTOP) for 2 s, ended",
    )
    assert time.monotonic() - started < 30
    deadline = time.monotonic() + 60
    while rankguard.process_tree(inner) and rankguard.process_tree(inner)[0][1] != "Z":
        assert time.monotonic() < deadline, (
            f"the stopped process {inner} was left: {rankguard.process_tree(inner)}"
        )
        time.sleep(0.1)


def test_a_rank_is_told_the_cpus_it_was_given_not_pbss_one():
    pbs = {"NCPUS": "1", "OMP_NUM_THREADS": "1"}
    assert rankguard.cpus_for_rank(pbs, 12) == {"NCPUS": "12", "OMP_NUM_THREADS": "12"}
    assert rankguard.cpus_for_rank(pbs, 1) == {}
    assert (
        rankguard.cpus_for_rank({"NCPUS": "1", "OMP_NUM_THREADS": "4"}, 12) == {}
    )  # the user's choice
    assert rankguard.cpus_for_rank({"OMP_NUM_THREADS": "1"}, 12) == {}  # no PBS
    assert rankguard.cpus_for_rank({"NCPUS": "16", "OMP_NUM_THREADS": "16"}, 12) == {}


def test_the_rank_guard_starts_the_rank_with_them(tmp_path, monkeypatch):
    monkeypatch.setenv("NCPUS", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "seen"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ['NCPUS'] + ' ' + os.environ['OMP_NUM_THREADS'])"
    assert rankguard.main(str(tmp_path), [sys.executable, "-c", code]) == 0
    n = len(os.sched_getaffinity(0))
    assert out.read_text() == f"{max(n, 1)} {max(n, 1)}"


def test_rank_0_notes_the_step_a_stop_saved_only_inside_a_job(tmp_path, monkeypatch, caplog):
    from octo_dist import savelayout
    from octo_dist.apps import harness

    monkeypatch.chdir(tmp_path)
    harness.note_stop(12, {})  # octo-dist smoke by hand: no job directory, nothing written
    assert list(tmp_path.iterdir()) == []
    harness.note_stop(12, {savelayout.JOB_DIR_ENV: str(tmp_path)})
    assert (tmp_path / "stopped").read_text() == "12\n" and savelayout.stopped_step(
        str(tmp_path)
    ) == 12
    gone = tmp_path / "gone"
    harness.note_stop(
        12, {savelayout.JOB_DIR_ENV: str(gone)}
    )  # the note is a courtesy: a warning, no error
    assert (
        "could not note the stop in" in caplog.text and savelayout.stopped_step(str(gone)) is None
    )
    (tmp_path / "stopped").write_text("12\x00")
    assert savelayout.stopped_step(str(tmp_path)) is None


def test_a_job_run_by_hand_never_takes_another_hand_run_jobs_directory(job, tmp_path, capfd):
    """Before: every job run by hand (no scheduler's job id) was job "0": a second one in the same save directory
    took the first's job directory (its mark said "0") and removed it at its end, under the running first."""
    make, log = job
    other = tmp_path / "save" / ".octo-dist-job-0"  # as a hand-run job running now made it
    other.mkdir(parents=True)
    (other / ".octo-dist-job").write_text("0\n")
    (other / "nodes").write_text("g0001\n")
    sup = make(JOB_ID="", FAKE_PREFLIGHT_WAITS="")
    when_logged(log, "train-started", signal_me(signal.SIGUSR1))
    assert sup.main() == 0, capfd.readouterr().err
    assert sup.job_id.startswith("by-hand-") and sup.job_id.endswith(f"-{os.getpid()}"), sup.job_id
    assert (other / "nodes").read_text() == "g0001\n"
    assert (tmp_path / "save" / f".octo-dist-exit-{sup.job_id}").read_text() == "0\n"


def test_an_executable_fifo_named_mpirun_is_refused_in_one_line(job, tmp_path, capfd):
    make, log = job
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "mpirun")
    os.chmod(fifo_dir / "mpirun", 0o755)
    sup = make(PATH=f"{fifo_dir}:{os.environ['PATH']}")
    assert sup.main() == 2
    err = capfd.readouterr().err
    assert f"the mpirun on PATH ({fifo_dir / 'mpirun'}) is not a file" in err, err


def _guard_of_rank(launcher_pid: int, rank: str) -> int:
    """The rank guard the (fake) launcher started for ``rank``: its child whose environment names that rank."""
    for pid, _, ppid in rankguard.process_tree(launcher_pid):
        if ppid != launcher_pid:
            continue
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no guard of rank {rank} below {launcher_pid}")


def test_a_rank_killed_with_its_guard_is_named_and_leaves_the_chain_free_to_resume(
    job, tmp_path, capfd
):
    """Before: ``kill -9`` of rank 0's guard (its rank dies with it) left no note; the rank the launcher ended after
    it was blamed, and the launcher's status (Open MPI: 134) in the exit file stopped the chain."""
    make, log = job
    sup = make()

    def kill_guard():
        launcher = int(re.findall(r"launcher pid (\d+)", log.read_text())[-1])  # the training's
        os.kill(_guard_of_rank(launcher, "0"), signal.SIGKILL)

    when_logged(log, "train-started", kill_guard)
    status = sup.main()
    err = capfd.readouterr().err
    assert status != 0, err
    assert "rank(s) 0 ended without a note: killed from outside with their guard" in err, err
    train, said = prepare.exitfile.read(str(tmp_path / "save" / ".octo-dist-exit-42"))
    assert train is True and "resumable" in said, said


def test_a_late_rank_note_never_makes_a_job_directory_again(tmp_path):
    """Before: a guard that outlived its job (its launcher killed) noted its rank after the job had removed its
    directory, making ``.octo-dist-job-<id>/failed/`` again, unmarked: no later job removed it."""
    gone = tmp_path / ".octo-dist-job-42"
    rankguard.write_note(str(gone), "1", 137, "g0001", "lost its launcher (pid 4242): ended")
    assert not gone.exists()
    gone.mkdir()
    rankguard.write_note(str(gone), "1", 137, "g0001")
    assert (gone / "failed" / "rank-1").read_text() == "rank 1 on g0001 exited with status 137\n"


FAKE_QDEL = """
import os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write("qdel " + " ".join(sys.argv[1:]) + "\\n")
"""


def _record_chain(save: Path, *submissions) -> None:
    save.mkdir(parents=True, exist_ok=True)
    (save / ".octo-dist-jobs.json").write_text(json.dumps(list(submissions)))


def test_a_job_that_finishes_training_cancels_the_rest_of_its_chain(job, tmp_path, capfd):
    """Before: the jobs queued after the one that trained the last step each started their nodes for nothing."""
    make, log = job
    program(tmp_path / "bin" / "qdel", FAKE_QDEL)
    other = {
        "scheduler": "sge",
        "jobs": [{"id": "7"}, {"id": "8"}],
    }  # another chain in the same save dir
    _record_chain(
        tmp_path / "save",
        {"scheduler": "sge", "jobs": [{"id": "41"}, {"id": "42"}, {"id": "43"}]},
        other,
        {"scheduler": "sge", "after": "43", "jobs": [{"id": "44"}, {"id": "1/../x"}]},  # extended
    )
    assert make(FAKE_TRAIN_FINISHES="1").main() == 0
    err = capfd.readouterr().err
    assert [ln for ln in log.read_text().splitlines() if ln.startswith("qdel")] == ["qdel 43 44"]
    assert "training finished: cancelled the rest of the chain" in err, err


def test_a_job_stopped_for_its_wall_time_leaves_its_chain_queued(job, tmp_path, capfd):
    make, log = job
    program(tmp_path / "bin" / "qdel", FAKE_QDEL)
    _record_chain(tmp_path / "save", {"scheduler": "sge", "jobs": [{"id": "42"}, {"id": "43"}]})
    sup = make(FAKE_PREFLIGHT_WAITS="")
    when_logged(log, "train-started", signal_me(signal.SIGUSR1))
    assert sup.main() == 0
    assert "qdel" not in log.read_text()


def test_the_rank_0_wait_is_one_name_on_both_sides_of_the_job():
    from octo_dist.jobs.settings import RANK0_WAIT_ENV
    from octo_dist.runtime import rankwait

    assert RANK0_WAIT_ENV == rankwait.TIMEOUT_ENV
