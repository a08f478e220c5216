"""``--walltime``: parsing what people type (``"1:30:00"``, ``"2-00:00:00"``), refusing what schedulers read
otherwise (``"30:00"``), the fix a refused value most likely meant, and how a wall time is shown and costed.
"""

from __future__ import annotations

import re

from octo_dist.jobs import settings as job_settings

# Shown the way every scheduler reads it ("72:00:00"); defined beside the settings, which check wall times too.
from octo_dist.jobs.settings import format_walltime as format_walltime
from octo_dist.jobs.flagchecks import JobSpecError

MOST_S = job_settings.BOUNDS[
    "walltime_s"
].high  # the longest wall time any job takes (a year), in seconds


WALLTIME_RE = re.compile(r"(?:(\d+)-)?(\d+):([0-5]\d)(?::([0-5]\d))?")
# Two fields, "30:00": PBS (walltime=[[HH:]MM:]SS), SLURM (--time=MM:SS) and Grid Engine (h_rt=[[H:]M:]S) all read
# minutes:seconds, while people mean hours:minutes as often as not; 30 hours instead of 30 minutes (or the reverse)
# costs a day in the queue or the run, so two fields are refused with both readings spelled out.
TWO_FIELDS_RE = re.compile(r"(\d+):(\d\d)")
# "12h", "30m", "90min", "2d", "1h30m", "45s": what people type for a duration, read to suggest H:MM:SS.
UNITS_RE = re.compile(
    r"(?:(\d+)\s*d(?:ays?)?)?\s*(?:(\d+)\s*h(?:ours?|rs?)?)?\s*(?:(\d+)\s*m(?:in(?:utes?)?)?)?"
    r"\s*(?:(\d+)\s*s(?:ec(?:onds?)?)?)?",
    re.IGNORECASE,
)


def walltime_fix(text: str) -> str:
    """The ``--walltime`` a refused value most likely meant, in the H:MM:SS form every scheduler reads alike:
    ``"12h"`` -> ``"12:00:00"``, ``"1h30m"`` -> ``"1:30:00"``, ``"2d"`` -> ``"2-00:00:00"``, ``"30:00"`` -> both
    readings (``"0:30:00 (30 minutes) or 30:00:00 (30 hours)"``); anything else -> ``"1:30:00"``."""
    text = text.strip()
    m = TWO_FIELDS_RE.fullmatch(text)
    if m:
        first, second = int(m.group(1)), int(m.group(2))
        return (
            f"{format_walltime(first * 60 + second)} ({first} min {second} s, as the schedulers read it) or "
            f"{format_walltime(first * 3600 + second * 60)} ({first} h {second} min)"
        )
    m = UNITS_RE.fullmatch(text)
    if text and m and any(m.groups()) and len(text) <= 20:
        days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
        total = ((hours * 60) + minutes) * 60 + seconds
        if days and not total:
            return f"{days}-00:00:00"
        if 0 < days * 86400 + total <= MOST_S:
            return format_walltime(days * 86400 + total)
    if text.isascii() and text.isdigit() and len(text) <= 9 and int(text) > 0:
        return bare_number_readings(int(text))
    return "1:30:00"


def bare_number_readings(n: int) -> str:
    """Each reading of a bare number as a wall time, named, in H:MM:SS: ``90`` -> ``"90:00:00 (90 hours), 1:30:00
    (90 minutes, as SLURM reads a bare number) or 0:01:30 (90 seconds, as PBS and Grid Engine read it)"``. The
    schedulers disagree (PBS and Grid Engine read seconds, SLURM minutes) and people mean hours as often: the fix
    names every reading rather than picking one for the reader."""
    readings = []
    if n * 3600 <= MOST_S:
        readings.append(f"{_short(n * 3600)} ({n} hours)")
    if n * 60 <= MOST_S:
        readings.append(f"{_short(n * 60)} ({n} minutes, as SLURM reads a bare number)")
    readings.append(f"{_short(n)} ({n} seconds, as PBS and Grid Engine read it)")
    return ", ".join(readings[:-1]) + " or " + readings[-1] if len(readings) > 1 else readings[0]


def _short(seconds: int) -> str:
    """``5400`` -> ``"1:30:00"``: H:MM:SS without a leading zero, as people type it."""
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def parse_walltime(text: str, label: str = "--walltime") -> int:
    """``"1:30:00"`` (H:MM:SS) / ``"2-00:00:00"`` / ``"2-00:00"`` (D-H:MM[:SS], SLURM's days) -> seconds; nothing
    around it. Two fields (``"30:00"``) are refused: the schedulers read minutes:seconds, people often mean hours.
    ``label`` names where the value came from (``"--walltime"``, ``"walltime in ./octo-dist.ini line 3"``)."""
    if len(text) <= 20 and TWO_FIELDS_RE.fullmatch(text):
        raise JobSpecError(
            f"{label} {text}, two fields, which PBS, SLURM and Grid Engine all read as minutes:seconds",
            "H:MM:SS (three fields), so that no one reads hours for minutes",
            f"--walltime {walltime_fix(text)}",
        )
    m = WALLTIME_RE.fullmatch(text)
    if not m or not any(int(g or 0) for g in m.groups()) or len(text) > 20:
        raise JobSpecError(
            f"{label} {text[:40]!r} is not a wall time",
            "H:MM:SS or D-H:MM:SS, more than zero (e.g. 1:30:00)",
            f"--walltime {walltime_fix(text)}",
        )
    days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total > MOST_S:
        raise JobSpecError(
            f"{label} {text} ({total} s)",
            f"at most {MOST_S // 86400} days",
            "--walltime 7-00:00:00 (ABCI 3.0 allows up to 168 hours on rt_HF)",
        )
    return total


def node_hours(nodes: int, walltime_s: int) -> str:
    """``(2, 1800)`` -> ``"1 node-hour"``, ``(2, 5400)`` -> ``"3 node-hours"``, ``(1, 600)`` -> ``"0.17 node-hours"``:
    what the job may use at most (sites charge by it; ABCI's points are node-hours x the resource type's rate)."""
    value = nodes * walltime_s / 3600
    shown = f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"
    return f"{shown} node-hour{'' if shown == '1' else 's'}"


def time_summary(job) -> str:
    """The wall time and what it may cost, for the line that says the script was written:
    ``"wall time 00:30:00, at most 1 node-hour"`` (2 nodes, ``--walltime 0:15:00``)."""
    walltime_s = job.settings.timing.walltime_s
    return f"wall time {format_walltime(walltime_s)}, at most {node_hours(job.settings.allocation.nodes, walltime_s)}"
