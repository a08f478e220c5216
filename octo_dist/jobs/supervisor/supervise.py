"""The job on its first node: checks, then the preflight and the training under the scheduler's launcher.

Every stop signal (TERM, INT, USR1, USR2, HUP) becomes SIGUSR1 for the launcher: every rank treats SIGUSR1 and
SIGTERM alike (checkpoint at the next step boundary, exit 0), mpirun forwards SIGUSR1 to every rank but answers
SIGTERM by killing the ranks within half a second (Open MPI 5.0.8, measured), and srun forwards SIGUSR1 too. A
signal ignored when the job started (``job.sh &`` from a script, nohup, cron, some CI runners) is armed again here:
Python can, bash could not. The launcher runs in a process group of its own, so a signal for the job's process
group (Grid Engine's -notify, Ctrl-C) reaches the ranks once, through here; it stays in the job's session, where
PBS looks for a job's processes (its qdel signals every one of them, and it accounts them).

A stop that ended with every rank's checkpoint written is said in one line, with the step saved and the exit
status this job leaves for a chain: a scheduler may report another status for a job it signalled (PBS: 271). PBS's
qdel signals mpirun too: there it starts with SIGTERM blocked (``ranks``). The exit file says "stopping ..." from
the stop's first signal, so a job the kill delay's SIGKILL ends mid-stop still lets its chain resume
(``exitfile``).

The concerns beside this one: what is checked and built before the ranks start (``prepare``), the launcher's runs
and what a failed or lost rank does to them (``ranks``), the save directory's names (``octo_dist.savelayout``).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import sys
import time
import zipfile
from typing import List, Optional

from octo_dist import savelayout
from octo_dist.jobs import schedulers
from octo_dist.jobs.settings import (
    RANK0_WAIT_ENV,
    JobSettings,
    SettingsError,
    rank0_wait_s,
)
from octo_dist.jobs.settingsread import from_json
from octo_dist.jobs.supervisor import chainend, exitfile, prepare, ranks
from octo_dist.jobs.supervisor.prepare import JobFailed, make_directory

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
AFTER_ENV = schedulers.base.AFTER_ENV


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
        self.scheduler = schedulers.get(settings.allocation.scheduler)
        self.stop: Optional[str] = None  # "TERM": the signal that asked for the stop (the latest)
        self.stop_signals: List[str] = []  # every one that did, in order: ["USR1", "TERM"]
        self.launch = ranks.Launcher(self)
        self.job_dir = ""
        self.save_dir = ""  # absolute, once check_node made it
        # True once the exit file says how the job ended: a later stop signal leaves it alone.
        self.exit_final = False
        self.training = False  # the training's ranks were started (a launcher killed then leaves a resumable job)
        self.finished = False  # the training exited 0 without a stop: every step trained
        self.job_id = "0"  # the scheduler's, once main() has read it: "12345.pbs1"
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
        if self.stop is None and self.job_dir and not self.exit_final:
            # What the chain reads if the scheduler's SIGKILL ends this job before it can say how the stop went.
            self.write_exit(exitfile.stopping(name, self.seconds()))
        self.stop = name
        self.stop_signals.append(name)
        self.launch.signal(signal.SIGUSR1)

    def check_timer(self) -> None:
        """The wall time is near: ask for the stop, as the scheduler's own signal would."""
        if self.deadline is not None and self.stop is None and self.clock() >= self.deadline:
            self.request_stop("USR1")

    # ---- the job ----------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Everything before the ranks start that needs the job's directory; raises JobFailed."""
        s, env = self.s, self.env
        data_dir = prepare.data_directory(s.storage.data_dir)
        cache = s.storage.compile_cache
        if cache:
            cache = make_directory("compilation cache", cache, "--compile-cache")
        self.paths = {"save_dir": self.save_dir, "data_dir": data_dir, "compile_cache": cache}
        self.run, self.bin = prepare.rank_runner(
            s, env, [self.save_dir, data_dir, cache], self.note
        )
        prepare.wandb_key(env)
        ctx = schedulers.base.JobContext(
            env=dict(env),
            job_id=self.job_id,
            job_dir=self.job_dir,
            cores=len(os.sched_getaffinity(0)),
            note=self.note,
        )
        self.launcher, exports = self.scheduler.launcher(s, ctx)
        env.update(exports)
        command = self_command()
        if (
            len(command) == 2
        ):  # a zipapp: a copy the other nodes see, which a later job cannot replace under us
            copy = savelayout.runtime_copy(self.job_dir)
            shutil.copyfile(command[1], copy)
            command[1] = copy
        self.guard = [*command, "octo-dist-rank", self.job_dir]

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

    def run_ranks(self, argv: List[str]) -> int:
        """Runs ``argv`` on every rank; its status, the first failed rank's when one failed."""
        return self.launch.run([*self.launcher, *self.guard, *self.run, *argv], self.check_timer)

    def check_node(self) -> None:
        """The allocation as the scheduler gave it, its launcher on PATH, the save directory; raises JobFailed."""
        s, env = self.s, self.env
        a = s.allocation
        error, warnings = self.scheduler.node_checks(env, a.nodes, a.ranks_per_node, s.script_name)
        for w in warnings:
            self.note(w)
        if error:
            raise JobFailed(error)
        program = self.scheduler.launcher_program
        found = shutil.which(program, path=env.get("PATH", ""))
        if not found:
            loaded = " ".join(s.software.modules) or "no modules"
            raise JobFailed(
                f"no {program} on PATH (after loading: {loaded}); expected the launcher of the job's MPI. "
                "Fix: module load the site's MPI (ABCI: hpcx), or re-render with --module NAME"
            )
        if not os.path.isfile(
            found
        ):  # follows links; an executable FIFO or device is no program to run
            raise JobFailed(
                f"the {program} on PATH ({found}) is not a file; expected the launcher program of the job's MPI. "
                f"Fix: remove it, or put the site's MPI first on PATH (module load hpcx)"
            )
        # absolute: every node, and the image, see the same path
        self.save_dir = make_directory("save", s.storage.save_dir, "--save-dir")

    def main(self) -> int:
        """The whole job; its exit status."""
        s, env = self.s, self.env
        self.arm()
        env["WANDB_MODE"] = s.storage.wandb_mode
        env.setdefault(RANK0_WAIT_ENV, str(rank0_wait_s(s.timing)))
        for name, value in s.forwarding.environment:
            env.setdefault(name, value)  # a value set before the job wins
        if s.forwarding.coordinator:
            env["COORDINATOR_ADDRESS"] = s.forwarding.coordinator
        try:
            # It names the job's directory and exit file: a value that is not a job id ("1/../..") ends it here.
            by_hand = savelayout.hand_run_id(socket.gethostname(), os.getpid())
            job = self.job_id = self.scheduler.job_id(env, by_hand)
            # Read and checked once, here: the ranks and every other module read this one (savelayout.job_id).
            env[savelayout.JOB_ID_ENV] = job
            self.check_node()
        except (JobFailed, savelayout.JobIdError) as e:
            self.note(f"error: {e}")
            return e.exit_status
        # This job's node list and the ranks' notes, marked as this job's; removed at the end, only if still so.
        status = 1
        try:
            # Whether the job before it in a chain lets it train, before this one writes anything but its exit file.
            after = env.get(AFTER_ENV, "")
            if after:
                prepare.previous_job(self.save_dir, after, self.note)
            try:
                self.job_dir = savelayout.make_job_dir(self.save_dir, job)
            except OSError as e:
                # A full file system (ENOSPC, a quota's EDQUOT) is fixed by making room, not by another directory.
                full = e.errno in (errno.ENOSPC, errno.EDQUOT)
                fix = (
                    f"make room there (df -h {self.save_dir}), then submit again"
                    if full
                    else "re-render with --save-dir PATH, or move that name away"
                )
                raise JobFailed(
                    f"the job directory in {self.save_dir} cannot be made ({e.strerror or e}); expected to make "
                    f"{os.path.basename(savelayout.job_dir(self.save_dir, job))} there. Fix: {fix}"
                ) from None
            status = self.supervise()
        except JobFailed as e:
            self.note(f"error: {e}")
            status = e.exit_status
        finally:
            left = savelayout.remove_job_dir(self.save_dir, self.job_dir, job)
            if left:
                self.note(f"warning: {left}")
            # For the next job of a chain (octo-dist launch --chain): 0 when this one finished or stopped for the
            # wall time.
            self.exit_final = True
            self.write_exit(self.exit_text(status))
            if self.finished:
                chainend.end_chain(
                    self.save_dir, job, self.s.allocation.scheduler, self.note, self.env
                )
        return status

    def exit_text(self, status: int) -> str:
        """The exit file's line for ``status`` (``exitfile``): a stop, or a launcher killed from outside, that
        ended non-zero leaves the chain free to resume from the checkpoints written before."""
        if status == 0:
            return "0"
        if self.training and self.launch.rank_killed:
            # Killed from outside, not failed: the checkpoints written before are intact.
            return exitfile.resumable(status, self.launch.rank_killed)
        killed = self.launch.launcher_killed if self.training else ""
        if killed:
            return exitfile.resumable(
                status, f"the launcher was killed by {killed} after {self.seconds()}s"
            )
        if self.stop:
            return exitfile.resumable(
                status,
                f"stopped by SIG{self.stop}, but the training exited with {status} before every rank said it saved",
            )
        return str(status)

    def write_exit(self, text: str) -> None:
        """The exit file for the chain; one line when it cannot be written."""
        path = savelayout.exit_file(self.save_dir, self.job_id)
        why = exitfile.write(path, text)
        if why:
            self.note(
                f"error: cannot write {path} ({why}): the next job of a chain will find it empty and not train. "
                f"Fix: make room on the save directory's file system (df -h {self.save_dir})"
            )

    def supervise(self) -> int:
        try:
            self.prepare()
        except OSError as e:
            # Copying the node list or the runtime into the job's directory: a full disk.
            where = f" ({e.filename})" if e.filename else ""
            raise JobFailed(
                f"the job's files cannot be written under {self.save_dir}{where}: {e.strerror or e}; expected "
                f"room for them on its file system. Fix: make room there (df -h {self.save_dir}), then submit "
                "again"
            ) from None
        preflight, train = self.command("preflight"), self.command("train")
        if self.stop:
            self.note(f"stop requested (SIG{self.stop}) before the ranks started: not training")
            return 0
        self.note(
            f"{self.s.allocation.nodes} node(s) x {self.s.allocation.ranks_per_node} rank(s); preflight: "
            + " ".join(preflight)
        )
        status = self.run_ranks(preflight)
        if self.stop:
            self.note("stop requested during the preflight: not training")
            return 0
        if status != 0:
            outcome = self.launch.outcome(status)
            self.note(f"preflight failed{outcome}: not training; its report above names the fix")
            return status
        self.note(f"training: {' '.join(train)}")
        self.training = True
        status = self.run_ranks(train)
        self.note(
            f"training exited with {status} after {self.seconds()}s"
            + (f" (stop requested by SIG{self.stop})" if self.stop else "")
            + (self.launch.outcome(status) if self.launch.rank_failure else "")
        )
        if self.stop and status == 0:
            self.note_stopped()
        # Every step trained (no stop asked): the rest of the chain has nothing left to do.
        self.finished = status == 0 and not self.stop
        return status

    def note_stopped(self) -> None:
        """One line: "stopped by SIGTERM: step 1200 saved; this job's exit status is 0 (...)", and what the
        scheduler will report instead where it reports another status for a job it signalled."""
        step = savelayout.stopped_step(self.job_dir)
        saved = f"step {step} saved" if step is not None else "every rank saved its checkpoint"
        exit_name = os.path.basename(savelayout.exit_file(self.save_dir, self.job_id))
        line = (
            f"stopped by SIG{self.stop}: {saved}; this job's exit status is 0 ({exit_name} in the save "
            "directory, which a chained job reads)"
        )
        # The first of the stop's signals the scheduler reports otherwise (PBS: a qdel's TERM), if any.
        reported = (self.scheduler.signalled_status(name) for name in self.stop_signals)
        self.note("; ".join([line, *[r for r in reported if r][:1]]))


def main(settings_json: str) -> int:
    """``supervise SETTINGS``: the settings are checked before anything starts; bad ones are one line, exit 2."""
    try:
        settings = from_json(settings_json)
    except SettingsError as e:
        os.write(2, f"octo-dist job: error: {e}\n".encode(errors="replace"))
        return e.exit_status
    return Supervisor(settings, dict(os.environ)).main()
