"""Stop cleanly when the scheduler says so: every rank agrees at a step boundary, saves, and exits 0.

PBS and SLURM send SIGTERM to the job's processes at wall time (then SIGKILL after a grace period); SGE's
``-notify`` sends SIGUSR1 before a suspend and SIGUSR2 before a kill. ``mpirun`` kills its ranks on SIGTERM within
about 0.5 s (measured, Open MPI 5) but forwards SIGUSR1/SIGUSR2, so the job scripts (``octo-dist launch``) turn
every one of these into SIGUSR1 for ``mpirun``, and ask for it themselves a margin before the wall time.

A signal usually reaches some ranks before others, and a rank that stopped alone would leave the others in a
collective forever; so a handler only records the signal, every rank passes its pending signal number into the
next train step, and the step returns the largest over all ranks (``engine.Engine.step``): every rank sees the
same value after the same step and they stop together, at no extra collective.

Once stopping, the job only saves and exits, so further stop signals are ignored: schedulers and impatient users
repeat them (SGE's ``-notify`` then the kill, ``scancel`` twice, a second ``qdel``), and a second SIGTERM or
SIGUSR1 arriving while the checkpoint is written or the process shuts down would otherwise end it with 143/138
(the default action: ``close()`` restores it, and so does Python's own shutdown for every Python-level handler).
The handler records the first signal and only that; ``close()`` (the job's work is done, the checkpoint written)
then sets ``SIG_IGN`` for all of them, which stays in force through interpreter shutdown. SIGKILL (a scheduler's
last word after its grace period) cannot be ignored and still ends the job.

Not ``SIG_IGN`` from the handler itself: a qdel's SIGTERM, the rank guard's copy of it and the job runtime's SIGUSR1
arrive within microseconds, and a signal Python has already noted but not yet handled when its handler becomes
``SIG_IGN`` is reported as "Signal 15 ignored due to race condition" with a traceback in the log. ``close()``
blocks the signals first (``pthread_sigmask`` runs the handlers of those already noted), ignores them, and unblocks
them: whatever came in between is dropped by the kernel, silently.

A stop signal already ignored when the handler is installed was ignored by whatever started this process (a
launcher run with ``&`` from a script, ``nohup``, some CI runners; an ignore survives fork and exec): the handler
replaces the ignore, so the signal stops the run with a checkpoint all the same, and the process says so once.

A training rank installs the handler before its start-up (``octo_dist.apps.harness.run``), which waits for every
rank in ``jax.distributed.initialize`` (seconds, up to the start-up timeout): installed after it, a qdel's SIGTERM,
the job runtime's SIGUSR1 or Grid Engine's SIGUSR2 in that wait ended the rank by the signal's default action (exit
138, 140, 143), a crashed rank to a chain, ``octo-dist jobs`` and the exit file. Recorded, it is honoured at the
first step like any other. Three consequences. The warning about an inherited ignore waits for the rank's
logging, set up after start-up (``StopSignal(report=False)``, then :meth:`StopSignal.report`).
``jax.distributed.initialize`` ends by starting TSL's preemption notifier, whose C handler takes SIGTERM over (it
only logs "SIGTERM caught at ..."; measured, jax 0.4.22: a SIGTERM then left ``pending`` at 0) while Python's table
still names this handler, so the harness takes the signals back right after start-up (:meth:`StopSignal.reinstall`).
And start-up starts threads and a process of its own (JAX's; the start-up watchdog's child, which a signal for the
whole job step or session reaches too: Slurm's, PBS's qdel, and which died of it, the rank then failing at its next
stage with a BrokenPipeError): so the signals are held back through start-up (:meth:`StopSignal.held`, blocked in
the main thread and inherited by everything started meanwhile; the smoke job runs no other thread before it) and
handled when it ends, by this handler, never by TSL's (a process started meanwhile keeps them blocked: the
watchdog's child, which ends when the rank's pipe closes). What is not covered: Python's own start-up and the
command's flag checks before ``harness.run`` (about a second). A stop signal during start-up never hides a start-up
that fails: that failure is the rank's report and exit status (nothing was trained, so nothing is saved).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Iterable, Iterator, Optional

# SIGINT too: Ctrl-C at a terminal, ``kill -INT``, the job runtime's rank guard forwarding one; before, it raised
# KeyboardInterrupt wherever the rank was, which aborted the whole job (MPI_ABORT, exit 1: a chain stops) and lost
# the steps since the last checkpoint.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# Inherited ignored, these stay ignored: POSIX has a shell ignore SIGINT for every command it starts with ``&``
# from a script, which asks that no Ctrl-C reaches it (not a stop signal lost: ``kill -INT`` is then the only way).
KEEP_IGNORED = (signal.SIGINT,)
log = logging.getLogger(__name__)
# The signals already named as re-armed: once per process, however many handlers follow.
_reported: set = set()
_ignored_here: set = set()  # the signals a handler below ignored after a stop: not inherited


class StopSignal:
    """Records SIGINT/SIGTERM/SIGUSR1/SIGUSR2 instead of dying; ``pending`` goes into every train step."""

    def __init__(self, signals: Iterable[int] = SIGNALS, *, report: bool = True):
        """``report=False``: the warning about an inherited ignore waits for :meth:`report` (a process whose
        logging is not set up yet: a training rank before its start-up)."""
        self.received: Optional[int] = None
        signals = [
            s
            for s in signals
            if not (
                s in KEEP_IGNORED
                and signal.getsignal(s) == signal.SIG_IGN
                and s not in _ignored_here
            )
        ]
        self._previous = {s: signal.signal(s, self._handle) for s in signals}
        # (SIGTERM,): the stop signals this process inherited ignored, handled from now on.
        self.rearmed = tuple(
            s for s, h in self._previous.items() if h == signal.SIG_IGN and s not in _ignored_here
        )
        if report:
            self.report()

    def report(self) -> None:
        """Logs the stop signals this handler re-armed (``rearmed``) that no handler of this process named yet."""
        unreported = [s for s in self.rearmed if s not in _reported]
        if unreported:
            _reported.update(unreported)
            log.warning(
                "%s ignored when this process started (by whatever launched it: nohup, '&' in a script, a CI "
                "runner?): octo-dist stops on it anyway, with a checkpoint",
                " ".join(self.name(s) for s in unreported),
            )

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Blocks the handled signals in this thread, and so in every thread and process started meanwhile, then
        puts the mask found back: a signal that came meanwhile is handled then, by the handler set by then."""
        before = signal.pthread_sigmask(signal.SIG_BLOCK, list(self._previous))
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    def reinstall(self) -> None:
        """Takes the signals back from a C handler installed over this one since (``jax.distributed.initialize``'s
        preemption notifier takes SIGTERM). ``signal.getsignal`` cannot tell: Python's own table still names this
        handler, so every signal is set again."""
        for s in self._previous:
            signal.signal(s, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            # Not a log call: logging from a signal handler can deadlock on the handler's lock.
            self.received = signum

    @property
    def pending(self) -> int:
        return self.received or 0

    @staticmethod
    def name(signum: int) -> str:
        return signal.Signals(signum).name

    def close(self) -> None:
        """Put back the handlers found at install time, unless a stop signal came: then ignore them from now on."""
        if self.received is not None:
            signals = list(self._previous)
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)
            for s in signals:
                signal.signal(s, signal.SIG_IGN)
            _ignored_here.update(signals)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
            return
        for s, previous in self._previous.items():
            signal.signal(s, previous)
