"""`octo-dist finetune`'s command line: the fork's absl flags, octo-dist's own, and the start-up flags every
training command shares (``--devices-per-process``, ``--launcher``..., as ``octo-dist smoke`` takes them).

    octo-dist finetune --config=finetune_config.py:head_only,image_conditioned \
        --config.pretrained_path=weights/octo-small --config.batch_size=256 --name=my_run --debug \
        --devices-per-process=all

The flags are the fork's (``--config`` ml_collections file with ``--config.<field>=...`` overrides, ``--name``,
``--debug``) plus octo-dist's (``--resume``, ``--step_fn``, ``--compile_cache``), read by absl; the start-up flags
are read by the argparse definitions ``octo_dist.runtime.runtime.argv_options`` gives every training command, so
they are spelled, checked and described as in ``smoke``. Standard library, absl and ml_collections only.
"""

from __future__ import annotations

import argparse
import functools
import textwrap
import warnings
from typing import Sequence

from octo_dist.apps.finetune.configfile import (
    DEFAULT_CONFIG,
    PACKAGED_CONFIGS,
    load_config,
    packaged_configs,
    resolve_config_file,
)
from octo_dist.apps.finetune.flagerrors import ALIASES, config_value, missing_value
from octo_dist.apps.finetune.modelconfig import FINETUNING_MODES, MODALITIES, flat_keys
from octo_dist.engine.stepfns import STEP_FNS
from octo_dist.runtime import runtime

# (flag, absl kind, default, value's name in --help, help): the flags besides --config, defined and described
# from this one table.
FLAGS = (
    (
        "name",
        "string",
        "experiment",
        "NAME",
        "the run's name; may use config fields (ft_{batch_size}_{finetuning_mode}); "
        "the run directory is <save_dir>/<wandb.project>/[<wandb.group>/]<name>",
    ),
    ("debug", "bool", False, "", "a debug run: wandb disabled"),
    ("resume", "bool", False, "", "continue from the latest checkpoint in the run directory"),
    (
        "step_fn",
        "enum",
        "auto",
        "|".join(STEP_FNS),
        "auto: shard_map over 2+ CPU devices, else jit; or either by name",
    ),
    (
        "compile_cache",
        "string",
        None,
        "DIR",
        "persistent compilation cache directory, or off (default: $OCTO_DIST_COMPILE_CACHE, else on GPUs "
        "~/.cache/octo-dist/compile-cache)",
    ),
)


# --- the start-up flags: smoke's, from the same definitions -------------------------------------------------------


class _StartupParser(argparse.ArgumentParser):
    """argparse's refusals as a ValueError (one line), not a usage message and SystemExit."""

    def error(self, message: str):
        raise ValueError(message)


def startup_parser() -> argparse.ArgumentParser:
    """The start-up flags every training command shares (``runtime.argv_options``): ``--devices-per-process``..."""
    parser = _StartupParser(prog="octo-dist finetune", add_help=False, allow_abbrev=False)
    runtime.argv_options(parser)
    return parser


def split_startup(argv: Sequence[str]) -> tuple:
    """argv (program name first) -> (runtime.initialize's options, argv without the start-up flags for absl).

    ``["prog", "--devices-per-process=all", "--config.seed=1"]`` -> ``({..., "devices": "all"}, ["prog",
    "--config.seed=1"])``. Raises ValueError (one line) for a malformed start-up flag.
    """
    args, rest = startup_parser().parse_known_args(list(argv[1:]))
    return runtime.from_args(args), [*argv[:1], *rest]


def _with_config_resolved(argv: Sequence[str]) -> list:
    """argv with ``--config=X`` / ``--config X`` made a real path (absl reads ``--config``'s file itself)."""
    out, args = list(argv[:1]), list(argv[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith(("--config=", "-config=")):
            flag, _, value = a.partition("=")
            out.append(f"{flag}={resolve_config_file(value)}")
        elif a in ("--config", "-config") and i + 1 < len(args):
            out += [a, resolve_config_file(args[i + 1])]
            i += 1
        else:
            out.append(a)
        i += 1
    return out


def define_flags(flag_values, argv: Sequence[str]) -> None:
    """The fork's flags (``--config``, ``--name``, ``--debug``) and octo-dist's (``--resume``, ``--step_fn``...).

    ``argv`` is needed at definition time: ml_collections registers one flag per ``--config.<field>=`` it sees.
    """
    from absl import flags
    from ml_collections import config_flags

    define = {"string": flags.DEFINE_string, "bool": flags.DEFINE_bool}
    for name, kind, default, _, text in FLAGS:
        if kind == "enum":
            flags.DEFINE_enum(name, default, STEP_FNS, text, flag_values=flag_values)
        else:
            define[kind](name, default, text, flag_values=flag_values)
    config_flags.DEFINE_config_file(
        "config",
        str(PACKAGED_CONFIGS / DEFAULT_CONFIG),
        "the config file",
        flag_values=flag_values,
        lock_config=False,
        sys_argv=list(argv),
    )


# octo-dist's own config fields (strings), which a config file written for the fork does not have: ml_collections
# refuses an override of a field the file lacks ("'augment_on'"), so these are taken out of argv and set after.
OWN_FIELDS = ("augment_on", "resize_method")


def split_own_fields(argv: Sequence[str]) -> tuple:
    """argv -> (argv without octo-dist's own config fields, those fields' values):

    ``["prog", "--config.augment_on=host", "--config.seed=1"]`` -> ``(["prog", "--config.seed=1"], {"augment_on":
    "host"})``; ``--config.augment_on host`` (the value as the next word) too.
    """
    own = {f"--config.{name}": name for name in OWN_FIELDS}
    out, values, args = list(argv[:1]), {}, list(argv[1:])
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag in own and (eq or i + 1 < len(args)):
            values[own[flag]] = value if eq else args[i + 1]
            i += 1 if eq else 2
            continue
        out.append(args[i])
        i += 1
    return out, values


def parse_flags(argv: Sequence[str]):
    """argv (program name first, start-up flags taken out: :func:`split_startup`) -> the parsed absl FlagValues
    (``.config``, ``.name``, ``.debug``, ``.resume``)."""
    from absl import flags

    given = _with_config_resolved(argv)
    argv, own = split_own_fields(given)
    fv = flags.FlagValues()
    define_flags(fv, argv)
    # "--config.augment_on --config.seed=1" took "--config.seed=1" as augment_on's value; which fields are booleans
    # (which need no value) is known once ml_collections has loaded the config, while parsing: so checked after it,
    # and before its own refusal ("invalid literal for int(): '--debug'") is shown.
    missing = functools.partial(missing_value, given, lambda name: name in fv and fv[name].boolean)
    with warnings.catch_warnings():
        # ml_collections loads the config file with importlib's deprecated load_module(): not ours to fix.
        warnings.filterwarnings("ignore", message="the load_module", category=DeprecationWarning)
        try:
            fv(list(argv))
        except Exception:
            if missing():
                raise ValueError(missing()) from None
            raise
    if missing():
        raise ValueError(missing())
    for (
        name,
        value,
    ) in own.items():  # checked with the rest of the config (config.augment_on_problems...)
        fv.config[name] = value
    return fv


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help", "-help", "--helpfull") for a in argv[1:])


USAGE = (
    "usage: octo-dist finetune [--config=FILE[:ARGS]] [--config.FIELD=VALUE ...] [--name=NAME] [--debug]\n"
    "                          [--resume] [--step-fn=auto|jit|shard_map] [--compile-cache=DIR]\n"
    "                          [--launcher=NAME] [--coordinator=HOST:PORT] [--init-timeout=S]\n"
    "                          [--devices-per-process=MODE]"
)
DESCRIPTION = """\
Fine-tune Octo on every rank (run it under mpirun, srun, or alone): the pretrained model, edited as the config
says, trained data-parallel on the RLDS dataset; checkpoints in the run directory, resumable with --resume.
The config is checked before any rank starts: a missing dataset or unreachable weights end the job at once.

    mpirun -np 8 octo-dist finetune --config=finetune_config.py:head_only,image_conditioned \\
        --config.pretrained_path=weights/octo-small --config.dataset_kwargs.data_dir=data --config.save_dir=runs"""


def help_text(argv: Sequence[str], width: int = 118) -> str:
    """``octo-dist finetune --help``: the flags with their defaults, then the fields of the chosen config."""
    rows = [
        (
            "--config=FILE[:ARGS]",
            f"a config shipped with octo-dist ({', '.join(packaged_configs())}; "
            f"finetune_config.py takes <mode>,<modality>: mode one of "
            f"{', '.join(FINETUNING_MODES)}; modality one of {', '.join(MODALITIES)}), "
            f"or the path to your own (default: {DEFAULT_CONFIG})",
        )
    ]
    for name, kind, default, metavar, text in FLAGS:
        shown = f"={metavar}" if metavar else ""
        # One name per setting: octo-dist's own flags as smoke and launch spell them (--compile-cache); absl's
        # underscore spelling, the fork's style, is accepted too (flagerrors.ALIASES).
        spelled = name.replace("_", "-") if "--" + name in ALIASES.values() else name
        also = f" (--{name} works too)" if spelled != name else ""
        rows.append(
            (
                f"--{spelled}{shown}",
                text + also
                if default is None
                else f"{text}{also} (default: {'off' if default is False else default})",
            )
        )
    # The start-up flags, described as smoke describes them (the same argparse definitions).
    for action in startup_parser()._actions:
        value_name = (
            action.metavar
            or ("|".join(action.choices) if action.choices else None)
            or {"coordinator": "HOST:PORT", "init_timeout": "SECONDS"}.get(
                action.dest, action.dest.upper()
            )
        )
        described = (action.help or "") % {"default": action.default}
        rows.append((f"{action.option_strings[0]}={value_name}", described))
    lines = [USAGE, "", DESCRIPTION, "", "flags:"]
    for flag, text in rows:
        lines += textwrap.wrap(
            text, width, initial_indent=f"  {flag:<24} ", subsequent_indent=" " * 27
        )
    value = config_value(argv)
    lines += [
        "",
        f"config fields of {value} (default value shown; set any with --config.FIELD=VALUE):",
    ]
    try:
        config = load_config(value).to_dict()
    except Exception as e:  # a bad config string or path: still show the flags
        lines.append(f"  (cannot load {value}: {e})")
    else:
        lines += [
            f"  --config.{'.'.join(map(str, key))}={value!r}"
            for key, value in flat_keys(config).items()
        ]
    return "\n".join(lines) + "\n"
