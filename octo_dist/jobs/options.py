"""``octo-dist launch``'s options: ``LaunchOptions``, one field per flag, from which the parser, the defaults files'
keys and ``--show-defaults`` are generated; each scheduler adds its own (``Scheduler.options``). Pure data and
help text: ``spec.build`` decides the options into a ``Job(header, settings)``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Mapping, Optional, Tuple, get_type_hints

from octo_dist import problems
from octo_dist.jobs import schedulers
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs.rankcores import default_cpus_per_rank
from octo_dist.launchers import outside

WANDB_MODES = job_settings.WANDB_MODES
_BOUNDS = job_settings.BOUNDS
DEFAULT_STOP_MARGIN_S = job_settings.DEFAULT_STOP_MARGIN_S
DEFAULT_COMPILE_CACHE = (
    ".octo-dist/compile-cache"  # under the submit directory: shared by every node and every job
)


def default_script(scheduler: str) -> str:
    """``-o``'s default: ``"pbs"`` -> ``"octo-dist-pbs.sh"``."""
    return f"octo-dist-{scheduler}.sh"


def scheduler_names() -> Tuple[str, ...]:
    """The registered schedulers, ``launch``'s sub-commands: ``("pbs", "sge", "slurm")`` and any registered since."""
    return tuple(schedulers.SCHEDULERS)


class GivenOnce(argparse.Action):
    """Stores the value of an option that takes one value: the same setting given twice with different values is
    refused in one line (exit 2), where argparse would keep the last without a word (``--nodes 2 ... --nodes 4``
    ran on 4 nodes; ``--account a --group b``, two spellings of one setting, ran under b). The same value twice is
    one value. Options meant to repeat (``--directive``, ``--module``, ``--bind``) append instead."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "given." + self.dest, None)
        if given is not None and given[1] != values:
            first = f"{given[0]} {_shown(given[1])}"
            second = f"{option_string} {_shown(values)}"
            parser.exit(
                2,
                "octo-dist launch: error: "
                + problems.line(
                    f"{first} and {second} set the same setting twice",
                    "one value",
                    f"keep one of them ({first}, or {second})",
                )
                + "\n",
            )
        setattr(namespace, "given." + self.dest, (option_string, values))
        setattr(namespace, self.dest, values)


def _shown(value) -> str:
    """A value as a refusal shows it: escaped and cut (``--save-dir`` of 5,000 characters is not echoed whole)."""
    return outside.shown(str(value), SHOWN_VALUE_CHARS)


SHOWN_VALUE_CHARS = 80


def _opt(
    default,
    help: str,
    group: str,
    *,
    flag: Optional[str] = None,
    in_header: bool = True,
    in_file: bool = False,
    needs: str = "",
    old_flags: Tuple[str, ...] = (),
    bound: Optional[job_settings.Bound] = None,
    **argparse_kwargs,
):
    """A LaunchOptions field: its default, its help line and argparse group, and extra ``add_argument`` keywords;
    ``bound``: a count's, from the one table (``settings.BOUNDS["steps"]``), checked by :func:`check_bounds`.

    ``help`` may use ``{default}``, ``{scheduler}``, ``{resource_type}``, ``{modules}``, ``{resource_types}``: each
    scheduler's ``launch`` help is filled in with its own values (``launch_help``). ``needs``: a scheduler
    attribute the option only makes sense with (``"resource_types"``): offered where it is not empty.
    """
    if "action" not in argparse_kwargs and not old_flags:
        # One value per setting: a second, different value is refused rather than silently taking its place
        # (an option with old flags gets Renamed, a GivenOnce, from the parser).
        argparse_kwargs["action"] = GivenOnce
    return dataclasses.field(
        default=default,
        metadata={
            "help": help,
            "group": group,
            "flag": flag,
            "in_header": in_header,
            "in_file": in_file,
            "needs": needs,
            "old_flags": old_flags,  # earlier spellings: still accepted, with a note naming this one
            "bound": bound,
            "argparse": argparse_kwargs,
        },
    )


def _setting(section, name: str, default, group: str, **argparse_kwargs):
    """A LaunchOptions field for a setting the job carries (``settings.Allocation``'s ``nodes``): its flag and help
    are the setting's own metadata, so the flag that sets it is the flag a refusal of its value names."""
    meta = next(f for f in dataclasses.fields(section) if f.name == name).metadata
    # A count taken as given has the setting's bound; --walltime's text ("1:00:00") is read first, and its seconds
    # are then checked with the timing.
    bound = meta["bound"] if argparse_kwargs.get("type") is int else None
    return _opt(default, meta["help"], group, flag=meta["flag"], bound=bound, **argparse_kwargs)


def _count(bound: str, help: str, group: str, **kwargs):
    """A launch-only count (``--steps``, ``--chain``): None when not given (the command's or the scheduler's own
    default), else a whole number within ``settings.BOUNDS[bound]``, the one table, checked by :func:`check_bounds`."""
    return _opt(None, help, group, bound=_BOUNDS[bound], type=int, **kwargs)


class Renamed(GivenOnce):
    """Stores the value, once (:class:`GivenOnce`); an option given by an earlier name (any option string but the
    first) gets a note naming the current one, on stderr: ``octo-dist launch pbs: note: --devices-per-rank is now
    --devices-per-process; the old name still works``. One name per setting across octo-dist's commands."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string != self.option_strings[0]:
            print(
                f"{parser.prog}: note: {option_string} is now {self.option_strings[0]}; the old name still works",
                file=sys.stderr,
            )
        super().__call__(parser, namespace, values, option_string)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Every choice ``octo-dist launch`` takes; argparse fills one from the command line (``jobs.cli``)."""

    scheduler: str = "pbs"
    train: tuple = ()  # the training command after `--`: ("smoke", "--model", "tiny"); empty: the smoke job
    # The scheduler's own options given (Scheduler.options), as (name, value) pairs: (("partition", "gpu"),).
    site: tuple = ()
    nodes: Optional[int] = _setting(job_settings.Allocation, "nodes", None, "resources", type=int)
    resource_type: Optional[str] = _opt(
        None,
        "{resource_types} (default: {resource_type})",
        "resources",
        in_file=True,
        needs="resource_types",  # only ABCI 3.0's PBS has resource types here
    )
    gpus_per_node: Optional[int] = _count(
        "gpus_per_node",
        "GPUs used on each node (default: {gpus_per_node})",
        "resources",
    )
    ranks_per_node: Optional[int] = _setting(
        job_settings.Allocation, "ranks_per_node", None, "resources", type=int
    )
    devices_per_rank: Optional[int] = _count(
        "devices_per_rank",
        "GPUs each rank uses; ranks per node x this must equal --gpus-per-node, so no GPU sits idle "
        "(default: GPUs per node / ranks per node)",
        "resources",
        # smoke's, finetune's and validate's spelling too: one name for one setting
        flag="--devices-per-process",
        old_flags=("--devices-per-rank",),
    )
    cpus_per_rank: Optional[int] = _setting(
        job_settings.Allocation, "cpus_per_rank", None, "resources", type=int
    )
    walltime: str = _setting(
        job_settings.Timing, "walltime_s", "1:00:00", "resources", in_file=True
    )
    group: Optional[str] = _opt(
        None, "{group_help}", "resources", action=GivenOnce, in_file=True
    )  # + the scheduler's group_flags
    name: str = _opt("octo-dist", "job name (default: {default})", "resources", in_file=True)
    directives: Optional[tuple] = _opt(
        None,
        "a line for the header as it is, repeatable: '{prefix} ...' in this scheduler's syntax; one that sets "
        "what the header already sets is refused (default: none)",
        "site",
        action="append",
        flag="--directive",
        metavar="TEXT",
    )
    modules: Optional[tuple] = _setting(
        job_settings.Software, "modules", None, "resources", action="append", in_file=True
    )
    image: Optional[str] = _setting(
        job_settings.Software, "image", None, "environment", in_file=True
    )
    skip_image_check: bool = _opt(
        False,
        "the image exists only on the cluster: do not look for it here; the script "
        "checks it when the job starts (default: off)",
        "environment",
        action="store_true",
        in_file=True,
    )
    venv: str = _setting(job_settings.Software, "venv", ".venv", "environment", in_file=True)
    bind: Optional[tuple] = _setting(
        job_settings.Software, "binds", None, "environment", action="append", in_file=True
    )
    coordinator: Optional[str] = _setting(
        job_settings.Forwarding, "coordinator", None, "environment"
    )
    per_gpu_batch: Optional[int] = _count(
        "per_gpu_batch",
        "examples per GPU per step; the global batch is this x GPUs per node x "
        "nodes, however many GPUs each rank has (default: the command's own)",
        "training",
    )
    global_batch: Optional[int] = _count(
        "global_batch",
        "examples per step over all GPUs, a multiple of their number (default: the command's own)",
        "training",
    )
    steps: Optional[int] = _count(
        "steps",
        "optimizer steps (default: the command's own)",
        "training",
    )
    keep_samples_from: Optional[int] = _count(
        "keep_samples_from",
        "--steps were planned for this global batch: scale them so the job "
        "sees as many examples (default: no scaling)",
        "training",
        metavar="BATCH",
    )
    save_dir: str = _setting(
        job_settings.Storage, "save_dir", "runs/octo-dist", "training", in_file=True
    )
    data_dir: Optional[str] = _setting(
        job_settings.Storage, "data_dir", None, "training", in_file=True
    )
    compile_cache: str = _setting(
        job_settings.Storage, "compile_cache", DEFAULT_COMPILE_CACHE, "training", in_file=True
    )
    wandb_mode: str = _setting(
        job_settings.Storage,
        "wandb_mode",
        "disabled",
        "training",
        choices=WANDB_MODES,
        in_file=True,
    )
    resume: bool = _opt(
        True,
        "do not pass the command's resume flag (default: resume from --save-dir)",
        "training",
        action="store_false",
        flag="--no-resume",
    )
    stop_margin: int = _setting(
        job_settings.Timing,
        "stop_margin_s",
        DEFAULT_STOP_MARGIN_S,
        "training",
        type=int,
        metavar="SECONDS",
    )
    dry_run: bool = _opt(
        False,
        "print the script instead of writing it (default: off)",
        "output",
        action="store_true",
        in_header=False,
    )
    output: Optional[str] = _opt(
        None,
        "file to write (default: octo-dist-{scheduler}.sh)",
        "output",
        flag="-o",
        in_header=False,
    )
    show_defaults: bool = _opt(
        False,
        "print every option's value and where it came from: the command line, "
        "~/.config/octo-dist/launch.ini, ./octo-dist.ini or built in; write nothing "
        "(default: off)",
        "output",
        action="store_true",
        in_header=False,
    )
    submit: bool = _opt(
        False,
        "submit the written script ({submit}) and print the job id and its log (default: off)",
        "output",
        action="store_true",
        in_header=False,
    )
    chain: Optional[int] = _count(
        "chain",
        "submit N jobs, each held until the one before has ended ({depend}); a job "
        "trains only when the one before did not fail, and resumes from its checkpoints; "
        "at most 50 (default: one job)",
        "output",
        metavar="N",
        in_header=False,
    )
    beside_running: bool = _opt(
        False,
        "with --submit/--chain: submit even while jobs recorded for the save directory are queued or running, "
        "which would train the same run side by side (default: off, refused)",
        "output",
        action="store_true",
        in_header=False,
    )

    def changed(self) -> list:
        """``(flag, value)`` for every option that differs from its default, in field order, then the
        scheduler's own: the header's line."""
        out = []
        for f in option_fields():
            value = getattr(self, f.name)
            if value == f.default or not f.metadata["in_header"]:
                continue
            out.append((flag_of(f, self.scheduler), value))
        given = dict(self.site)
        for opt in (
            schedulers.get(self.scheduler).options
            if self.scheduler in schedulers.SCHEDULERS
            else ()
        ):
            if given.get(opt.name) not in (None, opt.default, ()):
                out.append((opt.option, given[opt.name]))
        return out

    def chosen_resource_type(self) -> Optional[str]:
        """``--resource-type``, else the scheduler's default (ABCI 3.0's PBS: ``"rt_HF"``); None for a scheduler
        without resource types. The one place that default is taken: placement, --show-defaults, the image."""
        return self.resource_type or schedulers.get(self.scheduler).default_resource_type

    def script_path(self) -> str:
        """``-o``, else ``octo-dist-{scheduler}.sh`` (``"octo-dist-pbs.sh"``): where the script is written."""
        return self.output or default_script(self.scheduler)

    def site_values(self) -> dict:
        """Every option of the scheduler's own, given or its default: ``{"pe": "mpi", "queue": None}``; and any
        other scheduler's given (a refusal names it)."""
        given = dict(self.site)
        own = schedulers.get(self.scheduler).options
        return {**{o.name: given.pop(o.name, o.default) for o in own}, **given}


def with_settings(base: type) -> type:
    """``base`` with an option for each job setting declared with its launch group in its metadata
    (``settings._field(..., group="training", default=...)``) that ``base`` does not take already: its flag, help,
    bound, group and default are the setting's, its name the setting's (``spec`` passes ``o.NAME`` to it by name),
    so a setting the job runtime reads is one field in ``settings.py``."""
    taken = {f.name for f in dataclasses.fields(base)}
    extra = []
    for section in get_type_hints(job_settings.JobSettings).values():
        hints = get_type_hints(section) if dataclasses.is_dataclass(section) else {}
        for f in dataclasses.fields(section) if hints else ():
            meta = f.metadata
            if meta["group"] and f.name not in taken:
                kind = {"type": hints[f.name]} if hints[f.name] in (int, str) else {}
                opt = _opt(
                    meta["default"],
                    meta["help"],
                    meta["group"],
                    flag=meta["flag"],
                    bound=meta["bound"],
                    in_file=meta["in_file"],
                    **kind,
                )
                extra.append((f.name, Optional[hints[f.name]], opt))
    if not extra:
        return base
    namespace = {"__module__": base.__module__, "__doc__": base.__doc__}
    return dataclasses.make_dataclass(
        base.__name__, extra, bases=(base,), frozen=True, namespace=namespace
    )


LaunchOptions = with_settings(LaunchOptions)


def check_bounds(o: LaunchOptions) -> None:
    """Every count given against its bound in the one table (``settings.BOUNDS``), in its flag's words, before
    anything is derived from it: ``--steps 0`` -> ``--steps 0; expected --steps from 1 to 2147483647. Fix: --steps
    1000``, the words the settings' own check (``settings.check(flags=True)``) gives a count the job carries."""
    for f in option_fields():
        value = getattr(o, f.name)
        if f.metadata["bound"] is not None and value is not None:
            job_settings.check_bound(flag_of(f), value, f.metadata["bound"], flags=True)


def wandb_note(mode: str) -> str:
    """What ``launch``'s closing line says of wandb: ``"wandb: disabled (--wandb-mode offline|online to log)"``.

    The job's default is disabled (a job needs no account), while the fork's fine-tune logs to wandb: a run that
    logs nothing must not look like one that logs. ``"wandb: offline"``, ``"wandb: online"`` otherwise."""
    if mode == "disabled":
        return "wandb: disabled (--wandb-mode offline|online to log)"
    return f"wandb: {mode}"


def option_fields() -> list:
    """The fields of LaunchOptions that are command-line options (not the scheduler or the training command)."""
    return [f for f in dataclasses.fields(LaunchOptions) if "help" in f.metadata]


def file_keys() -> Mapping[str, dataclasses.Field]:
    """A defaults file's keys, each the option it sets: every option declared ``in_file``, under its flag's name
    (``{"group": <group>, "module": <modules>, "wandb-mode": <wandb_mode>, ...}``), a one-field setting's too."""
    return {flag_of(f)[2:]: f for f in option_fields() if f.metadata["in_file"]}


def repeated(field: dataclasses.Field) -> bool:
    """Whether the option adds up over repeats (``--module a --module b``): a defaults file lists it space-separated."""
    return field.metadata["argparse"].get("action") == "append"


def flag_of(field: dataclasses.Field, scheduler: Optional[str] = None) -> str:
    """The option's flag; with a scheduler, in that scheduler's words (``group`` on slurm: ``--account``)."""
    own = schedulers.get(scheduler).group_flags if field.name == "group" and scheduler else ()
    return own[0] if own else field.metadata["flag"] or "--" + field.name.replace("_", "-")


def offered(field: dataclasses.Field, scheduler: str) -> bool:
    """Whether ``launch SCHEDULER`` has this option (``--resource-type`` only where there are resource types)."""
    needs = field.metadata.get("needs")
    return not needs or bool(getattr(schedulers.get(scheduler), needs))


def launch_help(scheduler: str) -> Mapping[str, str]:
    """The values each scheduler's ``launch --help`` fills into the option help lines."""
    s = schedulers.get(scheduler)
    rt = s.resource_types.get(s.default_resource_type or "")
    modules = " ".join(s.default_modules + s.image_modules) or "none"
    if s.image_modules:
        modules = f"{' '.join(s.default_modules)}, plus {' '.join(s.image_modules)} with --image"
    binds = " ".join(s.default_binds("GROUP"))
    return {
        "scheduler": scheduler,
        "prefix": s.directive_prefix,
        "resource_types": (
            "resource type: " + "; ".join(f"{k} ({v.about})" for k, v in s.resource_types.items())
            if s.resource_types
            else "not used: no resource types on this scheduler, give --gpus-per-node"
        ),
        "resource_type": s.default_resource_type or "none",
        "gpus_per_node": f"the resource type's, {rt.gpus} on {s.default_resource_type}"
        if rt
        else "none, required",
        "cpus_per_rank": (
            f"the node's cores over its GPUs, {default_cpus_per_rank(rt, rt.gpus, 1)} on "
            f"{s.default_resource_type}"
            if rt
            else "0, none bound"
        ),
        "group_help": s.group_help,
        "modules": modules,
        "binds": f"{binds} with --group" if binds else "none",
        "submit": s.submit_program,
        "depend": s.depend_help or f"{s.submit_program} after the one before",
    }
