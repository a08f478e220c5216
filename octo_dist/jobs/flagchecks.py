"""Checks on one value as the user gave it, refused in the words of its flag: ``--save-dir '-x'`` ->
``JobSpecError("--save-dir '-x' starts with '-'; expected a path ...")``. Pure; used by ``spec.build`` and the modules
it calls (``allocation``, ``training``, ``walltime``).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from octo_dist.jobs import settings as job_settings
from octo_dist.jobs.settings import JobSpecError, shown_number

__all__ = [
    "JobSpecError",
    "shown_number",
    "check_printable",
    "check_path",
    "flag_given",
]


def check_printable(label: str, value: str) -> None:
    """Refuse a value the job script cannot hold safely: ``"runs\\n touch X"`` -> JobSpecError; the settings' own
    text check (``settings.check_text``), in the words of ``label``: a flag (``"--save-dir"``),
    ``"argument 3 after --"``, or a description that starts with "the" (``"the option"``)."""
    job_settings.check_text(label, value, flags=True)


def check_path(label: str, value: Optional[str], bound: bool) -> None:
    """A path given to ``label``: printable, not empty, not starting with '-' (the settings' path check), and,
    ``bound`` into the image, without the ':' and ',' singularity's --bind reads."""
    if value is None:
        return
    if not value:
        raise JobSpecError(f"{label} ''", "a path", f"{label} PATH")
    job_settings.check_text(label, value, {"path": True}, flags=True)
    if bound and (":" in value or "," in value):
        raise JobSpecError(
            f"{label} {value!r} contains ':' or ','",
            "a path without them: singularity --bind "
            "reads ':' as source:destination and ',' as a list",
            f"{label} with a path without them",
        )


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
