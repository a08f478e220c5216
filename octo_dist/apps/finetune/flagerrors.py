"""`octo-dist finetune`'s command line made forgiving and its refusals one line.

absl and ml_collections report a bad flag in their own words: ``'\\'batch_sise\\'\\nDid you mean "batch_size"...'``
(a repr of a KeyError), a 13-line traceback for a config string the config file refuses, ``malformed node or
string ... <ast.Name object at 0x...>`` for ``--config.num-steps=5``, or ``Did you mean: step_fn ?`` for
``--steps=5``. Everything here is a pure function of argv, the error's text and the config's field names, so each
wording is tested directly.
"""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Optional, Sequence

# octo-dist's own flags are spelled as the fork spells its flags (underscores: --step_fn); the hyphenated
# spelling the other subcommands use (smoke --step-fn) is accepted as an alias, so either works everywhere.
ALIASES = {"--step-fn": "--step_fn", "--compile-cache": "--compile_cache"}
# The start-up flags are smoke's own (--devices-per-process): the fork's underscore spelling is their alias.
STARTUP_ALIASES = {
    "--devices_per_process": "--devices-per-process",
    "--init_timeout": "--init-timeout",
}


def with_aliases(argv: Sequence[str]) -> list:
    """Each alias spelled as the flag it stands for (:data:`ALIASES`, :data:`STARTUP_ALIASES`):

    ``["prog", "--step-fn=jit", "--compile-cache", "d"]`` -> ``["prog", "--step_fn=jit", "--compile_cache", "d"]``.
    """
    out = []
    for a in argv:
        flag, eq, value = a.partition("=")
        alias = ALIASES.get(flag) or STARTUP_ALIASES.get(flag)
        out.append(alias + eq + value if alias else a)
    return out


def argv_problem(argv: Sequence[str]) -> Optional[str]:
    """A mistake absl would report badly, found before parsing: a config field spelled with hyphens.

    ``--config.num-steps=5`` -> "--config.num-steps=5: config fields are spelled with underscores, did you mean
    --config.num_steps=5?".
    """
    for a in argv[1:]:
        flag, _, value = a.partition("=")
        if flag.startswith("--config.") and "-" in flag[len("--config.") :]:
            fixed = "--config." + flag[len("--config.") :].replace("-", "_")
            return (
                f"{a}: config fields are spelled with underscores, did you mean "
                f"{fixed}{'=' + value if value else ''}?"
            )
    return None


def one_line(error: BaseException, argv: Sequence[str], fields: Iterable[str] = ()) -> str:
    """absl's or ml_collections' refusal of ``argv`` as one line naming what was found and the fix.

    ``fields`` are the config's flattened field names (``"optimizer.learning_rate"``), for suggestions.
    """
    text = str(error)
    if "Traceback (most recent call last)" in text:
        # ml_collections wraps the config file's own exception in its traceback: its last line is the message,
        # "octo_dist.apps.finetune.configfile.ConfigError: config string 'bogus'; expected ..." -> after the class.
        last = [ln for ln in text.splitlines() if ln.strip()][-1]
        message = re.sub(r"^[\w.]+(Error|Exception): ", "", last.strip())
        given = next((a for a in argv[1:] if a.startswith("--config=")), None)
        return f"{given}: {message}" if given else message
    text = " ".join(text.replace("\\n", " ").split())
    close = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
    if close:
        # ml_collections: '\'batch_sise\'\nDid you mean "batch_size" instead of "batch_sise"?'
        return f"unknown config field {close.group(2)}, did you mean --config.{close.group(1)}?"
    unknown = re.match(r"Unknown command line flag '([^']+)'", text)
    if unknown:
        # absl: "Unknown command line flag 'steps'. Did you mean: step_fn ?" -- its guess only looks at flags,
        # while the user most often meant a config field (--steps -> --config.num_steps).
        name = unknown.group(1)
        own = ["config", *(f[2:] for f in ALIASES.values()), "name", "debug", "resume"]
        # Every field and every node above one ("optimizer.learning_rate"), matched by its last name.
        nodes = {".".join(f.split(".")[: i + 1]) for f in fields for i in range(f.count(".") + 1)}
        candidates = {f"--{f}": f for f in own}
        candidates.update({f"--config.{n}": n.rsplit(".", 1)[-1] for n in sorted(nodes)})
        leaf = difflib.get_close_matches(name, list(candidates.values()), n=1, cutoff=0.75)
        best = next((flag for flag, last in candidates.items() if leaf and last == leaf[0]), None)
        if best is None:
            # --steps -> --config.num_steps: a word of a field's name, the least nested field first.
            words = [
                n
                for n in sorted(nodes, key=lambda n: (n.count("."), len(n)))
                if name in n.split(".")[-1].split("_")
            ]
            best = f"--config.{words[0]}" if words else None
        return f"unknown flag --{name}" + (f", did you mean {best}?" if best else "")
    return text[len("flag ") :] if text.startswith("flag --") else text
