"""Nothing that fails after the queue wait, when ``--submit`` is given: what a fine-tune would die of at its start,
refused before anything is queued (exit 2, the fix named). A render without ``--submit`` only warns
(``jobwarnings``): the paths may exist only on the cluster; a submission runs where the job will.

Checked: the dataset directory (``--data-dir``, in RLDS's ``<dataset name>/<version>/`` layout; one level too deep
is the usual mistake), a wandb key for ``--wandb-mode online``, the pretrained checkpoint (a directory holding
Octo's files: ``config.json`` and a step directory), the values of ``--config.augment_on``,
``--config.resize_method`` and ``--step_fn``, and the room the save directory needs (``footprint``). On a login
node's Python (no absl, no ml_collections) the rest of the fine-tune's flags are checked in the image (README).

Pure over the job, a Mapping environment and small file-system callables.
"""

from __future__ import annotations

import os
from typing import Callable, List, Mapping, Optional

from octo_dist.jobs import finetunevalues, footprint
from octo_dist.jobs.finetunevalues import Problem, flag_value
from octo_dist.jobs.supervisor import wandbkey

DATASET_INFO = "dataset_info.json"  # RLDS (tfds) writes it in <data dir>/<name>/<version>/
OCTO_CONFIG = "config.json"  # an Octo checkpoint: config.json, dataset_statistics.json, <step>/ ...


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def dataset_problem(
    data_dir: str,
    is_dir: Callable[[str], bool] = os.path.isdir,
    is_file: Callable[[str], bool] = os.path.isfile,
    listdir: Callable[[str], List[str]] = _listdir,
) -> Optional[Problem]:
    """``--data-dir`` must hold ``<dataset name>/<version>/dataset_info.json`` (``data/bridge_dataset/1.0.0/``)."""
    if not data_dir:
        return (
            "-- finetune without --data-dir",
            "the RLDS dataset directory the ranks read (<dataset name>/<version>/ under it)",
            "--data-dir data (the directory holding e.g. bridge_dataset/1.0.0/)",
        )
    if not is_dir(data_dir):
        return (
            f"--data-dir {data_dir}: no such directory",
            "the dataset directory",
            "fix the path",
        )
    for name in listdir(data_dir):
        for version in listdir(os.path.join(data_dir, name)):
            if is_file(os.path.join(data_dir, name, version, DATASET_INFO)):
                return None
    parent = os.path.dirname(os.path.abspath(data_dir))
    if is_file(os.path.join(data_dir, DATASET_INFO)):
        deep = "two levels too deep: it is a <version> directory"
        fix = f"--data-dir {os.path.dirname(parent)}"
    elif any(is_file(os.path.join(data_dir, v, DATASET_INFO)) for v in listdir(data_dir)):
        deep = "one level too deep: it is a <dataset name> directory, whose versions hold the data"
        fix = f"--data-dir {parent}"
    else:
        deep = f"no <dataset name>/<version>/{DATASET_INFO} under it"
        fix = "--data-dir the directory that holds <dataset name>/<version>/ (tfds's data_dir)"
    return (
        f"--data-dir {data_dir}: {deep}",
        f"<dataset name>/<version>/{DATASET_INFO} under it",
        fix,
    )


def pretrained_problem(
    path: Optional[str],
    is_dir: Callable[[str], bool] = os.path.isdir,
    is_file: Callable[[str], bool] = os.path.isfile,
    listdir: Callable[[str], List[str]] = _listdir,
) -> Optional[Problem]:
    """``--config.pretrained_path`` must be given and, when a directory here, hold Octo's files."""
    fix = (
        "--config.pretrained_path=weights/octo-small after -- finetune (make weights downloads it)"
    )
    if not path:
        return (
            "-- finetune without --config.pretrained_path (the packaged configs have none)",
            "the Octo checkpoint to fine-tune",
            fix,
        )
    if "://" in path:
        return None  # hf://, gs://: read by the ranks themselves
    if not is_dir(path):
        return (
            f"--config.pretrained_path={path}: no such directory",
            "an Octo checkpoint directory",
            fix,
        )
    steps = [
        s for s in listdir(path) if s.isascii() and s.isdigit() and is_dir(os.path.join(path, s))
    ]
    lacks = [OCTO_CONFIG] if not is_file(os.path.join(path, OCTO_CONFIG)) else []
    lacks += [] if steps else ["<step>/ directory (ASCII digits: 300000/)"]
    if lacks:
        return (
            f"--config.pretrained_path={path}: not an Octo checkpoint (no {' and no '.join(lacks)} in it)",
            f"Octo's files: {OCTO_CONFIG}, dataset_statistics.json and a <step>/ directory",
            "point it at the directory octo-dist weights wrote (" + fix.split(" after")[0] + ")",
        )
    return None


def refusal(
    job,
    environ: Mapping[str, str],
    read: Callable[[str], Optional[str]] = wandbkey.read_small,
    free_of: Callable[[str], Optional[int]] = footprint.free_bytes,
) -> Optional[Problem]:
    """The first thing that would fail the submitted job at its start, as (found, expected, fix); None."""
    training, storage = job.header.training, job.settings.storage
    if storage.wandb_mode == "online" and not wandbkey.key_found(environ, read):
        return (
            f"--wandb-mode online with no wandb key here ({wandbkey.places(environ)})",
            "a key the job finds when it starts",
            "export WANDB_API_KEY=..., or wandb login, or --wandb-mode offline",
        )
    if training.command != "finetune":
        return None
    args = [*training.lead_args, *training.user_args]
    pretrained = flag_value(args, "--config.pretrained_path")
    data_dir = storage.data_dir or flag_value(args, "--config.dataset_kwargs.data_dir") or ""
    found = (
        dataset_problem(data_dir)
        or pretrained_problem(pretrained)
        or finetunevalues.value_problem(args)
    )
    if found or not pretrained:
        return found
    fp = footprint.estimate(pretrained, job.settings.software.image)
    return footprint.shortfall(storage.save_dir, fp, free_of(storage.save_dir)) if fp else None
