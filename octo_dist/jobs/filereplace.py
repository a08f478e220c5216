"""A file octo-dist writes is replaced whole, never written through: a job script (``launch -o``), the job runtime's
zipapp (``job-runtime -o``), a save directory's record of its jobs.

    with replacing("runs/ft/.octo-dist-jobs.json", 0o644) as f:
        json.dump(records, f)

The new content goes to a file of a random name in the same directory (``mkstemp``: created, never opened through
whatever lies there, a planted link included), which is renamed over the path when the block ends: a reader sees
the old file or the new one, never half of one, and what was there (a link, a file of another owner) is replaced,
not written through. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator

from octo_dist import problems


@contextlib.contextmanager
def replacing(path: str, mode: int, binary: bool = False) -> Iterator[IO]:
    """The new file for ``path`` to write in the block, given ``mode`` (``0o755``: a script) and renamed over
    ``path`` at its end; on any error (the block's included) the new file is removed and ``path`` left as it was."""
    # Both names through the same absolute directory: a relative path resolved from the working directory may cross
    # a mount that the absolute path does not (a bind mount over the submit directory), and rename() then fails
    # with EXDEV ("Invalid cross-device link"), as it did in a node's mount namespace.
    directory = os.path.dirname(os.path.abspath(path))
    target = os.path.join(directory, os.path.basename(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            yield f
            os.fchmod(
                f.fileno(), mode
            )  # mkstemp's 0600 would hide a record from the group, a script from exec
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def existing_kind(path: str) -> str:
    """What is at ``path`` now: "" (nothing), "file", or what else it is ("character device", "directory")."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return ""
    return problems.file_kind(mode)
