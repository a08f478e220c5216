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
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple

from octo_dist.problems import Refusal
from octo_dist.jobs import schedulers
from octo_dist.launchers import outside

USER_FILE = os.path.join("octo-dist", "launch.ini")
PROJECT_FILE = "octo-dist.ini"
BUILT_IN = "built in"
FILE_LIMIT = 64 << 10  # bytes: a defaults file is a dozen lines; anything near this is not one
COMMAND_LINE = "command line"

# key in the file -> LaunchOptions field; lists are written space-separated.
KEYS = {
    "group": "group",
    "image": "image",
    "skip-image-check": "skip_image_check",
    "module": "modules",
    "venv": "venv",
    "bind": "bind",
    "save-dir": "save_dir",
    "data-dir": "data_dir",
    "compile-cache": "compile_cache",
    "wandb-mode": "wandb_mode",
    "resource-type": "resource_type",
    "walltime": "walltime",
    "name": "name",
}
LISTS = ("modules", "bind")
BOOLS = ("skip_image_check",)


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
    keys = {**KEYS, **{k: name for k, (name, _) in site.items()}}
    lists = LISTS + tuple(name for name, repeat in site.values() if repeat)
    for section in ("launch", f"launch.{scheduler}"):
        if not parser.has_section(section):
            continue
        for key, value in parser.items(section):
            if key not in keys:
                raise DefaultsError(
                    f"{path} [{section}]: unknown key {key!r}; expected one of "
                    f"{', '.join(sorted(keys))}. Fix: remove or rename it"
                )
            field = keys[key]
            if field in lists:
                out[field] = tuple(value.split())
            elif field in BOOLS:
                if value.lower() not in ("true", "false", "yes", "no", "1", "0"):
                    raise DefaultsError(
                        f"{path} [{section}]: {key} = {value!r}; expected true or false. "
                        f"Fix: {key} = true"
                    )
                out[field] = value.lower() in ("true", "yes", "1")
            else:
                out[field] = value
    unknown = [s for s in parser.sections() if s != "launch" and not s.startswith("launch.")]
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
