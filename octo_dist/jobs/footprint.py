"""How much room a fine-tune's save directory will take, against the free space where it is, before the job queues.

ABCI 3.0's group area starts at 0 TB (system-overview: ``/groups``' initial capacity is 0 TB, raised in the user
portal), and a run that fills it dies at its first checkpoint, after the queue wait. ``launch`` estimates the run's
footprint: the checkpoints kept at its fullest (the fine-tune keeps 3, plus the one being written) x one
checkpoint's size (the train state: the model's parameters and Adam's two moments, float32, from the model's
config: ``token_embedding_size`` 384 is Octo-Small, 27M parameters), plus the image; it compares that with the
free space it can read there: ``os.statvfs``'s, and, where ``show_quota`` answers (ABCI's login nodes), the room
left in the quota of the area that holds the save directory (a group quota is not in ``statvfs``: the Lustre file
system under ``/groups`` has petabytes free while the group's quota is 0 TB).

Pure over a reader of small files, a size-of-file callable, a free-space callable and ``show_quota``'s text, so
tests fabricate them.
"""

from __future__ import annotations

import json
import os
import re
from typing import Callable, List, NamedTuple, Optional, Tuple

from octo_dist import savelayout
from octo_dist.launchers import outside

# Octo's published models by token_embedding_size (their config.json): parameters.
OCTO_PARAMS = {384: ("Octo-Small", 27_000_000), 768: ("Octo-Base", 93_000_000)}
STATE_ARRAYS = 3  # parameters + Adam's mu and nu, each float32
BYTES_PER_VALUE = 4
KEPT = 3  # engine.train.TrainConfig.max_to_keep's default
COPIES = KEPT + 1  # pruning runs after a save completes: 3 kept and 1 being written
IMAGE_BYTES = 8 << 30  # a cuda12 .sif not built yet (CUDA 12 wheels, TensorFlow, JAX): about 8 GiB
# ABCI 3.0's show_quota (user guide, getting-started, "Checking Disk Quota"); -b G: GiB, not its default whole TiB
# (a 500 GiB quota would read "0"):
#   Disk quotas for ABCI group grpname
#     Directory                          used(GiB)        limit(GiB)      used(nfiles)     limit(nfiles)
#     /groups/grpname                          312             32768            422372         200000000
QUOTA_COMMAND = ("show_quota", "-b", "G")
QUOTA_TIMEOUT_S = 30  # it reads the file system's quota records: seconds at most
QUOTA_HEADER = re.compile(r"^\s*Directory\s+used\((\w+)\)\s+limit\((\w+)\)", re.M)
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}


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


class Quota(NamedTuple):
    """One row of ``show_quota``: ``/groups/grpname  312  32768 ...`` (GiB) -> ("/groups/grpname", 312 GiB, 32 TiB)."""

    directory: str
    used: int  # bytes
    limit: int  # bytes; 0 in a new group area ("initial capacity 0 TB": nothing may be written yet)
    over: bool  # show_quota marks a usage past the limit with "*"

    @property
    def free(self) -> int:
        return 0 if self.over else max(self.limit - self.used, 0)


def _amount(field: str) -> Optional[float]:
    """ "32768" / "1,024" (thousands separators) / "0.08" / "312*" (over the limit) -> a number; "*" -> None."""
    try:
        return float(field.replace(",", "").strip("*"))
    except ValueError:
        return None


def parse_quota(text: str) -> List[Quota]:
    """``show_quota``'s tables -> one :class:`Quota` per directory row, in the unit its table's header names
    (``used(GiB)``); a table in a unit not known, or a row that is not numbers, is skipped."""
    out, scale = [], None
    for line in text.splitlines():
        header = QUOTA_HEADER.match(line)
        if header:
            same = header.group(1) == header.group(2)
            scale = UNITS.get(header.group(1)) if same else None
            continue
        # "Disk quotas for ABCI group grpname": the next table's title
        if line.startswith("Disk quotas"):
            scale = None
            continue
        fields = line.split()
        if scale is None or len(fields) < 3 or not fields[0].startswith("/"):
            continue
        used, limit = _amount(fields[1]), _amount(fields[2])
        over = "*" in fields[1]
        if limit is None or (used is None and not over):
            continue
        limit_bytes = int(limit * scale)
        used_bytes = limit_bytes if used is None else int(used * scale)
        out.append(Quota(fields[0], used_bytes, limit_bytes, over))
    return out


def read_quotas(run=outside.run_command) -> List[Quota]:
    """What ``show_quota -b G`` says on this host; [] where there is none (not ABCI), or it fails or hangs."""
    try:
        done = run(list(QUOTA_COMMAND), QUOTA_TIMEOUT_S)
    except (OSError, outside.CommandTimeout):
        return []
    return parse_quota(done.stdout) if done.returncode == 0 else []


def quota_of(directory: str, quotas: List[Quota]) -> Optional[Quota]:
    """The quota whose directory holds ``directory`` (the innermost), its path taken as written and resolved."""
    paths = {os.path.abspath(directory), os.path.realpath(directory)}
    holding = [
        q
        for q in quotas
        if any(
            p == q.directory.rstrip("/") or p.startswith(q.directory.rstrip("/") + "/")
            for p in paths
        )
    ]
    return max(holding, key=lambda q: len(q.directory), default=None)


class Free(int):
    """Bytes free for a save directory, with where they were read: ``where`` is "on its file system" or "in the
    quota of /groups/gxx00000 (show_quota: 312.0 GiB of 32.0 TiB used)"."""

    where: str

    def __new__(cls, n: int, where: str) -> "Free":
        self = super().__new__(cls, n)
        self.where = where
        return self


ON_FILE_SYSTEM = "on its file system"


def free_bytes(directory: str, quotas: Callable[[], List[Quota]] = read_quotas) -> Optional[int]:
    """Bytes an unprivileged user can still write where ``directory`` is or would be created: the file system's,
    or what the quota of the area holding it leaves where that is less (``quotas``: show_quota's rows, read
    here); None when neither can be read."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path)
        on_disk: Optional[int] = st.f_bavail * st.f_frsize
    except OSError:
        on_disk = None
    quota = quota_of(directory, quotas())
    if quota is not None and (on_disk is None or quota.free < on_disk):
        used, limit = savelayout.size_text(quota.used), savelayout.size_text(quota.limit)
        return Free(
            quota.free, f"in the quota of {quota.directory} (show_quota: {used} of {limit} used)"
        )
    return None if on_disk is None else Free(on_disk, ON_FILE_SYSTEM)


def shortfall(save_dir: str, fp: Footprint, free: Optional[int]) -> Optional[Tuple[str, str, str]]:
    """(found, expected, fix) when ``free`` bytes cannot hold the footprint; None when they can or are unknown."""
    if free is None or free >= fp.need:
        return None
    return (
        f"--save-dir {save_dir}: {savelayout.size_text(free)} free {getattr(free, 'where', ON_FILE_SYSTEM)}",
        f"at least {savelayout.size_text(fp.need)} for {fp.said}",
        "free space there, raise the group's quota (ABCI: the user portal; show_quota shows it), or --save-dir "
        "on a file system with room",
    )
