"""The settings a job script carries, read back on the node: its last line's JSON -> a checked :class:`JobSettings`.

``render`` writes ``JobSettings.to_json()`` into the script; the job runtime (``supervisor``) reads it back here and
checks every field against its type and bounds (``settings.check``, naming fields by their JSON path), so a script
edited by hand, cut short or written by another octo-dist version is refused in one line (exit 2), never half-run::

    from_json('{"schema": 2, "script_name": "job.sh", "allocation": {"nodes": 0, ...}, ...}')
    # SettingsError: job setting allocation.nodes: 0; expected a whole number from 1 to 10000. Fix: re-render ...

Standard library only, Python 3.9: it ships in the job runtime's zipapp.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, get_type_hints

from octo_dist.jobs.settings import (
    SCHEMA,
    JobSettings,
    check,
    checked_value,
    json_kind,
    settings_error,
)

WHOLE = "the job settings"  # how a refusal names the whole object, where no one field is at fault


def from_json(text: str) -> JobSettings:
    """The settings a job script carries, checked; SettingsError names the first bad field."""
    if not isinstance(text, str):
        raise settings_error(WHOLE, "not text", "a JSON object")
    if "\0" in text:
        raise settings_error(WHOLE, "a NUL byte", "JSON text without one")
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise settings_error(WHOLE, f"not JSON ({str(e)[:120]})", "one JSON object") from None
    return from_mapping(raw)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a job setting can hold")


def from_mapping(raw: Any) -> JobSettings:
    """A parsed JSON value -> JobSettings, every field checked against its type and bounds."""
    if not isinstance(raw, dict):
        raise settings_error(WHOLE, json_kind(raw), "a JSON object {...}")
    schema = raw.get("schema")
    # An int, as every int field: 2.0 == 2 (and True == 1) in Python, but neither is what a script carries.
    if type(schema) is not int or schema != SCHEMA:
        found = (
            "no schema (an older octo-dist's script)" if schema is None else f"schema {schema!r}"
        )
        raise settings_error(WHOLE, found, f"schema {SCHEMA}, the one this octo-dist reads")
    values = {k: v for k, v in raw.items() if k != "schema"}
    settings = _build(JobSettings, values, "")
    check(settings)
    return settings


def _build(cls, values: Any, where: str):
    """Section ``cls`` (``Timing``) from its JSON object, each field checked; ``where``: its path (``"timing."``)."""
    if not isinstance(values, dict):
        raise settings_error(where.rstrip(".") or WHOLE, json_kind(values), "a JSON object {...}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise settings_error(
            f"{where}{unknown[0]}", "a key this octo-dist does not know", f"only {', '.join(names)}"
        )
    out = {}
    for f in dataclasses.fields(cls):
        name = f"{where}{f.name}"
        if f.name not in values:
            raise settings_error(name, "missing", "every setting octo-dist launch writes")
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out[f.name] = _build(kind, values[f.name], f"{name}.")
        else:
            out[f.name] = checked_value(name, kind, values[f.name], f.metadata)
    return cls(**out)
