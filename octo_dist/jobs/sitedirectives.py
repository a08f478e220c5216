"""The checks on the header lines a site adds to a job script (each scheduler's class writes them: ``site_lines``).

SLURM ``--account/--partition/--qos/--constraint``, Grid Engine ``--queue/--project`` (``--pe`` is part of every
Grid Engine header), PBS ``--resource KEY=VALUE`` (an extra ``#PBS -l``), and ``--directive TEXT`` on every
scheduler: a line of the scheduler's own syntax copied as it is (``#SBATCH --mail-type=END``), refused when it
holds a newline, is another scheduler's, or sets what the rendered header already sets (``#SBATCH --nodes=3`` beside
``#SBATCH --nodes=2``: which one wins depends on the scheduler, and either way the job is not the one rendered).

Pure: :func:`refusal` takes the options' values and returns ``(found, expected, fix)`` or None (the caller raises
it as a ``JobSpecError``); :func:`insert` puts a scheduler's ``site_lines`` into its rendered header.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Mapping, Optional, Sequence, Tuple

from octo_dist.jobs import schedulers

PREFIX = {name: s.directive_prefix for name, s in schedulers.SCHEDULERS.items()}  # "pbs": "#PBS"

# A value that goes into a directive as one word: the scheduler reads it, never bash, but a space would split it.
# SLURM constraints use & | [ ] * ( ) !: "a100&ib", "[rack1|rack2]".
WORD = re.compile(r"[A-Za-z0-9_.,:/=+@%-]+")
CONSTRAINT = re.compile(r"[A-Za-z0-9_.,:/=+@%&|\[\]*()!-]+")
RESOURCE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9_.,:/+@%-]+)")

# What each scheduler's rendered header always sets, as a directive's key (see :func:`keys`) -> the launch option
# that sets it. tests/test_site_options.py checks every directive octo-dist renders against these tables.
RENDERED = {
    "pbs": {
        "-l select": "--nodes/--ranks-per-node",
        "-l walltime": "--walltime",
        "-q": "--resource-type",
        "-P": "--group",
        "-N": "--name",
        "-j": "nothing (octo-dist keeps one log)",
        "-k": "nothing (octo-dist keeps one log)",
        "-o": "nothing (octo-dist keeps one log)",
        "-e": "nothing (octo-dist keeps one log)",
    },
    "sge": {
        "-pe": "--pe and --nodes/--ranks-per-node",
        "-l h_rt": "--walltime",
        "-N": "--name",
        "-j": "nothing (octo-dist keeps one log)",
        "-o": "nothing (octo-dist keeps one log)",
        "-e": "nothing (octo-dist keeps one log)",
        "-cwd": "nothing (the job starts where qsub ran)",
        "-wd": "nothing (the job starts where qsub ran)",
        "-notify": "nothing (the job asks for its stop signal)",
        "-q": "--queue",
        "-P": "--project",
    },
    "slurm": {
        "--job-name": "--name",
        "--nodes": "--nodes",
        "--ntasks": "--nodes/--ranks-per-node",
        "--ntasks-per-node": "--ranks-per-node",
        "--gpus-per-node": "--gpus-per-node",
        "--gpus": "--gpus-per-node",
        "--gres": "--gpus-per-node",
        "--cpus-per-task": "--cpus-per-rank",
        "--time": "--walltime",
        "--signal": "--stop-margin",
        "--output": "nothing (octo-dist names the log)",
        "--error": "nothing (octo-dist names the log)",
        "--account": "--account",
        "--partition": "--partition",
        "--qos": "--qos",
        "--constraint": "--constraint",
    },
}
# sbatch's one-letter spellings of the long options above.
SLURM_SHORT = {
    "-J": "--job-name",
    "-N": "--nodes",
    "-n": "--ntasks",
    "-G": "--gpus",
    "-c": "--cpus-per-task",
    "-t": "--time",
    "-o": "--output",
    "-e": "--error",
    "-A": "--account",
    "-p": "--partition",
    "-q": "--qos",
    "-C": "--constraint",
}


def keys(scheduler: str, directive: str) -> list:
    """What a directive sets: ``"#SBATCH -N 3"`` -> ``["--nodes"]``; ``"#PBS -l select=2:ngpus=8,walltime=1:00:00"``
    -> ``["-l select", "-l walltime"]``; ``"#$ -l h_rt=1:00:00 -q gpu.q"`` -> ``["-l h_rt", "-q"]``."""
    words = []
    for word in directive.split()[1:]:
        # getopt's attached values, "-N3" (sbatch) and "-lselect=3" (qsub of PBS, whose options are one letter);
        # Grid Engine's options are words (-pe, -cwd), never attached.
        if scheduler != "sge" and re.fullmatch(r"-[A-Za-z].+", word) and not word.startswith("--"):
            words += [word[:2], word[2:]]
        else:
            words.append(word)
    out = []
    for i, word in enumerate(words):
        if not word.startswith("-"):
            continue
        if scheduler == "slurm":
            name = word.split("=", 1)[0]
            out.append(SLURM_SHORT.get(name, name))
        elif word == "-l" and i + 1 < len(words):
            out += [f"-l {r.split('=', 1)[0]}" for r in words[i + 1].split(",") if r]
        else:
            out.append(word)
    return out


def _unprintable(text: str) -> bool:
    return any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in text)


def refusal(
    scheduler: str,
    *,
    group: Optional[str] = None,
    values: Mapping[str, Optional[str]],
    resources: Sequence[str] = (),
    directives: Sequence[str] = (),
) -> Optional[Tuple[str, str, str]]:
    """``(found, expected, fix)`` for the first site option that must not reach the header; None when all may.

    Args:
      scheduler: "pbs", "sge" or "slurm".
      group: ``--group`` (SLURM's account, Grid Engine's project, ABCI's group), already checked by the caller.
      values: flag -> value of the one-word site options (``{"--partition": "gpu", "--qos": None}``); a flag of
        another scheduler's (``--partition`` for pbs) given a value is refused.
      resources: PBS ``--resource`` values, ``"place=scatter"``.
      directives: ``--directive`` values, ``"#SBATCH --mail-type=END"``.
    """
    for flag, value in values.items():
        if value is None:
            continue
        if OWNER[flag] != scheduler:
            return (
                f"{flag} {value} for {scheduler}",
                f"{flag} only with {OWNER[flag]}",
                f"drop {flag}, or give the line as --directive '{PREFIX[scheduler]} ...'",
            )
        pattern = CONSTRAINT if flag == "--constraint" else WORD
        if _unprintable(value) or not pattern.fullmatch(value):
            return (
                f"{flag} {value!r}",
                "one word of letters, digits and _.,:/=+@%- (it goes into a scheduler directive)",
                f"{flag} {re.sub(r'[^A-Za-z0-9_.-]', '', value) or 'NAME'}",
            )
    if resources and scheduler != "pbs":
        return (
            f"--resource {resources[0]} for {scheduler}",
            "--resource only with pbs (an extra #PBS -l)",
            f"--directive '{PREFIX[scheduler]} ...' with your scheduler's own syntax",
        )
    for resource in resources:
        m = RESOURCE.fullmatch(resource)
        if _unprintable(resource) or not m:
            return (
                f"--resource {resource!r}",
                "KEY=VALUE, one PBS resource (e.g. place=scatter)",
                "--resource KEY=VALUE, once per resource",
            )
        if f"-l {m.group(1)}" in RENDERED["pbs"]:
            return (
                f"--resource {resource}",
                f"a resource octo-dist does not set itself ({m.group(1)} comes from "
                f"{RENDERED['pbs']['-l ' + m.group(1)]})",
                f"drop --resource {resource} and use {RENDERED['pbs']['-l ' + m.group(1)]}",
            )
    for directive in directives:
        found = _directive_refusal(
            scheduler, directive, {**values, "--account": group, "-P": group}
        )
        if found:
            return found
    return None


def _directive_refusal(
    scheduler: str, directive: str, given: Mapping[str, Optional[str]]
) -> Optional[Tuple[str, str, str]]:
    prefix = PREFIX[scheduler]
    if _unprintable(directive):
        return (
            f"--directive {directive!r} holds a newline or control character",
            "one directive line (a newline would end it and run the rest as a command)",
            "one --directive per line",
        )
    head = directive.split(None, 1)[0] if directive.strip() else ""
    if head != prefix or len(directive.split()) < 2 or "'" in directive or '"' in directive:
        other = [s for s, p in PREFIX.items() if head == p and s != scheduler]
        return (
            f"--directive {directive!r}"
            + (f" is a {other[0]} directive" if other else f" does not start with {prefix}"),
            f"one {scheduler} directive, {prefix} then its options, without quotes",
            f"--directive '{prefix} ...' in {scheduler}'s own syntax",
        )
    rendered = dict(RENDERED[scheduler])
    for key in keys(scheduler, directive):
        why = rendered.get(key)
        if why is None:
            continue
        if key in CONDITIONAL[scheduler] and not given.get(CONDITIONAL[scheduler][key]):
            continue  # not rendered for this job: the directive is its only spelling
        return (
            f"--directive {directive!r} sets {key}, which the header already sets",
            "directives that add to the header, not contradict it",
            f"drop the directive and use {why}"
            if not why.startswith("nothing")
            else "drop the directive: octo-dist sets it for the job's own needs",
        )
    return None


OWNER = {"--partition": "slurm", "--qos": "slurm", "--constraint": "slurm", "--queue": "sge"}
# Keys of RENDERED in the header only when an option is given: key -> the option (in ``given``).
CONDITIONAL = {
    "pbs": {},
    "sge": {"-q": "--queue", "-P": "-P"},
    "slurm": {k: k for k in ("--account", "--partition", "--qos", "--constraint")},
}


def insert(header: str, lines: Iterable[str], prefix: str) -> str:
    """``lines`` after the last directive of a rendered header, where the scheduler still reads them (PBS and
    Grid Engine stop at the first command; comments in between are fine)."""
    lines = list(lines)
    if not lines:
        return header
    rows = header.split("\n")
    last = max(i for i, row in enumerate(rows) if row.startswith(prefix + " "))
    return "\n".join(rows[: last + 1] + lines + rows[last + 1 :])
