"""The values a fine-tune accepts for the flags the job runtime cannot check before its ranks start, and the one
reading of them from a command line: ``["--config.augment_on=hots"]`` -> ``("--config.augment_on=hots", "one of
auto, device, host", "--config.augment_on=auto")``. A render warns of a bad one (``jobwarnings``), ``--submit``
refuses it (``submitchecks``); standard library only, as launch runs on a login node's bare Python.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

# The fine-tune's accepted values (apps/finetune/frames.py RESIZE_METHODS, engine/stepfns.py AUGMENT_ON and
# STEP_FNS; the jobs layer imports neither: tests/test_abci_submitchecks.py keeps them equal).
AUGMENT_ON = ("auto", "device", "host")
RESIZE_METHODS = ("lanczos3", "bilinear")
STEP_FNS = ("auto", "jit", "shard_map")
VALUE_FLAGS = (
    ("--config.augment_on", AUGMENT_ON),
    ("--config.resize_method", RESIZE_METHODS),
    ("--step_fn", STEP_FNS),
    ("--step-fn", STEP_FNS),
)

# (what was found, what was expected, the fix), as ``problems.line`` words a refusal.
Problem = Tuple[str, str, str]


def flag_value(args: Sequence[str], flag: str) -> Optional[str]:
    """The last value of ``flag`` in ``args``: ``--flag=value`` or ``--flag value``; None when not given."""
    value = None
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
        elif arg == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def value_problem(args: Sequence[str]) -> Optional[Problem]:
    for flag, allowed in VALUE_FLAGS:
        value = flag_value(args, flag)
        if value is not None and value not in allowed:
            return (f"{flag}={value}", f"one of {', '.join(allowed)}", f"{flag}={allowed[0]}")
    return None
