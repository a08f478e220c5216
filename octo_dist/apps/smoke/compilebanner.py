"""XLA's slow-compile banner, shown once per ``octo-dist smoke --check-equivalence`` (``make smoke``).

When one compilation takes over two minutes (a tiny model on a loaded or emulated CPU), XLA's slow-operation alarm
logs a banner, and logs it again, after "The operation took ...", when the compilation ends::

    2026-08-15 06:23:03.016556: E external/xla/xla/service/slow_operation_alarm.cc:65]
    ********************************
    [Compiling module jit_step] Very slow compile? If you want to file a bug, run with envvar XLA_FLAGS=...
    ********************************
    2026-08-15 06:24:05.368570: E external/xla/xla/service/slow_operation_alarm.cc:140] The operation took 3m2.369747s

    ********************************
    [Compiling module jit_step] Very slow compile? If you want to file a bug, run with envvar XLA_FLAGS=...
    ********************************

and every process of the check does the same (the reference, then each rank under mpirun): up to six banners for
one slow machine. :class:`CompileBanner` keeps the first banner whole (it names the module and how to dump it) and
the one line saying how long each slow compilation took; the repeats are left out. It is not hidden altogether:
on a machine where the smoke job's compile takes minutes, that is worth one look. Pure over lines of text, so it
is tested on recorded output.
"""

from __future__ import annotations

import re
import threading
from typing import IO

# "2026-08-15 06:23:03.016556: E external/xla/xla/service/slow_operation_alarm.cc:65] " (the file's path and line
# differ between XLA versions; the file name does not)
ALARM = re.compile(r"\bslow_operation_alarm\.cc:\d+\]\s?(.*)$")
# The banner's own lines: "********************************" around "[Compiling module jit_step] Very slow compile? ..."
SEPARATOR = re.compile(r"\*{8,}")
SLOW_COMPILE = "Very slow compile?"
BANNER_LINES = 3  # separator, "... Very slow compile? ...", separator


class CompileBanner:
    """Decides, line by line, what of a process's stderr is shown: :meth:`keep` is False for a repeated banner.

    A line that is not XLA's alarm passes. Lines of several processes may come interleaved (mpirun forwards each
    rank's lines as they come), so the banner's lines are told by their text, not by their order."""

    def __init__(self) -> None:
        self.banner_shown = 0  # lines of the first banner passed so far (up to BANNER_LINES)
        self.alarm_shown = False
        self.after_took = False

    def keep(self, line: str) -> bool:
        text = line.rstrip("\r\n")
        after_took, self.after_took = self.after_took, False
        alarm = ALARM.search(text)
        if alarm:
            rest = alarm.group(1)
            if rest.startswith("The operation took"):
                self.after_took = True
                return True  # one line: how long that compilation took
            if rest and SLOW_COMPILE not in rest:
                return True  # another of XLA's slow-operation alarms: not this banner
            shown, self.alarm_shown = self.alarm_shown, True
            if rest:  # the message on the alarm's own line (an XLA that logs it there)
                self.banner_shown += 1
            return not shown
        if self.alarm_shown and (SEPARATOR.fullmatch(text.strip()) or SLOW_COMPILE in text):
            if self.banner_shown < BANNER_LINES:
                self.banner_shown += 1
                return True
            return False
        if after_took and not text.strip():
            return False  # the blank line XLA puts between "The operation took ..." and the banner's copy
        return True


def forward(source: IO[bytes], sink: IO[bytes], banner: CompileBanner) -> threading.Thread:
    """Copy ``source`` to ``sink`` line by line, without the banner's repeats, on a daemon thread (started)."""

    def copy() -> None:
        for raw in iter(source.readline, b""):
            if banner.keep(raw.decode("utf-8", errors="backslashreplace")):
                sink.write(raw)
                sink.flush()
        source.close()

    thread = threading.Thread(target=copy, name="smoke-stderr", daemon=True)
    thread.start()
    return thread
