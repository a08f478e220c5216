"""One shape for every problem a command reports: what was found, what was expected, the fix, and its exit status.

    raise Problem("--config.batch_size=-3", "a positive integer", "--config.batch_size=256")
    # str(): "--config.batch_size=-3; expected a positive integer. Fix: --config.batch_size=256"

Every layer raises a :class:`Problem` (or a subclass: ``LauncherError``, ``CheckpointError``...), and the entry
points (``octo_dist.apps.harness``, the CLIs) turn it into one line and ``exit_status``; none of them keeps a list
of which exceptions mean "refused". A new refusal type only has to derive from :class:`Problem` (or
:class:`Refusal`, exit 2). Standard library only, Python 3.9 compatible: the host-side layers import it on a login
node's bare Python.
"""

from __future__ import annotations

import stat
from typing import Optional

from octo_dist import EXIT_FAILED, EXIT_USAGE

# What a path is, by its mode, in the words a problem's ``found`` uses ("the run lock ... is a FIFO"): os.stat's types.
FILE_KINDS = (
    (stat.S_ISREG, "file"),
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
)


class Problem(Exception):
    """Something a command cannot do as asked, worded for the person who asked.

    Build it from parts (``Problem(found, expected, fix)``) or, for a message already worded one way, from one
    line (``Problem("disk full ...")``: then ``found`` is that line). ``exit_status`` is the class's unless given.

    Attributes:
      found: what was seen ("--nodes=0").
      expected: what would have worked ("a number >= 1"); may be empty.
      fix: the command or action that fixes it ("--nodes 2"); may be empty.
      exit_status: 2 (``EXIT_USAGE``) for input refused before anything ran, 1 (``EXIT_FAILED``) for a run that
        failed; the entry point exits with it.
      same_on_every_rank: whether every rank of a job meets it alike (the same flags, the same shared files), so
        rank 0 alone reports it and the ranks stop together; else the rank that met it reports it and ends the job.
    """

    exit_status = EXIT_FAILED
    same_on_every_rank = False

    def __init__(
        self, found: str, expected: str = "", fix: str = "", *, exit_status: Optional[int] = None
    ):
        super().__init__(found)
        self.found, self.expected, self.fix = str(found), str(expected), str(fix)
        if exit_status is not None:
            self.exit_status = exit_status

    def __str__(self) -> str:
        return line(self.found, self.expected, self.fix)

    def as_dict(self) -> dict:
        return {
            "found": self.found,
            "expected": self.expected,
            "fix": self.fix,
            "exit_status": self.exit_status,
        }


class Refusal(Problem):
    """Input refused before anything ran (a flag, a config, an environment): exit 2, the same on every rank."""

    exit_status = EXIT_USAGE
    same_on_every_rank = True


def line(found: str, expected: str = "", fix: str = "") -> str:
    """``"x; expected y. Fix: z"``, leaving out the parts that are empty (the one wording every problem has)."""
    text = str(found)
    if expected:
        text += f"; expected {expected}"
    if fix:
        text += f". Fix: {fix}"
    return text


def file_kind(mode: int) -> str:
    """What a path is by its ``st_mode``, as a message names it: ``"file"``, ``"directory"``, ``"FIFO"``,
    ``"character device"`` (``/dev/null``); ``"special file"`` for any other."""
    return next((name for test, name in FILE_KINDS if test(mode)), "special file")


def exit_status(error: BaseException) -> Optional[int]:
    """The exit status ``error`` means when it is a :class:`Problem`, else None (a bug: let it raise)."""
    return error.exit_status if isinstance(error, Problem) else None
