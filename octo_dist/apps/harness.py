"""What every training job does around its own work: the smoke job and Octo fine-tuning both run through here.

    return harness.run("smoke", options, lambda job: train(job, args))

1. the stop signal, before start-up: start-up waits for every rank (seconds, up to its timeout), and a scheduler's
   signal then, or during model building or compilation, stops the job at its first step with a checkpoint
   instead of ending the rank by the signal's default action (exit 138: a crashed rank to a chain);
2. start-up (``runtime.initialize``): a launcher, coordinator or start-up error is one line, not a traceback,
   with the exit status its :class:`octo_dist.problems.Problem` means (2 for a malformed setting or
   environment, 1 for a start-up that failed), a stop signal before it or not. The stop signals are held back
   (blocked) through it, so that its threads and the watchdog's child process never get one, and taken back from
   ``jax.distributed.initialize`` before they are let through: it ends by installing TSL's own SIGTERM handler
   (its preemption notifier, which would swallow the signal);
3. rank-aware logging (then the stop handler's warning about a signal inherited ignored), and the persistent
   compilation cache;
4. the job's own work; any :class:`~octo_dist.problems.Problem` it raises is one line and its exit status. A refusal
   (batch that does not divide, checkpoints that cannot be resumed, the job's own) is the same on every rank:
   printed once by rank 0, clean shutdown. A problem seen by one rank alone (``same_on_every_rank=False``: a full
   disk under that rank's write) is printed by that rank, which ends the job (the others may wait in a collective);
5. shutdown, or an abort of the whole job when a rank raised.

:func:`fit` is the training part both jobs share: the tracker is finished however ``train.fit`` ends.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from octo_dist import EXIT_USAGE, savelayout
from octo_dist.problems import Problem
from octo_dist.runtime import runtime
from octo_dist.runtime import startclock

log = logging.getLogger(__name__)

COMPILE_CACHE_ENV = "OCTO_DIST_COMPILE_CACHE"  # "/groups/gxx00000/octo-dist-cache"


@dataclasses.dataclass(frozen=True)
class Options:
    """How a job starts, read from its flags and the environment once, at the command line."""

    runtime: Mapping[str, Any]  # runtime.initialize's keyword arguments
    compile_cache: Optional[str] = None
    log_all_ranks: bool = False

    @classmethod
    def from_environment(
        cls,
        runtime_options: Mapping[str, Any],
        compile_cache: Optional[str],
        environ: Mapping[str, str],
    ) -> "Options":
        """``compile_cache`` or ``$OCTO_DIST_COMPILE_CACHE``; ``$OCTO_DIST_LOG_ALL_RANKS``; ``environ`` for start-up."""
        from octo_dist.runtime import ranklog

        return cls(
            runtime={**runtime_options, "environ": environ},
            compile_cache=compile_cache or environ.get(COMPILE_CACHE_ENV) or None,
            log_all_ranks=ranklog.all_ranks_requested(environ),
        )


@dataclasses.dataclass(frozen=True)
class Job:
    """What the job's own work gets: the runtime (ranks, devices) and the stop signal to pass to ``train.fit``."""

    runtime: runtime.Runtime
    stop: Any  # stopping.StopSignal


def say(job: Job, text: str) -> None:
    """Print on rank 0 only (the verdict lines a person reads: one copy, not one per rank)."""
    if job.runtime.is_main:
        print(text, flush=True)


def run(command: str, options: Options, work: Callable[[Job], int]) -> int:
    """Start up, run ``work`` on every rank, shut down. Returns the exit code.

    Which exit code a failure means comes from its type: a :class:`~octo_dist.problems.Problem` carries it (a new
    refusal only has to derive from ``Problem``); anything else is a bug and aborts the job with its traceback.

    Args:
      command: the subcommand, for messages ("smoke" -> "octo-dist smoke: error: ...").
      options: start-up options (:class:`Options`).
      work: the job itself; returns its exit code.
    """
    from octo_dist.runtime import ranklog
    from octo_dist.runtime import stopping

    # Flags parsed and the job's configuration checked (the command's main).
    startclock.done("checks")
    # Before start-up, which waits for every rank: a stop signal there is honoured at the first step. Its warning
    # about a signal inherited ignored waits for the rank's logging, set up once the rank knows its number.
    stop = stopping.StopSignal(report=False)
    try:
        # Held back until the handler is this one again: start-up's threads and processes never get a stop signal
        # (the watchdog's child would die of one sent to the job step), nor TSL's handler in between.
        with stop.held():
            code, rt = _start_up(command, options)
            if rt is not None:
                stop.reinstall()  # SIGTERM back from jax.distributed.initialize's preemption notifier
    except BaseException:
        stop.close()
        raise
    if rt is None:
        # Refused or failed: said as such, a stop signal before it or not (nothing was trained, nothing to save).
        stop.close()
        return code
    startclock.done("distributed")
    with runtime.running(rt):
        ranklog.setup(rt.process_index, rt.process_count, all_ranks=options.log_all_ranks)
        stop.report()
        if stop.pending:
            log.warning(
                "%s came during start-up: the ranks agree on the stop in their first step, then save a "
                "checkpoint and exit 0",
                stop.name(stop.pending),
            )
        try:
            return _work(command, options, Job(rt, stop), work)
        finally:
            stop.close()


def _start_up(command: str, options: Options) -> Tuple[int, Optional[runtime.Runtime]]:
    """``(0, runtime.Runtime)``, or ``(exit status, None)`` once the refusal or the start-up failure is printed."""
    from octo_dist.runtime import compile_cache

    refused = compile_cache.problem(options.compile_cache)
    if refused:  # found before start-up, the same on every rank
        print(f"octo-dist {command}: error: {refused}", file=sys.stderr, flush=True)
        return EXIT_USAGE, None
    try:
        return 0, runtime.initialize(**options.runtime)
    except Problem as e:
        # A launcher, coordinator or setting refused (2), or a start-up that failed (1).
        print(f"octo-dist {command}: error: {e}", file=sys.stderr, flush=True)
        return e.exit_status, None


def _work(command: str, options: Options, job: Job, work: Callable[[Job], int]) -> int:
    """The compilation cache, then ``work``; a :class:`~octo_dist.problems.Problem` it raises is one line and its
    exit status."""
    from octo_dist.runtime import compile_cache

    rt = job.runtime
    compile_cache.enable(
        compile_cache.resolve(
            options.compile_cache, rt.platform, options.runtime.get("environ", os.environ)
        )
    )
    try:
        return work(job)
    except Problem as e:
        if e.same_on_every_rank:
            # The same flags and shared directories on every rank: refuse together, shut down cleanly.
            if rt.is_main:
                print(f"octo-dist {command}: error: {e}", file=sys.stderr, flush=True)
            return e.exit_status
        # Seen by this process alone (a full disk under its write): the others may wait in a collective
        # (orbax's barrier), so with several ranks this one ends the job (one line, no traceback).
        print(f"octo-dist {command}: error: {e}", file=sys.stderr, flush=True)
        if rt.process_count > 1:
            runtime.end_job(e.exit_status)
        return e.exit_status


@dataclasses.dataclass
class Timing:
    """When training started and when each step finished (``time.time()``), for the run summary."""

    fit_started: float
    step_ends: list


def process_started(proc: str = "/proc") -> float:
    """This process's start (``time.time()`` clock): the interpreter's launch, not this module's import.

    Its age is read on one clock, the kernel's time since boot: ``/proc/uptime`` now (``"35212.47 ..."``) minus
    the start in ``/proc/self/stat`` (field 22, clock ticks since boot). ``psutil``'s ``create_time`` adds that
    start to the boot time in whole seconds (``btime``): 0.6-0.85 s early on this machine."""
    try:
        with open(os.path.join(proc, "uptime")) as f:
            uptime = float(f.read().split()[0])
        with open(os.path.join(proc, "self", "stat")) as f:
            # "1234 (python3) S 1 ...": the command may hold spaces and parentheses; the fields follow the last ")".
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # no /proc: the import of this module is close enough
        return _IMPORTED


_IMPORTED = time.time()


def fit(job: Job, policy, optimizer, data, config, *, tracker, on_step=None, **fit_kwargs):
    """``train.fit`` with this job's stop signal, timed; the tracker is finished whether training ends or raises.

    Returns ``(train.FitResult, Timing)``."""
    from octo_dist.engine import train

    # The job's own set-up ends here; train.fit marks the rest (first batch, parameters, compile).
    timing = Timing(fit_started=startclock.done("setup"), step_ends=[])

    def timed(step, values):
        timing.step_ends.append(time.time())  # the metrics were fetched: the step has finished
        if on_step is not None:
            on_step(step, values)

    try:
        result = train.fit(
            policy,
            optimizer,
            data,
            config,
            tracker=tracker,
            stop=job.stop,
            on_step=timed,
            **fit_kwargs,
        )
        if result.stopped_by and job.runtime.is_main:
            # First, as soon as the stop's checkpoint is written: the scheduler's kill may follow within seconds
            # (PBS's kill_delay after a qdel: 10 s), and the job runtime's last line says which step was saved.
            note_stop(result.end_step)
    finally:
        tracker.finish()
    return result, timing


def parameter_digests(result) -> list:
    """Every rank's ``result.params_digest``, in rank order, on every rank (collective: every rank calls it)."""
    from octo_dist.runtime import collectives

    return [r["digest"] for r in collectives.allgather_json({"digest": result.params_digest})]


def note_stop(step: int, environ: Mapping[str, str] = os.environ) -> None:
    """Tells the job runtime which step a stop signal's checkpoint saved (``<job dir>/stopped``: "1200\\n"), for its
    last line; nothing outside a job. Rank 0 only, after the checkpoint is written."""
    from octo_dist.apps import summary as summary_mod

    job_dir = environ.get(savelayout.JOB_DIR_ENV, "")
    if not job_dir:
        return
    try:
        # A new file renamed over the name: never written through a link or into a FIFO planted there.
        summary_mod.replace_file(
            savelayout.stop_note(job_dir), lambda f: f.write(f"{step}\n".encode())
        )
    except OSError as e:  # a courtesy: the checkpoint and the exit status do not depend on it
        log.warning("could not note the stop in %s: %s", job_dir, e.strerror)


def summary(
    job: Job,
    command: str,
    result,
    timing: Timing,
    global_batch: int,
    config,
    digests: Optional[Sequence[str]] = None,
):
    """Rank 0 prints the run summary and, where the run's ``config`` (the ``train.TrainConfig`` it trained with) has
    a layout, writes its summary.json and loss.png.

    ``digests``: every rank's parameter digest (``parameter_digests``), recorded in summary.json."""
    from octo_dist.apps import summary as summary_mod

    from octo_dist.runtime import collectives

    rt = job.runtime
    started = process_started()
    phases = summary_mod.startup_phases(
        started, startclock.marks(), timing.step_ends[0] if timing.step_ends else None
    )
    # Every rank's profile (a collective: every rank calls summary()); the slowest rank is the one others waited for.
    everyone = collectives.allgather_json({"phases": phases})
    s = summary_mod.summarize(
        command=command,
        processes=rt.process_count,
        devices=rt.device_count,
        global_batch=global_batch,
        start_step=result.start_step,
        end_step=result.end_step,
        losses=result.losses,
        process_started=started,
        fit_started=timing.fit_started,
        step_ends=timing.step_ends,
        ended=time.time(),
        stopped_by=result.stopped_by,
        params_digests=digests,
        input_s=result.input_s,
        startup=phases,
        startup_by_rank=[r["phases"] for r in everyone],
        startup_beside=startclock.besides(),
    )
    if rt.is_main:
        print(summary_mod.lines(s), flush=True)
        if config.layout is not None:
            _write_summary(config.layout, s, result)
    return s


def _write_summary(layout: savelayout.RunLayout, s, result) -> None:
    """The run's summary.json and loss.png (``layout.summary``, ``layout.loss_plot``; rank 0)."""
    from octo_dist.apps import summary as summary_mod

    # Stopped by a signal, the scheduler's kill may follow within seconds: summary.json (small, and it
    # holds the whole run's losses) but not the plot (matplotlib's import and drawing take seconds on a
    # network file system); the run's next job draws the whole curve again.
    plot = not result.stopped_by
    json_path, png_path = summary_mod.write(layout, s, result.losses, with_plot=plot)
    if plot:
        log.info("run summary in %s and %s", json_path, png_path)
    else:
        log.info(
            "run summary in %s; %s not redrawn (stopped by %s: the scheduler's kill may follow); the "
            "run's next job draws it",
            json_path,
            png_path,
            result.stopped_by,
        )
