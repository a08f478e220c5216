"""Logging and progress bars that know their rank: ``[rank 1/8 g0002] WARNING octo_dist.engine.parallel: ...``.

INFO is shown on rank 0 only by default, warnings and errors from every rank (a failing node must be heard).
``all_ranks=True`` shows INFO everywhere (the jobs set it from ``OCTO_DIST_LOG_ALL_RANKS=1``).
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Iterable, Mapping, Optional, TextIO, TypeVar

T = TypeVar("T")
_HANDLER_FLAG = "_octo_dist_ranklog"
ALL_RANKS_ENV = "OCTO_DIST_LOG_ALL_RANKS"  # "1": INFO from every rank, not only rank 0


def all_ranks_requested(environ: Mapping[str, str]) -> bool:
    """``OCTO_DIST_LOG_ALL_RANKS`` set to anything but "" or "0" (read by the commands, passed to :func:`setup`)."""
    return environ.get(ALL_RANKS_ENV, "") not in ("", "0")


def prefix(rank: int, world: int, host: Optional[str] = None) -> str:
    return f"[rank {rank}/{world} {host or socket.gethostname()}]"


def _routine_orbax(record: logging.LogRecord) -> bool:
    """False for orbax's INFO records ("Saving item to /run/4.orbax-checkpoint-tmp-1796.../state.", "Renaming ...":
    8 lines per checkpoint, through absl, into the middle of the progress bar); its warnings still pass. The
    checkpointer logs one line of its own per save."""
    return not (
        record.levelno < logging.WARNING
        and record.name == "absl"
        and "orbax" in record.pathname.replace("\\", "/").split("/")
    )


def setup(
    rank: int,
    world: int,
    host: Optional[str] = None,
    *,
    level: int = logging.INFO,
    all_ranks: bool = False,
    stream: Optional[TextIO] = None,
) -> logging.Logger:
    """Configure the root logger (and absl's, which Octo uses) for this rank; idempotent."""
    effective = level if rank == 0 or all_ranks else max(level, logging.WARNING)
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, _HANDLER_FLAG, False)]:
        root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    setattr(handler, _HANDLER_FLAG, True)
    handler.setFormatter(
        logging.Formatter(f"{prefix(rank, world, host)} %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(_routine_orbax)
    root.addHandler(handler)
    root.setLevel(effective)
    # jax logs every backend it could not load ("Unable to initialize backend 'tpu'") at INFO: noise on every run.
    logging.getLogger("jax._src.xla_bridge").setLevel(max(effective, logging.WARNING))
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(
            absl_logging.INFO if effective <= logging.INFO else absl_logging.WARNING
        )
        # absl's own handler would print a second, unprefixed copy of every record.
        absl_handler = absl_logging.get_absl_handler()
        if absl_handler in root.handlers:
            root.removeHandler(absl_handler)
    except ImportError:
        pass
    return root


class StepLines:
    """The progress of a run whose stderr is a file (a batch job's log), as plain lines rather than tqdm's redraws:

        train: step 120/5000, loss 0.4123 at step 119 (1.92 steps/s)

    one every ``every_s`` seconds and one at the end. ``set_postfix_str`` takes what tqdm's would (the loss)."""

    def __init__(
        self,
        iterable: Iterable[T],
        *,
        total: int,
        initial: int = 0,
        desc: str = "train",
        every_s: float = 30.0,
        out: Optional[TextIO] = None,
        clock=None,
    ):
        import time

        self.iterable, self.total, self.initial, self.desc = iterable, total, initial, desc
        self.every_s, self.out, self.clock = every_s, out, clock or time.monotonic
        self.postfix = ""
        self.done = initial

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def _line(self, started: float) -> None:
        rate = (self.done - self.initial) / max(self.clock() - started, 1e-9)
        said = f", {self.postfix}" if self.postfix else ""
        out = self.out or sys.stderr
        print(
            f"{self.desc}: step {self.done}/{self.total}{said} ({rate:.2f} steps/s)",
            file=out,
            flush=True,
        )

    def __iter__(self):
        started = last = self.clock()
        try:
            for item in self.iterable:
                yield item
                self.done += 1
                if self.clock() - last >= self.every_s:
                    last = self.clock()
                    self._line(started)
        finally:
            self._line(started)


def progress(iterable: Iterable[T], rank: int, **tqdm_kwargs) -> Iterable[T]:
    """A tqdm bar on rank 0 at a terminal, :class:`StepLines` on rank 0 in a job's log (a file: tqdm's redraws every
    30 s leave carriage returns, not lines), the bare iterable elsewhere (N bars interleaved in one log are noise)."""
    if rank != 0:
        return iterable
    if not sys.stderr.isatty():
        return StepLines(
            iterable,
            total=tqdm_kwargs.get("total", 0),
            initial=tqdm_kwargs.get("initial", 0),
            desc=tqdm_kwargs.get("desc", "train"),
        )
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    tqdm_kwargs.setdefault("mininterval", 0.1)
    return tqdm(iterable, **tqdm_kwargs)
