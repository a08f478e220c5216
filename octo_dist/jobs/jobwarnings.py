"""What would make a job fail after its wait in the queue, though its script renders: warnings, not refusals
(a path may exist only on the cluster), printed by ``octo-dist launch`` before it writes the script.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping, Optional, Sequence

from octo_dist.jobs import finetunevalues, footprint, probesite
from octo_dist.jobs.supervisor import wandbkey
from octo_dist.jobs.flagchecks import flag_given


# The fine-tune configs shipped with octo-dist, which all leave pretrained_path unset (a placeholder): a job from one
# of them without --config.pretrained_path fails when it starts. tests/test_finetune_fields.py keeps this in sync.
PACKAGED_FINETUNE_CONFIGS = ("finetune_config.py", "finetune_smoke_config.py")


def finetune_warnings(
    job,
    environ: Optional[Mapping[str, str]] = None,
    read: Callable[[str], Optional[str]] = wandbkey.read_small,
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
    if job.settings.storage.wandb_mode == "online" and not wandbkey.key_found(environ, read):
        out.append(
            f"--wandb-mode online, but no wandb key here: {wandbkey.places(environ)}; the job fails at its start "
            f"unless one is there when it runs. Fix: (umask 077; cat > ~/{wandbkey.KEY_FILE}) and paste the key, or "
            "wandb login, or --wandb-mode offline"
        )
    return out


def value_warnings(args: Sequence[str]) -> list:
    """A fine-tune value only the job checks, at its start: ``--config.augment_on=hots`` ->
    ``["--config.augment_on=hots after -- finetune: ...; expected one of auto, device, host. Fix: ..."]``. The
    accepted values are ``finetunevalues``' tables (``--submit`` refuses what this warns of)."""
    bad = finetunevalues.value_problem(args)
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
