"""The fine-tune's own flags given once: absl keeps a repeated flag's last value without a word
(``--config.num_steps=3 ... --config.num_steps=5`` trained 5 steps, ``--name a --name b`` ran as b). A second,
different value is refused with the words every octo-dist command uses (``onevalue.refusal``); the same value twice
is one value. The start-up flags are ``runtime.argv_options``' and checked by their parser, before absl's.
"""

from __future__ import annotations

from typing import Iterator, Optional, Sequence, Tuple

from octo_dist.apps.finetune import flagerrors
from octo_dist.launchers import onevalue


def _given(argv: Sequence[str]) -> Iterator[Tuple[str, str, str]]:
    """(the name, the flag as given, its value) of each flag in ``argv`` (program name first), as absl reads them:
    ``--config.seed=1``, ``--config.seed 1``, ``-name x``; a flag with no value (``--debug``) has ``""``. absl reads
    no flag after ``--``."""
    args = list(argv[1:])
    i = 0
    while i < len(args) and args[i] != "--":
        arg = args[i]
        i += 1
        if not flagerrors._is_flag(arg):
            continue
        flag, eq, value = arg.partition("=")
        if not eq and i < len(args) and args[i] != "--" and not flagerrors._is_flag(args[i]):
            value = args[i]  # "--config.seed 1": the next argument is its value
            i += 1
        yield flag.lstrip("-"), flag, value


def repeated(argv: Sequence[str]) -> Optional[str]:
    """The refusal of the first flag given twice with two values, else None: ``["prog", "--config.num_steps=3",
    "--config.num_steps", "5"]`` -> "--config.num_steps 3 and --config.num_steps 5 set the same flag twice;
    expected one value. Fix: keep one of them (--config.num_steps 3, or --config.num_steps 5)"."""
    first = {}
    for name, flag, value in _given(argv):
        if name in first and first[name][1] != value:
            return onevalue.refusal(first[name], (flag, value))
        first.setdefault(name, (flag, value))
    return None
