"""What tests share: the repository's paths and an environment free of the caller's job (imported as ``helpers``)."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import psutil

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "tests" / "programs"
# `octo-dist smoke` of the tiny model, run by this Python from the checkout.
SMOKE = (sys.executable, "-m", "octo_dist", "smoke", "--model", "tiny")
# How long a test waits for a single-process program before calling it hung: a guard that ends a deadlock, never a
# budget the program is meant to meet. The programs take seconds to a minute on a quiet 2-core machine and up to ten
# times that at a load of 15 (fit_ahead.py took 358 s there when it compiled twice as much as it does now).
HANG_S = 900

# Variables of an enclosing job (a CI runner inside a SLURM step, a developer inside qrsh or torchrun) that would
# change launcher detection in the processes tests start: dropped by name and by prefix.
JOB_VARS = (
    "COORDINATOR_ADDRESS",
    "JAX_COORDINATOR_ADDRESS",
    "JOB_ID",
    "PE_HOSTFILE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "WANDB_MODE",
    "WANDB_API_KEY",
    "CUDA_VISIBLE_DEVICES",
)
JOB_PREFIXES = (
    "OMPI_",
    "PMIX_",
    "PRTE_",
    "PMI_",
    "SLURM_",
    "PALS_",
    "PBS_",
    "SGE_",
    "JSM_",
    "LSB_",
    "HOROVOD_",
    "OCTO_DIST_",
)


def clean_env(**extra: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in JOB_VARS and not k.startswith(JOB_PREFIXES)
    }
    # The checkout first, then whatever the caller's PYTHONPATH adds (e.g. a source tree of octo made importable by
    # hand for the `octo` tests): the subprocesses import what the test process imports.
    path = os.pathsep.join(
        [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=path,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# The signals the product stops on (INT, TERM, USR1, USR2) and nohup's HUP. An ignored disposition survives fork and
# exec: a pytest started as `pytest &` from a script (POSIX makes such a command ignore SIGINT), under nohup, cron or
# some CI runners hands it to every job script, mpirun and rank it starts, and a non-interactive bash cannot trap a
# signal that was ignored when it started. So every process a test starts begins with the defaults, as from a
# terminal, whatever the test run inherited. A test that wants an ignored signal sets it in its own preexec_fn.
DEFAULT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


def restore_signals() -> None:
    """``preexec_fn`` for every process a test starts: DEFAULT_SIGNALS at their default action and unblocked.

    Runs in the child between fork and exec (a handler of this process would be reset by exec anyway; SIG_IGN and
    the blocked mask would not). Public for any code that starts processes for a test: ``popen``/``run`` below,
    the namespace cluster's nodes (``subprocess.Popen(..., preexec_fn=helpers.restore_signals)``).
    """
    for s in DEFAULT_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DEFAULT_SIGNALS)


def signal_set(status: str, field: str) -> frozenset:
    """The signals a mask of /proc/PID/status's text names: ``("...SigIgn:\t0000000000004002...", "SigIgn")`` ->
    ``{SIGINT, SIGTERM}`` (bit ``n - 1`` is signal ``n``). ``field``: ``SigIgn``, ``SigCgt``, ``SigBlk``."""
    mask = int(re.search(rf"^{field}:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return frozenset(n for n in range(1, 65) if mask >> (n - 1) & 1)


def process_signals(pid: int, field: str) -> frozenset:
    """:func:`signal_set` of process ``pid`` now; empty once it has ended."""
    try:
        return signal_set(Path(f"/proc/{pid}/status").read_text(), field)
    except OSError:
        return frozenset()


def ignoring(*signals: int):
    """``preexec_fn`` for a test of an inherited ignore: the defaults, then ``signals`` ignored, as a process run with
    ``&`` from a script (SIGINT) or under ``trap '' TERM`` starts."""

    def preexec() -> None:
        restore_signals()
        for s in signals:
            signal.signal(s, signal.SIG_IGN)

    return preexec


def popen(args, **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` for job scripts, mpirun and ranks: the child starts with default stop signals."""
    return subprocess.Popen(args, preexec_fn=restore_signals, **kwargs)


def run(args, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` for job scripts, mpirun and ranks: the child starts with default stop signals."""
    return subprocess.run(args, preexec_fn=restore_signals, **kwargs)


def run_captured(
    argv: Sequence[str], *, cwd: Path = REPO, env: Optional[dict] = None, timeout: float = HANG_S
) -> subprocess.CompletedProcess:
    """``argv`` run in ``cwd`` (the checkout) with ``env`` (a clean environment) and no stdin, its output captured
    as text (``run``: default stop signals); ``timeout`` only ends a hang."""
    return run(
        list(argv),
        cwd=cwd,
        env=clean_env() if env is None else env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_smoke(
    *flags: str, cwd: Path, timeout: float = 600, env: Optional[dict] = None
) -> subprocess.CompletedProcess:
    """``octo-dist smoke --model tiny FLAGS...`` in one process, from this checkout, with ``env`` (a clean
    environment); its output captured as text."""
    return run_captured([*SMOKE, *flags], cwd=cwd, env=env, timeout=timeout)


def read_only_namespace_prefix(directory: Path) -> list:
    """A command prefix that runs the rest with ``directory`` bind-mounted read-only, for this process tree only:
    a read-only bind in a private mount namespace, as a container makes one (root, which runs the tests here,
    ignores permission bits: ``chmod`` would prove nothing). Skips the test where unshare or the mount is refused."""
    import shutil

    import pytest

    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    mount = (
        f"mount --bind {directory} {directory} && mount -o remount,ro,bind {directory} {directory} && "
        f'exec "$@"'
    )
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", mount, "sh", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(
            f"cannot make a read-only bind mount here (needs CAP_SYS_ADMIN): {probe.stderr.strip()}"
        )
    return ["unshare", "-m", "sh", "-c", mount, "sh"]


def run_script(work: Path, env: dict, script: str = "job.sh") -> subprocess.CompletedProcess:
    """``bash SCRIPT`` in ``work`` as a batch job runs it: with exactly ``env``, no stdin, its output captured as
    text (``run``: default stop signals); HANG_S only ends a hang."""
    return run(
        ["bash", script],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def start_script(
    work: Path, env: dict, script: str = "job.sh", preexec: Callable[[], None] = restore_signals
) -> subprocess.Popen:
    """``bash SCRIPT`` started in ``work`` in a session of its own (its session id is its pid), with exactly ``env``
    and no stdin, the signals as ``preexec`` sets them (the defaults; ``ignoring(...)``); its stdout and stderr
    together in one text pipe."""
    return subprocess.Popen(
        ["bash", script],
        preexec_fn=preexec,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def fake_program(directory: Path, name: str, body: str) -> Path:
    """An executable ``directory/name`` running ``body`` under /bin/sh (a stand-in put first on PATH)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def stdout_of(argv: Sequence[str]) -> str:
    """What ``argv`` prints, run from the checkout with a clean environment; a failure fails the test with its
    stderr."""
    proc = run_captured(argv)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}: {proc.stderr[-3000:]}"
    return proc.stdout


def json_lines(text: str) -> list:
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]


# Each rank's stdout and stderr go to files of their own: the lines of several ranks sharing one pipe interleave,
# even mid-line (under PYTHONUNBUFFERED=1 `print` writes the text and the newline separately), so no test may parse
# them from mpirun's stdout. `exec` keeps the rank's pid, so signals and `psutil` see the real process.
RANK_OUTPUT = (
    'exec "$@" >"$OCTO_DIST_TEST_RANK_DIR/$OMPI_COMM_WORLD_RANK.out" '
    '2>"$OCTO_DIST_TEST_RANK_DIR/$OMPI_COMM_WORLD_RANK.err"'
)
# mpirun start-up on a loaded 2-core machine (another job's 2 CPU hogs beside it) takes a few seconds per rank
# before JAX even imports: tests give it minutes, not the seconds it takes on a quiet machine.
MPI_TIMEOUT = 300


def tail(text: str, n: int = 2000) -> str:
    return text[-n:] if len(text) > n else text


def last_json_line(argv: Sequence[str], env: dict) -> dict:
    """``argv`` (a Python program that prints its result as one JSON line last) run as :func:`run_captured` runs
    it; it must exit 0. Its last line, parsed: ``{"saved": true}``."""
    proc = run_captured(argv, env=env)
    assert proc.returncode == 0, tail(proc.stderr, 3000)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_mpirun(
    exe: Path,
    np: int,
    argv: Sequence[str],
    *,
    out_dir: Path,
    env: Optional[dict] = None,
    timeout: float = MPI_TIMEOUT,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess:
    """``mpirun -np N python ARGV`` with every rank's output in ``out_dir/<rank>.out|.err``.

    The result's ``stdout`` / ``stderr`` are the ranks' files concatenated in rank order, then mpirun's own output:
    deterministic, whatever the scheduling. ``result.ranks[i]`` is ``(stdout, stderr)`` of rank i. On a timeout the
    whole job is killed and the test fails naming what it waited for and the tail of every rank's output.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(env or clean_env(), OCTO_DIST_TEST_RANK_DIR=str(out_dir))
    cmd = [
        str(exe),
        "--oversubscribe",
        "-np",
        str(np),
        "bash",
        "-c",
        RANK_OUTPUT,
        "rank-output",
        sys.executable,
        *argv,
    ]
    proc = popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        own_out, own_err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        own_out, own_err = proc.communicate()
        timed_out = True
    ranks = [tuple(_read(out_dir / f"{r}.{kind}") for kind in ("out", "err")) for r in range(np)]
    if timed_out:
        detail = "\n".join(
            f"--- rank {r} stdout:\n{tail(o)}\n--- rank {r} stderr:\n{tail(e)}"
            for r, (o, e) in enumerate(ranks)
        )
        raise AssertionError(
            f"waited {timeout:.0f} s for `mpirun -np {np} python {' '.join(map(str, argv))}` to exit; "
            f"it did not (killed)\n{detail}\n--- mpirun stderr:\n{tail(own_err)}"
        )
    result = subprocess.CompletedProcess(
        cmd,
        proc.returncode,
        "".join(o for o, _ in ranks) + own_out,
        "".join(e for _, e in ranks) + own_err,
    )
    result.ranks = ranks
    return result


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


# --- one program on both pinned JAX versions at once -------------------------------------------------------------

JAX020_PYTHON = REPO / ".venv-jax020" / "bin" / "python"
JAX_PYTHONS = {"0.4.20": JAX020_PYTHON, "0.4.22": Path(sys.executable)}


class VersionRuns:
    """``program`` started under every pinned JAX version at once, each result collected when a test asks for it.

    The programs are single-process and mostly XLA compilation (one core each): side by side on 2 cores they take
    about half as long as one after the other. Output goes to files, so neither blocks on a full pipe."""

    def __init__(self, program: Path, env: dict, out_dir: Path, hang_s: float = HANG_S):
        self.program, self.hang_s, self._done = program, hang_s, {}
        self._running = {}
        for version, python in JAX_PYTHONS.items():
            if python.exists():
                out, err = (
                    out_dir / f"{program.stem}-{version}.out",
                    out_dir / f"{program.stem}-{version}.err",
                )
                with open(out, "w") as o, open(err, "w") as e:
                    proc = popen(
                        [str(python), str(program)],
                        stdout=o,
                        stderr=e,
                        env=env,
                        cwd=REPO,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                self._running[version] = (proc, out, err)

    def result(self, version: str) -> dict:
        """The program's last JSON line on ``version``; skips where that version's venv is missing."""
        import pytest

        if version not in self._running and version not in self._done:
            pytest.skip(f"needs {JAX_PYTHONS[version].parent.parent} (make jax020-env)")
        if version not in self._done:
            proc, out, err = self._running.pop(version)
            # Waited for while it writes (its progress lines, JAX's own): only one silent for hang_s is hung.
            wait_until(
                lambda: proc.poll() is not None,
                watch=[out, err],
                what=f"{self.program.name} on jax {version} to finish",
                tail=lambda: tail(err.read_text(), 3000),
                on_hang=lambda: _kill_group(proc),
                hang_s=self.hang_s,
            )
            assert proc.returncode == 0, tail(err.read_text(), 3000)
            self._done[version] = json_lines(out.read_text())[-1]
        return self._done[version]

    def close(self) -> None:
        for proc, _, _ in self._running.values():
            _kill_group(proc)


def fast_version_runs(program: str, devices: int, out_dir: Path) -> VersionRuns:
    """``tests/programs/<program>`` under every pinned JAX version on ``devices`` forced host devices, compiled fast
    (:data:`COMPILE_FAST`): for programs whose comparisons are within one run, compiled alike."""
    env = clean_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {COMPILE_FAST}")
    return VersionRuns(PROGRAMS / program, env, out_dir)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: pgid == pid
    except ProcessLookupError:
        pass
    proc.wait()


# Short budgets a test is about (a 3 s start-up timeout), doubled and more while the machine is too busy for the
# process to get past its own start-up within one (an import of jax takes seconds on a loaded 2-core runner).
GROWING_BUDGETS = (3, 12, 48, 192)


def with_growing_budget(run, got_there, budgets: Sequence[float] = GROWING_BUDGETS):
    """``(budget, result)``: ``run(budget)`` for each budget in turn until ``got_there(result)`` says the process
    reached what the test is about within it (else the last). A test asserts on that result, whatever the load:
    a budget spent before the process got there (its imports) is load, not the behaviour under test."""
    for budget in budgets:
        result = run(budget)
        if got_there(result):
            break
    return budget, result


# --- a job's settings, as `octo-dist launch` writes them beside the job script ----------------------------------


def settings_mapping(scheduler: str, **fields) -> dict:
    """A job's settings mapping (the schema ``octo_dist.jobs.settings`` reads): 1 node x 1 rank, an hour, the smoke
    job saving to ``save``, a venv at ``/v``. ``fields`` replace any field by its name, whatever its section
    (``nodes=2``, ``venv=str(tmp_path / "venv")``, ``forward_prefixes=["NCCL_"]``)."""
    from octo_dist.jobs import settings

    sections = {
        "allocation": {
            "scheduler": scheduler,
            "nodes": 1,
            "ranks_per_node": 1,
            "cpus_per_rank": 0,
            "sockets": 0,
        },
        "timing": {"walltime_s": 3600, "stop_margin_s": 300},
        "software": {"modules": [], "image": "", "venv": "/v", "binds": []},
        "storage": {
            "save_dir": "save",
            "data_dir": "",
            "compile_cache": "",
            "wandb_mode": "disabled",
        },
        "forwarding": {
            "environment": [],
            "coordinator": "",
            "forward_prefixes": [],
            "forward_names": [],
        },
        "commands": {
            "preflight": ["octo-dist", "check-env", "--launch"],
            "train": ["octo-dist", "smoke", "--save-dir=@{save_dir}"],
        },
    }
    unknown = sorted(set(fields) - {name for s in sections.values() for name in s})
    if unknown:
        raise TypeError(f"settings_mapping: no field {unknown}; the fields are {sections}")
    for section in sections.values():
        section.update((name, fields[name]) for name in section if name in fields)
    return {"schema": settings.SCHEMA, "script_name": "job.sh", **sections}


def pbs_launch(*flags: str, group: str = "g1") -> list:
    """``launch pbs --nodes 1 --group GROUP FLAGS...``: the argv (for ``cli.main`` or after ``-m octo_dist``) of
    the smallest job ABCI's PBS takes, one node of a group."""
    return ["launch", "pbs", "--nodes", "1", "--group", group, *flags]


# One ABCI-shaped PBS job of the tiny smoke model: ranks per node and GPUs as ABCI's nodes have them, a group.
PBS_JOB = ("--ranks-per-node", "2", "--gpus-per-node", "2", "--group", "gxx00000")


def launch_job(work: Path, scheduler: str, *flags: str, smoke: Sequence[str] = ()) -> Path:
    """``octo-dist launch SCHEDULER FLAGS -o job.sh -- smoke --model tiny SMOKE`` in ``work``: the job script it
    rendered there (a refusal fails the test with octo-dist's message)."""
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "launch", scheduler, *flags, "-o", "job.sh", "--"]
        + ["smoke", "--model", "tiny", *smoke],
        capture_output=True,
        text=True,
        cwd=work,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    return work / "job.sh"


# What ``octo-dist jobs`` says, exit 1, when the scheduler's query failed: "octo-dist jobs: error: the state of 3, 4
# is unknown (qstat failed (exit 1): error: failed receiving gdi request response for mid=1 ...); expected ...".
UNKNOWN_STATE = re.compile(r"^octo-dist jobs: error: the state of .* is unknown \(", re.M)


def pbs_batch_env(work: Path, job_id: str, path: str, **extra: str) -> dict:
    """A clean environment as PBS gives a batch job of 2 rank slots on this host (``work/nodefile``: two
    ``localhost`` lines), ``PATH`` set to ``path``, ``extra`` added."""
    nodes = work / "nodefile"
    nodes.write_text("localhost\nlocalhost\n")
    return clean_env(
        PATH=path,
        PBS_ENVIRONMENT="PBS_BATCH",
        PBS_JOBID=job_id,
        PBS_NODEFILE=str(nodes),
        PBS_O_WORKDIR=str(work),
        **extra,
    )


def chain_running(
    status, first: str, checkpoint: Path, watch: Sequence[Path], tail, hang_s: float = HANG_S
) -> tuple:
    """``(output, {job id: state})`` of ``octo-dist jobs`` (``status()``), asked every 2 s until the chain's first job,
    ``first``, runs and has written ``checkpoint``: the two rows under its heading. Only a chain that changes
    nothing under ``watch`` (its submit directory, its logs) for ``hang_s`` ends the wait (``wait_until``), the test
    failing with ``tail()`` (its job's log).

    An answer that says a state is unknown (exit 1: the scheduler's query failed, as a loaded qmaster's qstat does
    now and then) is asked again: the jobs run on, and ``jobs`` rightly refused to guess. One that lasts to the
    wait's end fails the test with it; any other failure fails it at once."""
    seen = {}

    def running():
        res = status()
        seen["out"] = res.stdout + res.stderr
        if res.returncode == 1 and UNKNOWN_STATE.search(res.stderr):
            return None
        assert res.returncode == 0, res.stdout + res.stderr
        rows = {ln.split()[0]: ln.split()[1] for ln in res.stdout.splitlines()[1:3]}
        return (res.stdout, rows) if rows.get(first) == "running" and checkpoint.is_dir() else None

    return wait_until(
        running,
        watch=watch,
        what=f"job {first} running with {checkpoint.name}",
        tail=lambda: seen.get("out", "") + tail(),
        poll_s=2,
        hang_s=hang_s,
    )


def tree_state(paths: Sequence[Path]) -> int:
    """One number that changes when anything under ``paths`` does: a file added, removed, grown or rewritten."""
    names = []
    for top in paths:
        names.append(str(top))
        # os.walk passes over a directory renamed or removed while it lists (orbax renames its tmp directories)
        for where, dirs, files in os.walk(top):
            names += [os.path.join(where, n) for n in dirs + files]
    state = []
    for name in names:
        try:
            st = os.stat(name)
        except OSError:  # not there yet, or removed since it was listed
            continue
        state.append((name, st.st_size, st.st_mtime_ns))
    return hash(tuple(sorted(state)))


def wait_until(
    ready: Callable[[], object],
    *,
    watch: Sequence[Path] = (),
    what: str,
    tail: Callable[[], str] = lambda: "",
    on_hang: Callable[[], None] = lambda: None,
    poll_s: float = 1.0,
    hang_s: float = HANG_S,
):
    """``ready()``'s first truthy value, asked every ``poll_s`` seconds.

    Not a budget a job must meet on a loaded machine: a job slowed down (its JAX start-up and compilation take
    minutes at a load of 15 to 33 on 2 cores) keeps writing its logs, record and checkpoints under ``watch``, and is
    waited for. The wait fails only when ``ready()`` is still falsy and nothing under ``watch`` has changed for
    ``hang_s`` (HANG_S; without ``watch``, ``hang_s`` after the start): a hung job, ended by ``on_hang()`` (a qdel,
    a kill), the test failing with what it waited for and ``tail()``."""
    state, since, t0 = None, time.monotonic(), time.monotonic()
    while True:
        value = ready()
        if value:
            return value
        now = tree_state(watch) if watch else None
        if now != state:
            state, since = now, time.monotonic()
        if time.monotonic() - since > hang_s:
            on_hang()
            import pytest

            pytest.fail(
                f"waited {time.monotonic() - t0:.0f} s for {what}; nothing under {[str(w) for w in watch]} "
                f"changed in the last {hang_s} s (hung)\n{tail()}"
            )
        time.sleep(poll_s)


class SubmittedJobs:
    """What ``octo-dist launch ... --submit`` printed: the job ids and their logs, in order, and the submit
    directory; waiting for a job however long a loaded machine makes it take (``wait_until``). A scheduler's tests
    add how to read a job's record (``record_of``), whether it has ended, how to cancel one and what to show when
    one fails (``tail``)."""

    def record_of(self, job_id: str) -> dict:
        raise NotImplementedError

    def has_ended(self, record: dict) -> bool:
        raise NotImplementedError

    def cancel(self, job_id: str) -> None:
        raise NotImplementedError

    def tail(self, i: int = 0) -> str:
        return self.log(i)[-4000:]

    def wait(self, i: int = 0) -> dict:
        """Job ``i``'s final record; a job that changes nothing in its submit directory and log for HANG_S is hung:
        cancelled, the test fails."""
        job_id = self.ids[i]

        def final() -> Optional[dict]:
            record = self.record_of(job_id)
            return record if self.has_ended(record) else None

        return wait_until(
            final,
            watch=[self.work, self.logs[i]],
            what=f"job {job_id} to end",
            tail=lambda: self.tail(i),
            on_hang=lambda: self.cancel(job_id),
        )

    def wait_for(self, path: Path) -> None:
        """Until ``path`` appears while the first job runs; that job ending first fails the test."""

        def there() -> bool:
            if path.exists():
                return True
            record = self.record_of(self.id)
            assert not self.has_ended(record), (
                f"job {self.id} ended before {path} appeared: {record}\n{self.tail()}"
            )
            return False

        wait_until(there, watch=[self.work, self.logs[0]], what=str(path), tail=self.tail)

    def __init__(self, work: Path, stdout: str):
        self.work = work
        # "submitted job 3.node001, after 2.node001: log /var/spool/octosim-pbs/home/octo-dist.o3" (PBS),
        # "submitted job 12, after 11: log /path/octo-dist-12.out" (Slurm)
        found = re.findall(r"^submitted job (\S+?)(?:, after \S+)?: log (\S+)$", stdout, re.M)
        assert found, stdout
        self.ids = [j for j, _ in found]
        self.logs = [Path(log) for _, log in found]

    @property
    def id(self) -> str:
        return self.ids[0]

    def log(self, i: int = 0) -> str:
        return self.logs[i].read_text(errors="replace") if self.logs[i].exists() else "(no log yet)"

    def record(self) -> dict:
        """Rank 0's ``--record`` in the submit directory (``record.json``)."""
        path = self.work / "record.json"
        assert path.exists(), f"rank 0 wrote no {path}"
        return json.loads(path.read_text())


# --- checkpoints a fault must leave intact ---------------------------------------------------------------------

# What octo-dist writes last into a checkpoint, atomically (octo_dist/engine/checkpoint.py, MANIFEST): a step
# directory without it is still being written (orbax has renamed it into place, its checksums.json.<pid>.tmp may
# be half written).
MANIFEST = "checksums.json"


def checkpoints(save_dir: Path) -> dict:
    """Every file of every complete checkpoint (``<step>/`` holding its ``checksums.json``), with its sha256:
    ``{"2/state/...": "9f86d0..."}``."""
    out = {}
    for step in sorted(
        p for p in save_dir.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file()
    ):
        for f in sorted(step.rglob("*")):
            if f.is_file():
                out[str(f.relative_to(save_dir))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def changed_since(before: dict, after: dict) -> dict:
    """The files of ``before``'s checkpoints still there in ``after`` (max_to_keep may retire old ones) whose
    content changed, or that are gone from a checkpoint still there: ``{path: (before, after)}``."""
    steps_after = {k.split("/")[0] for k in after}
    return {
        k: (v, after.get(k))
        for k, v in before.items()
        if k.split("/")[0] in steps_after and after.get(k) != v
    }


# Jobs that a test compares with each other, every one compiled alike: LLVM at -O0, which takes a third of the CPU
# its default optimisation does (a tiny-model smoke process: 4-5 s instead of 11-12 s, most of it compiling the
# initialisation and the step). make smoke, what a user runs, keeps XLA's defaults.
COMPILE_FAST = "--xla_backend_optimization_level=0"


def signal_all(procs, *signals) -> None:
    """Each signal to every process in turn (psutil.Process); one already gone is skipped."""
    for s in signals:
        for p in procs:
            try:
                p.send_signal(s)
            except psutil.NoSuchProcess:  # already exited: nothing left to disturb
                pass
