"""A job's choices (``options.LaunchOptions``) decided into one ``Job(header, settings)``: the scheduler header's
values, and the ``JobSettings`` the script carries to the job runtime (the same object, checked by the same code).

Everything here is pure: ``build(options)`` takes the options (and an ``image_exists`` predicate, so tests need no
image) and either returns a ``Job`` or raises ``JobSpecError`` naming, in the words of launch's flags, what was
found, what was expected and the fix, before anything is written or submitted. What differs between schedulers
comes from the scheduler's class.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple, get_type_hints

from octo_dist.jobs import imagefit, schedulers, sitedirectives
from octo_dist.jobs.allocation import placement, shown_defaults
from octo_dist.jobs.commands import COMMANDS, FORWARD_NAMES, FORWARD_PREFIXES, PREFLIGHT, Checker
from octo_dist.jobs.flagchecks import (
    JobSpecError,
    check_coordinator,
    check_path,
    check_printable,
)
from octo_dist.jobs import settings as job_settings
from octo_dist.jobs.options import LaunchOptions, check_bounds, scheduler_names
from octo_dist.jobs.training import Training, pretrained_bind, training
from octo_dist.jobs.walltime import parse_walltime

__all__ = ["Job", "JobHeader", "JobSpecError", "build", "derived_defaults"]


@dataclasses.dataclass(frozen=True)
class JobHeader:
    """What only the login node needs of a job: the scheduler's header, and what launch says it wrote."""

    resource_type: Optional[str]  # "rt_HF"; None for SLURM and Grid Engine
    gpus_per_node: int
    devices_per_rank: int  # GPUs each rank binds; ranks_per_node x this == gpus_per_node
    group: Optional[str]  # ABCI group (qsub -P), Grid Engine project (-P) or SLURM account
    name: str
    # The scheduler's own options (Scheduler.options), given or default: {"pe": "mpi", "queue": None},
    # {"partition": "gpu"}, {"resources": ("mem=400gb",)}; the scheduler's site_lines(header, settings) read them.
    site: Mapping
    directives: tuple  # header lines as given: ("#SBATCH --mail-type=END",)
    command_line: tuple  # the `octo-dist launch ...` argv that rendered it, for the script's header
    training: Training  # the command, its flags from the job's settings and the user's, the batch and steps


@dataclasses.dataclass(frozen=True)
class Job:
    """What ``octo-dist launch`` renders: the header's values, and the settings the job runtime reads back from the
    script (``settings.JobSettings``, checked in the words of launch's flags before anything is written).

    The scheduler's render-time hooks get the two parts (``header_values(job.header, job.settings)``,
    ``site_lines(...)``), and so does ``render``. A reader names the part a value lives in:
    ``job.settings.allocation.nodes``, ``job.settings.software.image``, ``job.header.training.steps``."""

    header: JobHeader
    settings: job_settings.JobSettings

    @property
    def ranks(self) -> int:
        return self.settings.ranks

    @property
    def gpus(self) -> int:
        return self.settings.allocation.nodes * self.header.gpus_per_node

    @property
    def preflight_args(self) -> tuple:
        """What ``octo-dist check-env --launch`` is given besides itself: ``("--devices-per-process=2",)``."""
        return self.settings.commands.preflight[len(PREFLIGHT) :]


def derived_defaults(o: "LaunchOptions") -> dict:
    """What :func:`build` takes for the options left unset that depend on others, for ``--show-defaults``.

    ``launch pbs`` with nothing set -> ``{"resource_type": "rt_HF", "gpus_per_node": 8, "ranks_per_node": 8,
    "devices_per_rank": 1, "cpus_per_rank": 12, "modules": ("hpcx/2.20",)}`` (SLURM: no resource type, so only
    ``modules``); each with the option it follows, as ``(value, "from --resource-type rt_HF")``."""
    out: dict = {}
    scheduler = o.scheduler
    s = schedulers.get(scheduler)
    resource_type = o.chosen_resource_type()
    rt = s.resource_types.get(resource_type) if resource_type else None
    if o.resource_type is None and resource_type:
        out["resource_type"] = (resource_type, f"{scheduler}'s default")
    gpus = o.gpus_per_node
    if gpus is None and rt:
        gpus = rt.gpus
        out["gpus_per_node"] = (gpus, f"from --resource-type {resource_type}")
    out.update(shown_defaults(o, gpus, rt, resource_type))
    if o.output is None:
        out["output"] = (o.script_path(), "after the scheduler")
    if o.bind is None and s.default_binds("GROUP"):
        binds = " ".join(s.default_binds("GROUP"))
        out["bind"] = (s.default_binds(o.group), f"{binds} with --group")
    if o.modules is None:
        out["modules"] = (_modules(o, s, o.image), f"{scheduler}'s default")
    return out


def build(
    options: LaunchOptions,
    *,
    image_exists: Callable[[str], bool] = os.path.isfile,
    checkers: Optional[Mapping[str, Checker]] = None,
    command_line: Sequence[str] = (),
) -> Job:
    """A validated Job, or JobSpecError.

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
    check_bounds(o)  # every count given, in the words settings.check gives those the job carries
    _check_chain(o)
    _check_texts(o, command_line)
    alloc = placement(o, sched)
    timing = _by_name(
        job_settings.Timing,
        _named(o, walltime_s=parse_walltime(o.walltime), stop_margin_s=o.stop_margin),
    )
    job_settings.check_section("timing", timing, flags=True)
    _check_header_values(o, sched, site)
    image, binds = _paths(o, sched, image_exists, alloc.resource_type)
    train = training(o, alloc, checkers or {})
    if image:  # the pretrained checkpoint's directory, bound as --data-dir is
        for b in pretrained_bind(train):
            check_path("--config.pretrained_path", b, True)
        binds += tuple(b for b in pretrained_bind(train) if b not in binds)
    settings = _settings(o, sched, alloc, timing, image, binds, train)
    # Every setting, in the words of launch's flags, by the check the job runtime runs again on the node.
    job_settings.check(settings, flags=True)
    header = JobHeader(
        resource_type=alloc.resource_type,
        gpus_per_node=alloc.gpus_per_node,
        devices_per_rank=alloc.devices_per_rank,
        group=o.group,
        name=o.name,
        site={k: v for k, v in site.items() if v not in (None, ())},
        directives=tuple(o.directives or ()),
        command_line=tuple(command_line),
        training=train,
    )
    return Job(header, settings)


def _settings(
    o: LaunchOptions, sched, alloc, timing, image: Optional[str], binds: tuple, train: Training
) -> job_settings.JobSettings:
    """The job's settings, each by its name: what ``build`` derived (placement, wall time, paths, the commands),
    else the launch option of the same name (``o.save_dir``): a setting declared in ``settings.py`` with its launch
    group (``options.with_settings``) reaches the job with no edit here."""
    rt_environment = alloc.rt.environment if alloc.rt else ()
    derived = {
        "script_name": "job.sh",  # the name it is written under: render's
        "ranks_per_node": alloc.ranks_per_node,
        "cpus_per_rank": alloc.cpus_per_rank,
        "sockets": alloc.rt.sockets if alloc.rt else 0,
        **{f.name: getattr(timing, f.name) for f in dataclasses.fields(timing)},
        "modules": _modules(o, sched, image),
        "image": image or "",
        "binds": binds,
        "data_dir": o.data_dir or "",
        "environment": tuple(
            (n, v) for n, v, _ in rt_environment + COMMANDS[train.command].environment
        ),
        "coordinator": o.coordinator or "",
        "forward_prefixes": FORWARD_PREFIXES,
        "forward_names": FORWARD_NAMES,
        # + "--devices-per-process=2": the GPUs each rank binds, for the preflight's check
        "preflight": preflight_argv(alloc.devices_per_rank),
        "train": train.argv,
    }
    return _by_name(job_settings.JobSettings, _named(o, **derived))


def _named(o: LaunchOptions, **derived) -> Callable[[str], Any]:
    """A setting's value by its name: derived by ``build``, else the launch option of that name; one that is
    neither is a bug here, and AttributeError names it."""
    return lambda name: derived[name] if name in derived else getattr(o, name)


def _by_name(cls, value):
    """``cls`` (a section, or ``JobSettings`` itself) with each field ``value(name)``, a section built likewise."""
    hints = get_type_hints(cls)
    return cls(
        **{
            f.name: _by_name(hints[f.name], value)
            if dataclasses.is_dataclass(hints[f.name])
            else value(f.name)
            for f in dataclasses.fields(cls)
        }
    )


def _modules(o: LaunchOptions, sched, image: Optional[str]) -> tuple:
    if o.modules is not None:
        # --module '': no modules at all (the site's MPI is on PATH)
        return tuple(m for m in o.modules if m)
    return sched.default_modules + (sched.image_modules if image else ())


def preflight_argv(devices_per_rank: int) -> tuple:
    """``octo-dist check-env --launch``, with what it needs to check the GPUs each rank will bind against each
    host's: ``--devices-per-process=2``; nothing more for one GPU per rank (its default)."""
    return (
        *PREFLIGHT,
        *((f"--devices-per-process={devices_per_rank}",) if devices_per_rank > 1 else ()),
    )


MAX_CHAIN = (
    job_settings.MAX_CHAIN
)  # submit.MAX_CHAIN reads it here; its bound is settings.BOUNDS["chain"]


def _check_chain(o: LaunchOptions) -> None:
    """``--chain N`` queues N jobs (1 to MAX_CHAIN, ``check_bounds``): only with ``--submit`` (writing a script
    never submits)."""
    if o.chain is None:
        return
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
    if o.coordinator is not None:
        check_coordinator(o.coordinator)
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
    check_path("--image", image, False)
    if image and re.match(r"[^/]*:", image):
        # "x:y.sif": singularity reads what comes before the first ':' as a URI scheme (docker:, library:, oras:)
        # and fails on the node with "unsupported transport"; a path with a '/' before the ':' is a file.
        raise JobSpecError(
            f"--image {image!r}: singularity reads {image.split(':', 1)[0] + ':'!r} as a URI scheme "
            "(like docker: or library:), not as part of a file name",
            "a path to a .sif file",
            f"--image ./{image}, or rename the file without ':'",
        )
    check_path("--venv", o.venv, False)
    check_path("--save-dir", o.save_dir, bound)
    check_path("--data-dir", o.data_dir, bound)
    if o.compile_cache:
        check_path("--compile-cache", o.compile_cache, bound)
    binds = tuple(o.bind) if o.bind is not None else sched.default_binds(o.group)
    for b in binds:
        check_path("--bind", b, True)
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
