"""Checks on one value as the user gave it, refused in the words of its flag: ``--save-dir '-x'`` ->
``JobSpecError("--save-dir '-x' starts with '-'; expected a path ...")``. Pure; used by ``spec.build`` and the modules
it calls (``allocation``, ``training``, ``walltime``).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Optional, Sequence

from octo_dist.problems import Refusal
from octo_dist.jobs import settings as job_settings


class JobSpecError(Refusal, ValueError):
    """A job that must not be rendered: what was found, what was expected, and the fix (one line)."""


# Characters that end a comment or a quoted word in some reader of the script (bash, the scheduler, an editor), or
# hide text from the person reading it: C0/C1 controls (newline, carriage return, escape), format characters (bidi
# overrides, zero-width), line and paragraph separators.
# Lone surrogates too (Cs): what Python makes of bytes that are not UTF-8 in an argument; no file can hold them.
UNSAFE_CATEGORIES = job_settings.UNSAFE_CATEGORIES


def check_printable(label: str, value: str) -> None:
    """Refuse a value the job script cannot hold safely: ``"runs\\n touch X"`` -> JobSpecError.

    ``label`` names the value as the user gave it: a flag (``"--save-dir"``), ``"argument 3 after --"``, or a
    description that starts with "the" (``"the option"``)."""
    if len(value) > job_settings.MAX_TEXT:
        shorter = f"{label} shorter" if label.startswith("the ") else f"a shorter {label}"
        raise JobSpecError(
            f"{label} of {len(value)} characters ({value[:40]!r}...)",
            f"at most {job_settings.MAX_TEXT} (the longest path a Linux system call takes)",
            shorter,
        )
    bad = sorted({c for c in value if unicodedata.category(c) in UNSAFE_CATEGORIES})
    if bad:
        clean = "".join(c for c in value if c not in bad)
        raise JobSpecError(
            f"{label} {value!r} contains {', '.join(f'U+{ord(c):04X}' for c in bad)}",
            "printable characters only (a newline or control character can end a comment or a quoted "
            "word in the job script and run as a command)",
            f"{label} {clean!r}",
        )


def check_path(label: str, value: Optional[str], bound: bool) -> None:
    if value is None:
        return
    check_printable(label, value)
    if not value:
        raise JobSpecError(f"{label} ''", "a path", f"{label} PATH")
    if value.startswith("-"):
        raise JobSpecError(
            f"{label} {value!r} starts with '-'",
            "a path the script's commands cannot read as an option",
            f"{label} ./{value}",
        )
    if bound and (":" in value or "," in value):
        raise JobSpecError(
            f"{label} {value!r} contains ':' or ','",
            "a path without them: singularity --bind "
            "reads ':' as source:destination and ',' as a list",
            f"{label} with a path without them",
        )


# The largest batch, step count or sample count a flag takes: what every training program's int32 counters hold.
MAX_COUNT = 2**31 - 1


def positive(name: str, value: Optional[int], fix: str, most: int = MAX_COUNT) -> None:
    if value is not None and not 1 <= value <= most:
        raise JobSpecError(f"{name} {shown_number(value)}", f"{name} from 1 to {most}", fix)


def flag_given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def check_coordinator(value: str) -> None:
    check_printable("--coordinator", value)
    m = re.fullmatch(r"([A-Za-z0-9_.-]+):(\d{1,5})", value)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise JobSpecError(
            f"--coordinator {value!r}",
            "HOST:PORT with a port from 1 to 65535 (e.g. g0001:23456)",
            "drop --coordinator (octo-dist agrees one), or --coordinator g0001:23456",
        )


def shown_number(value: int) -> str:
    """A number as an error shows it: whole up to 20 digits, else its first 20 and how long it is
    (``10**3999`` -> ``"10000000000000000000... (4,000 digits)"``): a pasted run of digits must not fill the screen."""
    text = str(value)
    digits = text.lstrip("-")
    if len(digits) <= 20:
        return text
    return f"{text[: len(text) - len(digits) + 20]}... ({len(digits):,} digits)"
