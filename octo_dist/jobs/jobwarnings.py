"""What would make a job fail after its wait in the queue, though its script renders: warnings, not refusals
(a path may exist only on the cluster), printed by ``octo-dist launch`` before it writes the script.
"""

from __future__ import annotations

import os
import stat
from typing import Callable, Mapping, Optional, Sequence

from octo_dist.jobs import footprint, probesite
from octo_dist.jobs.flagchecks import flag_given


# The fine-tune configs shipped with octo-dist, which all leave pretrained_path unset (a placeholder): a job from one
# of them without --config.pretrained_path fails when it starts. tests/test_finetune_fields.py keeps this in sync.
PACKAGED_FINETUNE_CONFIGS = ("finetune_config.py", "finetune_smoke_config.py")
WANDB_KEY_FILE = os.path.join(
    ".config", "octo-dist", "wandb_api_key"
)  # under $HOME, or $WANDB_KEY_FILE


def wandb_key_found(environ: Mapping[str, str], read: Callable[[str], Optional[str]]) -> bool:
    """Whether a job with ``--wandb-mode online`` will find a key where the job runtime looks (WANDB_API_KEY, the
    key file, ``~/.netrc``'s api.wandb.ai): ``read(path)`` is the file's text, None when there is none."""
    if environ.get("WANDB_API_KEY"):
        return True
    home = environ.get("HOME", os.path.expanduser("~"))
    if read(environ.get("WANDB_KEY_FILE") or os.path.join(home, WANDB_KEY_FILE)) is not None:
        return True
    return "api.wandb.ai" in (read(os.path.join(home, ".netrc")) or "")


def _read_small(path: str) -> Optional[str]:
    """The first 64 KiB of ``path`` as text; None when it is not a regular file here (missing, a directory, a FIFO,
    a socket). Opened without blocking: a plain open of a FIFO waits for a writer, for ever when none comes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, 1 << 16).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


# What a path is, when it is there but not a file: os.stat's file types, in the words a message uses.
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _what_is(path: str) -> str:
    """``"does not exist"``, ``"is a FIFO, not a file"`` (or a directory, a socket, a device), or ``"is a file"``;
    from ``os.stat`` alone, so nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "does not exist"
    if stat.S_ISREG(mode):
        return "is a file"
    kind = next((word for test, word in _KINDS if test(mode)), "a device")
    return f"is {kind}, not a file"


def key_places(environ: Mapping[str, str]) -> str:
    """Where the job runtime looks for a wandb key and what is there, for a message: ``"WANDB_API_KEY is unset,
    /home/u/.config/octo-dist/wandb_api_key is a FIFO, not a file, and ~/.netrc has no api.wandb.ai entry"``."""
    home = environ.get("HOME", os.path.expanduser("~"))
    key_file = environ.get("WANDB_KEY_FILE") or os.path.join(home, WANDB_KEY_FILE)
    netrc = _what_is(os.path.join(home, ".netrc"))
    netrc = "has no api.wandb.ai entry" if netrc in ("is a file", "does not exist") else netrc
    return f"WANDB_API_KEY is unset, {key_file} {_what_is(key_file)}, and ~/.netrc {netrc}"


def finetune_warnings(
    job,
    environ: Optional[Mapping[str, str]] = None,
    read: Callable[[str], Optional[str]] = _read_small,
) -> list:
    """What would make the job fail after its wait in the queue, though the script renders: a packaged fine-tune
    config without ``--config.pretrained_path``; ``--wandb-mode online`` with no key this host can see."""
    environ = os.environ if environ is None else environ
    out = []
    training = job.header.training
    if training.command == "finetune":
        given = [*training.lead_args, *training.user_args]
        config = next(
            (a.partition("=")[2] for a in given if a.startswith("--config=")), "finetune_config.py"
        )
        if os.path.basename(
            config.partition(":")[0]
        ) in PACKAGED_FINETUNE_CONFIGS and not flag_given(
            training.user_args, "--config.pretrained_path"
        ):
            out.append(
                "-- finetune without --config.pretrained_path: the packaged config has none, so every rank stops "
                "at its start (after the wait in the queue). Fix: add --config.pretrained_path=weights/octo-small "
                "after -- finetune (make weights downloads it on a login node)"
            )
        out += value_warnings(given)
    if job.settings.storage.wandb_mode == "online" and not wandb_key_found(environ, read):
        out.append(
            f"--wandb-mode online, but no wandb key here: {key_places(environ)}; the job fails at its start "
            f"unless one is there when it runs. Fix: (umask 077; cat > ~/{WANDB_KEY_FILE}) and paste the key, or "
            "wandb login, or --wandb-mode offline"
        )
    return out


def value_warnings(args: Sequence[str]) -> list:
    """A fine-tune value only the job checks, at its start: ``--config.augment_on=hots`` ->
    ``["--config.augment_on=hots after -- finetune: ...; expected one of auto, device, host. Fix: ..."]``. The
    accepted values are ``submitchecks``' tables (``--submit`` refuses what this warns of), read from there."""
    # Imported here: submitchecks builds on this module (its refusals reuse the warnings' checks).
    from octo_dist.jobs import submitchecks

    bad = submitchecks.value_problem(args)
    if bad is None:
        return []
    found, expected, fix = bad
    return [
        f"{found} after -- finetune: every rank stops at its start (after the wait in the queue); expected "
        f"{expected}. Fix: {fix}"
    ]


def missing_paths(job, is_dir: Callable[[str], bool]) -> list:
    """One warning per directory the job reads that this host does not have (it may exist only on the
    cluster, so the render goes on): ``["--data-dir data/bridge: no such directory here (/home/u/proj); ..."]``;
    then :func:`finetune_warnings`' (this host's environment and files).

    ``is_dir``: ``os.path.isdir`` relative to where the script is rendered (and, usually, submitted)."""
    out = []
    storage, software = job.settings.storage, job.settings.software
    if storage.data_dir and not is_dir(storage.data_dir):
        out.append(
            f"--data-dir {storage.data_dir}: no such directory on this host; the job fails at its start unless "
            f"it exists where the job runs. Fix: check the path, or make it before submitting"
        )
    if not software.image and not is_dir(os.path.join(software.venv, "bin")):
        out.append(
            f"--venv {software.venv}: no such environment on this host (no {os.path.join(software.venv, 'bin')}); "
            "the job fails at its start unless it exists where the job runs. Fix: make env, or --venv PATH or "
            "--image FILE.sif"
        )
    return out + finetune_warnings(job) + footprint_warnings(job)


def footprint_warnings(job, free_of: Callable[[str], Optional[int]] = footprint.free_bytes) -> list:
    """The save directory's file system without room for the fine-tune's checkpoints (and the image still to
    build): a warning at render (``--submit`` refuses it: ``submitchecks``)."""
    training = job.header.training
    if training.command != "finetune":
        return []
    path = None
    for arg in (*training.lead_args, *training.user_args):
        if arg.startswith("--config.pretrained_path="):
            path = arg.partition("=")[2]
    fp = footprint.estimate(path, job.settings.software.image) if path else None
    save_dir = job.settings.storage.save_dir
    short = footprint.shortfall(save_dir, fp, free_of(save_dir)) if fp else None
    if not short:
        return []
    found, expected, fix = short
    return [f"{found}; expected {expected}: the job would stop at a checkpoint. Fix: {fix}"]


def probe_warnings(job, environ: Mapping[str, str], cwd: str) -> list:
    """Where a probe job (``octo-dist probe``) found the PBS site other than launch assumes: its report in the save
    directory, ``runs/probe/`` or ``$OCTO_DIST_PROBE_REPORT``; one warning per difference that concerns this job
    (the multi-node ones only for a job of several nodes); [] without a report or for another scheduler."""
    if job.settings.allocation.scheduler != "pbs":
        return []
    path = probesite.find_report(job.settings.storage.save_dir, environ, cwd)
    report = probesite.read_report(path) if path else None
    if path and report is None:
        return [
            f"{path}: not a probe report octo-dist wrote (unreadable, or not its JSON). Fix: octo-dist probe "
            f"again, or unset {probesite.REPORT_ENV}"
        ]
    return probesite.launch_warnings(report, path, job.settings.allocation.nodes) if report else []
