"""``octo-dist launch {pbs,sge,slurm}``: render a job script; ``--dry-run`` prints it, ``-o FILE`` writes it.

The options are the fields of ``options.LaunchOptions``: the parser is generated from them, and argparse's namespace
goes back into one ``LaunchOptions``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Sequence

from octo_dist import EXIT_USAGE
from octo_dist.problems import Problem
from octo_dist.jobs import defaults as defaults_mod
from octo_dist.jobs import flagsinimage, imagefit, schedulers
from octo_dist.jobs import commands
from octo_dist.jobs import options as options_mod
from octo_dist.jobs import jobwarnings, runfrom, submitchecks, walltime
from octo_dist.jobs import spec as spec_mod
from octo_dist.jobs import submit as submit_mod
from octo_dist.jobs.render import render
from octo_dist.jobs.filereplace import existing_kind, replacing
from octo_dist.launchers import outside


COMMON_DESCRIPTION = (
    " Every rank runs in the image (or the venv); a preflight (octo-dist check-env --launch) runs under the same "
    "launcher first; every rank checkpoints and stops before the wall time. Bad choices are refused (exit 2) before "
    "anything is written. The training command follows `--` (default: the smoke job): -- smoke --model tiny, or "
    "-- finetune --config.pretrained_path=weights/octo-small."
)


def add_parser(
    sub, checkers: Optional[Mapping[str, commands.Checker]] = None
) -> argparse.ArgumentParser:
    """Register ``launch``; ``checkers`` maps a training command to a Checker of its arguments
    (see commands.Checker)."""
    p = sub.add_parser(
        "launch",
        help="render a job script for PBS (ABCI 3.0), Grid Engine or SLURM",
        description="Render a complete job script."
        + COMMON_DESCRIPTION
        + " Options: octo-dist launch "
        "SCHEDULER --help.",
    )
    # One sub-parser per scheduler, so that the training command after `--` is the only positional: argparse would
    # otherwise fill an optional positional with nothing as soon as it meets the scheduler's name.
    names = options_mod.scheduler_names()
    subs = p.add_subparsers(dest="scheduler", metavar="{" + ",".join(names) + "}", required=True)
    for name in names:
        s = schedulers.get(name)
        sp = subs.add_parser(
            name,
            help=s.help or s.title,
            description=(s.description or f"Render a job script for {s.title}.")
            + COMMON_DESCRIPTION,
            usage=f"octo-dist launch {name} [options] [-- {{smoke,finetune}} [ARGS...]]",
        )
        _add_options(sp, name)
        sp.add_argument(
            "train",
            nargs="*",
            metavar="-- COMMAND ARGS",
            help="the training command after --: smoke (default) or finetune, then its own flags",
        )
        sp.set_defaults(func=run, checkers=dict(checkers or {}))
    return p


def _add_options(parser: argparse.ArgumentParser, scheduler: str) -> None:
    values = options_mod.launch_help(scheduler)
    s = schedulers.get(scheduler)
    groups = {}

    def group(name: str):
        return groups.get(name) or groups.setdefault(name, parser.add_argument_group(name))

    for f in options_mod.option_fields():
        if not options_mod.offered(f, scheduler):
            continue
        meta = f.metadata
        flag = options_mod.flag_of(f)
        names = [flag, "--" + f.name.replace("_", "-")] if not flag.startswith("--") else [flag]
        if f.name == "group":
            names = [*s.group_flags, *names]  # the scheduler's own word first
        renamed = {"action": options_mod.Renamed} if meta["old_flags"] else {}
        names += meta["old_flags"]
        default = "none" if f.default is None else f.default
        # NOT_GIVEN tells a flag left out (a defaults file may set it) from one given with the built-in value.
        configurable = meta["in_file"] and not options_mod.repeated(f)
        group(meta["group"]).add_argument(
            *names,
            dest=f.name,
            default=NOT_GIVEN if configurable else f.default,
            help=meta["help"].format(default=default, **values),
            **meta["argparse"],
            **renamed,
        )
    for opt in s.options:  # the scheduler's own: NOT_GIVEN, so a defaults file may set them
        default = "none" if opt.default is None else opt.default
        group(opt.group).add_argument(
            opt.option,
            dest=SITE_DEST + opt.name,
            default=None if opt.repeat else NOT_GIVEN,  # append needs a list or None to start from
            action="append" if opt.repeat else options_mod.GivenOnce,
            metavar=opt.metavar or opt.name.upper(),
            help=opt.help.format(default=default, **values),
        )


SITE_DEST = "site."  # argparse's dest for a scheduler's own option: "site.partition"


NOT_GIVEN = type("NotGiven", (), {"__repr__": lambda self: "NOT_GIVEN"})()


def options_from_args(args: argparse.Namespace, files: Optional[Mapping[str, tuple]] = None):
    """argparse's namespace (+ defaults files: field -> (value, path)) -> (LaunchOptions, field -> source).

    Lists from repeated flags become tuples; a flag left out takes the files' value, else the built-in one.
    """
    values, sources = {}, {}
    files = files or {}
    for f in options_mod.option_fields():
        value = getattr(args, f.name, NOT_GIVEN)
        own = options_mod.offered(f, args.scheduler)
        if value is NOT_GIVEN or (
            value is None and f.metadata["in_file"] and options_mod.repeated(f)
        ):
            value, sources[f.name] = ((files or {}) if own else {}).get(
                f.name, (f.default, defaults_mod.BUILT_IN)
            )
        else:
            given = (
                f.metadata["in_file"] or value != f.default
            )  # those can tell; the others show it
            sources[f.name] = defaults_mod.COMMAND_LINE if given else defaults_mod.BUILT_IN
        values[f.name] = tuple(value) if isinstance(value, list) else value
    # The scheduler's own options; a defaults file's [launch] holds every scheduler's: its partition = gpu is
    # not for pbs, and is left out there.
    site = []
    for opt in schedulers.get(args.scheduler).options:
        value = getattr(args, SITE_DEST + opt.name, NOT_GIVEN)
        if value is NOT_GIVEN or (value is None and opt.repeat):
            value, sources[opt.name] = files.get(opt.name, (opt.default, defaults_mod.BUILT_IN))
        else:
            sources[opt.name] = defaults_mod.COMMAND_LINE
        if value is not None:
            site.append((opt.name, tuple(value) if isinstance(value, (list, tuple)) else value))
    return options_mod.LaunchOptions(
        scheduler=args.scheduler, train=tuple(args.train), site=tuple(site), **values
    ), sources


def command_line(options: options_mod.LaunchOptions) -> list:
    """The canonical ``octo-dist launch ...`` for these options (non-default ones only), for the header."""
    out = ["octo-dist", "launch", options.scheduler]
    for flag, value in options.changed():
        if isinstance(value, bool):
            out.append(flag)
        else:
            for v in value if isinstance(value, tuple) else [value]:
                out += [flag, str(v)]
    return out + (["--", *options.train] if options.train else [])


def parse(
    argv: Sequence[str], checkers: Optional[Mapping[str, commands.Checker]] = None
) -> spec_mod.Job:
    """``octo-dist launch`` argv (without "launch") -> JobSpec; for the examples and tests."""
    parser = argparse.ArgumentParser(prog="octo-dist")
    add_parser(parser.add_subparsers(), checkers)
    args = parser.parse_args(["launch", *argv])
    options, _ = options_from_args(args)
    refusal = commands.job_decides(options.train[1:])
    if refusal:
        raise spec_mod.JobSpecError(*refusal)
    return spec_mod.build(options, checkers=args.checkers, command_line=command_line(options))


class ScriptError(Problem, RuntimeError):
    """A rendered script that bash cannot parse: a bug in octo-dist's templates, never the user's input."""


SYNTAX_CHECK_TIMEOUT_S = 60  # bash -n of a 300-line script takes milliseconds


def syntax_check(text: str) -> None:
    """``bash -n`` on the rendered script; skipped where there is no bash (the job needs bash anyway)."""
    bash = shutil.which("bash")
    if bash is None:
        return
    try:
        proc = subprocess.run(
            [bash, "-n"], input=text, capture_output=True, text=True, timeout=SYNTAX_CHECK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise ScriptError(
            f"bash -n on the rendered script did not finish within {SYNTAX_CHECK_TIMEOUT_S} s; nothing was "
            f"written. Fix: rerun on a less loaded login node, or report it with the octo-dist launch line"
        ) from None
    if proc.returncode != 0:
        raise ScriptError(
            f"the rendered script fails bash -n ({proc.stderr.strip()}); nothing was written. This is a "
            f"bug in octo-dist: report it with the octo-dist launch line you ran"
        )


def output_path(options: options_mod.LaunchOptions) -> str:
    """Where ``-o`` writes: a new file or a regular file to replace. Refuses, before anything is opened, a
    directory, a missing parent, a link (never followed out), a device, FIFO or socket (``/dev/null`` would be
    chmod'ed, a FIFO would block), with the fix."""
    out = options.script_path()
    default = options_mod.default_script(options.scheduler)
    kind = existing_kind(out)
    if kind == "directory":
        raise spec_mod.JobSpecError(
            f"-o {out!r} is a directory",
            "a file name for the script",
            f"-o {os.path.join(out, default)}",
        )
    if kind not in ("", "file"):
        raise spec_mod.JobSpecError(
            f"-o {out!r} is a {kind}, not a file",
            "a new file name or a regular file to replace (a link is not followed)",
            f"-o {default}",
        )
    parent = os.path.dirname(out) or "."
    if not os.path.isdir(parent):
        raise spec_mod.JobSpecError(
            f"-o {out!r}: directory {parent!r} does not exist",
            "a file in an existing directory",
            f"mkdir -p {shlex.quote(parent)}",
        )
    return out


SCRIPT_MARK = b"\n# octo-dist job for "  # a line of every script render writes, near its top


def is_job_script(path: str) -> bool:
    """Whether the regular file ``path`` is a job script octo-dist wrote (its first 4 KB hold ``SCRIPT_MARK``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return SCRIPT_MARK in f.read(4096)


def write_script(out: str, text: str) -> None:
    """Writes ``text`` to ``out`` as an executable file, replacing what was there (a link, a file of another owner)
    rather than writing through it: only the file written is chmod'ed."""
    with replacing(out, 0o755) as f:
        f.write(text)


def show_defaults(options: options_mod.LaunchOptions, sources: Mapping[str, str]) -> str:
    """One line per option: flag, value, and where it came from."""
    rows = []
    derived = spec_mod.derived_defaults(options)
    for f in options_mod.option_fields():
        if f.name in ("show_defaults", "dry_run"):
            continue
        if not options_mod.offered(f, options.scheduler):
            continue
        value = getattr(options, f.name)
        if f.metadata["argparse"].get("action") == "store_false":
            value = not value  # --no-resume: shown as whether the flag is in effect
        if isinstance(value, bool):
            value = "on" if value else "off"
        source = sources[f.name]
        if f.name in derived:
            # unset, and what it will be follows another option: show that value, as --help describes it
            value, why = derived[f.name]
            value = "(none)" if value in ((), None) else value
            source = f"{source} ({why})"
        rows.append((options_mod.flag_of(f, options.scheduler), value, source))
    site = dict(options.site)
    for opt in schedulers.get(options.scheduler).options:
        rows.append((opt.option, site.get(opt.name, opt.default), sources[opt.name]))
    width = max(len(flag) for flag, _, _ in rows)
    shown = []
    for flag, value, source in rows:
        text = (
            " ".join(value)
            if isinstance(value, tuple)
            else ("(none)" if value is None else str(value))
        )
        # Values come from files: an ESC/OSC sequence in one is shown, never sent to the terminal.
        shown.append(f"{flag:<{width}}  {outside.escape(text):<40}  {outside.escape(source)}")
    return "\n".join(shown) + "\n"


def no_exit(checker: commands.Checker) -> commands.Checker:
    """``checker``, with a ``SystemExit`` from inside it (a ``--config`` file whose import calls ``sys.exit(0)``)
    made the ``ValueError`` of a refused flag: launch never ends silently, with nothing written and exit 0."""

    def check(argv: Sequence[str]) -> None:
        try:
            checker(argv)
        except SystemExit as e:
            raise ValueError(
                f"checking these flags exited (SystemExit({str(e.code)[:40]!r}): a --config file that exits "
                "when it is loaded?)"
            ) from None

    return check


def _checked(options: options_mod.LaunchOptions, name: str, checker: commands.Checker):
    """``checker``, never exiting (:func:`no_exit`), and run in the image where this Python cannot import it (a
    login node's: ``flagsinimage``), with this launch's ``--dry-run`` in the image as the way to check by hand."""
    line = command_line(options)  # the header's line: no -o, --submit, --chain or --dry-run in it
    at = line.index("--") if "--" in line else len(line)
    image = options.image
    dry = shlex.join([*line[:at], "--dry-run", *line[at:]])
    by_hand = f"singularity exec {shlex.quote(image or 'IMAGE.sif')} {dry}"
    if not image:
        by_hand += " (or run launch with the octo-dist environment's Python: make env)"
    return flagsinimage.checker(no_exit(checker), name, image, by_hand)


def wrote_line(out: str, job: spec_mod.Job) -> str:
    """What launch says it wrote: ``"wrote job.sh: 2 node(s) x 8 rank(s), finetune, global batch 256, 1000 steps,
    wall time 12:00:00, at most 24 node-hours"``."""
    allocation, training = job.settings.allocation, job.header.training
    return (
        f"wrote {out}: {allocation.nodes} node(s) x {allocation.ranks_per_node} rank(s), {training.command}"
        + (f", global batch {training.global_batch}" if training.global_batch else "")
        + (f", {training.steps} steps" if training.steps else "")
        # The fork logs to wandb; octo-dist's default does not: say so where the job is summed up.
        + f", {options_mod.wandb_note(job.settings.storage.wandb_mode)}"
        + f", {walltime.time_summary(job)}"
    )


def refusal_and_warning(options: options_mod.LaunchOptions, job: spec_mod.Job) -> tuple:
    """(refusal, warning) of a built job before it is written: an image that does not suit the GPUs, a venv that
    cannot run, and under --submit/--chain anything that would fail the job after its queue wait."""
    refusal, warning = imagefit.check(job.settings.software.image, job.header.resource_type)
    if not job.settings.software.image:
        refusal = refusal or runfrom.venv_refusal(job.settings.software.venv)
    if options.submit or options.chain:
        refusal = refusal or submitchecks.refusal(job, os.environ)
    return refusal, warning


def warnings(job: spec_mod.Job, warning: Optional[str]) -> list:
    """Everything launch warns of before it writes: the image's fit, paths this host lacks, the fine-tune's
    missing pieces, and where a probe job found the site other than launch assumes."""
    out = [warning] if warning else []
    out += jobwarnings.missing_paths(job, os.path.isdir)
    return out + jobwarnings.probe_warnings(job, os.environ, os.getcwd())


def run(args: argparse.Namespace) -> int:
    try:
        found = defaults_mod.read(defaults_mod.files(os.environ, os.getcwd()))
        files = defaults_mod.resolve(found, args.scheduler)
    except defaults_mod.DefaultsError as e:
        return _said(e)
    options, sources = options_from_args(args, files)
    if options.show_defaults:
        sys.stdout.write(show_defaults(options, sources))
        return 0
    options, image_note = runfrom.with_default_image(options)
    if image_note:
        print(f"octo-dist launch: note: {image_note}", file=sys.stderr)
    try:
        job, warning = _job(options, args.checkers)
        out = None if options.dry_run else output_path(options)
    except spec_mod.JobSpecError as e:
        return _said(e)
    for warning in warnings(job, warning):
        print(f"octo-dist launch: warning: {warning}", file=sys.stderr)
    # --dry-run with -o shows the script as -o would name it ("sbatch job.sh"), not the default name
    text = render(job, os.path.basename(out or options.script_path()))
    try:
        syntax_check(text)
        replaced = None if out is None else _write(out, text)
    except Problem as e:
        return _said(e)
    if out is None:
        sys.stdout.write(text)
        return 0
    return _hint_or_submit(options, job, out, replaced)


def _said(problem: Problem) -> int:
    """``octo-dist launch: error: --nodes 0; expected ...`` on stderr; the problem's exit status."""
    print(f"octo-dist launch: error: {problem}", file=sys.stderr)
    return problem.exit_status


def _job(options: options_mod.LaunchOptions, checkers: Mapping[str, commands.Checker]) -> tuple:
    """``(job, warning)``: the job ``options`` describe, built and checked, and what launch warns of it (None);
    JobSpecError when it must not be written."""
    refusal = commands.job_decides(options.train[1:])
    if refusal:
        raise spec_mod.JobSpecError(*refusal)
    checked = {name: _checked(options, name, c) for name, c in checkers.items()}
    job = spec_mod.build(options, checkers=checked, command_line=command_line(options))
    refusal, warning = refusal_and_warning(options, job)
    if refusal:
        raise spec_mod.JobSpecError(*refusal)
    _check_submit(options)
    return job, warning


def _write(out: str, text: str) -> bool:
    """Writes the script to ``out``; whether it replaced a file that was not a job script octo-dist wrote.
    Problem (exit 2) when ``out`` became something else than a file after the checks, or cannot be written."""
    kind = existing_kind(out)
    if kind not in ("", "file"):  # it became one after the checks: still never written through
        raise Problem(
            f"-o {out!r} is now a {kind}", "a file", f"-o {out}.sh", exit_status=EXIT_USAGE
        )
    foreign = kind == "file" and not is_job_script(out)
    try:
        write_script(out, text)
    except OSError as e:
        raise Problem(
            f"cannot write {out!r} ({e.strerror})",
            "a file you can write",
            "-o a path in a directory you own",
            exit_status=EXIT_USAGE,
        ) from None
    return foreign


def _hint_or_submit(
    options: options_mod.LaunchOptions, job: spec_mod.Job, out: str, replaced: bool
) -> int:
    """After the script is written: how to submit it, or (``--submit``, ``--chain N``) its submission."""
    scheduler = job.settings.allocation.scheduler
    submit = schedulers.get(scheduler).submit_hint(shlex.quote(out), job.header.group)
    wrote = wrote_line(out, job)
    if replaced:
        wrote = f"replaced {out!r}, which was not a job script octo-dist wrote; " + wrote
    if not (options.submit or options.chain):
        print(f"{wrote}. Submit: {submit}")
        return 0
    print(wrote)
    # What the queue will be asked for, before anything is queued: "submitting 3 jobs x 2 nodes x 12:00:00 = ...".
    print(submit_mod.chain_summary(job, options.chain or 1))
    try:
        named = dict(name=job.header.name, group=job.header.group, chain=options.chain or 1)
        jobs = submit_mod.submit(scheduler, out, beside_running=options.beside_running, **named)
    except submit_mod.SubmitError as e:
        return _said(e)
    for n, s in enumerate(jobs, 1):
        after = f", after {jobs[n - 2].job_id}" if n > 1 else ""
        print(f"submitted job {s.job_id}{after}: log {s.log}")
    return 0


def _check_submit(options: options_mod.LaunchOptions) -> None:
    # --chain's range is settings.BOUNDS["chain"], refused by spec.build before this runs.
    if options.dry_run and (options.submit or options.chain):
        raise spec_mod.JobSpecError(
            "--dry-run with --submit/--chain",
            "one of them: --dry-run only prints",
            "drop --dry-run",
        )
