"""The job's settings: one typed, nested object, written into the job script as JSON and read back on the node.

``render`` builds a :class:`JobSettings` from the validated ``JobSpec`` and writes ``to_json()`` into the script's
last line; the job runtime (``supervisor``) reads it back with :func:`from_json`, the same code, so what a script
carries is checked field by field before anything starts: a script edited by hand, cut short or written by another
octo-dist version is refused in one line (exit 2), never half-run. Standard library only, Python 3.9: it ships in the
job runtime's zipapp.

    {"schema": 2, "script_name": "job.sh",
     "allocation": {"scheduler": "pbs", "nodes": 2, "ranks_per_node": 8, "cpus_per_rank": 12, "sockets": 2},
     "timing": {"walltime_s": 3600, "stop_margin_s": 300}, ...}
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import unicodedata
from typing import Any, Mapping, Tuple, get_type_hints

from octo_dist.problems import Refusal

SCHEMA = 2  # 1: the flat dictionary of earlier releases (no "schema" key)

# Bounds every count and length has, at render and in the runtime: a job script outside them was not written by
# `octo-dist launch`, and a runtime that believed it could loop over 10**20 ranks.
MAX_NODES = 10_000  # ABCI 3.0 has 766 H nodes; the largest machines a few thousand
MAX_RANKS_PER_NODE = 256  # one rank per GPU: 8 on ABCI; 256 leaves room for CPU-only tests
MAX_CPUS_PER_RANK = 1024
MAX_SOCKETS = 64
MAX_WALLTIME_S = 366 * 24 * 3600  # schedulers cap jobs at days; a year is past any site's limit
MIN_TRAINING_S = (
    30  # wall time minus stop margin: less leaves the ranks no time to start, let alone train
)
MAX_TEXT = 4096  # PATH_MAX: the longest path, module name or argument a job script holds
MAX_ITEMS = 1000  # the most entries of one list (training arguments, binds, modules, variables)
WANDB_MODES = ("online", "offline", "disabled")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters no job setting holds: controls (NUL, newline, escape), format characters (bidi overrides), line and
# paragraph separators, and lone surrogates (JSON's "\ud800", which no file system or argv can carry).
UNSAFE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")

Text = str
Texts = Tuple[str, ...]
Pairs = Tuple[Tuple[str, str], ...]


class SettingsError(Refusal, ValueError):
    """Job settings that must not run: which field, what it held, what was expected; exit 2."""


def _field(low: int = 0, high: int = 0, *, choices: Tuple[str, ...] = (), path: bool = False):
    """A field's bounds (integers: ``low <= value <= high``), allowed values, or whether it is a path."""
    return dataclasses.field(metadata={"low": low, "high": high, "choices": choices, "path": path})


@dataclasses.dataclass(frozen=True)
class Allocation:
    """Where the ranks run: what the scheduler was asked for."""

    scheduler: Text = _field()  # "pbs": a registered scheduler's name
    nodes: int = _field(1, MAX_NODES)
    ranks_per_node: int = _field(1, MAX_RANKS_PER_NODE)
    cpus_per_rank: int = _field(0, MAX_CPUS_PER_RANK)  # 0: no binding
    sockets: int = _field(0, MAX_SOCKETS)  # 0: unknown (SLURM, Grid Engine)


@dataclasses.dataclass(frozen=True)
class Timing:
    walltime_s: int = _field(1, MAX_WALLTIME_S)
    stop_margin_s: int = _field(
        0, MAX_WALLTIME_S
    )  # every rank checkpoints and stops this long before it


@dataclasses.dataclass(frozen=True)
class Software:
    """What the ranks run from: the image, else the venv; the modules loaded before."""

    modules: Texts = _field()
    image: Text = _field(path=True)  # "" runs from ``venv``
    venv: Text = _field(path=True)
    binds: Texts = _field(
        path=True
    )  # extra directories bound into the image when the node has them


@dataclasses.dataclass(frozen=True)
class Storage:
    """Where the job reads and writes, relative to the submit directory; the runtime makes them absolute."""

    save_dir: Text = _field(path=True)
    data_dir: Text = _field(path=True)  # "": no dataset
    compile_cache: Text = _field(path=True)  # "": off
    wandb_mode: Text = _field(choices=WANDB_MODES)


@dataclasses.dataclass(frozen=True)
class Forwarding:
    """What the job exports, and which of its variables reach the ranks on every node."""

    environment: Pairs = (
        _field()
    )  # (("NCCL_IB_HCA", "mlx5_ibn1,..."),): exported unless already set
    coordinator: Text = _field()  # "host:port", or "" when octo-dist agrees one
    forward_prefixes: Texts = _field()  # ("NCCL_", "XLA_", ...)
    forward_names: Texts = _field()


@dataclasses.dataclass(frozen=True)
class Commands:
    """The preflight's and the training's argv; ``@{save_dir}`` and the like are filled in on the node."""

    preflight: Texts = _field()
    train: Texts = _field()


@dataclasses.dataclass(frozen=True)
class JobSettings:
    script_name: Text
    allocation: Allocation
    timing: Timing
    software: Software
    storage: Storage
    forwarding: Forwarding
    commands: Commands

    @property
    def ranks(self) -> int:
        return self.allocation.nodes * self.allocation.ranks_per_node

    def to_json(self) -> str:
        """``{"schema": 2, ...}``, one section per line, for a reader of the script."""
        lines = [f'"schema": {SCHEMA}, "script_name": {json.dumps(self.script_name)}']
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section):
                lines.append(f"{json.dumps(f.name)}: {json.dumps(_plain(section))}")
        return "{" + ",\n ".join(lines) + "}"


def _plain(section) -> dict:
    return {f.name: _json_value(getattr(section, f.name)) for f in dataclasses.fields(section)}


def _json_value(value):
    return [_json_value(v) for v in value] if isinstance(value, tuple) else value


def from_json(text: str) -> JobSettings:
    """The settings a job script carries, checked; SettingsError names the first bad field."""
    if not isinstance(text, str):
        raise _error("the job settings", "not text", "a JSON object")
    if "\0" in text:
        raise _error("the job settings", "a NUL byte", "JSON text without one")
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise _error("the job settings", f"not JSON ({str(e)[:120]})", "one JSON object") from None
    return from_mapping(raw)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a job setting can hold")


def from_mapping(raw: Any) -> JobSettings:
    """A parsed JSON value -> JobSettings, every field checked against its type and bounds."""
    if not isinstance(raw, dict):
        raise _error("the job settings", _kind(raw), "a JSON object {...}")
    schema = raw.get("schema")
    # An int, as every int field: 2.0 == 2 (and True == 1) in Python, but neither is what a script carries.
    if type(schema) is not int or schema != SCHEMA:
        found = (
            "no schema (an older octo-dist's script)" if schema is None else f"schema {schema!r}"
        )
        raise _error("the job settings", found, f"schema {SCHEMA}, the one this octo-dist reads")
    values = {k: v for k, v in raw.items() if k != "schema"}
    settings = _build(JobSettings, values, "")
    check(settings)
    return settings


def _build(cls, values: Any, where: str):
    if not isinstance(values, dict):
        raise _error(where.rstrip(".") or "the job settings", _kind(values), "a JSON object {...}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise _error(
            f"{where}{unknown[0]}", "a key this octo-dist does not know", f"only {', '.join(names)}"
        )
    out = {}
    for f in dataclasses.fields(cls):
        name = f"{where}{f.name}"
        if f.name not in values:
            raise _error(name, "missing", "every setting octo-dist launch writes")
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out[f.name] = _build(kind, values[f.name], f"{name}.")
        else:
            out[f.name] = _value(name, kind, values[f.name], f.metadata)
    return cls(**out)


def _value(name: str, kind, value: Any, meta: Mapping):
    if kind is int:
        if (
            type(value) is not int
        ):  # bool is an int to Python, and 1e999 a float: neither is a count
            raise _error(name, _kind(value), _range(meta))
        if not meta["low"] <= value <= meta["high"]:
            raise _error(name, str(value), _range(meta))
        return value
    if kind is str:
        return _text(name, value, meta)
    if kind == Texts:
        return tuple(_text(f"{name}[{i}]", v, meta) for i, v in enumerate(_items(name, value)))
    if kind == Pairs:
        out = []
        for i, pair in enumerate(_items(name, value)):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise _error(f"{name}[{i}]", _kind(pair), "a [NAME, VALUE] pair")
            var, val = (_text(f"{name}[{i}]", v, meta) for v in pair)
            if not ENV_NAME.fullmatch(var):
                raise _error(f"{name}[{i}]", f"variable name {var!r}", "letters, digits and '_'")
            out.append((var, val))
        return tuple(out)
    raise TypeError(f"no reader for {name}: {kind}")  # a field type added without one: a bug here


def _items(name: str, value: Any) -> list:
    if not isinstance(value, list):
        raise _error(name, _kind(value), "a JSON list [...]")
    if len(value) > MAX_ITEMS:
        raise _error(name, f"{len(value)} entries", f"at most {MAX_ITEMS}")
    return value


def _text(name: str, value: Any, meta: Mapping) -> str:
    if not isinstance(value, str):
        raise _error(name, _kind(value), "a JSON string")
    if len(value) > MAX_TEXT:
        raise _error(name, f"{len(value)} characters", f"at most {MAX_TEXT}")
    bad = sorted({c for c in value if unicodedata.category(c) in UNSAFE_CATEGORIES})
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
        raise _error(name, f"{value[:60]!r} holding {shown}", "printable characters only")
    if meta.get("choices") and value not in meta["choices"]:
        raise _error(name, repr(value), f"one of {', '.join(meta['choices'])}")
    if meta.get("path") and value.startswith("-"):
        raise _error(name, repr(value), "a path that does not start with '-'")
    return value


def check(s: JobSettings) -> None:
    """The rules between fields (each field alone is checked while reading)."""
    # Imported here: the schedulers' registry is the runtime's, and settings are also built where none is needed.
    from octo_dist.jobs import schedulers

    a, t = s.allocation, s.timing
    if a.scheduler not in schedulers.SCHEDULERS:
        known = ", ".join(sorted(schedulers.SCHEDULERS))
        raise _error("allocation.scheduler", repr(a.scheduler), f"one of {known}")
    if t.walltime_s - t.stop_margin_s < MIN_TRAINING_S:
        raise _error(
            "timing",
            f"walltime_s {t.walltime_s} with stop_margin_s {t.stop_margin_s}",
            f"at least {MIN_TRAINING_S} s between the start and the stop",
        )
    for key in ("preflight", "train"):
        if not getattr(s.commands, key):
            raise _error(f"commands.{key}", "an empty command", "a program and its arguments")
    if not s.storage.save_dir:
        raise _error("storage.save_dir", "''", "the checkpoint directory")
    if not s.software.venv and not s.software.image:
        raise _error("software", "neither an image nor a venv", "one of them")


def _kind(value: Any) -> str:
    """How a JSON value reads to a person: ``"two"`` -> ``'two' (a string)``, ``None`` -> ``null``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (true/false)"
    if isinstance(value, float):
        return (
            f"{value!r} (a number with a fraction)"
            if math.isfinite(value)
            else "an infinite number"
        )
    names = {int: "a number", str: "a string", list: "a list", dict: "an object"}
    shown = repr(value) if not isinstance(value, (list, dict)) else json.dumps(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{shown} ({names.get(type(value), type(value).__name__)})"


def _range(meta: Mapping) -> str:
    return f"a whole number from {meta['low']} to {meta['high']}"


def _error(name: str, found: str, expected: str) -> SettingsError:
    # "job setting timing.walltime_s: ..." for one setting; "the job settings: not JSON ..." for the whole
    what = name if name == "the job settings" else f"job setting {name}"
    return SettingsError(
        f"{what}: {found}",
        expected,
        "re-render the job script with octo-dist launch (it writes and checks these settings)",
    )
