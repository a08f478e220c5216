"""The job's settings: one typed, nested object, written into the job script as JSON and read back on the node.

``spec.build`` makes the :class:`JobSettings` of a ``Job`` and checks it with :func:`check` in the words of
``octo-dist launch``'s flags (each field's metadata names its flag, bounds and the fix); ``render`` writes
``to_json()`` into the script's last line; the job runtime (``supervisor``) reads it back with
``settingsread.from_json`` and the same :func:`check`, naming fields by their JSON path, so what a script carries is
checked field by field before anything starts: a script edited by hand, cut short or written by another octo-dist
version is refused in one line (exit 2), never half-run. Standard library only, Python 3.9: it ships in the job
runtime's zipapp. ``{"schema": 2, "script_name": "job.sh", "allocation": {"scheduler": "pbs", "nodes": 2, ...}, ...}``
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
# Ranks checkpoint this long before the wall time unless --stop-margin says otherwise (an Octo checkpoint: seconds)
DEFAULT_STOP_MARGIN_S = 300
MAX_TEXT = 4096  # PATH_MAX: the longest path, module name or argument a job script holds
MAX_ITEMS = 1000  # the most entries of one list (training arguments, binds, modules, variables)
# The largest batch, step count or sample count a flag takes: what every training program's int32 counters hold.
MAX_COUNT = 2**31 - 1
MAX_CHAIN = 50  # jobs in one --chain: 50 wall times of 24 h are 50 days of training
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


class JobSpecError(SettingsError):
    """The same refusal in the words of ``octo-dist launch``'s flags, before anything is written:
    ``--nodes 0; expected --nodes from 1 to 10000. Fix: --nodes 1 (or more)`` (one line)."""


@dataclasses.dataclass(frozen=True)
class Bound:
    """The values a count may take, ``low <= value <= high``, and how a refusal at render words them: ``expected``
    and ``fix`` with ``{flag}``, ``{low}``, ``{high}`` and ``{nearest}`` (the bound the value passed) filled in."""

    low: int
    high: int
    fix: str = "{flag} {nearest}"
    expected: str = "{flag} from {low} to {high}"

    def refusal(self, flag: str, value: int) -> "JobSpecError":
        """``--nodes 0`` -> ``--nodes 0; expected --nodes from 1 to 10000. Fix: --nodes 1 (or more)``."""
        words = {"flag": flag, "low": self.low, "high": self.high}
        nearest = min(max(value, self.low), self.high)
        return JobSpecError(
            f"{flag} {shown_number(value)}",
            self.expected.format(**words),
            self.fix.format(nearest=nearest, **words),
        )


# Every bound a count has, the one table: the job's settings name theirs in their metadata (checked at render in the
# words of launch's flags and again on the node by JSON path); launch's own counts (GPUs, batch, steps, the chain)
# name theirs in LaunchOptions' metadata, checked by ``options.check_bounds`` before anything is derived from them.
BOUNDS = {
    "nodes": Bound(1, MAX_NODES, "--nodes 1 (or more)"),
    "ranks_per_node": Bound(1, MAX_RANKS_PER_NODE, "--ranks-per-node 8"),
    "cpus_per_rank": Bound(0, MAX_CPUS_PER_RANK, "--cpus-per-rank 0", "0 (no binding) to {high}"),
    "sockets": Bound(0, MAX_SOCKETS),  # 0: unknown (SLURM, Grid Engine); no flag sets it
    "walltime_s": Bound(1, MAX_WALLTIME_S, "--walltime 1:00:00"),
    "stop_margin_s": Bound(0, MAX_WALLTIME_S, "--stop-margin 300"),
    "gpus_per_node": Bound(1, MAX_RANKS_PER_NODE, "--gpus-per-node 8"),
    "devices_per_rank": Bound(1, MAX_COUNT, "--devices-per-process 1"),
    "per_gpu_batch": Bound(1, MAX_COUNT, "--per-gpu-batch 32"),
    "global_batch": Bound(1, MAX_COUNT, "--global-batch 256"),
    "steps": Bound(1, MAX_COUNT, "--steps 1000"),
    "keep_samples_from": Bound(1, MAX_COUNT, "--keep-samples-from 256"),
    "chain": Bound(
        1,
        MAX_CHAIN,
        "--chain {nearest} (a longer run: another chain once this one ends)",
        "{low} to {high} jobs in one chain",
    ),
}


def _field(
    bound: str = "",
    *,
    choices: Tuple[str, ...] = (),
    path: bool = False,
    flag: str = "",
    fix: str = "",
    help: str = "",
    group: str = "",
    default: Any = None,
    in_file: bool = False,
):
    """A setting's metadata: its bound (a key of :data:`BOUNDS`, for a count), allowed values, whether it is a path;
    ``flag``: the ``octo-dist launch`` option that sets it, which names it in a refusal at render time (on the
    node, its JSON path does); ``fix``: the fix of a refusal of its choices (``"--wandb-mode offline"``); ``help``:
    the flag's ``launch --help`` line (``{default}`` and each scheduler's values filled in by ``options``);
    ``group`` and ``default``: its ``launch --help`` group and default, where the option is this field alone
    (``options.with_settings`` makes it, ``spec`` passes its value by name); ``in_file``: a defaults file may set
    that option too (``heartbeat = 45`` in launch.ini)."""
    meta = {"bound": BOUNDS[bound] if bound else None, "choices": choices, "path": path}
    launch = {"group": group, "default": default, "in_file": in_file}
    return dataclasses.field(metadata={**meta, **launch, "help": help, "flag": flag, "fix": fix})


def _path_field(flag: str, help: str):
    """A path setting (``--save-dir runs/ft``), refused when it starts with '-' (read as an option); see _field."""
    return _field(path=True, flag=flag, help=help)


@dataclasses.dataclass(frozen=True)
class Allocation:
    """Where the ranks run: what the scheduler was asked for."""

    scheduler: Text = _field()  # "pbs": a registered scheduler's name
    nodes: int = _field("nodes", flag="--nodes", help="number of nodes (required)")
    ranks_per_node: int = _field(
        "ranks_per_node",
        flag="--ranks-per-node",
        help="processes per node (default: GPUs per node / --devices-per-process, one per GPU without it)",
    )
    cpus_per_rank: int = _field(  # 0: no binding
        "cpus_per_rank",
        flag="--cpus-per-rank",
        help="CPU cores bound to each rank, for its input pipeline; 0 binds none (default: {cpus_per_rank})",
    )
    sockets: int = _field("sockets")  # 0: unknown (SLURM, Grid Engine)


@dataclasses.dataclass(frozen=True)
class Timing:
    walltime_s: int = _field(
        "walltime_s",
        flag="--walltime",
        help="wall-time limit, H:MM:SS or D-H:MM:SS; two fields (30:00) are refused, since PBS, SLURM and Grid Engine "
        "read them as MM:SS (default: {default})",
    )
    # every rank checkpoints and stops this long before it
    stop_margin_s: int = _field(
        "stop_margin_s",
        flag="--stop-margin",
        help="seconds before the wall time at which every rank checkpoints and "
        "stops (default: {default})",
    )


# Set by the job runtime for every rank, whatever the forwarded prefixes: how long the other ranks wait for rank 0's
# dataset ("43200"), read by octo_dist.runtime.rankwait. Its value: Timing.rank0_wait_s.
RANK0_WAIT_ENV = "OCTO_DIST_RANK0_WAIT_TIMEOUT"


def rank0_wait_s(timing: "Timing") -> int:
    """The other ranks wait for rank 0's dataset (a statistics pass of minutes to hours on a large dataset) as long
    as the job may train: its wall time less the stop margin (43200 - 300 = 42900), not the ranks' own two-hour
    default; the job's stop ends the wait before the wall time."""
    return max(1, timing.walltime_s - timing.stop_margin_s)


@dataclasses.dataclass(frozen=True)
class Software:
    """What the ranks run from: the image, else the venv; the modules loaded before."""

    modules: Texts = _field(
        flag="--module",
        fix="--module hpcx/2.20",
        help="environment module to load, repeatable; replaces the defaults, '' loads none (default: {modules})",
    )
    image: Text = _path_field(
        "--image",
        "Singularity image (.sif) every rank runs in (default: none, run from --venv)",
    )  # "" runs from ``venv``
    venv: Text = _path_field(
        "--venv",
        "environment to run from without an image (default: {default})",
    )
    # extra directories bound into the image when the node has them
    binds: Texts = _path_field(
        "--bind",
        "extra directory to bind into the image, repeatable (default: {binds})",
    )


@dataclasses.dataclass(frozen=True)
class Storage:
    """Where the job reads and writes, relative to the submit directory; the runtime makes them absolute."""

    save_dir: Text = _path_field(
        "--save-dir",
        "checkpoint directory, bound into the image (default: {default})",
    )
    data_dir: Text = _path_field(
        "--data-dir",
        "dataset directory for finetune, bound into the image (default: none)",
    )  # "": no dataset
    compile_cache: Text = _path_field(
        "--compile-cache",
        "JAX's persistent compilation cache, shared by the nodes and by "
        "later jobs so a resubmission does not recompile; empty: off "
        "(default: {default})",
    )  # "": off
    wandb_mode: Text = _field(
        choices=WANDB_MODES,
        flag="--wandb-mode",
        fix="--wandb-mode offline",
        help="wandb logging, as octo-dist smoke's --wandb-mode: disabled logs nothing to wandb (the run summary and "
        "loss.png are written all the same), offline keeps the run in the save directory for wandb sync, online "
        "needs WANDB_API_KEY or a key file only you can read (default: {default}, the same for every command)",
    )


@dataclasses.dataclass(frozen=True)
class Forwarding:
    """What the job exports, and which of its variables reach the ranks on every node."""

    # (("NCCL_IB_HCA", "mlx5_ibn1,..."),): exported unless already set
    environment: Pairs = _field()
    coordinator: Text = _field(
        flag="--coordinator",
        help="HOST:PORT of the coordinator (default: octo-dist agrees one when the job starts)",
    )  # "host:port", or "" when octo-dist agrees one
    forward_prefixes: Texts = _field()  # ("NCCL_", "XLA_", ...)
    forward_names: Texts = _field()


@dataclasses.dataclass(frozen=True)
class Commands:
    """The preflight's and the training's argv; ``@{save_dir}`` and the like are filled in on the node."""

    preflight: Texts = _field()
    train: Texts = _field(flag="the training command")


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


def checked_value(name: str, kind, value: Any, meta: Mapping, flags: bool = False):
    """One setting checked against its type and metadata; ``name`` is its JSON path (``allocation.nodes``), or with
    ``flags`` the launch option that set it (``--nodes``), and the refusal speaks of that."""
    if kind is int:
        return check_bound(name, value, meta["bound"], flags)
    if kind is str:
        return check_text(name, value, meta, flags)
    if kind == Texts:
        return tuple(
            check_text(name if flags else f"{name}[{i}]", v, meta, flags)
            for i, v in enumerate(_items(name, value))
        )
    if kind == Pairs:
        out = []
        for i, pair in enumerate(_items(name, value)):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise settings_error(f"{name}[{i}]", json_kind(pair), "a [NAME, VALUE] pair")
            var, val = (check_text(f"{name}[{i}]", v, meta) for v in pair)
            if not ENV_NAME.fullmatch(var):
                raise settings_error(
                    f"{name}[{i}]", f"variable name {var!r}", "letters, digits and '_'"
                )
            out.append((var, val))
        return tuple(out)
    raise TypeError(f"no reader for {name}: {kind}")  # a field type added without one: a bug here


def check_bound(name: str, value: Any, bound: Bound, flags: bool = False) -> int:
    """A count within its bound: ``name`` is its JSON path, or with ``flags`` the flag that gave it, and the refusal
    is the bound's own in that flag's words (``Bound.refusal``), the same whichever check finds it."""
    if type(value) is not int:  # bool is an int to Python, and 1e999 a float: neither is a count
        raise settings_error(name, json_kind(value), _range(bound))
    if bound.low <= value <= bound.high:
        return value
    if flags:
        raise bound.refusal(name, value)
    raise settings_error(name, str(value), _range(bound))


def _items(name: str, value: Any) -> list:
    # A tuple where launch built the settings; a JSON list where a script carried them.
    if not isinstance(value, (list, tuple)):
        raise settings_error(name, json_kind(value), "a JSON list [...]")
    if len(value) > MAX_ITEMS:
        raise settings_error(name, f"{len(value)} entries", f"at most {MAX_ITEMS}")
    return list(value)


def check_text(name: str, value: Any, meta: Mapping = {}, flags: bool = False) -> str:
    """A text setting: a string of at most MAX_TEXT printable characters, one of ``meta["choices"]``, a path not
    starting with '-' (``meta["path"]``). With ``flags``, ``name`` is what the user gave it as (``"--save-dir"``,
    ``"argument 3 after --"``, or a description starting with "the") and the refusal gives a fix."""
    if not isinstance(value, str):
        raise settings_error(name, json_kind(value), "a JSON string")
    if len(value) > MAX_TEXT:
        if not flags:
            raise settings_error(name, f"{len(value)} characters", f"at most {MAX_TEXT}")
        raise JobSpecError(
            f"{name} of {len(value)} characters ({value[:40]!r}...)",
            f"at most {MAX_TEXT} (the longest path a Linux system call takes)",
            f"{name} shorter" if name.startswith("the ") else f"a shorter {name}",
        )
    bad = sorted({c for c in value if unicodedata.category(c) in UNSAFE_CATEGORIES})
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
        if not flags:
            raise settings_error(
                name, f"{value[:60]!r} holding {shown}", "printable characters only"
            )
        clean = "".join(c for c in value if c not in bad)
        raise JobSpecError(
            f"{name} {value!r} contains {shown}",
            "printable characters only (a newline or control character can end a comment or a quoted "
            "word in the job script and run as a command)",
            f"{name} {clean!r}",
        )
    if meta.get("choices") and value not in meta["choices"]:
        if flags:
            raise JobSpecError(
                f"{name} {value!r}", f"one of {', '.join(meta['choices'])}", meta["fix"]
            )
        raise settings_error(name, repr(value), f"one of {', '.join(meta['choices'])}")
    if meta.get("path") and value.startswith("-"):
        if flags:
            raise JobSpecError(
                f"{name} {value!r} starts with '-'",
                "a path the script's commands cannot read as an option",
                f"{name} ./{value}",
            )
        raise settings_error(name, repr(value), "a path that does not start with '-'")
    return value


def check(s: JobSettings, flags: bool = False) -> None:
    """Every setting against its type and bounds, then the rules between them: on the node after reading (JSON
    paths), and in ``octo-dist launch`` before anything is written (``flags``: in the words of its options)."""
    # Imported here: the schedulers' registry is the runtime's, and settings are also built where none is needed.
    from octo_dist.jobs import schedulers

    a = s.allocation
    if a.scheduler not in schedulers.SCHEDULERS:
        known = ", ".join(sorted(schedulers.SCHEDULERS))
        raise settings_error("allocation.scheduler", repr(a.scheduler), f"one of {known}")
    for f in dataclasses.fields(s):
        section = getattr(s, f.name)
        if dataclasses.is_dataclass(section):
            check_section(f.name, section, flags)
    for key in ("preflight", "train"):
        if not getattr(s.commands, key):
            raise settings_error(
                f"commands.{key}", "an empty command", "a program and its arguments"
            )
    if not s.storage.save_dir:
        raise settings_error("storage.save_dir", "''", "the checkpoint directory")
    if not s.software.venv and not s.software.image:
        raise settings_error("software", "neither an image nor a venv", "one of them")


def check_section(where: str, section: Any, flags: bool = False) -> None:
    """One section (``"timing"``, a :class:`Timing`): each field, then the rules between them (a negative stop
    margin is its bound's refusal, as ``options.check_bounds`` words it); ``launch`` checks a section as soon as it
    is decided, so what depends on it (the GPUs, from the nodes) is never computed from a bad value."""
    hints = get_type_hints(type(section))
    for f in dataclasses.fields(section):
        flag = f.metadata.get("flag")
        name = flag if flags and flag else f"{where}.{f.name}"
        checked_value(
            name, hints[f.name], getattr(section, f.name), f.metadata, flags and bool(flag)
        )
    if isinstance(section, Timing):
        _check_timing(section, flags)


def _check_timing(t: Timing, flags: bool) -> None:
    """The ranks need MIN_TRAINING_S between their start and the stop margin: 5:01 with a 300 s margin would leave
    them 1 s, and they would stop before the first step while a chain goes on."""
    least, margin, walltime_s = MIN_TRAINING_S, t.stop_margin_s, t.walltime_s
    if margin <= walltime_s - least:  # each within its bound already (check_section)
        return
    if not flags:
        raise settings_error(
            "timing",
            f"walltime_s {walltime_s} with stop_margin_s {margin}",
            f"at least {least} s between the start and the stop",
        )
    walltime = format_walltime(walltime_s)
    if walltime_s < least:
        # No margin makes 10 s enough: the fix is a longer wall time, with the margin asked for (or the default).
        raise JobSpecError(
            f"--walltime {walltime} ({walltime_s} s)",
            f"at least {least} s for the ranks to start and train, plus the stop margin "
            f"({shown_number(margin)} s)",
            f"--walltime {format_walltime(min(margin, 3600) + max(least, 600))}",
        )
    raise JobSpecError(
        f"--stop-margin {shown_number(margin)} s with --walltime {walltime}",
        f"a margin of 0 s or more that leaves the ranks at least {least} s before it "
        "(they need time to start and train)",
        f"--stop-margin {max(min(DEFAULT_STOP_MARGIN_S, walltime_s // 10, walltime_s - least), 0)} "
        "or a longer --walltime",
    )


def format_walltime(seconds: int) -> str:
    """Seconds -> ``"HH:MM:SS"`` with hours past 24 (``"72:00:00"``), which PBS, SGE and SLURM all accept."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def shown_number(value: int) -> str:
    """A number as an error shows it: whole up to 20 digits, else its first 20 and how long it is
    (``10**3999`` -> ``"10000000000000000000... (4,000 digits)"``): a pasted run of digits must not fill the screen."""
    text = str(value)
    digits = text.lstrip("-")
    if len(digits) <= 20:
        return text
    return f"{text[: len(text) - len(digits) + 20]}... ({len(digits):,} digits)"


def json_kind(value: Any) -> str:
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


def _range(bound: Bound) -> str:
    return f"a whole number from {bound.low} to {bound.high}"


def settings_error(name: str, found: str, expected: str) -> SettingsError:
    # "job setting timing.walltime_s: ..." for one setting; "the job settings: not JSON ..." for the whole
    what = name if name == "the job settings" else f"job setting {name}"
    return SettingsError(
        f"{what}: {found}",
        expected,
        "re-render the job script with octo-dist launch (it writes and checks these settings)",
    )
