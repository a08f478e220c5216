"""The training command's flags checked inside the image, where this Python cannot check them.

``octo-dist launch`` runs on a login node's system Python (ABCI: 3.9, standard library only), where the fine-tune's
flag checker cannot be imported (no absl, no ml_collections): ``-- finetune --config.tpyo=1`` would render and fail
after the wait in the queue. When ``singularity`` (or ``apptainer``) is on PATH and the job's image is here, the
check runs in the image instead, a bounded subprocess (``outside.run_command``: a timeout, the output cut):

    singularity exec /groups/g/octo-dist-cuda12.sif python3 -m octo_dist.apps.finetune.arguments --config.tpyo=1

and what it refuses launch refuses (exit 2, its one line). Where neither is possible, or the image cannot run the
check (an older image, a runner that fails), launch says so and how to check by hand: the same ``launch`` with
``--dry-run``, run in the image. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Callable, Optional, Sequence

from octo_dist.jobs.commands import Checker
from octo_dist.launchers import outside

RUNNERS = ("singularity", "apptainer")  # SingularityCE (ABCI 3.0) or its Linux Foundation fork
# Starting a SIF takes seconds; loading the config file with ml_collections a few more. Far beyond both.
TIMEOUT_S = 300
# The command (in the image) that checks a training command's flags: exit 0 printing CHECKED, or exit 2 with the
# refusal as its last line on stderr. Only finetune: smoke's checker is standard library and runs here.
IN_IMAGE = {"finetune": ("python3", "-m", "octo_dist.apps.finetune.arguments")}
CHECKED = (
    "octo-dist: flags checked"  # printed by the check in the image; an older image prints nothing
)
ERROR_PREFIX = "octo-dist finetune: error: "


def _note(text: str) -> None:
    print(f"octo-dist launch: note: {text}", file=sys.stderr)


def checker(
    check: Checker,
    command: str,
    image: Optional[str],
    by_hand: str,
    which: Callable[[str], Optional[str]] = shutil.which,
    run=outside.run_command,
    note: Callable[[str], None] = _note,
) -> Checker:
    """``check``, which raises ImportError where this Python lacks what it needs, made to check in ``image`` then
    (:func:`in_image`); ``by_hand``: the command that checks by hand, for the note when it cannot."""

    def checked(argv: Sequence[str]) -> None:
        try:
            check(argv)
        except ImportError as e:
            in_image(command, argv, str(e), image, by_hand, which, run, note)

    return checked


def in_image(
    command: str,
    argv: Sequence[str],
    missing: str,
    image: Optional[str],
    by_hand: str,
    which: Callable[[str], Optional[str]],
    run,
    note: Callable[[str], None],
) -> None:
    """Check ``argv`` in ``image``; raise ValueError (the image's one line) for a refusal; otherwise a note:
    checked there, or not checked and how to check by hand."""
    runner = next((which(name) for name in RUNNERS if which(name)), None)
    inside = IN_IMAGE.get(command)
    unchecked = f"the {command} flags after -- are not checked here ({missing})"
    if not (inside and image and runner and os.path.isfile(image)):
        why = (
            "no image to check them in (--image)"
            if not image
            else f"{image} is not here"
            if not os.path.isfile(image)
            else "singularity (or apptainer) is not on PATH"
        )
        note(f"{unchecked}: {why}. Check them by hand: {by_hand}")
        return
    argv_run = [runner, "exec", image, *inside, *argv]
    shown_run = f"{os.path.basename(runner)} exec {image} {' '.join(inside)} ..."
    try:
        done = run(argv_run, TIMEOUT_S)
    except (OSError, outside.CommandTimeout) as e:
        timed_out = isinstance(e, outside.CommandTimeout)
        failed = f"did not end within {TIMEOUT_S} s" if timed_out else outside.shown(str(e), 200)
        note(
            f"{unchecked}, nor in the image: {shown_run} failed ({failed}). Check them by hand: {by_hand}"
        )
        return
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    if done.returncode == 2 and lines and lines[-1].startswith(ERROR_PREFIX):
        raise ValueError(outside.shown(lines[-1][len(ERROR_PREFIX) :], 1000))
    if done.returncode == 0 and CHECKED in done.stdout:
        note(f"the {command} flags after -- were checked in {image} ({missing} here)")
        return
    said = outside.shown(lines[-1], 300) if lines else "no output"
    note(
        f"{unchecked}, nor in the image: {shown_run} ended with exit {done.returncode} ({said}). Check them by "
        f"hand: {by_hand}"
    )
