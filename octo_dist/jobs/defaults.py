"""Defaults for ``octo-dist launch`` from files, so the group, image and modules need not be typed every time.

Read in this order, each winning over the one before, the command line over all:

1. built in (``LaunchOptions``' own defaults);
2. the user's file, ``$XDG_CONFIG_HOME/octo-dist/launch.ini`` (default ``~/.config/octo-dist/launch.ini``);
3. the project's file, ``octo-dist.ini`` in the directory ``launch`` runs from.

An INI file (``configparser``: standard library on Python 3.9, which ABCI's login nodes have)::

    [launch]              ; every scheduler
    group = gxx00000
    image = /groups/gxx00000/octo-dist/octo-dist-cuda12.sif
    wandb-mode = online
    [launch.pbs]          ; one scheduler, over [launch]
    module = hpcx/2.20
    [launch.slurm]
    partition = gpu
    qos = normal

Pure: ``resolve`` takes the files' texts; ``files`` says where they are for an environment and a directory.
"""

from __future__ import annotations

import configparser
import dataclasses
import difflib
import os
import re
from typing import Dict, Mapping, Optional, Sequence, Tuple

from octo_dist.problems import Refusal
from octo_dist.jobs import schedulers
from octo_dist.jobs import options, walltime
from octo_dist.jobs.flagchecks import JobSpecError
from octo_dist.launchers import outside

USER_FILE = os.path.join("octo-dist", "launch.ini")
PROJECT_FILE = "octo-dist.ini"
BUILT_IN = "built in"
FILE_LIMIT = 64 << 10  # bytes: a defaults file is a dozen lines; anything near this is not one
COMMAND_LINE = "command line"

# The keys a file may set are the options declared ``in_file`` (options.file_keys: "group", "module", "wandb-mode",
# a one-field setting's own), under their flags' names; repeatable ones (--module) are written space-separated.


def site_keys() -> Dict[str, Tuple[str, bool]]:
    """Every registered scheduler's own options as file keys -> (name, repeatable): ``{"partition":
    ("partition", False), "resource": ("resources", True)}``. In [launch.slurm] / [launch.sge] / [launch.pbs]; in
    [launch], the other schedulers skip them."""
    return {
        opt.option[2:]: (opt.name, opt.repeat)
        for s in schedulers.SCHEDULERS.values()
        for opt in s.options
    }


class DefaultsError(Refusal, ValueError):
    """A defaults file that cannot be used: the file, what was found, what was expected, the fix (one line)."""


def files(environ: Mapping[str, str], cwd: str) -> Tuple[str, str]:
    """(user file, project file) for this environment and directory; either may not exist."""
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(
        environ.get("HOME", "~"), ".config"
    )
    return os.path.join(config_home, USER_FILE), os.path.join(cwd, PROJECT_FILE)


def _line_of(text: str, section: str, key: str) -> int:
    """The line (from 1) where ``key`` is set in ``[section]`` of an INI text; 0 when not found. configparser keeps
    no line numbers, so errors find it again: ``("[launch]\\nwalltime = 12h\\n", "launch", "walltime")`` -> 2."""
    current = None
    for n, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        header = re.fullmatch(r"\[([^\]]+)\]\s*(?:[#;].*)?", stripped)
        if header:
            current = header.group(1).strip()
        elif current == section and re.match(
            rf"{re.escape(key)}\s*(?:[=:]|$)", stripped, re.IGNORECASE
        ):
            return n
    return 0


def _where(path: str, text: str, section: str, key: str) -> str:
    """``"/home/u/.config/octo-dist/launch.ini line 3 [launch]"``: where an error's key is, for the editor."""
    n = _line_of(text, section, key)
    return f"{path}{f' line {n}' if n else ''} [{section}]"


def _value(where: str, key: str, option: Optional[dataclasses.Field], value: str) -> object:
    """A key's value checked as the command line checks its flag (a switch, the wall time's text, its choices, a
    whole number), the error naming the file and line; a scheduler's own option (``option`` None) as written."""
    declared = option.metadata["argparse"] if option else {}
    if declared.get("action") == "store_true":
        if value.lower() not in ("true", "false", "yes", "no", "1", "0"):
            raise DefaultsError(
                f"{where}: {key} = {value!r}; expected true or false. Fix: {key} = true"
            )
        return value.lower() in ("true", "yes", "1")
    if option is not None and option.name == "walltime":
        try:
            walltime.parse_walltime(value, label=f"{key} =")
        except JobSpecError as e:
            fix = e.fix.replace("--walltime ", f"{key} = ", 1)
            raise DefaultsError(f"{where}: {e.found}; expected {e.expected}. Fix: {fix}") from None
    choices = declared.get("choices")
    if choices and value not in choices:
        close = difflib.get_close_matches(value, choices, n=1) or [choices[0]]
        raise DefaultsError(
            f"{where}: {key} = {value!r}; expected one of {', '.join(choices)}. Fix: {key} = {close[0]}"
        )
    if declared.get("type") is int:
        if not re.fullmatch(r"[0-9]{1,18}", value.strip()):
            raise DefaultsError(
                f"{where}: {key} = {value!r}; expected a whole number. Fix: {key} = {option.default or 1}"
            )
        return int(value)
    return value


def _parse(path: str, text: str, scheduler: str) -> Dict[str, object]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text, source=path)
    except configparser.Error as e:
        raise DefaultsError(
            f"{path}: not an INI file ({str(e).splitlines()[0]}); expected [launch] and key = value "
            f"lines. Fix: correct or remove {path}"
        ) from None
    out: Dict[str, object] = {}
    site = site_keys()
    own = options.file_keys()
    keys = {**{k: f.name for k, f in own.items()}, **{k: name for k, (name, _) in site.items()}}
    lists = tuple(f.name for f in own.values() if options.repeated(f))
    lists += tuple(name for name, repeat in site.values() if repeat)
    for section in ("launch", f"launch.{scheduler}"):
        if not parser.has_section(section):
            continue
        for key, value in parser.items(section):
            where = _where(path, text, section, key)
            if key not in keys:
                # "group_" / "wall-time" / "walltime_" -> the key meant, as the command line's "did you mean".
                spelled = key.replace("_", "-")
                close = difflib.get_close_matches(spelled, list(keys), n=1, cutoff=0.6)
                meant = close[0] if close else None
                raise DefaultsError(
                    f"{where}: unknown key {key!r}"
                    + (f", did you mean {meant!r}?" if meant else "")
                    + f" Expected one of {', '.join(sorted(keys))}. Fix: "
                    + (f"{meant} = {value}" if meant else "remove or rename it")
                )
            field = keys[key]
            if field in lists:
                out[field] = tuple(value.split())
            else:
                out[field] = _value(where, key, own.get(key), value)
    # "[launch.lsf]" where no LSF scheduler is registered would be read by nothing: name it, as a typo would be.
    known = {"launch", *(f"launch.{name}" for name in schedulers.SCHEDULERS)}
    unknown = [s for s in parser.sections() if s not in known]
    if unknown:
        raise DefaultsError(
            f"{path}: unknown section [{unknown[0]}]; expected [launch] or "
            f"[launch.{'|'.join(schedulers.SCHEDULERS)}]. "
            f"Fix: rename it"
        )
    return out


def resolve(
    texts: Sequence[Tuple[str, Optional[str]]], scheduler: str
) -> Dict[str, Tuple[object, str]]:
    """Field -> (value, the file it came from), later files winning; ``texts``: (path, text or None if absent)."""
    out: Dict[str, Tuple[object, str]] = {}
    for path, text in texts:
        if text is None:
            continue
        for field, value in _parse(path, text, scheduler).items():
            out[field] = (value, path)
    return out


def read(paths: Sequence[str]) -> list:
    """(path, text or None) for each path: the only side effect here. Each file is read to at most ``FILE_LIMIT``
    bytes and must be UTF-8 (``outside.read_text``): a 50 MB or binary file is refused at once, naming it."""
    out = []
    for path in paths:
        fix = f"correct or remove {path}"
        try:
            out.append((path, outside.read_text(path, FILE_LIMIT, "", fix)))
        except FileNotFoundError:
            out.append((path, None))
        except outside.InputError as e:
            raise DefaultsError(str(e)) from None
    return out
