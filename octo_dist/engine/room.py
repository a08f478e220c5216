"""How much room a run's checkpoints take, and how much a file system has: the arithmetic in which the save
directory's checks before training (``savedir``) and a save that found the disk full (``checkpoint``) both speak.

    one = room.checkpoint_nbytes(room.state_nbytes(state))          # an upper bound for one checkpoint
    copies = room.copies_needed(max_to_keep=3, saves=10)            # 4: 3 kept plus 1 being written
    room.space_problem("/groups/gxx00000/run", room.free_bytes(d), state_bytes, copies)   # None, or one line

Pure functions over numbers (``free_bytes`` reads ``statvfs``; ``state_nbytes`` imports JAX when called), so both
modules import this one and neither imports the other for it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional

from octo_dist import savelayout

COPIES = 2  # room for the checkpoint being written while the previous one is still kept (see copies_needed)
# zarr/orbax metadata and chunk headers, on top of the arrays' bytes; chunks are compressed, so an upper bound.
OVERHEAD = 1.05
OVERHEAD_BYTES = 1 << 20
# How a size is said ("1.1 GiB"), alike on the other side of the job; room.size_text for engine/checkpoint.py.
size_text = savelayout.size_text


def state_nbytes(tree) -> int:
    """Bytes of a state's arrays: ``jax.ShapeDtypeStruct`` leaves (``jax.eval_shape``) or real arrays."""
    import jax
    import numpy as np

    return sum(
        math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree_util.tree_leaves(tree)
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype")
    )


def checkpoint_nbytes(state_bytes: int) -> int:
    """An upper bound for one checkpoint of a state of ``state_bytes``."""
    return int(state_bytes * OVERHEAD) + OVERHEAD_BYTES


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged user can still write where ``directory`` is (or would be created)."""
    path = Path(directory).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def copies_needed(max_to_keep: Optional[int], saves: int, kept_now: int = 0) -> int:
    """Checkpoints of free room a run needs at its fullest: the ones kept plus the one being written, less those
    already on disk (``kept_now``, a resumed run's; the free space already excludes them).

    Pruning runs only after a save is complete, so during the j-th save of the run the directory holds
    ``min(max_to_keep, kept_now + j - 1)`` complete checkpoints and the one being written. ``max_to_keep`` None or
    0 keeps all; ``saves``: how many this run writes. ``copies_needed(3, 10)`` -> 4; ``copies_needed(3, 10, 3)``
    -> 1; ``copies_needed(3, 1)`` -> 1."""
    if saves <= 0:
        return 0
    fullest = kept_now + saves - 1 if not max_to_keep else min(max_to_keep, kept_now + saves - 1)
    return max(1, fullest + 1 - kept_now)


def room_phrase(copies: int, one: int, kept_now: int = 0) -> str:
    """``"4 checkpoints of 1.1 MiB each: 3 kept plus 1 being written"``, for the messages about room."""
    kept = copies - 1 + kept_now
    on_disk = f", {kept_now} of them already there" if kept_now else ""
    return (
        f"{copies} checkpoint{'s' if copies != 1 else ''} of {size_text(one)} each: "
        f"{kept} kept plus 1 being written{on_disk}"
    )


def space_problem(
    directory, free: int, state_bytes: int, copies: int = COPIES, kept_now: int = 0
) -> Optional[str]:
    """None when ``free`` bytes hold ``copies`` checkpoints of a ``state_bytes`` state (:func:`copies_needed`);
    else the one-line problem."""
    one = checkpoint_nbytes(state_bytes)
    need = copies * one
    if free >= need:
        return None
    return (
        f"save directory {directory} has {size_text(free)} free; expected at least {size_text(need)} "
        f"({room_phrase(copies, one, kept_now)}, for this run's state). Fix: free space there (old runs, "
        f"*.damaged steps), or pass a --save-dir on a larger file system"
    )
