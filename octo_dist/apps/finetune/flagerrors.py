"""`octo-dist finetune`'s command line made forgiving and its refusals one line.

absl and ml_collections report a bad flag in their own words: ``'\\'batch_sise\\'\\nDid you mean "batch_size"...'``
(a repr of a KeyError), a 13-line traceback for a config string the config file refuses, ``malformed node or
string ... <ast.Name object at 0x...>`` for ``--config.num-steps=5``, or ``Did you mean: step_fn ?`` for
``--steps=5``. Everything here is a pure function of argv, the error's text and the config's field names, so each
wording is tested directly.
"""

from __future__ import annotations

import difflib
import itertools
import re
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional, Sequence

from octo_dist.apps.finetune.configfile import DEFAULT_CONFIG, PACKAGED_CONFIGS, packaged_configs

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


# The packaged configs' field names as plain text, so that `octo-dist launch ... -- finetune --config.tpyo=1` is caught
# on a login node's bare Python 3.9 (no absl, no ml_collections to load the config): one "<config file> <field>" a
# line, generated from the configs by `python -m octo_dist.apps.finetune.flagerrors > .../fields.txt` and checked to
# be in sync by tests/test_finetune_fields.py.
FIELDS_FILE = PACKAGED_CONFIGS / "fields.txt"
FIELDS_HEADER = (
    "# The packaged fine-tune configs' fields, for checking --config.FIELD without ml_collections. Generated:\n"
    "# python -m octo_dist.apps.finetune.flagerrors > octo_dist/apps/finetune/configs/fields.txt\n"
)


def generate_fields() -> str:
    """:data:`FIELDS_FILE`'s text from the packaged configs, over every config string they take (a field that only
    some finetuning modes have is known): needs ml_collections."""
    from octo_dist.apps.finetune.configfile import load_config
    from octo_dist.apps.finetune.modelconfig import FINETUNING_MODES, MODALITIES, flat_keys

    lines = []
    strings = [""] + [",".join(p) for p in itertools.product(FINETUNING_MODES, MODALITIES)]
    for name in packaged_configs():
        fields = set()
        for arg in strings:
            try:
                config = load_config(f"{name}:{arg}" if arg else name).to_dict()
            except Exception:  # a config string this config does not take
                continue
            fields.update(".".join(map(str, key)) for key in flat_keys(config))
        lines += [f"{name} {field}" for field in sorted(fields)]
    return FIELDS_HEADER + "\n".join(lines) + "\n"


def packaged_fields(text: Optional[str] = None) -> Dict[str, set]:
    """``{"finetune_config.py": {"pretrained_path", "optimizer.learning_rate.peak_value", ...}}`` from
    :data:`FIELDS_FILE` (or ``text``); standard library only."""
    if text is None:
        try:
            text = FIELDS_FILE.read_text()
        except OSError:
            return {}
    out: Dict[str, set] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, field = line.partition(" ")
            out.setdefault(name, set()).add(field.strip())
    return out


def config_value(argv: Sequence[str]) -> str:
    """The config argv chooses, as given: ``["prog", "--config=finetune_config.py:full,multimodal"]`` ->
    ``"finetune_config.py:full,multimodal"`` (``--config X`` too); :data:`DEFAULT_CONFIG` without one."""
    for i, a in enumerate(argv[1:], 1):
        if a.startswith(("--config=", "-config=")):
            return a.partition("=")[2]
        if a in ("--config", "-config") and i + 1 < len(argv):
            return argv[i + 1]
    return DEFAULT_CONFIG


def _packaged_config(value: str) -> Optional[str]:
    """``"finetune_config.py:head_only,multimodal"`` or its packaged path -> ``"finetune_config.py"``; a config
    file of the user's own -> None (only ml_collections, loading it, knows its fields)."""
    path = value.partition(":")[0]
    if "/" not in path and Path(path).is_file():
        return None  # a file of that name in the working directory is what ml_collections loads
    if "/" in path and Path(path).resolve().parent != PACKAGED_CONFIGS:
        return None
    name = Path(path).name
    return name if name in packaged_configs() else None


def unknown_field(argv: Sequence[str], fields: Optional[Dict[str, set]] = None) -> Optional[str]:
    """The first ``--config.FIELD`` the chosen packaged config does not have, as ml_collections refuses it (one
    line, with the closest field): ``--config.tpyo=1`` -> "unknown config field tpyo, did you mean ..."; None when
    every field is known, or the config is the user's own."""
    fields = packaged_fields() if fields is None else fields
    name = _packaged_config(config_value(argv))
    known = fields.get(name or "")
    if not known:
        return None
    nodes = {".".join(f.split(".")[: i + 1]) for f in known for i in range(f.count(".") + 1)}
    for a in argv[1:]:
        flag = a.partition("=")[0]
        if not flag.startswith("--config.") or flag[len("--config.") :] in nodes:
            continue
        field = flag[len("--config.") :]
        close = difflib.get_close_matches(field, sorted(nodes), n=1, cutoff=0.6)
        if not close:
            last = field.rsplit(".", 1)[-1]
            leaves = {n.rsplit(".", 1)[-1]: n for n in sorted(nodes, key=len, reverse=True)}
            close = [
                leaves[m] for m in difflib.get_close_matches(last, list(leaves), n=1, cutoff=0.6)
            ]
        return f"unknown config field {field}" + (
            f", did you mean --config.{close[0]}?" if close else ""
        )
    return None


def _is_flag(arg: str) -> bool:
    """``--config.seed=1`` and ``-h`` are flags; ``-1`` and ``-0.5`` are values (a negative number)."""
    try:
        float(arg)
    except ValueError:
        return arg.startswith("-") and arg != "-"
    return False


def missing_value(
    argv: Sequence[str], is_boolean: Callable[[str], bool] = lambda name: False
) -> Optional[str]:
    """A ``--config.FIELD`` given without ``=`` whose next argument is another flag (or nothing): absl and
    ml_collections take that flag as the value, so ``--config.augment_on --config.seed=1`` set augment_on to
    "--config.seed=1" and lost seed 1. A boolean field (``is_boolean("config.FIELD")``) needs no value.

    ``["prog", "--config.augment_on", "--debug"]`` -> "--config.augment_on without a value (the next argument,
    --debug, is a flag, not its value); give it as --config.augment_on=VALUE".
    """
    for i, arg in enumerate(argv[1:], 1):
        if not arg.startswith("--config.") or "=" in arg or is_boolean(arg[2:]):
            continue
        following = argv[i + 1] if i + 1 < len(argv) else None
        if following is None:
            return f"{arg} without a value (nothing follows it); give it as {arg}=VALUE"
        if _is_flag(following):
            return (
                f"{arg} without a value (the next argument, {following}, is a flag, not its value); "
                f"give it as {arg}=VALUE"
            )
    return None


def argv_problem(argv: Sequence[str]) -> Optional[str]:
    """A mistake absl would report badly, found before parsing: a config field spelled with hyphens; a field the
    packaged config does not have (checked from :data:`FIELDS_FILE`, so also where absl is missing).

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
    return unknown_field(argv)


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


if __name__ == "__main__":
    import sys

    sys.stdout.write(generate_fields())
