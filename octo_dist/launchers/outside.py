"""Text from outside octo-dist, read with bounds and shown safely: files a user names, a scheduler's answers.

Three rules, each in one place so every caller keeps them:

* a read is bounded: ``read_text(path, limit)`` reads at most ``limit`` bytes and refuses more (``/dev/zero``, a
  50 MB ini file); a directory, an unreadable file or bytes that are not UTF-8 are refused in one line too;
* an outside command is bounded: ``run_command(argv, timeout_s)`` ends it (its whole process group) after
  ``timeout_s`` and keeps at most ``OUTPUT_LIMIT`` bytes of each stream; bytes that are not UTF-8 become ``\\xff``;
* what is shown is escaped: ``escape("\\x1b[31mred")`` -> ``"\\\\x1b[31mred"``, so an ESC/OSC sequence in an ini value
  or a scheduler's error cannot recolour, retitle or rewrite the user's terminal, and a message stays one line.

Standard library only: ``octo-dist launch`` runs on a login node's bare Python.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import stat
import subprocess
import threading
from typing import IO, List, Optional, Sequence

from octo_dist.problems import Problem, Refusal

OUTPUT_LIMIT = (
    1 << 16
)  # bytes kept of each stream of an outside command: a job id or an error fits many times

# C0 controls (ESC, BEL, CR, newline...), DEL, and C1 controls (U+0080-U+009F: U+009B is a one-character CSI on
# terminals that honour 8-bit controls).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class InputError(Refusal, ValueError):
    """Outside input that cannot be used: what was found, what was expected, the fix (one line)."""

    def __init__(self, found: str, expected: str, fix: str):
        super().__init__(found, expected, fix)  # str(): "found; expected .... Fix: ..."


def escape(text: str) -> str:
    """``text`` with every control character written as an escape: ``"a\\x1b]0;t\\x07\\nb"`` ->
    ``"a\\\\x1b]0;t\\\\x07\\\\nb"`` (tab, newline and carriage return as ``\\\\t``, ``\\\\n``, ``\\\\r``)."""

    def one(m: "re.Match[str]") -> str:
        c = m.group()
        return {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(c) or f"\\x{ord(c):02x}"

    return _CONTROL.sub(one, text)


def shown(text: str, limit: int = 500) -> str:
    """``text`` escaped (:func:`escape`) and cut to ``limit`` characters, for one line of a message."""
    text = escape(text.strip())
    return (
        text if len(text) <= limit else text[:limit] + f"... ({len(text) - limit} more characters)"
    )


def decode(data: bytes) -> str:
    """Bytes from outside as text: UTF-8, with any other byte kept visible as ``\\xff`` (never an exception)."""
    return data.decode("utf-8", errors="backslashreplace")


def read_bytes(path: str, limit: int, what: str, fix: str) -> bytes:
    """At most ``limit`` bytes of ``path``; FileNotFoundError passes through (callers decide if absent is fine).

    ``what`` names the file in messages (``"--env-file"`` -> ``"--env-file f.env is a directory"``; ``""``: the
    path alone).

    Raises:
      InputError: a directory, an unreadable file, or one longer than ``limit`` (``/dev/zero`` included).
    """
    what = f"{what} {path}" if what else str(path)
    try:
        # A FIFO's open blocks until a writer comes (forever, for a stray one): refused before opening.
        mode = os.stat(path).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            kind = "FIFO" if stat.S_ISFIFO(mode) else "socket"
            raise InputError(f"{what} is a {kind}, not a file", "a regular file", fix)
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise InputError(f"{what} is a directory", "a file", fix) from None
    except OSError as e:
        raise InputError(
            f"{what} cannot be read ({e.strerror or e})", "a readable file", fix
        ) from None
    if len(data) > limit:
        raise InputError(
            f"{what} is longer than {limit} bytes (read stopped there)",
            f"a file of at most {limit} bytes",
            fix,
        )
    return data


def read_text(path: str, limit: int, what: str, fix: str) -> str:
    """:func:`read_bytes`, decoded as UTF-8.

    Raises:
      InputError: as :func:`read_bytes`, or bytes that are not UTF-8 (a binary file), naming the first one.
    """
    data = read_bytes(path, limit, what, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{f'{what} {path}' if what else path} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})",
            "a UTF-8 text file",
            fix,
        ) from None


@dataclasses.dataclass(frozen=True)
class Finished:
    """An outside command that ended: its exit status and (bounded, decoded) output."""

    argv: tuple
    returncode: int
    stdout: str
    stderr: str


class CommandTimeout(Problem, RuntimeError):
    """An outside command that did not end within its timeout (it was killed, with its process group)."""

    def __init__(self, argv: Sequence[str], timeout_s: float, stderr: str):
        super().__init__(f"{' '.join(argv)} did not end within {timeout_s:g} s")
        self.argv, self.timeout_s, self.stderr = tuple(argv), timeout_s, stderr


def _drain(stream: IO[bytes], keep: List[bytes], limit: int) -> None:
    """Read ``stream`` to its end, keeping its first ``limit`` bytes (reading on, so the writer never blocks)."""
    kept = 0
    for block in iter(lambda: stream.read1(1 << 14), b""):
        if kept < limit:
            keep.append(block[: limit - kept])
            kept += len(keep[-1])
    stream.close()


def run_command(
    argv: Sequence[str], timeout_s: float, limit: int = OUTPUT_LIMIT, env: Optional[dict] = None
) -> Finished:
    """Run ``argv`` with no input, at most ``timeout_s`` seconds; keep at most ``limit`` bytes of each stream.

    Raises:
      FileNotFoundError: no such command.
      CommandTimeout: it did not end in time; it and every process it started were killed.
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # its own process group: a timeout ends the children it forked too
    )
    out: List[bytes] = []
    err: List[bytes] = []
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out, limit), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err, limit), daemon=True),
    ]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        # A grandchild that left the group may hold the pipes open: do not wait on the readers for ever.
        for r in readers:
            r.join(timeout=5)
        raise CommandTimeout(argv, timeout_s, decode(b"".join(err))) from None
    for r in readers:
        r.join(timeout=5)
    return Finished(tuple(argv), proc.returncode, decode(b"".join(out)), decode(b"".join(err)))
