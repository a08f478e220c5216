"""How much room a fine-tune's save directory will take, against the free space where it is, before the job queues.

ABCI 3.0's group area starts at 0 TB (system-overview: ``/groups``' initial capacity is 0 TB, raised in the user
portal), and a run that fills it dies at its first checkpoint, after the queue wait. ``launch`` estimates the run's
footprint: the checkpoints kept at its fullest (the fine-tune keeps 3, plus the one being written) x one
checkpoint's size (the train state: the model's parameters and Adam's two moments, float32, from the model's
config: ``token_embedding_size`` 384 is Octo-Small, 27M parameters), plus the image; it compares that with the
free space ``os.statvfs`` reads there. A group quota is not in ``statvfs``: README step 0 checks it
(``show_quota``).

Pure over a reader of small files, a size-of-file callable and a free-space callable, so tests fabricate them.
"""

from __future__ import annotations

import json
import os
from typing import Callable, NamedTuple, Optional, Tuple

from octo_dist import savelayout

# Octo's published models by token_embedding_size (their config.json): parameters.
OCTO_PARAMS = {384: ("Octo-Small", 27_000_000), 768: ("Octo-Base", 93_000_000)}
STATE_ARRAYS = 3  # parameters + Adam's mu and nu, each float32
BYTES_PER_VALUE = 4
KEPT = 3  # engine.train.TrainConfig.max_to_keep's default
COPIES = KEPT + 1  # pruning runs after a save completes: 3 kept and 1 being written
IMAGE_BYTES = 8 << 30  # a cuda12 .sif not built yet (CUDA 12 wheels, TensorFlow, JAX): about 8 GiB


class Footprint(NamedTuple):
    need: int  # bytes the save directory's file system must still have
    said: str  # "4 checkpoints of Octo-Small's state (309.0 MiB each) and the image to build (8.0 GiB)"


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _find(tree, key: str):
    """The first value of ``key`` anywhere in a parsed JSON tree."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    if isinstance(tree, list):
        for item in tree:
            found = _find(item, key)
            if found is not None:
                return found
    return None


def model_params(
    pretrained: str, read: Callable[[str], Optional[str]] = _read
) -> Optional[Tuple[str, int]]:
    """(model, parameters) from the pretrained checkpoint's ``config.json`` (``"token_embedding_size": 384`` ->
    ``("Octo-Small", 27000000)``), else from its name (``hf://rail-berkeley/octo-base``); None when neither says."""
    text = read(os.path.join(pretrained, "config.json")) if "://" not in pretrained else None
    try:
        width = _find(json.loads(text), "token_embedding_size") if text else None
    except ValueError:
        width = None
    if width in OCTO_PARAMS:
        return OCTO_PARAMS[width]
    name = os.path.basename(pretrained.rstrip("/")).lower()
    for model, params in OCTO_PARAMS.values():
        if model.lower() in name:
            return model, params
    return None


def estimate(
    pretrained: str,
    image: str,
    read: Callable[[str], Optional[str]] = _read,
    is_file: Callable[[str], bool] = os.path.isfile,
) -> Optional[Footprint]:
    """The room a fine-tune from ``pretrained`` still needs where it saves; None when the model is unknown."""
    model = model_params(pretrained, read)
    if model is None:
        return None
    name, params = model
    one = params * STATE_ARRAYS * BYTES_PER_VALUE
    each = savelayout.size_text(one)
    said = (
        f"{COPIES} checkpoints of {name}'s train state ({each} each: {KEPT} kept, 1 being written)"
    )
    need = COPIES * one
    if image and not is_file(image):
        need += IMAGE_BYTES
        said += f" and the image still to build (about {savelayout.size_text(IMAGE_BYTES)})"
    return Footprint(need, said)


def free_bytes(directory: str) -> Optional[int]:
    """Bytes an unprivileged user can still write where ``directory`` is or would be created; None unreadable."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shortfall(save_dir: str, fp: Footprint, free: Optional[int]) -> Optional[Tuple[str, str, str]]:
    """(found, expected, fix) when ``free`` bytes cannot hold the footprint; None when they can or are unknown."""
    if free is None or free >= fp.need:
        return None
    return (
        f"--save-dir {save_dir}: {savelayout.size_text(free)} free on its file system",
        f"at least {savelayout.size_text(fp.need)} for {fp.said}",
        "free space there, raise the group's quota (ABCI: the user portal; show_quota shows it), or --save-dir "
        "on a file system with room",
    )
