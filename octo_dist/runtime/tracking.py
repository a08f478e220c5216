"""Experiment tracking behind a small interface: wandb on rank 0, a no-op on every other rank.

Every rank calling ``wandb.init`` races on one run directory and crashes (``FileExistsError``).
Here rank 0 alone talks to wandb, after all ranks agreed on the run id by broadcast (so any rank can name
files after the run). The wandb ``group`` defaults to the scheduler's job id, so the runs of one job, and
its resumptions, are grouped. ``WANDB_MODE=offline|disabled`` is honoured; secrets never reach the config.
"""

from __future__ import annotations

import abc
import os
import re
import secrets
import string
from typing import Any, Callable, Mapping, Optional

from octo_dist.launchers import scheduler

MODES = ("online", "offline", "disabled")
_SECRET = re.compile(r"api[_-]?key|token|secret|password", re.I)


class Tracker(abc.ABC):
    def __init__(self, run_id: str):
        self.run_id = run_id

    @abc.abstractmethod
    def log(self, metrics: Mapping[str, Any], step: int) -> None: ...

    def finish(self) -> None:
        pass


class NoopTracker(Tracker):
    """Ranks other than 0, and ``WANDB_MODE=disabled``."""

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        pass


class WandbTracker(Tracker):
    def __init__(
        self,
        run_id: str,
        *,
        project: str,
        mode: str,
        group: Optional[str] = None,
        name: Optional[str] = None,
        config: Optional[Mapping[str, Any]] = None,
        entity: Optional[str] = None,
        dir: Optional[str] = None,
    ):
        super().__init__(run_id)
        self.offline = mode == "offline"
        if self.offline:
            # An offline run (compute nodes without internet) would otherwise print about 20 "wandb:" lines into
            # the job log and retry its error reports to sentry.io; wandb reads both when it is imported. The one
            # line that matters, where the run is and how to upload it, is printed by finish(). A user's own
            # WANDB_SILENT / WANDB_ERROR_REPORTING still win.
            os.environ.setdefault("WANDB_SILENT", "true")
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        import wandb

        self.run = wandb.init(
            id=run_id,
            project=project,
            entity=entity,
            group=group,
            name=name,
            mode=mode,
            dir=dir,
            config=redact(config or {}),
            # offline runs cannot resume (wandb warns and starts a new run with the same id)
            resume=None if self.offline else "allow",
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def finish(self) -> None:
        run_dir = os.path.dirname(
            self.run.dir
        )  # ".../wandb/offline-run-20261204_052811-k3x9a2bq/files" -> its run
        self.run.finish()
        if self.offline:
            print(
                f"octo-dist: wandb run {self.run_id} saved offline in {run_dir}; upload it with: wandb sync {run_dir}",
                flush=True,
            )


def redact(config: Mapping[str, Any]) -> dict:
    """A copy with values under secret-looking keys (``wandb_api_key``, ``hf_token``...) replaced by ``"***"``."""
    out = {}
    for k, v in config.items():
        if _SECRET.search(str(k)):
            out[k] = "***"
        elif isinstance(v, Mapping):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


def new_run_id() -> str:
    """8 characters from [a-z0-9], the form wandb itself generates."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def resolve_mode(
    environ: Mapping[str, str], mode: Optional[str] = None, default: str = "online"
) -> str:
    """``mode`` if given, else ``WANDB_MODE`` ("dryrun" is wandb's old word for offline), else ``default``."""
    value = (mode or environ.get("WANDB_MODE") or default).lower()
    value = {"dryrun": "offline", "run": "online"}.get(value, value)
    if value not in MODES:
        raise ValueError(
            f"wandb mode {value!r}; expected one of {MODES} (from {'--wandb-mode' if mode else 'WANDB_MODE'})"
        )
    return value


def make_tracker(
    rank: int,
    *,
    project: str,
    run_id: Optional[str] = None,
    group: Optional[str] = None,
    name: Optional[str] = None,
    config: Optional[Mapping[str, Any]] = None,
    mode: Optional[str] = None,
    entity: Optional[str] = None,
    dir: Optional[str] = None,
    launch=None,
    broadcast: Optional[Callable[[Optional[str]], str]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Tracker:
    """Call on every rank: the run id is agreed by ``broadcast`` (default ``collectives.broadcast_str``), then rank 0
    gets a WandbTracker (a NoopTracker when the mode is disabled) and the others a NoopTracker with the same id."""
    environ = os.environ if environ is None else environ
    mode = resolve_mode(environ, mode)
    if broadcast is None:
        from octo_dist.runtime.collectives import broadcast_str as broadcast
    agreed = broadcast(
        run_id or environ.get("WANDB_RUN_ID") or (new_run_id() if rank == 0 else None)
    )
    if rank != 0 or mode == "disabled":
        return NoopTracker(agreed)
    return WandbTracker(
        agreed,
        project=project,
        mode=mode,
        group=group or scheduler.job_id(environ, launch),
        name=name,
        config=config,
        entity=entity,
        dir=dir,
    )
