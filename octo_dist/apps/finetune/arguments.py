"""`octo-dist finetune`'s command line, read in one place: argv -> the run's :class:`config.FinetuneJob`, or one
refusal (a :class:`~octo_dist.problems.Problem`, one line) before the runtime starts.

    arguments.job_config(["octo-dist finetune", "--config.pretrained_path=weights/octo-small",
                          "--config.batch_size=256", "--devices-per-process=all"], os.environ)

``octo-dist launch`` checks a job's flags with :func:`check_command` when it renders the script (standard library,
absl and ml_collections only: no JAX, no TensorFlow, no Octo).
"""

from __future__ import annotations

import functools
import sys
from typing import Mapping, Optional, Sequence

from octo_dist.apps.finetune import checks, commandline, config, configfile, flagerrors, flagsonce
from octo_dist.apps.finetune import modelconfig
from octo_dist.problems import Refusal


class FlagError(Refusal, ValueError):
    """A flag or config field ``octo-dist finetune`` refuses: one line, exit 2."""


def job_config(
    argv: Sequence[str], environ: Mapping[str, str], probe: Optional[checks.HfProbe] = None
) -> config.FinetuneJob:
    """argv (program name first) -> the checked job (:func:`config.parse`: the weights, the dataset, the save
    directory, whether to resume); raises FlagError or the check's own Problem."""
    try:
        flags, startup = parse_command_line(argv)
    except ValueError as e:
        # "unknown flag --steps, did you mean --config.num_steps?" gets the fix; a refusal with its own keeps it.
        text = str(e)
        if "Fix: " not in text:
            text += "" if text.endswith("?") else "."
            text += " Fix: octo-dist finetune --help lists the flags and config fields"
        raise FlagError(text) from None
    if probe is None:
        from octo_dist.apps.finetune import weights

        probe = functools.partial(weights.probe, environ=environ)
    return config.parse(
        flags.config,
        probe,
        name=flags.name,
        debug=flags.debug,
        resume=flags.resume,
        step_fn=flags.step_fn,
        compile_cache=flags.compile_cache,
        runtime=startup,
    )


def check_command(argv: Sequence[str]) -> None:
    """Raise ValueError (one line) when ``octo-dist finetune ARGV`` would refuse its flags or config fields.

    ``octo-dist launch`` calls this when it renders a job script; it parses the fork's flags and loads the config
    file (standard library, absl and ml_collections only: no JAX, no Octo)."""
    parse_command_line(["octo-dist finetune", *argv])


def parse_command_line(argv: Sequence[str]) -> tuple:
    """argv (program name first) -> (absl's FlagValues, runtime.initialize's options from the start-up flags smoke
    takes too: ``--devices-per-process``...); any refusal is a one-line ValueError (ImportError passes: absl or
    ml_collections missing on a login node's bare Python, where the caller skips the check)."""
    argv = flagerrors.with_aliases(argv)
    problem = flagerrors.argv_problem(argv)
    if problem:
        raise ValueError(problem)
    startup, argv = commandline.split_startup(argv)
    try:
        flags = commandline.parse_flags(argv)
    except ImportError:
        raise
    except (
        Exception
    ) as e:  # absl's flags.Error, ml_collections' KeyError for an unknown field, ConfigError
        raise ValueError(flagerrors.one_line(e, argv, _config_fields(argv))) from None
    # After absl's own reading: a flag it does not know (launch's `-o` after `-- finetune`) is said as unknown first.
    problem = flagsonce.repeated(argv)
    if problem:
        raise ValueError(problem)
    return flags, startup


def parse_flags(argv: Sequence[str]):
    """argv (program name first) -> absl's FlagValues (:func:`parse_command_line` without the start-up options)."""
    return parse_command_line(argv)[0]


def _config_fields(argv: Sequence[str]) -> list:
    """The chosen config's fields as dotted names, for suggestions (none when the config itself cannot load)."""
    try:
        loaded = configfile.load_config(commandline.config_value(argv)).to_dict()
    except Exception:
        return []
    return [".".join(map(str, key)) for key in modelconfig.flat_keys(loaded)]


def main(argv: Sequence[str]) -> int:
    """``python -m octo_dist.apps.finetune.arguments FLAGS...``: what ``octo-dist launch`` runs in the image when
    the login node's Python cannot check the fine-tune's flags (``jobs/flagsinimage.py``): exit 0 and its
    CHECKED line, or exit 2 and the refusal in one line."""
    from octo_dist.jobs import flagsinimage

    try:
        check_command(argv)
    except ValueError as e:
        print(f"{flagsinimage.ERROR_PREFIX}{e}", file=sys.stderr)
        return 2
    print(flagsinimage.CHECKED)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
