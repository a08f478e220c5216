"""A job's choices (``options.LaunchOptions``) validated into a ``JobSpec``: what the header and the job's settings
are rendered from.

Everything here is pure: ``build(options)`` takes the options (and an ``image_exists`` predicate, so tests need no
image) and either returns a ``JobSpec`` or raises ``JobSpecError`` naming what was found, what was expected and the
fix, before anything is written or submitted. What differs between schedulers comes from the scheduler's class.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import unicodedata
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

from octo_dist.problems import Refusal
from octo_dist.jobs import imagefit, schedulers, sitedirectives
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs.commands import COMMANDS, DEFAULT_COMMAND, Checker, Command, config_file_first
from octo_dist.jobs.options import (
    DEFAULT_STOP_MARGIN_S,
    WANDB_MODES,
    LaunchOptions,
    flag_of,
    option_fields,
    scheduler_names,
)


class JobSpecError(Refusal, ValueError):
    """A job that must not be rendered: what was found, what was expected, and the fix (one line)."""


@dataclasses.dataclass(frozen=True)
class JobSpec:
    scheduler: str
    nodes: int
    gpus_per_node: int
    ranks_per_node: int
    resource_type: Optional[str]  # "rt_HF"; None for SLURM and Grid Engine
    sockets: int  # 0: unknown (SLURM, Grid Engine)
    cpus_per_rank: int  # 0: no binding
    walltime_s: int
    group: Optional[str]  # ABCI group (qsub -P), Grid Engine project (-P) or SLURM account
    name: str
    image: Optional[str]  # a .sif; None runs from ``venv``
    venv: str
    binds: tuple  # extra directories bound into the image when they exist on the node
    save_dir: str
    data_dir: Optional[str]
    compile_cache: str  # "" when off
    wandb_mode: str
    coordinator: Optional[str]  # "host:port" only when asked; octo-dist agrees one otherwise
    modules: tuple
    environment: tuple  # (name, value, why) the job exports unless already set (NCCL for ABCI 3.0)
    stop_margin_s: int
    command: str  # a key of COMMANDS
    job_args: (
        tuple  # the job's settings as the command's flags: ("--global-batch=64", "--steps=100")
    )
    user_args: tuple  # the training command's own flags, after `--` (the config file's excepted)
    resume: bool  # pass the command's resume flag (continue from save_dir after a stop)
    global_batch: Optional[int]
    steps: Optional[int]
    command_line: tuple = ()  # the `octo-dist launch ...` argv that rendered it, for the script's header
    lead_args: tuple = ()  # ("--config=finetune_config.py:head_only,multimodal",): before every other flag
    devices_per_rank: int = 1  # GPUs each rank binds; ranks_per_node x this == gpus_per_node
    # The scheduler's own options (Scheduler.options), given or default: {"pe": "mpi", "queue": None},
    # {"partition": "gpu"}, {"resources": ("mem=400gb",)}; the scheduler's site_lines read them.
    site: Mapping = dataclasses.field(default_factory=dict)
    directives: tuple = ()  # header lines as given: ("#SBATCH --mail-type=END",)

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def preflight_args(self) -> tuple:
        """What ``octo-dist check-env --launch`` needs to check the GPUs each rank will bind against each host's:
        ``("--devices-per-process=2",)``; empty for one GPU per rank (its default)."""
        return (
            (f"--devices-per-process={self.devices_per_rank}",) if self.devices_per_rank > 1 else ()
        )


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
        if 0 < days * 86400 + total <= job_settings.MAX_WALLTIME_S:
            return format_walltime(days * 86400 + total)
    if text.isdigit() and 0 < int(text) <= 168:
        return (
            f"{int(text)}:00:00 (a bare number is seconds to PBS and Grid Engine, minutes to SLURM)"
        )
    return "1:30:00"


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
    if total > job_settings.MAX_WALLTIME_S:
        raise JobSpecError(
            f"{label} {text} ({total} s)",
            f"at most {job_settings.MAX_WALLTIME_S // 86400} days",
            "--walltime 7-00:00:00 (ABCI 3.0 allows up to 168 hours on rt_HF)",
        )
    return total


def format_walltime(seconds: int) -> str:
    """Seconds -> ``"HH:MM:SS"`` with hours past 24 (``"72:00:00"``), which PBS, SGE and SLURM all accept."""
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def node_hours(nodes: int, walltime_s: int) -> str:
    """``(2, 1800)`` -> ``"1 node-hour"``, ``(2, 5400)`` -> ``"3 node-hours"``, ``(1, 600)`` -> ``"0.17 node-hours"``:
    what the job may use at most (sites charge by it; ABCI's points are node-hours x the resource type's rate)."""
    value = nodes * walltime_s / 3600
    shown = f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2g}"
    return f"{shown} node-hour{'' if shown == '1' else 's'}"


def time_summary(job: "JobSpec") -> str:
    """The wall time and what it may cost, for the line that says the script was written:
    ``"wall time 00:30:00, at most 1 node-hour"`` (2 nodes, ``--walltime 0:15:00``)."""
    return f"wall time {format_walltime(job.walltime_s)}, at most {node_hours(job.nodes, job.walltime_s)}"


def scaled_steps(steps: int, reference_batch: int, global_batch: int) -> int:
    """Steps that see as many examples at ``global_batch`` as ``steps`` did at ``reference_batch`` (rounded up)."""
    return math.ceil(steps * reference_batch / global_batch)


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


def _path(label: str, value: Optional[str], bound: bool) -> None:
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


def _ranks_and_devices(
    gpus_per_node: int, ranks: Optional[int], devices: Optional[int]
) -> Tuple[int, int]:
    """(ranks per node, GPUs per rank) that use every GPU of a node, from the two options (either may be unset).

    8 GPUs: (None, None) -> (8, 1); (4, None) -> (4, 2); (None, 8) -> (1, 8); (3, None) and (4, 4) are refused:
    a GPU nobody binds sits idle for the whole job while the batch is counted as if it worked.
    """
    _positive("--devices-per-process", devices, "--devices-per-process 1")
    _positive("--ranks-per-node", ranks, f"--ranks-per-node {gpus_per_node}")
    if ranks is not None and ranks > gpus_per_node:
        raise JobSpecError(
            f"--ranks-per-node {shown_number(ranks)} with --gpus-per-node {gpus_per_node}",
            "at most one rank per GPU (JAX binds whole GPUs to a process; two ranks on one GPU fail "
            "or share its memory)",
            f"--ranks-per-node {gpus_per_node}",
        )
    if ranks is None:
        ranks = gpus_per_node // devices if devices and devices <= gpus_per_node else gpus_per_node
    if devices is None:
        devices = gpus_per_node // ranks
    if ranks * devices != gpus_per_node:
        divisors = [r for r in range(1, gpus_per_node + 1) if gpus_per_node % r == 0]
        near = max((r for r in divisors if r <= ranks), default=1)
        raise JobSpecError(
            f"{shown_number(ranks)} rank(s) per node x {shown_number(devices)} GPU(s) per rank "
            f"with --gpus-per-node {gpus_per_node}",
            f"ranks per node x devices per rank = {gpus_per_node}, so every GPU is used",
            f"--ranks-per-node {near} --devices-per-process {gpus_per_node // near}, "
            f"or --ranks-per-node {gpus_per_node} (one GPU each)",
        )
    return ranks, devices


# The fine-tune configs shipped with octo-dist, which all leave pretrained_path unset (a placeholder): a job from one
# of them without --config.pretrained_path fails when it starts. tests/test_finetune_fields.py keeps this in sync.
PACKAGED_FINETUNE_CONFIGS = ("finetune_config.py", "finetune_smoke_config.py")
WANDB_KEY_FILE = os.path.join(
    ".config", "octo-dist", "wandb_api_key"
)  # under $HOME, or $WANDB_KEY_FILE


def wandb_key_found(environ: Mapping[str, str], read: Callable[[str], Optional[str]]) -> bool:
    """Whether a job with ``--wandb-mode online`` will find a key where the job runtime looks (WANDB_API_KEY, the
    key file, ``~/.netrc``'s api.wandb.ai): ``read(path)`` is the file's text, None when there is none."""
    if environ.get("WANDB_API_KEY"):
        return True
    home = environ.get("HOME", os.path.expanduser("~"))
    if read(environ.get("WANDB_KEY_FILE") or os.path.join(home, WANDB_KEY_FILE)) is not None:
        return True
    return "api.wandb.ai" in (read(os.path.join(home, ".netrc")) or "")


def _read_small(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode("utf-8", "replace")
    except OSError:
        return None


def finetune_warnings(
    spec: "JobSpec",
    environ: Optional[Mapping[str, str]] = None,
    read: Callable[[str], Optional[str]] = _read_small,
) -> list:
    """What would make the job fail after its wait in the queue, though the script renders: a packaged fine-tune
    config without ``--config.pretrained_path``; ``--wandb-mode online`` with no key this host can see."""
    environ = os.environ if environ is None else environ
    out = []
    if spec.command == "finetune":
        given = [*spec.lead_args, *spec.user_args]
        config = next(
            (a.partition("=")[2] for a in given if a.startswith("--config=")), "finetune_config.py"
        )
        if os.path.basename(
            config.partition(":")[0]
        ) in PACKAGED_FINETUNE_CONFIGS and not _flag_given(
            spec.user_args, "--config.pretrained_path"
        ):
            out.append(
                "-- finetune without --config.pretrained_path: the packaged config has none, so every rank stops "
                "at its start (after the wait in the queue). Fix: add --config.pretrained_path=weights/octo-small "
                "after -- finetune (make weights downloads it on a login node)"
            )
    if spec.wandb_mode == "online" and not wandb_key_found(environ, read):
        home = environ.get("HOME", "~")
        out.append(
            f"--wandb-mode online, but no wandb key here: WANDB_API_KEY is unset, {os.path.join(home, WANDB_KEY_FILE)} "
            "does not exist and ~/.netrc has no api.wandb.ai entry; the job fails at its start unless one is there "
            f"when it runs. Fix: (umask 077; cat > ~/{WANDB_KEY_FILE}) and paste the key, or wandb login, or "
            "--wandb-mode offline"
        )
    return out


def missing_paths(spec: "JobSpec", is_dir: Callable[[str], bool]) -> list:
    """One warning per directory the job reads that this host does not have (it may exist only on the
    cluster, so the render goes on): ``["--data-dir data/bridge: no such directory here (/home/u/proj); ..."]``;
    then :func:`finetune_warnings`' (this host's environment and files).

    ``is_dir``: ``os.path.isdir`` relative to where the script is rendered (and, usually, submitted)."""
    out = []
    if spec.data_dir and not is_dir(spec.data_dir):
        out.append(
            f"--data-dir {spec.data_dir}: no such directory on this host; the job fails at its start unless "
            f"it exists where the job runs. Fix: check the path, or make it before submitting"
        )
    if not spec.image and not is_dir(os.path.join(spec.venv, "bin")):
        out.append(
            f"--venv {spec.venv}: no such environment on this host (no {os.path.join(spec.venv, 'bin')}); the job "
            f"fails at its start unless it exists where the job runs. Fix: make env, or --venv PATH or --image FILE.sif"
        )
    return out + finetune_warnings(spec)


# The largest batch, step count or sample count a flag takes: what every training program's int32 counters hold.
MAX_COUNT = 2**31 - 1


def _positive(name: str, value: Optional[int], fix: str, most: int = MAX_COUNT) -> None:
    if value is not None and not 1 <= value <= most:
        raise JobSpecError(f"{name} {shown_number(value)}", f"{name} from 1 to {most}", fix)


def _flag_given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _coordinator(value: str) -> None:
    check_printable("--coordinator", value)
    m = re.fullmatch(r"([A-Za-z0-9_.-]+):(\d{1,5})", value)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise JobSpecError(
            f"--coordinator {value!r}",
            "HOST:PORT with a port from 1 to 65535 (e.g. g0001:23456)",
            "drop --coordinator (octo-dist agrees one), or --coordinator g0001:23456",
        )


def derived_defaults(o: "LaunchOptions") -> dict:
    """What :func:`build` takes for the options left unset that depend on others, for ``--show-defaults``.

    ``launch pbs`` with nothing set -> ``{"resource_type": "rt_HF", "gpus_per_node": 8, "ranks_per_node": 8,
    "devices_per_rank": 1, "cpus_per_rank": 12, "modules": ("hpcx/2.20",)}`` (SLURM: no resource type, so only
    ``modules``); each with the option it follows, as ``(value, "from --resource-type rt_HF")``."""
    out: dict = {}
    scheduler = o.scheduler
    s = schedulers.get(scheduler)
    resource_type = o.resource_type or s.default_resource_type
    rt = s.resource_types.get(resource_type) if resource_type else None
    if o.resource_type is None and resource_type:
        out["resource_type"] = (resource_type, f"{scheduler}'s default")
    gpus = o.gpus_per_node
    if gpus is None and rt:
        gpus = rt.gpus
        out["gpus_per_node"] = (gpus, f"from --resource-type {resource_type}")
    ranks, devices = o.ranks_per_node, o.devices_per_rank
    if gpus:
        try:
            ranks, devices = _ranks_and_devices(gpus, ranks, devices)
        except JobSpecError:
            ranks, devices = None, None  # the render refuses them, saying why
    # The reasons use --help's words: "(default: GPUs per node / ranks per node)".
    if o.ranks_per_node is None:
        why = "GPUs per node / --devices-per-process" if o.devices_per_rank else "one per GPU"
        out["ranks_per_node"] = (ranks, why)
    if o.devices_per_rank is None:
        out["devices_per_rank"] = (devices, "GPUs per node / ranks per node")
    if o.cpus_per_rank is None and rt:
        cpus = 0 if ranks == 1 else rt.cores // rt.gpus * (devices or 1)
        out["cpus_per_rank"] = (cpus, f"from --resource-type {resource_type}")
    elif o.cpus_per_rank is None:
        out["cpus_per_rank"] = (0, "none bound without a resource type")
    if o.output is None:
        out["output"] = (f"octo-dist-{scheduler}.sh", "after the scheduler")
    if o.bind is None and s.default_binds("GROUP"):
        binds = " ".join(s.default_binds("GROUP"))
        out["bind"] = (s.default_binds(o.group), f"{binds} with --group")
    if o.modules is None:
        modules = s.default_modules + (s.image_modules if o.image else ())
        out["modules"] = (modules, f"{scheduler}'s default")
    return out


class _Allocation(NamedTuple):
    """What a node holds and how the ranks split it, decided once from the options and the resource type."""

    gpus_per_node: int
    resource_type: Optional[str]
    rt: Optional[schedulers.base.ResourceType]
    ranks_per_node: int
    devices_per_rank: int
    cpus_per_rank: int


class _Training(NamedTuple):
    """The training command and the job settings it gets through its flags (``COMMANDS``)."""

    command: str
    lead_args: tuple
    user_args: tuple
    job_args: tuple  # ("--global-batch=64", "--steps=100")
    global_batch: Optional[int]
    steps: Optional[int]
    resume: bool


def build(
    options: LaunchOptions,
    *,
    image_exists: Callable[[str], bool] = os.path.isfile,
    checkers: Optional[Mapping[str, Checker]] = None,
    command_line: Sequence[str] = (),
) -> JobSpec:
    """A validated JobSpec, or JobSpecError.

    Args:
      options: the choices; ``options.train`` is the training command after ``--`` (``("smoke", "--model",
        "tiny")``, ``("finetune", "--config=...")``), empty for the smoke job with its defaults.
      image_exists: whether ``--image`` names a file here (unless ``skip_image_check``).
      checkers: command name -> Checker for the arguments the ranks will get; a command without one is not checked.
      command_line: the ``octo-dist launch ...`` argv, for the script's header.
    """
    o = options
    if o.scheduler not in schedulers.SCHEDULERS:
        raise JobSpecError(
            f"scheduler {o.scheduler!r}",
            f"one of {', '.join(scheduler_names())}",
            "octo-dist launch pbs ...",
        )
    sched = schedulers.get(o.scheduler)
    site = o.site_values()
    _check_chain(o)
    _check_texts(o, command_line)
    alloc = _allocation(o, sched)
    walltime_s = _walltime(o)
    _check_header_values(o, sched, site)
    image, binds = _paths(o, sched, image_exists, alloc.resource_type)
    training = _training(o, alloc, checkers or {})
    modules = (
        tuple(
            m for m in o.modules if m
        )  # --module '': no modules at all (the site's MPI is on PATH)
        if o.modules is not None
        else sched.default_modules + (sched.image_modules if image else ())
    )
    return JobSpec(
        scheduler=o.scheduler,
        nodes=o.nodes,
        gpus_per_node=alloc.gpus_per_node,
        ranks_per_node=alloc.ranks_per_node,
        devices_per_rank=alloc.devices_per_rank,
        resource_type=alloc.resource_type,
        sockets=alloc.rt.sockets if alloc.rt else 0,
        cpus_per_rank=alloc.cpus_per_rank,
        walltime_s=walltime_s,
        group=o.group,
        name=o.name,
        image=image,
        venv=o.venv,
        binds=binds,
        save_dir=o.save_dir,
        data_dir=o.data_dir,
        compile_cache=o.compile_cache,
        wandb_mode=o.wandb_mode,
        coordinator=o.coordinator,
        modules=modules,
        environment=alloc.rt.environment if alloc.rt else (),
        stop_margin_s=o.stop_margin,
        command=training.command,
        job_args=training.job_args,
        user_args=training.user_args,
        lead_args=training.lead_args,
        site={k: v for k, v in site.items() if v not in (None, ())},
        directives=tuple(o.directives or ()),
        resume=training.resume,
        global_batch=training.global_batch,
        steps=training.steps,
        command_line=tuple(command_line),
    )


MAX_CHAIN = (
    50  # jobs in one --chain (submit.MAX_CHAIN): 50 wall times of 24 h are 50 days of training
)


def _check_chain(o: LaunchOptions) -> None:
    """``--chain N`` queues N jobs: only with ``--submit`` (writing a script never submits), 1 to MAX_CHAIN."""
    if o.chain is None:
        return
    if o.chain < 1:
        raise JobSpecError(f"--chain {shown_number(o.chain)}", "1 or more jobs", "--chain 3")
    if o.chain > MAX_CHAIN:
        raise JobSpecError(
            f"--chain {shown_number(o.chain)}",
            f"at most {MAX_CHAIN} jobs in one chain",
            f"--chain {MAX_CHAIN}, then another chain after it ends",
        )
    if not o.submit and not o.dry_run:
        raise JobSpecError(
            f"--chain {o.chain} without --submit",
            "--submit with it: --chain submits jobs to the queue, and without --submit launch only writes the "
            "script",
            f"--submit --chain {o.chain} (or drop --chain to only write the script)",
        )


def _check_texts(o: LaunchOptions, command_line: Sequence[str]) -> None:
    """Every free text the script will hold, printable and of a sane length."""
    for label, value in (
        ("--walltime", o.walltime),
        ("--resource-type", o.resource_type),
        ("--group", o.group),
        ("--name", o.name),
        ("--wandb-mode", o.wandb_mode),
        ("-o", o.output),
    ):
        if value is not None:
            check_printable(label, value)
    for n, arg in enumerate(o.train, 1):
        check_printable(f"argument {n} after --", arg)
    # The launch line in the header holds every option's value: name each by its flag ("--save-dir"), not by
    # where it sits, so the fix says which option to shorten.
    flag = None
    for arg in command_line:
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            flag = None if eq else name
            check_printable(name if eq else "the option", value if eq else arg)
        else:
            check_printable(flag or "the command line's word", arg)
            flag = None


def _gpus_per_node(o: LaunchOptions, sched) -> Tuple[int, Optional[str], Any]:
    """(GPUs per node, resource type, its ResourceType): from --gpus-per-node, or the scheduler's resource type."""
    gpus_per_node = o.gpus_per_node
    if not sched.resource_types:
        if o.resource_type:
            raise JobSpecError(
                f"--resource-type {o.resource_type} for {o.scheduler}",
                f"none: octo-dist knows no {sched.title} resource types (ABCI 3.0's are PBS's)",
                "drop --resource-type and give --gpus-per-node",
            )
        if gpus_per_node is None:
            raise JobSpecError(
                f"{o.scheduler} without --gpus-per-node",
                f"the GPUs of one node ({sched.title} sites differ)",
                "--gpus-per-node 8 (or what your nodes have)",
            )
        return gpus_per_node, None, None
    resource_type = o.resource_type or sched.default_resource_type
    rt = sched.resource_types.get(resource_type)
    if rt is None:
        known = ", ".join(f"{k} ({v.about})" for k, v in sched.resource_types.items())
        raise JobSpecError(
            f"--resource-type {resource_type!r} for {o.scheduler}",
            f"one of: {known}",
            f"--resource-type {sched.default_resource_type or next(iter(sched.resource_types))}",
        )
    if gpus_per_node is None:
        gpus_per_node = rt.gpus
    elif gpus_per_node > rt.gpus:
        raise JobSpecError(
            f"--gpus-per-node {shown_number(gpus_per_node)} on {resource_type}",
            f"at most {rt.gpus} ({rt.about})",
            f"--gpus-per-node {rt.gpus}",
        )
    return gpus_per_node, resource_type, rt


def _allocation(o: LaunchOptions, sched) -> _Allocation:
    if o.nodes is None:
        raise JobSpecError(f"{o.scheduler} without --nodes", "the number of nodes", "--nodes 2")
    _positive("--nodes", o.nodes, "--nodes 1 (or more)", job_settings.MAX_NODES)
    gpus_per_node, resource_type, rt = _gpus_per_node(o, sched)
    _positive(
        "--gpus-per-node",
        gpus_per_node,
        f"--gpus-per-node {rt.gpus if rt else 8}",
        job_settings.MAX_RANKS_PER_NODE,
    )
    ranks_per_node, devices_per_rank = _ranks_and_devices(
        gpus_per_node, o.ranks_per_node, o.devices_per_rank
    )
    # CPU binding: each rank gets its own cores for its input pipeline, ranks spread evenly over the sockets.
    cpus_per_rank = o.cpus_per_rank
    if cpus_per_rank is None:
        cpus_per_rank = rt.cores // rt.gpus * devices_per_rank if rt else 0
    if not 0 <= cpus_per_rank <= job_settings.MAX_CPUS_PER_RANK:
        raise JobSpecError(
            f"--cpus-per-rank {shown_number(cpus_per_rank)}",
            f"0 (no binding) to {job_settings.MAX_CPUS_PER_RANK}",
            "--cpus-per-rank 0",
        )
    if rt and cpus_per_rank * ranks_per_node > rt.cores:
        raise JobSpecError(
            f"--cpus-per-rank {shown_number(cpus_per_rank)} x {ranks_per_node} rank(s) on {resource_type}",
            f"at most {rt.cores} cores ({rt.about})",
            f"--cpus-per-rank {rt.cores // ranks_per_node}",
        )
    if ranks_per_node == 1:
        cpus_per_rank = 0  # one rank per node has the node's CPUs to itself; a partial node's cores are the cgroup's
    return _Allocation(
        gpus_per_node, resource_type, rt, ranks_per_node, devices_per_rank, cpus_per_rank
    )


def _walltime(o: LaunchOptions) -> int:
    walltime_s = parse_walltime(o.walltime)
    # 5:01 with a 300 s margin would leave the ranks 1 s: they stop before the first step, and a chain goes on.
    least = job_settings.MIN_TRAINING_S
    if walltime_s < least and 0 <= o.stop_margin:
        # No margin makes 10 s enough: the fix is a longer wall time, with the margin asked for (or the default).
        longer = format_walltime(min(o.stop_margin, 3600) + max(least, 600))
        raise JobSpecError(
            f"--walltime {o.walltime} ({walltime_s} s)",
            f"at least {least} s for the ranks to start and train, plus the stop margin "
            f"({shown_number(o.stop_margin)} s)",
            f"--walltime {longer}",
        )
    if not 0 <= o.stop_margin <= walltime_s - least:
        raise JobSpecError(
            f"--stop-margin {shown_number(o.stop_margin)} s with --walltime {o.walltime}",
            f"a margin of 0 s or more that leaves the ranks at least {least} s before it "
            "(they need time to start and train)",
            f"--stop-margin {max(min(DEFAULT_STOP_MARGIN_S, walltime_s // 10, walltime_s - least), 0)} "
            "or a longer --walltime",
        )
    return walltime_s


def shown_number(value: int) -> str:
    """A number as an error shows it: whole up to 20 digits, else its first 20 and how long it is
    (``10**3999`` -> ``"10000000000000000000... (4,000 digits)"``): a pasted run of digits must not fill the screen."""
    text = str(value)
    digits = text.lstrip("-")
    if len(digits) <= 20:
        return text
    return f"{text[: len(text) - len(digits) + 20]}... ({len(digits):,} digits)"


def _check_header_values(o: LaunchOptions, sched, site: Mapping[str, Any]) -> None:
    """The values that go into the header's directives and the job's environment."""
    if sched.group_required and not o.group:
        raise JobSpecError(
            f"{o.scheduler} without --group", sched.group_required, "--group gxx00000"
        )
    for label, value in (("--group", o.group), ("--name", o.name)):
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise JobSpecError(
                f"{label} {value!r}",
                f"letters, digits, '_', '.', '-' (it goes into the scheduler's {sched.directive_prefix} "
                "lines)",
                f"{label} {re.sub(r'[^A-Za-z0-9_.-]', '-', value).strip('-') or 'octo-dist'}",
            )
    refused = sitedirectives.refusal(
        sched, group=o.group, values=site, directives=o.directives or ()
    )
    if refused:
        raise JobSpecError(*refused)
    if o.wandb_mode not in WANDB_MODES:
        raise JobSpecError(
            f"--wandb-mode {o.wandb_mode!r}",
            f"one of {', '.join(WANDB_MODES)}",
            "--wandb-mode offline",
        )
    if o.coordinator is not None:
        _coordinator(o.coordinator)
    for module in o.modules or ():
        check_printable("--module", module)
        if module.startswith("-"):
            raise JobSpecError(
                f"--module {module!r}", "a module name (e.g. hpcx/2.20)", "--module hpcx/2.20"
            )


def _paths(
    o: LaunchOptions,
    sched,
    image_exists: Callable[[str], bool],
    resource_type: Optional[str] = None,
    read_head: Callable[[str], Optional[bytes]] = imagefit.read_head,
) -> Tuple[Optional[str], tuple]:
    """(the image, absolute when checked here; the directories bound into it)."""
    image = o.image or None
    bound = bool(image)
    _path("--image", image, False)
    if image and re.match(r"[^/]*:", image):
        # "x:y.sif": singularity reads what comes before the first ':' as a URI scheme (docker:, library:, oras:)
        # and fails on the node with "unsupported transport"; a path with a '/' before the ':' is a file.
        raise JobSpecError(
            f"--image {image!r}: singularity reads {image.split(':', 1)[0] + ':'!r} as a URI scheme "
            "(like docker: or library:), not as part of a file name",
            "a path to a .sif file",
            f"--image ./{image}, or rename the file without ':'",
        )
    _path("--venv", o.venv, False)
    _path("--save-dir", o.save_dir, bound)
    _path("--data-dir", o.data_dir, bound)
    if o.compile_cache:
        _path("--compile-cache", o.compile_cache, bound)
    binds = tuple(o.bind) if o.bind is not None else sched.default_binds(o.group)
    for b in binds:
        _path("--bind", b, True)
    if image and not o.skip_image_check:
        if not image_exists(image):
            raise JobSpecError(
                f"--image {image}: no such file",
                f"a Singularity image (.sif) that exists here, the {imagefit.needed_profile(resource_type)} "
                f"profile for {resource_type or 'these GPUs'}",
                f"{imagefit.build_fix(resource_type)}, fix the path, or --skip-image-check when it "
                "exists only on the cluster",
            )
        head = read_head(image)
        problem = imagefit.header_problem(head, image) if head is not None else None
        if problem:
            raise JobSpecError(
                problem,
                "a Singularity image: a SIF file starts with a '#!/usr/bin/env run-singularity' line and "
                "SIF_MAGIC at byte 32",
                f"point --image at the .sif that {imagefit.build_fix(resource_type).split(' (')[0]} or "
                "singularity build wrote",
            )
        image = os.path.abspath(
            image
        )  # the job runs from another directory than the one it was rendered in
    return image, binds


def _batch_and_steps(
    o: LaunchOptions, gpus: int, nodes_x_gpus: str
) -> Tuple[Optional[int], Optional[int]]:
    """(global batch, steps): the batch counted in GPUs, not ranks (a rank with 2 GPUs takes 2 GPUs' share)."""
    _positive("--per-gpu-batch", o.per_gpu_batch, "--per-gpu-batch 32", MAX_COUNT)
    _positive("--global-batch", o.global_batch, "--global-batch 256", MAX_COUNT)
    _positive("--steps", o.steps, "--steps 1000", MAX_COUNT)
    _positive("--keep-samples-from", o.keep_samples_from, "--keep-samples-from 256", MAX_COUNT)
    global_batch, steps = o.global_batch, o.steps
    if o.per_gpu_batch is not None and global_batch is not None:
        raise JobSpecError(
            f"--per-gpu-batch {o.per_gpu_batch} and --global-batch {global_batch}",
            "one of them",
            f"--per-gpu-batch {o.per_gpu_batch} alone (global = {o.per_gpu_batch * gpus})",
        )
    if o.per_gpu_batch is not None:
        global_batch = o.per_gpu_batch * gpus
    if global_batch is not None and global_batch % gpus:
        lower, upper = global_batch // gpus * gpus, (global_batch // gpus + 1) * gpus
        raise JobSpecError(
            f"--global-batch {global_batch} over {gpus} GPU(s) ({nodes_x_gpus})",
            f"a multiple of {gpus}, so every GPU gets the same share",
            f"--global-batch {upper}"
            + (f" (or {lower})" if lower else "")
            + f", or --per-gpu-batch {max(global_batch // gpus, 1)}",
        )
    if o.keep_samples_from is not None:
        if steps is None or global_batch is None:
            raise JobSpecError(
                "--keep-samples-from without --steps and a batch",
                "--steps N (planned for that global batch) and --per-gpu-batch or --global-batch",
                "--steps 50000 --keep-samples-from 256 --per-gpu-batch 32",
            )
        steps = scaled_steps(steps, o.keep_samples_from, global_batch)
    return global_batch, steps


def _training(o: LaunchOptions, alloc: _Allocation, checkers: Mapping[str, Checker]) -> _Training:
    train = list(o.train) or [DEFAULT_COMMAND]
    command_name, user_args = train[0], train[1:]
    lead_args, user_args = config_file_first(user_args)
    if command_name not in COMMANDS:
        raise JobSpecError(
            f"training command {command_name!r} after --",
            f"one of {', '.join(COMMANDS)}",
            "-- smoke --model tiny   or   -- finetune --config.pretrained_path=hf://rail-berkeley/octo-small",
        )
    cmd = COMMANDS[command_name]
    if o.data_dir and not cmd.data_dir:
        raise JobSpecError(
            f"--data-dir with {command_name}",
            f"no --data-dir: {command_name} reads no dataset",
            "drop --data-dir",
        )
    gpus = o.nodes * alloc.gpus_per_node
    global_batch, steps = _batch_and_steps(o, gpus, f"{o.nodes} node(s) x {alloc.gpus_per_node}")
    mapped = []
    if global_batch is not None:
        mapped.append(f"{cmd.batch}={global_batch}")
    if steps is not None:
        mapped.append(f"{cmd.steps}={steps}")
    if cmd.wandb_mode:
        mapped.append(f"{cmd.wandb_mode}={o.wandb_mode}")
    if alloc.devices_per_rank > 1:
        mapped.append(f"{cmd.devices}={alloc.devices_per_rank}")
    _check_not_given_twice(cmd, mapped, user_args)
    resume = bool(o.resume and cmd.resume)
    checker = checkers.get(command_name)
    if checker is not None:
        argv = [*lead_args, *mapped, f"{cmd.save_dir}={o.save_dir}"]
        if o.data_dir:
            argv.append(f"{cmd.data_dir}={o.data_dir}")
        if o.compile_cache:
            argv.append(f"{cmd.compile_cache}={o.compile_cache}")
        argv += [*user_args, *([cmd.resume] if resume else [])]
        try:
            checker(argv)
        except ValueError as e:
            _refuse_launch_flags(o, user_args, command_name, str(e))
            raise JobSpecError(
                f"-- {command_name}: {e}",
                f"flags that octo-dist {command_name} accepts",
                f"octo-dist {command_name} --help lists them",
            ) from None
    return _Training(
        command_name, tuple(lead_args), tuple(user_args), tuple(mapped), global_batch, steps, resume
    )


def _check_not_given_twice(cmd: Command, mapped: Sequence[str], user_args: Sequence[str]) -> None:
    """The training command's own flags after ``--`` must not set what launch sets."""
    for flag in mapped:
        flag_name = flag.split("=", 1)[0]
        if _flag_given(user_args, flag_name):
            raise JobSpecError(
                f"{flag_name} after -- while octo-dist launch sets it ({flag})",
                "each setting given once",
                f"drop {flag_name} after --",
            )
    for flag in (cmd.save_dir, cmd.data_dir, cmd.resume, cmd.compile_cache):
        if flag and _flag_given(user_args, flag):
            raise JobSpecError(
                f"{flag} after --",
                "the job's directories and resumption set by octo-dist launch "
                "(they are bound into the image and created by the script)",
                f"drop {flag} after -- and use launch's own option (--save-dir, --data-dir, "
                f"--compile-cache, --no-resume)",
            )
    if _flag_given(user_args, cmd.devices):
        raise JobSpecError(
            f"{cmd.devices} after --",
            "the GPUs of each rank set by octo-dist launch, which also sizes the ranks and the batch",
            f"drop {cmd.devices} after -- and use --devices-per-process",
        )


def _refuse_launch_flags(
    o: LaunchOptions, user_args: Sequence[str], command_name: str, refusal: str
) -> None:
    """A flag of launch's own given after ``--`` (``-- finetune -o job.sh``): say where it belongs.

    Only when the command itself called that flag unknown (its checker's "unknown flag -o"): smoke's own
    ``--steps -5`` is smoke's refusal to report, though launch has a ``--steps`` too."""
    unknown = re.match(r"unknown flag (\S+?)(?:=\S*)?(?:,|$)", refusal)
    if unknown is None:
        return
    own = {flag_of(f, o.scheduler) for f in option_fields()} | {
        "--" + f.name.replace("_", "-") for f in option_fields()
    }
    own |= {opt.option for opt in schedulers.get(o.scheduler).options}
    # Compared without dashes: absl names the -o it refused "--o".
    name = unknown.group(1).lstrip("-")
    if name not in {f.lstrip("-") for f in own}:
        return
    for i, arg in enumerate(user_args):
        flag = arg.split("=", 1)[0]
        if flag.startswith("-") and flag.lstrip("-") == name:
            value = user_args[i + 1] if i + 1 < len(user_args) and "=" not in arg else ""
            arg = f"{arg} {value}" if value and not value.startswith("-") else arg
            raise JobSpecError(
                f"{flag} after -- {command_name}: it is octo-dist launch's, and {command_name} has no such flag",
                "launch's flags before --, the training command's after it",
                f"octo-dist launch {o.scheduler} ... {arg} -- {command_name} ...",
            )
