"""The exit file a job leaves for the next job of its chain (``.octo-dist-exit-12345.pbs1`` in the save directory):
one line, what it says decides whether the next job trains.

    0                                       finished, or stopped with every rank's checkpoint written
    stopping SIGTERM: asked to stop ...     written the moment a stop is asked: what stays when the scheduler's
                                            SIGKILL (PBS's kill delay) ends the job before its ranks saved
    143 resumable: stopped by SIGTERM ...   a stop, or a launcher killed from outside, that ended before every
                                            rank saved: the checkpoints written before are intact
    2                                       failed (bad settings, a rank's error): the chain stops there
    (empty)                                 the job could not write it (its file system was full)

The next job trains after "0", "stopping ..." and "N resumable: ...", from the newest checkpoint that verifies (the
ranks' ``--resume`` sets a damaged newer one aside); anything else stops the chain in one line. The file is read
at most ``MAX_BYTES``: a save directory is shared, and what lies there may be anything.
"""

from __future__ import annotations

import os
from typing import Optional, Tuple

MAX_BYTES = 4096  # an exit file octo-dist writes is one line of under 300 bytes
SHOWN = 80  # characters of a file's text an error shows
RESUMES = "a chained job resumes from the newest verified checkpoint"


def stopping(signal_name: str, seconds: int) -> str:
    """What the job leaves while it stops: ``stopping("TERM", 21)``."""
    return (
        f"stopping SIG{signal_name}: asked to stop after {seconds}s and ended before it said how the stop went "
        f"(the scheduler's SIGKILL after its kill delay?); {RESUMES}"
    )


def resumable(status: int, why: str) -> str:
    """``resumable(143, "stopped by SIGTERM, but ...")``: a job ended from outside with its checkpoints intact."""
    return f"{status} resumable: {why}; {RESUMES}"


def write(path: str, text: str) -> Optional[str]:
    """Replaces ``path`` with ``text`` and a newline, atomically (a reader never sees half of it); None, or why it
    could not (``"No space left on device"``: the file is then left empty, if it can be made at all, so the next
    job of the chain says what happened instead of resuming as after a scheduler's kill)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
        return None
    except OSError as e:
        why = e.strerror or str(e)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    try:
        open(path, "w").close()  # a new file needs no data block: this works on a full file system
    except OSError:
        pass
    return why


def shown(text: str) -> str:
    """At most ``SHOWN`` characters of ``text`` for one line of an error."""
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def read(path: str) -> Tuple[Optional[bool], str]:
    """(True: train after it; False: the previous job failed; None: the file is not one octo-dist writes, or
    empty), and what to say: its line, or what is wrong with it ("binary, 4096 bytes read")."""
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if not data.strip():
        return None, "empty"
    try:
        text = data[:MAX_BYTES].decode("utf-8")
    except UnicodeDecodeError:
        return None, f"binary ({len(data[:MAX_BYTES])} bytes read)"
    lines = text.strip().splitlines()
    if len(data) > MAX_BYTES or len(lines) != 1 or not lines[0].isprintable():
        more = "over " if len(data) > MAX_BYTES else ""
        return (
            None,
            f"not one line of text ({more}{len(data[:MAX_BYTES])} bytes: {shown(text.strip())!r})",
        )
    line = lines[0]
    words = line.split()
    if words == ["0"]:
        return True, line
    if words[0] == "stopping" or (
        words[0].isascii() and words[0].isdigit() and words[1:2] == ["resumable:"]
    ):
        return True, line
    if words[0].isascii() and words[0].isdigit() and len(words) == 1 and len(line) <= 3:
        return False, line
    return None, f"not an exit status ({shown(line)!r})"
