"""The smoke job end to end under a real mpirun: N-process = 1-process equivalence, per-rank input counts,
stop on a scheduler's signal, checkpoint, resume; and the pure verdicts behind them."""

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import helpers
from helpers import COMPILE_FAST, HANG_S, REPO, clean_env, signal_all
from octo_dist import EXIT_USAGE
from octo_dist.apps.smoke import equivalence
from octo_dist.apps.smoke import app as smoke
from octo_dist.engine import checkpoint, checksums, train
from octo_dist.engine.checkpoint import CheckpointError

SMOKE = ["-m", "octo_dist", "smoke", "--model", "tiny"]


# --- pure -----------------------------------------------------------------------------------------------


def rec(losses, digests=("d", "d"), reads=(4, 4), ranks=2, devices=2):
    return {
        "losses": {str(i): v for i, v in enumerate(losses)},
        "digests": list(digests),
        "reads_per_step": list(reads),
        "global_batch": 8,
        "ranks": ranks,
        "devices": devices,
    }


def test_equivalent_runs_pass_and_each_departure_is_named():
    ref = rec([1.0, 0.5, 0.25])
    assert equivalence.compare(ref, rec([1.0, 0.5000001, 0.25]), 2, 1e-5) == []
    assert "step 1: loss 0.50002" in equivalence.compare(ref, rec([1.0, 0.50002, 0.25]), 2, 1e-5)[0]
    assert (
        "parameters differ across ranks"
        in equivalence.compare(ref, rec([1.0, 0.5, 0.25], ("a", "b")), 2, 1e-5)[0]
    )
    assert (
        "expected 4 (global batch / 2)"
        in equivalence.compare(ref, rec([1.0, 0.5, 0.25], reads=(8, 8)), 2, 1e-5)[0]
    )
    assert "steps differ" in equivalence.compare(ref, rec([1.0, 0.5]), 2, 1e-5)[0]
    assert equivalence.max_relative(ref, rec([1.0, 0.5, 0.2500025])) == pytest.approx(
        1e-5, rel=1e-3
    )


def test_every_smoke_flag_has_help_that_shows_its_default():
    parser = argparse.ArgumentParser(prog="octo-dist")
    p = smoke.add_parser(parser.add_subparsers())
    for action in p._actions:
        if action.dest != "help":
            assert action.help and "(default: " in action.help, action.option_strings
    assert "``" not in p.format_help() and ":func:" not in p.format_help()


def test_verdict_names_ranks_devices_steps_and_losses():
    r = dict(
        rec([0.83, 0.02]),
        model="tiny",
        local_devices=1,
        platform="cpu",
        steps=2,
        start_step=0,
        end_step=2,
        stopped_by=None,
    )
    text = smoke.verdict(r)
    assert "2 rank(s) x 1 cpu device(s) = 2 device(s), global batch 8 (4 per rank" in text
    assert "steps 0 -> 2 of 2, loss 0.8300 -> 0.0200" in text and "identical on every rank" in text
    assert "DIFFER across ranks" in smoke.verdict(dict(r, digests=["a", "b"]))
    one = smoke.verdict(dict(r, ranks=1, digests=["a"]))
    assert (
        "  parameters of the one rank: a (one rank: nothing to compare)" in one
        and "identical" not in one
    )


def test_resuming_refuses_other_settings_and_fresh_runs_refuse_old_checkpoints(tmp_path):
    train.check_resumable(
        {"fingerprint": {"global_batch": 8, "seed": 0}}, {"global_batch": 8, "seed": 0}, tmp_path
    )
    with pytest.raises(CheckpointError, match=r"global_batch=8 \(now 16\)"):
        train.check_resumable({"fingerprint": {"global_batch": 8}}, {"global_batch": 16}, tmp_path)

    # Whether to resume is decided once, before start-up (checkpoint.decide; its cases are in
    # test_checkpoint_integrity.py): a new run over old checkpoints is refused there, with the fix.
    (tmp_path / "12").mkdir()
    with pytest.raises(CheckpointError, match="latest: step 12.*add --resume"):
        checkpoint.decide(tmp_path, False)


# --- real processes -------------------------------------------------------------------------------------


def mpirun_smoke(np_, *args, env=None, **popen):
    exe = Path(sys.executable).parent / "mpirun"
    if not exe.exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    cmd = [str(exe), "--oversubscribe", "-np", str(np_), sys.executable, *SMOKE, *args]
    return helpers.popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or clean_env(XLA_FLAGS=COMPILE_FAST),
        cwd=REPO,
        **popen,
    )


def finish(proc, timeout=HANG_S):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.mark.mpi
@pytest.mark.slow
def test_make_smoke_runs_two_ranks_and_matches_one_process():
    # What a new user runs first; the env already exists here, so make only runs the job. Its reference run and its
    # ranks are compiled alike, fast (helpers.COMPILE_FAST: --check-equivalence gives both sides the caller's XLA
    # flags): what is tested is the recipe, the two runs and their comparison, not XLA's optimiser.
    proc = helpers.run(
        ["make", "--no-print-directory", "smoke", "SMOKE_ARGS=--model tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(XLA_FLAGS=COMPILE_FAST),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert (
        "1 rank(s) x 2 cpu device(s)" in out and "2 rank(s) x 1 cpu device(s) = 2 device(s)" in out
    )
    assert "read per rank per step: [4]" in out  # each rank read global batch / 2 examples per step
    assert "steps 0 -> 20 of 20" in out
    assert "equivalence: OK: 20 steps, 2 processes x 1 device match 1 process x 2 devices" in out


# The 2-rank runs below: STEPS steps of the jit step (the GPUs' step function; make smoke above checks the CPU's
# shard_map), each stopped run paced (--step-time PACE_S) so that its signal lands between steps long before STEPS
# however fast the machine, a checkpoint every SAVE_EVERY steps: the two stops share (STEPS - 4) x PACE_S = 20 s for
# the test to see each awaited checkpoint and signal. The run that resumes to the end is paced too (LAST_PACE_S):
# its parameters, the same bits as the full-speed run's, show that the pace changes none. A step costs CPU (about
# 55 ms a rank), a pace's sleep none: few steps, a long pace.
STEPS = 24
SAVE_EVERY = 2
PACE_S = "1.0"
LAST_PACE_S = 0.25
RUN = ("--steps", str(STEPS), "--step-fn", "jit")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The record of the run every run below is compared with, run once for the file: 2 ranks x STEPS steps under
    mpirun, started as an image without an MPI library starts them: OCTO_DIST_NO_MPI4PY=1 beside an mpi4py whose
    import raises and leaves a mark (the coordinator comes from the launcher's environment). ``["imported"]``: the
    mark was left."""
    if not (Path(sys.executable).parent / "mpirun").exists():
        pytest.skip("no mpirun in this venv (the cpu profile has one: make env)")
    tmp = tmp_path_factory.mktemp("uninterrupted")
    fake = tmp / "site" / "mpi4py"
    fake.mkdir(parents=True)
    mark = tmp / "imported"
    (fake / "__init__.py").write_text(
        f"open({str(mark)!r}, 'a').write('x')\nraise RuntimeError('cannot load MPI library')\n"
    )
    env = clean_env(
        OCTO_DIST_NO_MPI4PY="1", PYTHONPATH=f"{tmp / 'site'}:{REPO}", XLA_FLAGS=COMPILE_FAST
    )
    record = tmp / "full.json"
    proc = mpirun_wrapped(tmp, "", *RUN, "--record", str(record), env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + str(rank_errors(tmp))
    return dict(json.loads(record.read_text()), imported=mark.exists())


@pytest.mark.mpi
@pytest.mark.slow
def test_the_jit_step_the_gpus_run_is_equivalent_too(uninterrupted, tmp_path):
    # The 2-process run above against the reference --check-equivalence runs (its command and environment: 1
    # process x 2 forced devices), compared as it compares: with one all-reduce per parameter leaf, which XLA
    # combines, across processes over gloo.
    parser = argparse.ArgumentParser(prog="octo-dist")
    smoke.add_parser(parser.add_subparsers())
    args = parser.parse_args(["smoke", "--model", "tiny", *RUN])
    reference, _ = equivalence.commands(args, tmp_path)
    env, _ = equivalence.environments(2, clean_env())
    env["XLA_FLAGS"] += " " + COMPILE_FAST  # compiled as the 2-process run was
    proc = helpers.run(reference, cwd=REPO, capture_output=True, text=True, timeout=HANG_S, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ref = json.loads((tmp_path / "reference.json").read_text())
    assert ref["devices"] == 2 and len(ref["losses"]) == STEPS
    assert equivalence.compare(ref, uninterrupted, 2, args.tolerance) == []


@pytest.mark.mpi
def test_octo_dist_no_mpi4py_means_mpi4py_is_never_imported(uninterrupted):
    # The run above trained every step without touching the mpi4py that cannot be imported.
    assert uninterrupted["end_step"] == STEPS and uninterrupted["ranks"] == 2
    assert not uninterrupted["imported"]


def wait_for(path: Path, proc, timeout=HANG_S):
    """Until ``path`` appears; ``timeout`` (HANG_S) only ends a hang: a loaded machine starts JAX slowly."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, (
            "the job ended before its first checkpoint: " + proc.stderr.read()[-3000:]
        )
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.2)


def ranks_of(proc) -> list:
    return [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "octo_dist" in " ".join(p.cmdline())
    ]


def stopped(ckpt: Path, record: Path, after: int, stop, *flags: str) -> tuple:
    """(record, stdout, stderr) of a paced 2-rank run into ``ckpt`` (``flags``: --resume), ``stop(job)`` called once
    its first checkpoint past step ``after`` is complete; the run must end 0 stopped before STEPS."""
    every = ("--save-every", str(SAVE_EVERY), "--step-time", PACE_S)
    job = mpirun_smoke(2, *RUN, "--save-dir", str(ckpt), *every, "--record", str(record), *flags)
    wait_for(ckpt / str(after - after % SAVE_EVERY + SAVE_EVERY), job)
    stop(job)
    code, out, err = finish(job)
    assert code == 0, err[-3000:]
    part = json.loads(record.read_text())
    assert after <= part["start_step"] < part["end_step"] < STEPS, part
    return part, out, err


def sigterm_and_again(job) -> None:
    """SIGTERM to every rank, as PBS and SLURM stop a job at wall time; then SIGTERM to every rank again and again (a
    second qdel, scancel twice) until each has exited, through the save and the shutdown. SIGTERM only: a signal of a
    lower number pending beside the first would run its handler first and be the one recorded (Python runs pending
    handlers in signal order); other signals after the first are test_stop_signals.py's INT case."""
    ranks = ranks_of(job)
    assert len(ranks) == 2, ranks
    signal_all(ranks, signal.SIGTERM)

    def again():
        while any(alive(p) for p in ranks):
            signal_all(ranks, signal.SIGTERM)
            time.sleep(0.02)

    threading.Thread(target=again, daemon=True).start()  # while finish() reads the job's output


def alive(proc) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def same_as(part: dict, whole: dict) -> None:
    for k, loss in part["losses"].items():
        assert loss == pytest.approx(whole["losses"][k], rel=1e-6), k


# The chain: three jobs into one save directory, each a test of its own (one stop each, then the resume to the end),
# the jobs in module fixtures so that a test needs only the jobs before it.


@pytest.fixture(scope="module")
def sigterm_stop(tmp_path_factory) -> dict:
    """The first job, stopped as PBS and SLURM stop one at wall time: SIGTERM to every process of the job, and again
    while it saves and shuts down (:func:`sigterm_and_again`), once its step-2 checkpoint directory is there."""
    ckpt = tmp_path_factory.mktemp("chain") / "ckpt"
    record, out, err = stopped(ckpt, ckpt.parent / "first.json", 0, sigterm_and_again)
    return {"ckpt": ckpt, "record": record, "out": out, "err": err}


@pytest.fixture(scope="module")
def sigusr1_stop(sigterm_stop) -> dict:
    """The second: resumed from the first's stop, and stopped as Grid Engine's notify stops one: SIGUSR1 to mpirun,
    which forwards it to every rank."""
    ckpt = sigterm_stop["ckpt"]
    sigusr1 = lambda job: job.send_signal(signal.SIGUSR1)  # noqa: E731
    after = sigterm_stop["record"]["end_step"]
    record, out, err = stopped(ckpt, ckpt.parent / "second.json", after, sigusr1, "--resume")
    return {"ckpt": ckpt, "record": record, "out": out, "err": err}


@pytest.mark.mpi
@pytest.mark.slow
def test_sigterm_to_every_rank_and_again_while_it_saves_stops_the_job_with_a_verified_checkpoint(
    sigterm_stop,
):
    # Exit 0 (stopped(): before STEPS), the stop step's checkpoint verified, no traceback: the signals after the
    # first change nothing.
    first, ckpt = sigterm_stop["record"], sigterm_stop["ckpt"]
    stop = first["end_step"]
    assert first["stopped_by"] == "SIGTERM" and checksums.verify(ckpt / str(stop), stop) is None
    assert "stopped by SIGTERM (checkpoint saved)" in sigterm_stop["out"]
    err = sigterm_stop["err"]
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err[-3000:]


@pytest.mark.mpi
@pytest.mark.slow
def test_sigusr1_to_mpirun_stops_every_rank_of_the_resumed_job(sigterm_stop, sigusr1_stop):
    second = sigusr1_stop["record"]
    assert second["start_step"] == sigterm_stop["record"]["end_step"], second
    assert second["stopped_by"] == "SIGUSR1", second
    assert "stopped by SIGUSR1" in sigusr1_stop["out"]


@pytest.mark.mpi
@pytest.mark.slow
def test_the_resume_of_a_resume_reproduces_the_uninterrupted_run_and_its_history_spans_the_three_jobs(
    uninterrupted, sigterm_stop, sigusr1_stop
):
    first, second = sigterm_stop["record"], sigusr1_stop["record"]
    ckpt, stop = sigterm_stop["ckpt"], second["end_step"]
    # A kill mid-write leaves orbax's temporary directory: fabricate one past the last complete checkpoint.
    torn = ckpt / f"{stop + 5}.orbax-checkpoint-tmp-1796280000000000"
    (torn / "state").mkdir(parents=True)
    (torn / "state" / "garbage").write_text("half written")
    before = sorted(p.name for p in ckpt.iterdir() if p.name.isdigit())
    # Without --resume the directory is left alone: refused before anything is compiled or written.
    code, out, err = finish(mpirun_smoke(2, *RUN, "--save-dir", str(ckpt)))
    assert code == EXIT_USAGE, err[-3000:]
    assert f"already holds checkpoints (latest: step {stop})" in err and "add --resume" in err
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == before

    record = ckpt.parent / "last.json"
    # a checkpoint at the end only (each costs about 0.4 s of CPU a rank): the resumes above read the stop's
    paced = ("--step-time", str(LAST_PACE_S), "--save-every", "0")
    code, out, err = finish(
        mpirun_smoke(2, *RUN, "--save-dir", str(ckpt), "--resume", "--record", str(record), *paced)
    )
    assert code == 0, err[-3000:]
    assert f"steps {stop} -> {STEPS} of {STEPS}" in out and not torn.exists()
    last = json.loads(record.read_text())
    for part in (first, second, last):
        same_as(part, uninterrupted)
    # Optimizer state, RNG and data position all came back, through two resumes, and the pace changed nothing: the
    # final parameters of the paced run resumed from a resumed one are the full-speed run's bits.
    assert last["digests"][0] == uninterrupted["digests"][0]
    # What the sleep guarantees, not a speed: the summary times a step from one metrics read to the next, and the
    # pace from just after the read, so an interval is the pace plus the difference of two reads' own times (a tiny
    # model's: milliseconds); 0.05 s leaves that room.
    assert last["step_time_median_s"] >= LAST_PACE_S - 0.05, last["step_time_median_s"]
    # The run's history in summary.json (tests/test_summary.py's subject) across the three jobs: each job's steps,
    # the top level the last job's, every step's loss, the first job's losses kept as it recorded them.
    run = json.loads((ckpt / "summary.json").read_text())
    starts = [0, first["end_step"], second["end_step"], STEPS]
    assert [(j["start_step"], j["end_step"]) for j in run["jobs"]] == list(zip(starts, starts[1:]))
    assert (run["start_step"], run["end_step"]) == (second["end_step"], STEPS)
    assert sorted(map(int, run["losses"])) == list(range(STEPS))
    assert all(run["losses"][k] == v for k, v in first["losses"].items())


@pytest.mark.mpi
def test_a_global_batch_that_does_not_divide_is_refused_before_compiling():
    code, out, err = finish(mpirun_smoke(2, "--global-batch", "7", "--steps", "2"))
    assert code == EXIT_USAGE
    assert (
        "global batch 7 does not divide by the 2 devices" in err
        and "use a global batch of 6 or 8" in err
    )
    assert "train:" not in err  # not one step was started


# --- start-up that always ends ---------------------------------------------------------------------------


def mpirun_wrapped(tmp_path, shell: str, *args: str, env=None, timeout=HANG_S):
    """``mpirun -np 2 bash -c SHELL _ python -m octo_dist smoke --model tiny ARGS``; SHELL ends with
    ``exec "$@"`` and may change one rank's environment. Each rank's stderr goes to tmp_path/rank<N>.err."""
    mpirun = Path(sys.executable).parent / "mpirun"
    wrapper = shell + f' exec "$@" 2> {tmp_path}/rank$OMPI_COMM_WORLD_RANK.err'
    cmd = [
        str(mpirun),
        "--oversubscribe",
        "-np",
        "2",
        "bash",
        "-c",
        wrapper,
        "_",
        sys.executable,
        *SMOKE,
        *args,
    ]
    # The timeout is what a hang would hit: these jobs must end on their own within --init-timeout.
    return helpers.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or clean_env(XLA_FLAGS=COMPILE_FAST),
    )


def rank_errors(tmp_path) -> dict:
    return {int(p.stem[4:]): p.read_text() for p in tmp_path.glob("rank*.err")}


@pytest.mark.mpi
@pytest.mark.parametrize("odd", [0, 1])
def test_ranks_that_disagree_about_the_world_size_end_with_the_odd_ranks_error(tmp_path, odd):
    # One rank sees another world size (a wrapper or module that changes it): before, the other rank waited
    # forever in mpi4py's broadcast. Now the odd rank names the disagreement and MPI_Abort ends the job.
    proc = mpirun_wrapped(
        tmp_path,
        f'if [ "$OMPI_COMM_WORLD_RANK" = {odd} ]; then export OMPI_COMM_WORLD_SIZE=3; fi;',
        "--steps",
        "2",
        "--init-timeout",
        "120",
    )
    assert proc.returncode != 0
    err = rank_errors(tmp_path)[odd]
    assert f"rank {odd}/3: start-up failed: openmpi5's environment says 3 ranks" in err, err[-3000:]
    assert "but MPI started 2: the ranks disagree about the world size" in err
    assert "Traceback" not in err


@pytest.mark.mpi
def test_a_rank_stuck_in_mpi_init_ends_at_the_start_up_timeout_naming_what_it_waited_for(tmp_path):
    # Rank 0 never starts Python (a node where the image cannot run): rank 1 waits inside MPI_Init, with the GIL
    # held, where no Python thread can run; the watchdog's child process ends it anyway. The timeout starts short
    # and grows only where rank 1's imports spent it before MPI_Init (helpers.with_growing_budget).
    stage = "the coordinator agreement through mpi4py (MPI_Init, broadcast) did not complete within"

    def run(budget):
        ranks = tmp_path / f"within-{budget}"
        ranks.mkdir()
        proc = mpirun_wrapped(
            ranks,
            'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec sleep 600; fi;',
            "--steps",
            "2",
            "--init-timeout",
            str(budget),
        )
        return proc, rank_errors(ranks).get(1, "")

    budget, (proc, err) = helpers.with_growing_budget(run, lambda result: stage in result[1])
    assert proc.returncode != 0
    assert f"rank 1/2: {stage} {budget} s" in err, err


def test_the_start_up_timeout_is_a_positive_number_from_the_flag_or_the_environment():
    from octo_dist.runtime import runtime

    assert runtime.startup_timeout(None, {}) == runtime.DEFAULT_TIMEOUT_S
    assert runtime.startup_timeout(None, {"OCTO_DIST_INIT_TIMEOUT": "45"}) == 45
    assert runtime.startup_timeout(20, {"OCTO_DIST_INIT_TIMEOUT": "45"}) == 20
    for bad in ("abc", "0", "-3", "nan", "inf"):
        with pytest.raises(
            runtime.SettingError,
            match=rf"OCTO_DIST_INIT_TIMEOUT='{bad}'; expected a positive number",
        ):
            runtime.startup_timeout(None, {"OCTO_DIST_INIT_TIMEOUT": bad})


def test_octo_dist_no_mpi4py_is_read_as_a_switch():
    from octo_dist.runtime import mpi

    assert mpi.allowed({}) and mpi.allowed({"OCTO_DIST_NO_MPI4PY": "0"})
    assert not mpi.allowed({"OCTO_DIST_NO_MPI4PY": "1"}) and not mpi.allowed(
        {"OCTO_DIST_NO_MPI4PY": "yes"}
    )


def _python(program: str) -> subprocess.CompletedProcess:
    """``program`` run by this Python from the checkout, its output captured."""
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "busy, code",
    [
        ("time.sleep(120)", 1),  # the thread fires: exit 1 with the message
        # a C call holding the GIL (as MPI_Init does): the child fires. libc's sleep through ctypes.PyDLL, which
        # keeps the GIL, blocks as MPI_Init waiting for its peers does, without a busy loop's 7 s of CPU.
        ("import ctypes; ctypes.PyDLL(None).sleep(120)", -signal.SIGKILL),
    ],
)
def test_the_watchdog_ends_a_process_even_while_the_gil_is_held(busy, code):
    program = (
        "import time\nfrom octo_dist.runtime import watchdog\n"
        "dog = watchdog.Watchdog(2, 'octo-dist: error: {stage} did not complete within 2 s', exit_code=1)\n"
        "dog.stage('the test stage')\n" + busy + "\n"
    )
    proc = _python(program)  # a watchdog that never fired would hang until HANG_S
    assert proc.returncode == code
    assert "octo-dist: error: the test stage did not complete within 2 s" in proc.stderr


def test_a_cancelled_watchdog_never_fires():
    program = (
        "import time\nfrom octo_dist.runtime import watchdog\n"
        "dog = watchdog.Watchdog(1, 'fired: {stage}', exit_code=1)\ndog.cancel()\n"
        "time.sleep(1 + watchdog.GRACE_S + 3)\n"
    )
    proc = _python(program)
    assert proc.returncode == 0 and "fired" not in proc.stderr


@pytest.mark.parametrize(
    "args, env, message",
    [
        (
            ["--launcher", "slurm"],
            {},
            "octo-dist smoke: error: --launcher slurm was asked for, but its environment",
        ),
        (
            [],
            {"OCTO_DIST_INIT_TIMEOUT": "abc"},
            "octo-dist smoke: error: OCTO_DIST_INIT_TIMEOUT='abc'; expected a positive",
        ),
    ],
)
def test_start_up_settings_that_cannot_work_are_one_line_and_exit_2(args, env, message):
    proc = subprocess.run(
        [sys.executable, *SMOKE, "--steps", "1", *args],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(**env),
        cwd=REPO,
    )
    assert proc.returncode == EXIT_USAGE
    assert proc.stderr.startswith(message) and "Traceback" not in proc.stderr
