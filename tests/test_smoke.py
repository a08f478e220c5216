"""The smoke job end to end under a real mpirun: N-process = 1-process equivalence, per-rank input counts,
stop on a scheduler's signal, checkpoint, resume; and the pure verdicts behind them."""

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import helpers
from helpers import HANG_S, REPO, clean_env
from octo_dist import EXIT_USAGE
from octo_dist.apps.smoke import equivalence
from octo_dist.apps.smoke import app as smoke
from octo_dist.engine import checkpoint, train
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
        env=env or clean_env(),
        cwd=REPO,
        **popen,
    )


def finish(proc, timeout=HANG_S):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


@pytest.mark.mpi
@pytest.mark.slow
def test_make_smoke_runs_two_ranks_and_matches_one_process():
    # What a new user runs first; the env already exists here, so make only runs the job.
    proc = helpers.run(
        ["make", "--no-print-directory", "smoke", "SMOKE_ARGS=--model tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert (
        "1 rank(s) x 2 cpu device(s)" in out and "2 rank(s) x 1 cpu device(s) = 2 device(s)" in out
    )
    assert "read per rank per step: [4]" in out  # each rank read global batch / 2 examples per step
    assert "steps 0 -> 20 of 20" in out
    assert "equivalence: OK: 20 steps, 2 processes x 1 device match 1 process x 2 devices" in out


@pytest.mark.mpi
@pytest.mark.slow
def test_the_jit_step_the_gpus_run_is_equivalent_too(tmp_path):
    # On the CPU --step-fn auto is shard_map (make smoke above checks it); auto on GPUs is jit, with one all-reduce
    # per parameter leaf that XLA combines: the same check with it, across processes over gloo.
    proc = subprocess.run(
        [
            sys.executable,
            *SMOKE,
            "--check-equivalence",
            "--np",
            "2",
            "--step-fn",
            "jit",
            "--steps",
            "4",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "equivalence: OK: 4 steps" in proc.stdout


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


@pytest.mark.mpi
@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    # Enough steps (and a save every 4) that the signal lands well before the end on a fast machine.
    steps = "120"
    full = mpirun_smoke(2, "--steps", steps, "--record", str(tmp_path / "full.json"))
    code, out, err = finish(full)
    assert code == 0, err[-3000:]

    ckpt = tmp_path / "ckpt"
    job = mpirun_smoke(
        2,
        "--steps",
        steps,
        "--save-dir",
        str(ckpt),
        "--save-every",
        "4",
        "--record",
        str(tmp_path / "part.json"),
    )
    wait_for(ckpt / "4", job)
    # What PBS and SLURM do at wall time: SIGTERM to every process of the job.
    for p in ranks_of(job):
        p.send_signal(signal.SIGTERM)
    code, out, err = finish(job)
    assert code == 0, err[-3000:]
    part = json.loads((tmp_path / "part.json").read_text())
    stop = part["end_step"]
    assert part["stopped_by"] == "SIGTERM" and 4 <= stop < 120, part
    assert (ckpt / str(stop)).is_dir()
    assert "stopped by SIGTERM (checkpoint saved)" in out

    resumed = mpirun_smoke(
        2,
        "--steps",
        steps,
        "--save-dir",
        str(ckpt),
        "--resume",
        "--record",
        str(tmp_path / "resumed.json"),
    )
    code, out, err = finish(resumed)
    assert code == 0, err[-3000:]
    again = json.loads((tmp_path / "resumed.json").read_text())
    whole = json.loads((tmp_path / "full.json").read_text())
    assert again["start_step"] == stop and again["end_step"] == 120
    for k, loss in again["losses"].items():
        assert loss == pytest.approx(whole["losses"][k], rel=1e-6), k
    for k, loss in part["losses"].items():
        assert loss == pytest.approx(whole["losses"][k], rel=1e-6), k
    # Optimizer state, RNG and data position all came back: the final parameters are the same bits.
    assert again["digests"][0] == whole["digests"][0]


@pytest.mark.mpi
@pytest.mark.slow
def test_sigusr1_to_mpirun_sge_notify_stops_every_rank_and_a_half_written_checkpoint_is_ignored(
    tmp_path,
):
    ckpt = tmp_path / "ckpt"
    job = mpirun_smoke(
        2,
        "--steps",
        "400",
        "--save-dir",
        str(ckpt),
        "--save-every",
        "3",
        "--record",
        str(tmp_path / "part.json"),
    )
    wait_for(ckpt / "3", job)
    job.send_signal(signal.SIGUSR1)  # to mpirun itself, which forwards it to every rank
    code, out, err = finish(job)
    assert code == 0, err[-3000:]
    stop = json.loads((tmp_path / "part.json").read_text())["end_step"]
    assert "stopped by SIGUSR1" in out

    # A kill mid-write leaves orbax's temporary directory: fabricate one past the last complete checkpoint.
    torn = ckpt / f"{stop + 5}.orbax-checkpoint-tmp-1796280000000000"
    (torn / "state").mkdir(parents=True)
    (torn / "state" / "garbage").write_text("half written")
    before = sorted(p.name for p in ckpt.iterdir() if p.name.isdigit())

    # Without --resume the directory is left alone: refused before anything is compiled or written.
    code, out, err = finish(mpirun_smoke(2, "--steps", "400", "--save-dir", str(ckpt)))
    assert code == EXIT_USAGE, err[-3000:]
    assert f"already holds checkpoints (latest: step {stop})" in err and "add --resume" in err
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == before

    code, out, err = finish(
        mpirun_smoke(2, "--steps", str(stop + 2), "--save-dir", str(ckpt), "--resume")
    )
    assert code == 0, err[-3000:]
    assert f"steps {stop} -> {stop + 2} of {stop + 2}" in out
    assert not torn.exists()


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
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env or clean_env()
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
    # held, where no Python thread can run; the watchdog's child process ends it anyway.
    proc = mpirun_wrapped(
        tmp_path,
        'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec sleep 600; fi;',
        "--steps",
        "2",
        "--init-timeout",
        "30",
    )
    assert proc.returncode != 0
    err = rank_errors(tmp_path)[1]
    assert (
        "rank 1/2: the coordinator agreement through mpi4py (MPI_Init, broadcast) did not complete within 30 s"
        in err
    ), err


@pytest.mark.mpi
def test_octo_dist_no_mpi4py_means_mpi4py_is_never_imported(tmp_path):
    # An image without an MPI library: importing mpi4py raises there. Fabricate that mpi4py, leaving a mark when
    # imported; with OCTO_DIST_NO_MPI4PY=1 the job must train without touching it (coordinator from the launcher's
    # environment: both ranks on this node).
    fake = tmp_path / "site" / "mpi4py"
    fake.mkdir(parents=True)
    mark = tmp_path / "imported"
    (fake / "__init__.py").write_text(
        f"open({str(mark)!r}, 'a').write('x')\nraise RuntimeError('cannot load MPI library')\n"
    )
    env = clean_env(OCTO_DIST_NO_MPI4PY="1", PYTHONPATH=f"{tmp_path / 'site'}:{REPO}")
    record = tmp_path / "rec.json"
    proc = mpirun_wrapped(tmp_path, "", "--steps", "2", "--record", str(record), env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + str(rank_errors(tmp_path))
    assert json.loads(record.read_text())["end_step"] == 2
    assert not mark.exists()


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


@pytest.mark.parametrize(
    "busy, code",
    [
        ("time.sleep(120)", 1),  # the thread fires: exit 1 with the message
        (
            "sum(range(10 ** 13))",
            -signal.SIGKILL,
        ),  # a C call holding the GIL (as MPI_Init does): the child fires
    ],
)
def test_the_watchdog_ends_a_process_even_while_the_gil_is_held(busy, code):
    program = (
        "import time\nfrom octo_dist.runtime import watchdog\n"
        "dog = watchdog.Watchdog(2, 'octo-dist: error: {stage} did not complete within 2 s', exit_code=1)\n"
        "dog.stage('the test stage')\n" + busy + "\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=REPO,
    )  # a watchdog that never fired would hit this timeout
    assert proc.returncode == code
    assert "octo-dist: error: the test stage did not complete within 2 s" in proc.stderr


def test_a_cancelled_watchdog_never_fires():
    program = (
        "import time\nfrom octo_dist.runtime import watchdog\n"
        "dog = watchdog.Watchdog(1, 'fired: {stage}', exit_code=1)\ndog.cancel()\n"
        "time.sleep(1 + watchdog.GRACE_S + 3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env=clean_env(),
        cwd=REPO,
    )
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
