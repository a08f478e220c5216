"""Where a job finds its wandb key, and what is there: the job runtime reads the key from these places when the job
starts (``prepare.wandb_key``, which also checks the key file's mode and content); they are the places launch's
check looks at when it renders or submits the job (``jobwarnings``), and this module is where both can read them
(the job runtime's zipapp carries ``supervisor/``, not ``jobwarnings``).

The places, in order: ``WANDB_API_KEY``; the key file (``$WANDB_KEY_FILE``, else
``~/.config/octo-dist/wandb_api_key``); an ``api.wandb.ai`` entry in ``~/.netrc``. Nothing is opened blocking (a
plain open of a FIFO waits for a writer, for ever when none comes) and nothing is read unbounded (``/dev/zero``).
Standard library only: this module is part of the job runtime's zipapp.
"""

from __future__ import annotations

import os
import stat
from typing import Callable, Mapping, Optional

from octo_dist import problems

KEY_FILE_ENV = "WANDB_KEY_FILE"
KEY_FILE = os.path.join(
    ".config", "octo-dist", "wandb_api_key"
)  # under $HOME, unless $WANDB_KEY_FILE
# Bytes read of a key file or ~/.netrc at the most: a key is under 100, a netrc with many hosts fits.
READ_LIMIT = 1 << 16


def key_file(environ: Mapping[str, str]) -> str:
    """``$WANDB_KEY_FILE``, else :func:`default_key_file`."""
    return environ.get(KEY_FILE_ENV) or default_key_file(environ)


def default_key_file(environ: Mapping[str, str]) -> str:
    """``$HOME/.config/octo-dist/wandb_api_key``: ``/home/u/.config/octo-dist/wandb_api_key``."""
    return os.path.join(_home(environ), KEY_FILE)


def netrc(environ: Mapping[str, str]) -> str:
    """``$HOME/.netrc``, where ``wandb login`` writes the key."""
    return os.path.join(_home(environ), ".netrc")


def _home(environ: Mapping[str, str]) -> str:
    return environ.get("HOME", os.path.expanduser("~"))


def read_small(path: str) -> Optional[str]:
    """The first 64 KiB of ``path`` as text; None when it is not a regular file here (missing, a directory, a FIFO,
    a device, a socket) or cannot be read. Opened without blocking, and the type checked on what was opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, READ_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


IS_A_FILE = "is a file"


def what_is(path: str) -> str:
    """What is at ``path``, for a message: ``"is a file"``; ``"does not exist"``; ``"is a FIFO, not a file"`` (a
    directory, a socket, a device: ``/dev/zero``); ``"is a file this user cannot read (Permission denied)"``;
    ``"cannot be reached (Permission denied)"`` (a directory on the way). Opens a regular file only, without
    blocking, to learn whether it can be read."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return f"cannot be reached ({e.strerror or e})"
    if not stat.S_ISREG(mode):
        return f"is a {problems.file_kind(mode)}, not a file"
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as e:
        return f"is a file this user cannot read ({e.strerror or e})"
    return IS_A_FILE


def key_found(
    environ: Mapping[str, str], read: Callable[[str], Optional[str]] = read_small
) -> bool:
    """Whether a job with ``--wandb-mode online`` finds a key in one of the places: ``read(path)`` is the file's
    text, None when there is none (:func:`read_small`)."""
    if environ.get("WANDB_API_KEY"):
        return True
    if read(key_file(environ)) is not None:
        return True
    return "api.wandb.ai" in (read(netrc(environ)) or "")


def places(environ: Mapping[str, str]) -> str:
    """The places and what is there, for a message: ``"WANDB_API_KEY is unset, /home/u/.config/octo-dist/
    wandb_api_key is a FIFO, not a file, and ~/.netrc has no api.wandb.ai entry"``."""
    found = what_is(netrc(environ))
    found = "has no api.wandb.ai entry" if found in (IS_A_FILE, "does not exist") else found
    path = key_file(environ)
    return f"WANDB_API_KEY is unset, {path} {what_is(path)}, and ~/.netrc {found}"
