"""The job on its first node: checks, then the preflight and the training under the scheduler's launcher.

Every stop signal (TERM, INT, USR1, USR2, HUP) becomes SIGUSR1 for the launcher: every rank treats SIGUSR1 and
SIGTERM alike (checkpoint at the next step boundary, exit 0), mpirun forwards SIGUSR1 to every rank but answers
SIGTERM by killing the ranks within half a second (Open MPI 5.0.8, measured), and srun forwards SIGUSR1 too. A
signal ignored when the job started (``job.sh &`` from a script, nohup, cron, some CI runners) is armed again here:
Python can, bash could not. The launcher runs in a session of its own, so a signal for the job's process group
(Grid Engine's -notify, Ctrl-C) reaches the ranks once, through here.

A rank that fails leaves a note (``rankguard``); a launcher still running ``FAILED_GRACE_S`` after the first one
(mpirun waiting for a node it lost) is ended, so a dead job never holds its nodes until the wall time; a launcher
that exits 0 while some rank never said it finished fails the job, naming the ranks that are missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from typing import List, Optional

from octo_dist.jobs import schedulers
from octo_dist.jobs.settings import JobSettings, SettingsError, from_json
from octo_dist.problems import Problem

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
FAILED_GRACE_S = 20  # a launcher still running this long after a rank failed is ended
END_WAIT_S = 10  # after SIGTERM to the launcher's group, this long before SIGKILL
NODE_PROBE_S = (
    15  # between two probes of the nodes (schedulers without a launcher keepalive: SLURM)
)
POLL_S = 0.5
AFTER_ENV = schedulers.base.AFTER_ENV
RUNTIME_NAME = "octo-dist-runtime.pyz"
# Where octo-dist's key file is; WANDB_API_KEY in the environment wins. The key itself is never in the script.
KEY_FILE_ENV = "WANDB_KEY_FILE"


class JobFailed(Problem):
    """Ends the job before its ranks start, after one line (found; expected; fix): exit 2 unless told."""

    exit_status = 2


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell gives it: -9 (SIGKILL) -> 137."""
    return 128 - returncode if returncode < 0 else returncode


def make_directory(what: str, path: str, option: str) -> str:
    """Makes ``path`` (and its parents) and returns it absolute; one line naming it when it cannot be made:
    ``/etc/passwd/x`` (a file on the way), ``/proc/x``, a name longer than the file system takes."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.isdir(path):
            raise NotADirectoryError(20, "not a directory")
    except OSError as e:
        shown = path if len(path) <= 80 else path[:77] + "..."
        raise JobFailed(
            f"{what} directory {shown!r} cannot be made from {os.getcwd()} ({e.strerror or e}); expected a "
            f"directory this job can write. Fix: re-render with {option} PATH"
        ) from None
    return os.path.abspath(path)


def self_command() -> List[str]:
    """How a rank's node starts this runtime again: the zipapp this process runs from, else the package."""
    if os.path.isfile(sys.argv[0]) and zipfile.is_zipfile(sys.argv[0]):
        return [sys.executable, os.path.abspath(sys.argv[0])]
    return [sys.executable, "-m", "octo_dist.jobs.supervisor"]


class Supervisor:
    """One job. ``settings``: what the rendered script passes (``jobs/settings.py``, checked); ``env``: the job's
    environment, changed in place as the job exports; ``clock``: seconds, monotonic."""

    def __init__(self, settings: JobSettings, env: dict, clock=time.monotonic):
        self.s = settings
        self.env = env
        self.clock = clock
        self.started = clock()
        a = settings.allocation
        self.scheduler = schedulers.get(a.scheduler)
        self.nodes = a.nodes
        self.ranks_per_node = a.ranks_per_node
        self.cpus_per_rank = a.cpus_per_rank
        self.sockets = a.sockets
        self.forward_prefixes = settings.forwarding.forward_prefixes
        self.forward_names = settings.forwarding.forward_names
        self.stop: Optional[str] = None  # "TERM": the signal that asked for the stop
        self.proc: Optional[subprocess.Popen] = None  # the launcher, while it runs
        self.job_dir = ""
        self.rank_failure = ""
        self.launcher_status = 0
        self.deadline = None
        if self.scheduler.stop_timer:
            self.deadline = (
                self.started + settings.timing.walltime_s - settings.timing.stop_margin_s
            )

    # ---- output -----------------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        # os.write: a signal handler may note while the main code is writing; print could refuse (reentrant call).
        os.write(2, f"octo-dist job: {text}\n".encode(errors="replace"))

    def seconds(self) -> int:
        return int(self.clock() - self.started)

    # ---- stops ------------------------------------------------------------------------------------------------
    def arm(self) -> None:
        """Every stop signal calls ``request_stop``, ignored on entry or not."""
        for sig in STOP_SIGNALS:
            signal.signal(
                sig, lambda signum, _frame: self.request_stop(signal.Signals(signum).name[3:])
            )

    def request_stop(self, name: str) -> None:
        """``name``: "TERM". Asks every rank to checkpoint and stop (again, when asked twice)."""
        self.note(f"SIG{name} after {self.seconds()}s: asking every rank to checkpoint and stop")
        self.stop = name
        self._signal_launcher(signal.SIGUSR1)

    def _signal_launcher(self, sig) -> None:
        proc = self.proc
        # Until it is reaped the launcher's pid cannot be reused: kill is safe while returncode is None.
        if proc is not None and proc.returncode is None:
            try:
                os.kill(proc.pid, sig)
            except OSError:
                pass

    # ---- the ranks --------------------------------------------------------------------------------------------
    def first_failure(self) -> str:
        """The oldest note: the rank that failed first, not one the launcher ended after it."""
        failed = os.path.join(self.job_dir, "failed")
        try:
            notes = [os.path.join(failed, n) for n in os.listdir(failed)]
            notes.sort(key=lambda p: (os.stat(p).st_mtime_ns, p))
            with open(notes[0]) as f:
                return f.read().strip()
        except (OSError, IndexError):
            return ""

    def missing_ranks(self) -> List[int]:
        done = os.path.join(self.job_dir, "done")
        return [
            r
            for r in range(self.nodes * self.ranks_per_node)
            if not os.path.exists(os.path.join(done, f"rank-{r}"))
        ]

    def end_launcher(self) -> None:
        """A rank failed and the launcher has not ended the others by itself: TERM its group, then KILL."""
        self.note(f"the launcher is still running {FAILED_GRACE_S}s after a rank failed: ending it")
        pid = self.proc.pid
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            pass
        try:
            self.proc.wait(END_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass

    def probe_nodes(self, finished: threading.Event) -> None:
        """While the launcher runs: a probe that fails naming a node ends the launcher, naming the node; one that
        fails naming none (a busy controller) only leaves a note."""
        probe = self.scheduler.node_probe(self.nodes)
        while probe and not finished.wait(NODE_PROBE_S):
            try:
                done = subprocess.run(
                    list(probe),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=self.env,
                    timeout=120,
                )
            except (OSError, subprocess.SubprocessError) as e:
                self.note(f"a node probe failed, not ending the job: {e}")
                continue
            if done.returncode == 0 or finished.is_set():
                continue
            said = " ".join(done.stderr.split("\n")).strip()
            node = self.scheduler.lost_node(said)
            if not node:
                self.note(f"a node probe failed, not ending the job: {said}")
                continue
            self.note(
                f"node {node} cannot be reached by {self.scheduler.title}: ending the job step ({said})"
            )
            self._signal_launcher(signal.SIGTERM)
            if finished.wait(END_WAIT_S):
                return
            self._signal_launcher(signal.SIGKILL)
            return

    def run_ranks(self, argv: List[str]) -> int:
        """Runs ``argv`` on every rank; its status, the first failed rank's when one failed."""
        for sub in ("failed", "done"):
            shutil.rmtree(os.path.join(self.job_dir, sub), ignore_errors=True)
        self.proc = subprocess.Popen(
            [*self.launcher, *self.guard, *self.run, *argv],
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        if self.stop:  # a stop that came while it was starting has not reached it yet
            self._signal_launcher(signal.SIGUSR1)
        finished = threading.Event()
        prober = threading.Thread(target=self.probe_nodes, args=(finished,), daemon=True)
        prober.start()
        failed_at = None
        failure = ""
        try:
            while self.proc.poll() is None:
                try:
                    self.proc.wait(POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                if (
                    self.deadline is not None
                    and self.stop is None
                    and self.clock() >= self.deadline
                ):
                    self.request_stop(
                        "USR1"
                    )  # the wall time is near: as the scheduler's signal would
                if failed_at is None:
                    failure = self.first_failure()
                    if failure:
                        failed_at = self.clock()
                        self.note(failure)
                if (
                    failed_at is not None
                    and self.clock() - failed_at >= FAILED_GRACE_S
                    and self.proc.poll() is None
                ):
                    self.end_launcher()
                    break
            status = exit_status(self.proc.wait())
        finally:
            finished.set()
        if (
            failed_at is None and status != 0
        ):  # the launcher ended them itself: say which rank it was
            failure = self.first_failure()
            if failure:
                self.note(failure)
        # The rank that failed first decides the job's status and final line, not what the launcher exits with after
        # it: Open MPI 5.0.8's prterun may abort itself (134) while it ends a job whose rank refused to start (2).
        self.launcher_status = status
        self.rank_failure = failure
        last = failure.rsplit(" ", 1)[-1] if failure else ""
        if last.isdigit():
            status = int(last)
        if failed_at is not None and status == 0:
            status = 1
        if status == 0:
            missing = self.missing_ranks()
            if missing:
                self.note(
                    f"the launcher exited 0 but rank(s) {' '.join(map(str, missing))} never finished (their node was "
                    "lost, or they were killed): failing the job"
                )
                status = 1
        self.proc = None
        return status

    def outcome(self, status: int) -> str:
        """ ": rank 1 on g0001 exited with status 2 (the launcher then exited with status 134)"; " (exit 1)"."""
        if not self.rank_failure:
            return f" (exit {status})"
        then = (
            ""
            if self.launcher_status == status
            else f" (the launcher then exited with status {self.launcher_status})"
        )
        return f": {self.rank_failure}{then}"

    # ---- the job ----------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Everything before the ranks start that needs the job's directory; raises JobFailed."""
        s, env = self.s, self.env
        after = env.get(AFTER_ENV, "")
        if after:
            previous = os.path.join(self.save_dir, f".octo-dist-exit-{after}")
            if not os.path.isfile(previous):
                self.note(
                    f"the previous job of this chain ({after}) left no exit status (ended by the scheduler?): "
                    "resuming from the last checkpoint"
                )
            else:
                with open(previous) as f:
                    was = f.read().strip()
                if was != "0":
                    raise JobFailed(
                        f"the previous job of this chain ({after}) failed with exit {was}: not training; expected it "
                        "to finish or to stop for the wall time. Fix: read its log, then submit again (octo-dist "
                        "launch ... --submit)"
                    )
        data_dir = s.storage.data_dir
        if data_dir:
            if not os.path.isdir(data_dir):
                raise JobFailed(
                    f"data directory {data_dir} not found from {os.getcwd()}; expected the dataset directory. "
                    "Fix: re-render with --data-dir PATH"
                )
            data_dir = os.path.abspath(data_dir)
        cache = s.storage.compile_cache
        if cache:
            cache = make_directory("compilation cache", cache, "--compile-cache")
        self.paths = {"save_dir": self.save_dir, "data_dir": data_dir, "compile_cache": cache}
        if s.software.image:
            image = s.software.image
            if not os.path.isfile(image):
                raise JobFailed(
                    f"image {image} not found; expected the .sif this job was rendered for. Fix: copy it there, "
                    "or re-render with --image PATH"
                )
            image = os.path.abspath(image)  # as the binds: every node sees it
            # An absolute path: the ranks on other nodes do not get this node's PATH from the module providing it.
            singularity = shutil.which("singularity", path=env.get("PATH", ""))
            if not singularity:
                raise JobFailed(
                    "no singularity command; expected SingularityCE/PRO on the node. Fix: module load "
                    "singularitypro (if your site has it), or re-render with --module"
                )
            # --nv brings the host's NVIDIA driver in; the binds put checkpoints, data, the compilation cache, the
            # job's node list and the group area at the same paths inside.
            run = [os.path.abspath(singularity), "exec", "--nv", "--bind", self.save_dir]
            for d in (data_dir, cache):
                if d:
                    run += ["--bind", d]
            for d in s.software.binds:
                if os.path.isdir(d):
                    run += ["--bind", os.path.abspath(d)]
                else:
                    self.note(f"not binding {d}: no such directory on this node")
            self.run = [*run, image]
            self.bin = ""
            # The image has no MPI library: octo-dist must not call into mpi4py there (it would fail, or hang).
            env["OCTO_DIST_NO_MPI4PY"] = "1"
        else:
            venv = s.software.venv
            if not os.access(os.path.join(venv, "bin", "python"), os.X_OK):
                raise JobFailed(
                    f"no {venv}/bin/python; expected the octo-dist environment (make env PROFILE=cuda11). Fix: "
                    "build it, or re-render with --venv PATH or --image FILE.sif"
                )
            self.run = []
            self.bin = os.path.join(os.path.abspath(venv), "bin") + os.sep
        self.wandb_key()
        self.launcher, exports = self.scheduler.launcher(self)
        env.update(exports)
        command = self_command()
        if (
            len(command) == 2
        ):  # a zipapp: a copy the other nodes see, which a later job cannot replace under us
            shutil.copyfile(command[1], os.path.join(self.job_dir, RUNTIME_NAME))
            command[1] = os.path.join(self.job_dir, RUNTIME_NAME)
        self.guard = [*command, "octo-dist-rank", self.job_dir]

    def wandb_key(self) -> None:
        """The key comes from the environment, or from a file only you can read; never from the script."""
        env = self.env
        if env.get("WANDB_MODE") != "online" or env.get("WANDB_API_KEY"):
            return
        home = env.get("HOME", os.path.expanduser("~"))
        key_file = env.get(KEY_FILE_ENV) or os.path.join(
            home, ".config", "octo-dist", "wandb_api_key"
        )
        if os.path.isfile(key_file):
            mode = os.stat(key_file).st_mode & 0o777
            if mode & 0o077 or not mode & 0o400:
                raise JobFailed(
                    f"{key_file} has mode {mode:o}; expected 600 or 400 (readable by you only). Fix: chmod 600 {key_file}"
                )
            with open(key_file) as f:
                env["WANDB_API_KEY"] = "".join(f.read().split())
            return
        try:
            with open(os.path.join(home, ".netrc")) as f:
                if "api.wandb.ai" in f.read():
                    return
        except OSError:
            pass
        raise JobFailed(
            f"WANDB_MODE=online but no wandb key: WANDB_API_KEY is unset, {key_file} does not exist and ~/.netrc has "
            f"no api.wandb.ai entry. Fix: (umask 077; cat >{key_file}) and paste the key, or wandb login, or "
            "re-render with --wandb-mode offline"
        )

    def command(self, key: str) -> List[str]:
        """The preflight's or training's argv, its program from the venv's bin/ (or the image's PATH) and the
        job's absolute paths in its flags ("--save-dir=@{save_dir}")."""
        program, *rest = getattr(self.s.commands, key)
        out = [self.bin + program]
        for arg in rest:
            for name, value in self.paths.items():
                arg = arg.replace("@{" + name + "}", value or "")
            out.append(arg)
        return out

    def main(self) -> int:
        """The whole job; its exit status."""
        s, env = self.s, self.env
        self.arm()
        env["WANDB_MODE"] = s.storage.wandb_mode
        for name, value in s.forwarding.environment:
            env.setdefault(name, value)  # a value set before the job wins
        if s.forwarding.coordinator:
            env["COORDINATOR_ADDRESS"] = s.forwarding.coordinator
        job = self.scheduler.job_id(env)
        try:
            error, warnings = self.scheduler.node_checks(
                env, self.nodes, self.ranks_per_node, s.script_name
            )
            for w in warnings:
                self.note(w)
            if error:
                raise JobFailed(error)
            program = self.scheduler.launcher_program
            if not shutil.which(program, path=env.get("PATH", "")):
                raise JobFailed(
                    f"no {program} on PATH (after loading: {' '.join(s.software.modules) or 'no modules'}); "
                    "expected the "
                    "launcher of the job's MPI. Fix: module load the site's MPI (ABCI: hpcx), or re-render with "
                    "--module NAME"
                )
            # absolute: every node, and the image, see the same path
            self.save_dir = make_directory("save", s.storage.save_dir, "--save-dir")
        except JobFailed as e:
            self.note(f"error: {e}")
            return e.exit_status
        # This job's node list and the ranks' notes; removed at the end.
        self.job_dir = os.path.join(self.save_dir, f".octo-dist-job-{job}")
        status = 1
        try:
            make_directory("job", self.job_dir, "--save-dir")
            status = self.supervise()
        except JobFailed as e:
            self.note(f"error: {e}")
            status = e.exit_status
        finally:
            shutil.rmtree(self.job_dir, ignore_errors=True)
            # For the next job of a chain (octo-dist launch --chain): 0 when this one finished or stopped for the
            # wall time.
            try:
                with open(os.path.join(self.save_dir, f".octo-dist-exit-{job}"), "w") as f:
                    f.write(f"{status}\n")
            except OSError:
                pass
        return status

    def supervise(self) -> int:
        self.prepare()
        preflight, train = self.command("preflight"), self.command("train")
        if self.stop:
            self.note(f"stop requested (SIG{self.stop}) before the ranks started: not training")
            return 0
        self.note(
            f"{self.nodes} node(s) x {self.ranks_per_node} rank(s); preflight: {' '.join(preflight)}"
        )
        status = self.run_ranks(preflight)
        if self.stop:
            self.note("stop requested during the preflight: not training")
            return 0
        if status != 0:
            self.note(
                f"preflight failed{self.outcome(status)}: not training; its report above names the fix"
            )
            return status
        self.note(f"training: {' '.join(train)}")
        status = self.run_ranks(train)
        self.note(
            f"training exited with {status} after {self.seconds()}s"
            + (f" (stop requested by SIG{self.stop})" if self.stop else "")
            + (self.outcome(status) if self.rank_failure else "")
        )
        return status


def main(settings_json: str) -> int:
    """``supervise SETTINGS``: the settings are checked before anything starts; bad ones are one line, exit 2."""
    try:
        settings = from_json(settings_json)
    except SettingsError as e:
        os.write(2, f"octo-dist job: error: {e}\n".encode(errors="replace"))
        return e.exit_status
    return Supervisor(settings, dict(os.environ)).main()
