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

import dataclasses
import os
import re
import stat
from typing import Optional, Tuple

from octo_dist import problems

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


# What an exit file says (``ExitLine.kind``), in the words of the module docstring's table.
DONE = "done"  # "0"
STOPPING = "stopping"  # "stopping SIGTERM: ..."
RESUMABLE = "resumable"  # "143 resumable: ..."
FAILED = "failed"  # "2"
EMPTY = "empty"  # "": the job could not write it
FOREIGN = "foreign"  # anything else: not a line octo-dist writes (binary, several lines, "²", a directory, a FIFO)


@dataclasses.dataclass(frozen=True)
class ExitLine:
    """One exit file, parsed: the one reading the next job of a chain (``prepare.previous_job``) and ``octo-dist
    jobs`` share. ``kind``: one of the constants above; ``status``: the exit status it names (``"143 resumable:
    ..."`` -> 143, ``"0"`` -> 0, ``"stopping ..."`` -> None); ``said``: the line, or what is wrong with the file
    ("binary, 4096 bytes read")."""

    kind: str
    status: Optional[int]
    said: str

    @property
    def trains_next(self) -> Optional[bool]:
        """True: the next job of a chain trains after it; False: it failed, the chain stops; None: octo-dist did
        not write it (or could not: empty)."""
        if self.kind in (DONE, STOPPING, RESUMABLE):
            return True
        return False if self.kind == FAILED else None


def _status(word: str) -> Optional[int]:
    """``"143"`` -> 143; None for anything but 1 to 3 ASCII digits (not ``"²"`` or ``"٣"``, which isdigit()
    passes)."""
    return int(word) if re.fullmatch(r"[0-9]{1,3}", word) else None


def parse(data: bytes) -> ExitLine:
    """What the first ``MAX_BYTES`` (+1) bytes of an exit file say: every line the job runtime writes (``"0"``,
    ``stopping(...)``, ``resumable(...)``, ``str(status)``, ``""``) and anything else found there."""
    if not data.strip():
        return ExitLine(EMPTY, None, "empty")
    try:
        text = data[:MAX_BYTES].decode("utf-8")
    except UnicodeDecodeError:
        return ExitLine(FOREIGN, None, f"binary ({len(data[:MAX_BYTES])} bytes read)")
    lines = text.strip().splitlines()
    if len(data) > MAX_BYTES or len(lines) != 1 or not lines[0].isprintable():
        more = "over " if len(data) > MAX_BYTES else ""
        what = (
            f"not one line of text ({more}{len(data[:MAX_BYTES])} bytes: {shown(text.strip())!r})"
        )
        return ExitLine(FOREIGN, None, what)
    line = lines[0]
    words = line.split()
    status = _status(words[0])
    if words[0] == "stopping" and words[1:2] and words[1].startswith("SIG"):
        return ExitLine(STOPPING, None, line)
    if status is not None and words[1:2] == ["resumable:"]:
        return ExitLine(RESUMABLE, status, line)
    if status is not None and len(words) == 1:
        return ExitLine(DONE if status == 0 else FAILED, status, line)
    return ExitLine(FOREIGN, None, f"not an exit status ({shown(line)!r})")


def load(path: str) -> Optional[ExitLine]:
    """The exit file at ``path``, parsed; None when there is none. Read without blocking and at most
    ``MAX_BYTES`` + 1: a FIFO or a device there (a save directory is shared) is named, never waited on.

    Raises:
      OSError: it exists but cannot be read (permissions).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return ExitLine(FOREIGN, None, "a directory, not a file")
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            return ExitLine(FOREIGN, None, "a directory, not a file")
        if not stat.S_ISREG(mode):
            return ExitLine(FOREIGN, None, f"a {problems.file_kind(mode)}, not a file")
        with os.fdopen(os.dup(fd), "rb") as f:
            return parse(f.read(MAX_BYTES + 1))
    finally:
        os.close(fd)


def read(path: str) -> Tuple[Optional[bool], str]:
    """(``ExitLine.trains_next``, and what to say: its line, or what is wrong with it) for the file at ``path``
    (``load``); a missing file reads as (None, "missing")."""
    found = load(path)
    return (None, "missing") if found is None else (found.trains_next, found.said)
